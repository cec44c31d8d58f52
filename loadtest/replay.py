"""``accscale replay``: send a trace to a KServe v2 endpoint, open loop, and score the answers.

Each trace line becomes one single-sample gRPC request, sent at its arrival time whether or
not earlier ones have returned, with ``parameters={"slo_us": ...}``. Payloads are held-out
digits (the trace's payload index picks one). A request meets its SLO if its answer comes
back within the SLO of its scheduled arrival, so a client that falls behind is charged, not
excused. SLO attainment and mean serving accuracy (the accuracy the sidecar reports for the
variant that served each request that met its SLO) are the papers' metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadtest.traces import Trace

CLIENT_GRACE_S = 5.0  # a request still unanswered this long after its SLO is abandoned (counted as an error)


@dataclass
class ReplayResult:
    scheduled_s: np.ndarray  # trace arrival times
    lag_ms: np.ndarray  # how late each request was sent
    latency_ms: np.ndarray  # from scheduled arrival to answer; NaN for errors
    slo_ms: np.ndarray
    accuracy: np.ndarray  # reported by the server; NaN for errors
    status: list[str]  # "ok" or the error's status

    def summary(self) -> dict[str, object]:
        n = len(self.status)
        met = self.latency_ms <= self.slo_ms  # NaN compares False
        errors = Counter(s for s in self.status if s != "ok")
        return {
            "queries": n,
            "met": int(met.sum()),
            "answered": n - sum(errors.values()),
            "errors": dict(errors),
            "slo_attainment": float(met.mean()) if n else 0.0,
            "mean_serving_accuracy": float(np.mean(self.accuracy[met])) if met.any() else 0.0,
            "p50_latency_ms": float(np.nanpercentile(self.latency_ms, 50)) if np.isfinite(self.latency_ms).any() else None,
            "p99_latency_ms": float(np.nanpercentile(self.latency_ms, 99)) if np.isfinite(self.latency_ms).any() else None,
            "p99_send_lag_ms": float(np.percentile(self.lag_ms, 99)) if n else 0.0,
        }


async def replay(url: str, model: str, trace: Trace, default_slo_ms: float, progress=lambda msg: None) -> ReplayResult:
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as grpcaio
    from tritonclient.utils import InferenceServerException

    from export import data

    n = len(trace)
    slo_ms = np.where(np.isnan(trace.slo_ms), default_slo_ms, trace.slo_ms)
    lag_ms, latency_ms, accuracy = np.zeros(n), np.full(n, np.nan), np.full(n, np.nan)
    status = ["ok"] * n
    async with grpcaio.InferenceServerClient(url) as client:
        meta = await client.get_model_metadata(model, as_json=True)
        (tensor,) = meta["inputs"]
        images = data.load(int(tensor["shape"][-1]))["heldout"].images
        payload = np.where(trace.payload_index >= 0, trace.payload_index, np.arange(n))  # -1: the i-th image

        async def one(i: int, start: float) -> None:
            x = images[int(payload[i]) % len(images)][None]
            inp = grpcclient.InferInput(tensor["name"], list(x.shape), tensor["datatype"])
            inp.set_data_from_numpy(x)
            try:
                result = await client.infer(model, [inp], parameters={"slo_us": round(slo_ms[i] * 1e3)},
                                            client_timeout=slo_ms[i] / 1e3 + CLIENT_GRACE_S)
            except InferenceServerException as exc:
                status[i] = exc.status() or "error"
                return
            latency_ms[i] = (time.perf_counter() - start - trace.arrival_s[i]) * 1e3
            params = result.get_response().parameters
            accuracy[i] = params["accuracy"].double_param if "accuracy" in params else np.nan

        tasks = []
        start = time.perf_counter()
        next_report = 5.0
        for i, t in enumerate(trace.arrival_s):
            delay = t - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            lag_ms[i] = max(0.0, (time.perf_counter() - start - t) * 1e3)
            tasks.append(asyncio.ensure_future(one(i, start)))
            if t >= next_report:
                progress(f"replay: {i + 1}/{n} sent ({t:.0f} s)")
                next_report += 5.0
        await asyncio.gather(*tasks)
    return ReplayResult(trace.arrival_s, lag_ms, latency_ms, slo_ms, accuracy, status)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="send a trace to the sidecar (or Triton) open loop and score it",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="trace file (`accscale trace gen` writes them)")
    p.add_argument("--url", default="127.0.0.1:8101", help="gRPC endpoint (default: the sidecar's, 127.0.0.1:8101)")
    p.add_argument("--model", default="digits", help="model name (default: digits)")
    p.add_argument("--slo-ms", type=float, default=36.0, help="SLO of trace lines without one (default: 36)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    trace = Trace.load(args.trace)
    result = asyncio.run(replay(args.url, args.model, trace, args.slo_ms, progress=print if not args.json else
                                (lambda msg: None)))
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:<22} {value}")
    return 0
