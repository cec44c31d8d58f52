"""``accscale bench overload`` and ``accscale bench soak``: the sidecar under more load than it can serve, and for long.

Both start Triton(s) and the sidecar on a model of modest capacity (by default a small ONNX MLP,
so that this process's own gRPC client can offer several times what the sidecar serves on a
2-core machine), then measure the capacity: requests met per second by a closed loop of
``--concurrency`` clients (answered requests per second). Load is then offered open loop, each request sent at its time
whatever the earlier ones did, with ``--slo-ms`` as its SLO.

overload:
  1. ``--factor`` (3) x capacity for ``--overload-s`` (30 s);
  2. recovery at half the capacity for ``--recovery-s`` (20 s).
  Reported per phase: requests sent and the rate really sent (the client can be the limit; compare
  it with the target), answered (met: within the SLO at the client; late), refused by status code
  (explicit errors: UNAVAILABLE for a full queue, DEADLINE_EXCEEDED for what the policy drops) and
  lost (no answer before the client gave up, SLO + 30 s). Over the whole run: the sidecar's peak RSS
  and its request-size limit, the peak queue depth (its /metrics), false worker-down (workers it
  marked down: Triton never fails here, so every one is false) and the recovery time (from the end
  of the overload to the first 1 s window of sends with >= 99% met).
  Targets: 0 lost, 0 false worker-down, peak RSS bounded (well under the request limit times the
  queue limit).

soak:
  ``--load`` (0.7) x capacity for ``--duration-s`` (1800 s). Reported: RSS sampled every second, its
  growth from the end of the warm-up (the first 10% of the run, at least 60 s when the run allows)
  to the end, and attainment per window of ``--window-s``. Target: RSS growth under 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MODEL = "mlp"
IMAGE_SIZE, HIDDEN, NUM_CLASSES = 16, 4096, 10
LOST_GRACE_S = 30.0  # the client waits this long past the SLO before it calls a request lost
MET_TARGET = 0.99  # a recovery window counts as recovered at this share of met requests


def register_bench(kinds: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile", type=Path, help="profile of a real build (default: the bench's own MLP, "
                        "profiled in this run)")
    common.add_argument("--repository", type=Path, help="Triton repository of that build")
    common.add_argument("--model-name", default="digits", help="logical model name with --profile (default digits)")
    common.add_argument("--workers", type=int, default=1, help="Triton servers, one worker each (default 1)")
    common.add_argument("--slo-ms", type=float, default=100.0, help="SLO of every request (default 100)")
    common.add_argument("--concurrency", type=int, default=64, help="closed-loop clients measuring capacity "
                        "(default 64)")
    common.add_argument("--capacity-s", type=float, default=5.0, help="length of the capacity run (default 5)")
    common.add_argument("--json", action="store_true", help="print one JSON object")
    o = kinds.add_parser("overload", parents=[common], help="3x capacity for 30 s, then recovery: nothing lost, "
                         "no worker falsely down, memory bounded", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("--factor", type=float, default=3.0, help="offered load over capacity (default 3)")
    o.add_argument("--overload-s", type=float, default=30.0, help="length of the overload (default 30)")
    o.add_argument("--recovery-s", type=float, default=20.0, help="length of the recovery phase (default 20)")
    o.set_defaults(func=run_overload)
    s = kinds.add_parser("soak", parents=[common], help="a long run below capacity: RSS growth and attainment",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--load", type=float, default=0.7, help="offered load over capacity (default 0.7)")
    s.add_argument("--rate", type=float, help="offered load in requests/s instead of --load x capacity (to run "
                   "two builds at the same load)")
    s.add_argument("--duration-s", type=float, default=1800.0, help="length of the run (default 1800)")
    s.add_argument("--window-s", type=float, default=60.0, help="attainment window (default 60)")
    s.set_defaults(func=run_soak)


def mlp_model():
    """An MLP on 16x16 inputs, 35 M multiply-adds a row: capacity of a few hundred requests a second on one
    thread, so that this process's own client can offer three times that."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    shapes = [(IMAGE_SIZE * IMAGE_SIZE, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, NUM_CLASSES)]
    weights = [(rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32) for shape in shapes]
    nodes, x = [helper.make_node("Flatten", ["INPUT"], ["h0"])], "h0"
    for i in range(len(weights)):
        out = "LOGITS" if i == len(weights) - 1 else f"h{i + 1}"
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [out if out == "LOGITS" else f"m{i}"]))
        if out != "LOGITS":
            nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        x = out
    graph = helper.make_graph(
        nodes, MODEL, [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["N", 1, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        [numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(weights)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ----------------------------------------------------------------------------- load
@dataclass
class Sends:
    """What one phase sent and got: each request's send time (s from the phase start) and outcome."""

    target_qps: float
    duration_s: float
    times: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)  # met, late, lost, or the gRPC status name
    send_s: float = 0.0  # how long sending took: above duration_s when the client could not keep up

    def summary(self) -> dict:
        counts = Counter(self.outcomes)
        refused = {k: v for k, v in sorted(counts.items()) if k not in ("met", "late", "lost")}
        return {"target_qps": round(self.target_qps, 1), "sent": len(self.outcomes),
                "sent_qps": round(len(self.outcomes) / max(self.send_s, self.duration_s), 1), "met": counts["met"],
                "late": counts["late"], "refused": refused, "lost": counts["lost"]}

    def windows(self, width_s: float) -> list[tuple[float, float]]:
        """(window start, share met) per window of sends."""
        t, met = np.asarray(self.times), np.asarray([o == "met" for o in self.outcomes])
        out = []
        for start in np.arange(0.0, self.duration_s - width_s / 2, width_s):
            inside = (t >= start) & (t < start + width_s)
            out.append((float(start), float(met[inside].mean()) if inside.any() else 0.0))
        return out


class Client:
    """Sends the same well-formed request over one gRPC channel; open or closed loop."""

    def __init__(self, url: str, model: str, slo_us: int) -> None:
        import grpc
        from tritonclient.grpc import service_pb2 as pb
        from tritonclient.grpc import service_pb2_grpc

        self.slo_s = slo_us / 1e6
        self._grpc = grpc
        self._channel = grpc.aio.insecure_channel(url)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._request = pb.ModelInferRequest(model_name=model)
        self._request.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1, IMAGE_SIZE, IMAGE_SIZE])
        self._request.raw_input_contents.append(np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.float32).tobytes())
        self._request.parameters["slo_us"].int64_param = slo_us

    async def one(self) -> str:
        start = time.perf_counter()
        try:
            await self._stub.ModelInfer(self._request, timeout=self.slo_s + LOST_GRACE_S)
        except self._grpc.aio.AioRpcError as exc:
            if time.perf_counter() - start >= self.slo_s + LOST_GRACE_S:
                return "lost"
            return exc.code().name
        return "met" if time.perf_counter() - start <= self.slo_s else "late"

    async def closed(self, concurrency: int, duration_s: float) -> float:
        """Answered requests per second with ``concurrency`` clients each sending again on every answer."""
        end = time.perf_counter() + duration_s
        answered = 0

        async def loop() -> None:
            nonlocal answered
            while time.perf_counter() < end:
                outcome = await self.one()  # not `answered += await ...`: that reads `answered` before the await
                answered += outcome in ("met", "late")

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return answered / duration_s

    async def open(self, rate_qps: float, duration_s: float) -> Sends:
        """Send at ``rate_qps`` for ``duration_s`` (evenly spaced; a late sender catches up at once)."""
        sends = Sends(rate_qps, duration_s)
        tasks = []
        start = time.perf_counter()
        n = int(rate_qps * duration_s)
        for i in range(n):
            delay = start + i / rate_qps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sends.times.append(time.perf_counter() - start)
            tasks.append(asyncio.ensure_future(self.one()))
        sends.send_s = time.perf_counter() - start
        sends.outcomes = list(await asyncio.gather(*tasks))
        return sends

    async def close(self) -> None:
        await self._channel.close()


# ----------------------------------------------------------------------------- the sidecar, watched
class Watch:
    """Samples the sidecar's RSS and its /metrics on a thread while a run goes on."""

    def __init__(self, pid: int, http_url: str, interval_s: float = 0.25) -> None:
        import psutil

        self._process = psutil.Process(pid)
        self._url = f"http://{http_url}/metrics"
        self._interval_s = interval_s
        self.rss: list[tuple[float, float]] = []  # (time s, MiB)
        self.queue_depth: list[float] = []
        self.start = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def metrics(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self._url, timeout=10) as response:
            text = response.read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.rss.append((time.perf_counter() - self.start, self._process.memory_info().rss / 2**20))
            with contextlib.suppress(OSError):
                m = self.metrics()
                self.queue_depth.append(m.get("accscale_queue_depth", 0.0))

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def deployment(args: argparse.Namespace, progress):
    """Triton(s) and the sidecar on the bench's MLP (profiled now) or on ``--profile``/``--repository``."""
    from export.repository import write_static
    from scheduler_sidecar.experiments.sidecar_bench import measure_profile
    from scheduler_sidecar.live.triton_launcher import TritonServer
    from scheduler_sidecar.server.serve import SidecarServer

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        repository, profile, name = args.repository, args.profile, args.model_name
        if profile is None:
            repository, profile, name = Path(tmp) / "repository", Path(tmp) / "profile.json", MODEL
            write_static(repository, MODEL, mlp_model(), IMAGE_SIZE, NUM_CLASSES, MODEL)
        tritons = [stack.enter_context(TritonServer(repository=repository)) for _ in range(args.workers)]
        if args.profile is None:
            progress("profiling the MLP")
            measure_profile(tritons[0].grpc_url, profile, model=MODEL)
        sidecar = stack.enter_context(SidecarServer(workers=[t.grpc_url for t in tritons], profile=profile,
                                                    extra_args=["--model-name", name]))
        yield sidecar, name


async def _capacity(client: Client, args: argparse.Namespace, progress) -> float:
    progress(f"capacity: {args.concurrency} closed-loop clients for {args.capacity_s:g} s")
    await client.closed(args.concurrency, min(2.0, args.capacity_s))  # warm the path and the latency calibration
    capacity = await client.closed(args.concurrency, args.capacity_s)
    if capacity <= 0:
        raise RuntimeError("no request was answered in the capacity run; raise --slo-ms")
    return capacity


def overload(args: argparse.Namespace, progress=lambda msg: None) -> dict:
    from scheduler_sidecar.server.protocol import Limits

    with deployment(args, progress) as (sidecar, name), Watch(sidecar.pid, sidecar.http_url) as watch:
        async def main() -> tuple[float, Sends, Sends]:
            client = Client(sidecar.grpc_url, name, round(args.slo_ms * 1e3))
            try:
                capacity = await _capacity(client, args, progress)
                progress(f"overload: {args.factor:g} x {capacity:.0f}/s for {args.overload_s:g} s")
                hot = await client.open(args.factor * capacity, args.overload_s)
                progress(f"recovery: {capacity / 2:.0f}/s for {args.recovery_s:g} s")
                cool = await client.open(capacity / 2, args.recovery_s)
            finally:
                await client.close()
            return capacity, hot, cool

        before = watch.metrics()
        capacity, hot, cool = asyncio.run(main())
        after = watch.metrics()
    recovered = next((start for start, share in cool.windows(1.0) if share >= MET_TARGET), None)
    return {
        "capacity_qps": round(capacity, 1), "factor": args.factor, "slo_ms": args.slo_ms,
        "overload": hot.summary(), "recovery": cool.summary(),
        "recovery_s": recovered,
        "lost": hot.summary()["lost"] + cool.summary()["lost"],
        "false_worker_down": int(after.get("accscale_worker_failures_total", 0.0)
                                 - before.get("accscale_worker_failures_total", 0.0)),
        "peak_queue_depth": max(watch.queue_depth, default=0.0),
        "rss_start_mb": round(watch.rss[0][1], 1), "peak_rss_mb": round(max(r for _, r in watch.rss), 1),
        "max_request_bytes": Limits.max_request_bytes,  # the bench's sidecar runs with the default
        "targets": {"lost": 0, "false_worker_down": 0},
    }


def soak(args: argparse.Namespace, progress=lambda msg: None) -> dict:
    with deployment(args, progress) as (sidecar, name), Watch(sidecar.pid, sidecar.http_url, 1.0) as watch:
        async def main() -> tuple[float, Sends]:
            client = Client(sidecar.grpc_url, name, round(args.slo_ms * 1e3))
            try:
                capacity = await _capacity(client, args, progress)
                rate = args.rate or args.load * capacity
                progress(f"soak: {rate:.0f}/s (capacity {capacity:.0f}/s) for {args.duration_s:g} s")
                watch.start = time.perf_counter()
                watch.rss.clear()
                return capacity, await client.open(rate, args.duration_s)
            finally:
                await client.close()

        capacity, sends = asyncio.run(main())
    warm_s = min(max(60.0, args.duration_s / 10), args.duration_s / 2)
    after_warm = next(r for t, r in watch.rss if t >= warm_s)
    end = watch.rss[-1][1]
    return {
        "capacity_qps": round(capacity, 1), "load": args.load, "slo_ms": args.slo_ms,
        "duration_s": args.duration_s, "warm_up_s": warm_s, "run": sends.summary(),
        "rss_after_warm_up_mb": round(after_warm, 1), "rss_end_mb": round(end, 1),
        "rss_peak_mb": round(max(r for _, r in watch.rss), 1),
        "rss_growth_pct": round(100 * (end - after_warm) / after_warm, 2),
        "attainment_per_window": [(round(t), round(share, 4)) for t, share in sends.windows(args.window_s)],
        "rss_mb_per_window": [(round(t), round(r, 1)) for t, r in watch.rss[::max(1, int(args.window_s))]],
        "targets": {"rss_growth_pct": 5.0},
    }


def _printer(args: argparse.Namespace):
    return (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print


def run_overload(args: argparse.Namespace) -> int:
    result = overload(args, _printer(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"capacity {result['capacity_qps']:.0f}/s at SLO {args.slo_ms:g} ms")
    for phase in ("overload", "recovery"):
        r = result[phase]
        print(f"{phase:<9} target {r['target_qps']:.0f}/s, sent {r['sent']} ({r['sent_qps']:.0f}/s): met {r['met']}, "
              f"late {r['late']}, refused {r['refused']}, lost {r['lost']}")
    print(f"recovered after {result['recovery_s']} s; peak queue {result['peak_queue_depth']:.0f}; "
          f"RSS {result['rss_start_mb']} -> peak {result['peak_rss_mb']} MiB (request limit "
          f"{result['max_request_bytes']} B)")
    print(f"lost {result['lost']} (target 0), false worker-down {result['false_worker_down']} (target 0)")
    return 0


def run_soak(args: argparse.Namespace) -> int:
    result = soak(args, _printer(args))
    if args.json:
        print(json.dumps(result))
        return 0
    r = result["run"]
    print(f"capacity {result['capacity_qps']:.0f}/s; {r['target_qps']:.0f}/s for {args.duration_s:g} s: sent {r['sent']}, "
          f"met {r['met']}, late {r['late']}, refused {r['refused']}, lost {r['lost']}")
    print(f"RSS {result['rss_after_warm_up_mb']} MiB after {result['warm_up_s']:g} s of warm-up -> "
          f"{result['rss_end_mb']} MiB at the end: {result['rss_growth_pct']:+.2f}% (target < 5%)")
    print("attainment per window:", ", ".join(f"{t}s {share:.3f}" for t, share in result["attainment_per_window"]))
    return 0
