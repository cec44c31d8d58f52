"""``accscale bench sidecar``: what the sidecar adds over calling Triton directly, measured in one run.

A trivial model (one 256x10 matmul behind the python backend) keeps model time small, so
the sidecar's own cost shows. perf_analyzer (C++, little CPU of its own) drives both
targets over gRPC, one after the other, in the same run:

- ``added_p50_ms``, ``added_p99_ms``: latency through the sidecar minus direct to Triton,
  both at the same moderate constant request rate (``--rate``).
- ``throughput_ratio``: the most single-sample requests per second the sidecar sustains
  divided by Triton's own, each at its best concurrency from ``--concurrency``.

``--cprofile FILE`` runs the sidecar under cProfile and prints where its time went.
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
