"""``accscale bench sidecar``: what the sidecar adds over calling Triton directly, measured in one run.

A trivial model (one 256x10 matmul behind the python backend) keeps model time small, so
the sidecar's own cost shows. perf_analyzer (C++, little CPU of its own) drives both
targets over gRPC, one after the other, in the same run:

- ``added_p50_ms``, ``added_p99_ms``: latency through the sidecar minus direct to Triton,
  both at the same moderate constant request rate (``--rate``).
- ``throughput_ratio``: the most single-sample requests per second the sidecar sustains
  divided by Triton's own, each at its best concurrency from ``--concurrency``.

``--cprofile FILE`` runs the sidecar under cProfile and prints where its time went.

``accscale bench fidelity``: the live system against the simulator on the same trace,
profile, policy and worker count (DESIGN 3). The trace is replayed open loop through the
sidecar in front of real Tritons (``accscale loadtest``) and simulated with the profile's
p50 latencies (``accscale simulate``). The live side is scored twice: at the client (from
each request's scheduled arrival, the client's own delays included) and in the sidecar
(its /metrics, from arrival at the sidecar, which is what the simulator models). SLO
attainments and mean serving accuracies are printed side by side with their gaps in points.
"""

from __future__ import annotations

import argparse
import csv
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL = "trivial"
IMAGE_SIZE, NUM_CLASSES = 16, 10
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("sidecar", help="latency and throughput through the sidecar vs direct to Triton",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=200.0, help="requests/s for the latency comparison (default 200)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[4, 16, 48],
                   help="concurrencies tried for peak throughput (default: 4 16 48)")
    p.add_argument("--window-ms", type=int, default=4000, help="perf_analyzer measurement window (default 4000)")
    p.add_argument("--slo-ms", type=float, default=1000.0, help="slo_us sent to the sidecar (default 1000 ms)")
    p.add_argument("--cprofile", type=Path, help="run the sidecar under cProfile, save the stats here, print a summary")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
    f = kinds.add_parser("fidelity", help="live sidecar + Triton vs the simulator on one trace and profile",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--profile", type=Path, default=Path("build/full/profile.json"),
                   help="profile measured through Triton (default: build/full/profile.json, `accscale profile`)")
    f.add_argument("--repository", type=Path, default=Path("model_repository"),
                   help="Triton repository exported with that profile (default: model_repository)")
    f.add_argument("--trace", type=Path, help="trace to replay (default: a bursty 30 s trace, 150 + 250 q/s, CV² 4)")
    f.add_argument("--policy", default="slackfit", help="policy of both drivers (default: slackfit)")
    f.add_argument("--workers", type=int, default=1, help="Triton servers, one worker each (default: 1)")
    f.add_argument("--slo-ms", type=float, default=30.0, help="SLO of trace lines without one (default: 30)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=run_fidelity)


def trivial_model() -> onnx.ModelProto:
    weights = np.random.default_rng(0).normal(size=(IMAGE_SIZE * IMAGE_SIZE, NUM_CLASSES)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["INPUT"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["LOGITS"])],
        MODEL, [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["N", 1, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        [numpy_helper.from_array(weights, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def measure_profile(url: str, path: Path, repeats: int = 30, model: str = MODEL) -> None:
    """Profile a one-input 16x16 model directly (p50/p99 per batch size), as the sidecar's policy needs."""
    import tritonclient.grpc as grpcclient

    from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant

    p50, p99 = [], []
    with grpcclient.InferenceServerClient(url) as client:
        for b in PROFILE_BATCHES:
            tensor = grpcclient.InferInput("INPUT", [b, 1, IMAGE_SIZE, IMAGE_SIZE], "FP32")
            tensor.set_data_from_numpy(np.zeros((b, 1, IMAGE_SIZE, IMAGE_SIZE), np.float32))
            times = []
            for _ in range(repeats + 3):
                start = time.perf_counter()
                client.infer(model, [tensor])
                times.append((time.perf_counter() - start) * 1e3)
            p50.append(float(np.percentile(times[3:], 50)))
            p99.append(float(np.percentile(times[3:], 99)))
    curve = LatencyCurve(PROFILE_BATCHES, tuple(np.maximum.accumulate(p50)), tuple(np.maximum.accumulate(p99)))
    variant = Variant(model, 1.0, Actuation("model", model), {"cpu": curve})
    Profile(model, "accscale bench (measured direct, this run)", (variant,)).save(path)


def perf_analyzer(binary: Path, url: str, window_ms: int, load: list[str], slo_us: int | None) -> dict[str, float]:
    """One perf_analyzer measurement: throughput and latency percentiles (ms)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pa.csv"
        cmd = [str(binary), "-m", MODEL, "-u", url, "-i", "grpc", "-p", str(window_ms), "--max-trials", "4",
               "-s", "50", "-f", str(out), *load]
        if slo_us is not None:
            cmd += ["--request-parameter", f"slo_us:{slo_us}:int"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if result.returncode != 0 or not out.exists():
            raise RuntimeError(f"perf_analyzer failed ({' '.join(cmd)}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        (row,) = list(csv.DictReader(out.open()))
    return {"throughput_qps": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3}


def bench(rate: float, concurrency: list[int], window_ms: int, slo_ms: float, cprofile: Path | None,
          progress=lambda msg: None) -> dict:
    from export.repository import write_static
    from scheduler_sidecar.experiments.perf_analyzer import ensure
    from scheduler_sidecar.live.triton_launcher import TritonServer
    from scheduler_sidecar.server.serve import SidecarServer

    binary = ensure()
    with tempfile.TemporaryDirectory() as tmp:
        repository, profile = Path(tmp) / "repository", Path(tmp) / "profile.json"
        write_static(repository, MODEL, trivial_model(), IMAGE_SIZE, NUM_CLASSES, MODEL)
        with TritonServer(repository=repository) as triton:
            progress("profiling the trivial model")
            measure_profile(triton.grpc_url, profile)
            python_args = ["-m", "cProfile", "-o", str(cprofile)] if cprofile else []
            with SidecarServer(workers=[triton.grpc_url], profile=profile, python_args=python_args,
                               extra_args=["--model-name", MODEL]) as sidecar:
                targets = {"direct": (triton.grpc_url, None), "sidecar": (sidecar.grpc_url, round(slo_ms * 1e3))}
                at_rate, peak = {}, {}
                for name, (url, slo) in targets.items():
                    progress(f"{name}: latency at {rate:g} requests/s")
                    at_rate[name] = perf_analyzer(binary, url, window_ms, [
                        "--request-rate-range", str(rate), "--request-distribution", "constant"], slo)
                    runs = {}
                    for c in concurrency:
                        progress(f"{name}: throughput at concurrency {c}")
                        runs[c] = perf_analyzer(binary, url, window_ms, ["--concurrency-range", str(c)], slo)
                    best = max(runs, key=lambda c: runs[c]["throughput_qps"])
                    peak[name] = {"concurrency": best, **runs[best]}
    return {
        "added_p50_ms": round(at_rate["sidecar"]["p50_ms"] - at_rate["direct"]["p50_ms"], 3),
        "added_p99_ms": round(at_rate["sidecar"]["p99_ms"] - at_rate["direct"]["p99_ms"], 3),
        "throughput_ratio": round(peak["sidecar"]["throughput_qps"] / peak["direct"]["throughput_qps"], 3),
        "rate_qps": rate, "at_rate": at_rate, "peak": peak,
    }


def run(args: argparse.Namespace) -> int:
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    result = bench(args.rate, args.concurrency, args.window_ms, args.slo_ms, args.cprofile, progress)
    if args.json:
        print(json.dumps(result))
    else:
        for name in ("direct", "sidecar"):
            r, p = result["at_rate"][name], result["peak"][name]
            print(f"{name:<8} at {args.rate:g}/s: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms; "
                  f"peak {p['throughput_qps']:.0f}/s at concurrency {p['concurrency']}")
        print(f"added p50 {result['added_p50_ms']:.2f} ms, added p99 {result['added_p99_ms']:.2f} ms, "
              f"throughput ratio {result['throughput_ratio']:.2f}")
    if args.cprofile:
        print(f"\nwhere the sidecar's time went (cProfile, {args.cprofile}):", file=sys.stderr)
        pstats.Stats(str(args.cprofile), stream=sys.stderr).sort_stats("tottime").print_stats(15)
    return 0


def sidecar_view(http_url: str) -> dict[str, float]:
    """SLO attainment and mean serving accuracy as the sidecar counted them (its /metrics): from the
    request's arrival at the sidecar, so the client's own delays are left out, as in the simulator."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{http_url}/metrics") as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    outcomes: dict[str, float] = {}
    for sample in families["accscale_requests"].samples:
        if sample.name.endswith("_total"):
            outcome = sample.labels["outcome"]
            outcomes[outcome] = outcomes.get(outcome, 0.0) + sample.value
    accuracy = {s.name: s.value for s in families["accscale_served_accuracy"].samples}
    count = accuracy.get("accscale_served_accuracy_count", 0.0)
    total = sum(outcomes.values())
    return {"queries": int(total), "outcomes": outcomes,
            "slo_attainment": outcomes.get("met", 0.0) / total if total else 0.0,
            "mean_serving_accuracy": accuracy.get("accscale_served_accuracy_sum", 0.0) / count if count else 0.0}


def run_fidelity(args: argparse.Namespace) -> int:
    import contextlib

    from loadtest.loadtest_cli import loadtest
    from loadtest.traces import Trace, bursty
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.experiments.simulate import load_queries
    from scheduler_sidecar.live.triton_launcher import TritonServer
    from scheduler_sidecar.server.config import ModelSpec
    from scheduler_sidecar.server.serve import SidecarServer
    from scheduler_sidecar.sim.simulator import SimConfig, Simulator
    from scheduler_sidecar.systems import make_policy

    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    profile = Profile.load(args.profile)
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = args.trace or Path(tmp) / "trace.txt"
        if args.trace is None:
            bursty(150.0, 250.0, cv2=4.0, duration_s=30.0, seed=0).save(trace_path)
        trace = Trace.load(trace_path)
        models = sorted({v.actuation.model for v in profile.variants})
        with contextlib.ExitStack() as stack:
            tritons = [stack.enter_context(TritonServer(repository=args.repository, models=models))
                       for _ in range(args.workers)]
            sidecar = stack.enter_context(SidecarServer(
                workers=[t.grpc_url for t in tritons], profile=args.profile,
                extra_args=["--policy", args.policy, "--default-slo-ms", str(args.slo_ms)]))
            progress(f"replaying {len(trace)} queries ({trace.mean_rate_qps:.0f} q/s) through the sidecar")
            client = loadtest(trace_path, sidecar.grpc_url, Path(tmp) / "run", slo_ms=args.slo_ms,
                              progress_s=0 if args.json else 5.0)["summary"]
            server = sidecar_view(sidecar.http_url)
        arrival_us, deadline_us = load_queries(trace_path, args.slo_ms)
    overhead_us = ModelSpec("digits", args.profile).overhead_us  # what the live policy subtracts from slack
    policy = make_policy(args.policy, profile, overhead_us=overhead_us)
    sim = Simulator(policy, SimConfig(workers=args.workers)).run(arrival_us, deadline_us).summary()
    keys = ("slo_attainment", "mean_serving_accuracy")
    result = {
        "queries": len(trace), "policy": args.policy, "workers": args.workers,
        "live_client": client, "live_sidecar": server,
        "simulated": {k: sim[k] for k in (*keys, "met", "late", "dropped")},
        **{f"{what}_gap_pts": {side: round(100 * (view[key] - sim[key]), 2)
                               for side, view in (("client", client), ("sidecar", server))}
           for what, key in zip(("attainment", "accuracy"), keys)},
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'':<26} {'attainment':>10} {'accuracy':>9}")
        for name, r in (("live, at the client", client), ("live, in the sidecar", server), ("simulated", sim)):
            print(f"{name:<26} {r['slo_attainment']:>10.4f} {100 * r['mean_serving_accuracy']:>8.2f}%")
        for side in ("client", "sidecar"):
            print(f"gap (points), {side:<12} {result['attainment_gap_pts'][side]:>10.2f} "
                  f"{result['accuracy_gap_pts'][side]:>9.2f}")
        print(f"client errors {client['errors']}, p99 send lag {client['p99_send_lag_ms']:.1f} ms")
    return 0
