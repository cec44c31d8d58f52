"""``accscale bench sidecar``: what the sidecar adds over calling Triton directly, measured in one run.

A trivial model (one 256x10 matmul behind the python backend) keeps model time small, so
the sidecar's own cost shows. perf_analyzer (C++, little CPU of its own) drives both
targets over gRPC, one after the other, in the same run:

- ``added_p50_ms``, ``added_p99_ms``: latency through the sidecar minus direct to Triton,
  both at the same moderate constant request rate (``--rate``).
- ``throughput_ratio``: the most single-sample requests per second the sidecar sustains
  divided by Triton's own, each at its best concurrency from ``--concurrency``.
- ``cpu_us_per_request``: at a constant ``--cpu-rate`` (1,000/s), for each front end (``grpc``,
  ``http`` with binary tensors, ``streaming``: gRPC ``ModelStreamInfer``), the CPU time (user +
  system, all threads) the sidecar and Triton (with its python-backend stubs) spent over the
  whole perf_analyzer run, divided by the rows Triton served in it (its own statistics), direct
  and through the sidecar, and the sidecar's split by thread (``sidecar_threads``: its event loop's, ``main``,
  gRPC's and the native edge's). A front end the sidecar does not serve reports its error instead.

- ``floor`` (with ``--floor``): the same CPU count for the least a Python ``grpc.aio`` front end
  costs (:mod:`.grpc_floor`): ``echo`` answers every request with a canned response, ``proxy``
  passes each to Triton in its own call (its "sidecar" figure is the floor server's). What the
  sidecar cannot go below on this runtime. ``native floor``: the same two servers in C++ (native/floor.cc, gRPC's
  callback API), what a native edge cannot go below, and ``cq-echo``, echo on gRPC's completion-queue API (the
  callback API's alternative); ``edge``: the native edge itself with Python passing each request from its server to
  its Triton client and back (:mod:`.grpc_floor`'s edge mode), what a sidecar on it costs before its engine and
  policy run. ``proxy_floor_peak_by_processes``: the Python proxy's
  peak throughput in 1 and in 2 processes sharing its port (whether more front-end processes pay here), and the
  native proxy's in one (``native``); ``native_proxy_floor``: the latency the native proxy adds at ``--rate``, the
  least a sidecar in C++ could add.
- ``fake_worker`` (with ``--fake-worker``): each edge's sidecar alone, before a worker that costs next to nothing
  (the C++ floor's ``fake`` mode: an answer of the request's rows, no model run): its CPU per request at the CPU rate
  and at three times it (``cpu_ratio_3x``: does any one thread serialize the edge as the load grows), and its peak
  throughput. Triton takes half the machine in the other figures; here the sidecar has nearly all of it.

``--cprofile FILE`` runs the sidecar under cProfile and prints where its time went.
``--py-spy FILE`` samples the sidecar with py-spy (every thread, gRPC's included, which cProfile
cannot see) under the gRPC load of the CPU runs, saves the collapsed stacks and reports the share
of the sidecar's busy samples per part (:data:`PARTS`, by the innermost frame that names one).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import pstats
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.experiments.deployment import deploy
from scheduler_sidecar.experiments.perf_analyzer import ensure
from scheduler_sidecar.native import edge as edge_module
from scheduler_sidecar.native import program
from scheduler_sidecar.processes.die_with_parent import wrap
from scheduler_sidecar.processes.sidecar import SidecarServer

if TYPE_CHECKING:
    import onnx

MODEL = "trivial"
IMAGE_SIZE, NUM_CLASSES = 16, 10
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
FRONT_ENDS = ("grpc", "http", "streaming")
# (the result's key, the floor server's mode, whether the server is native/floor.cc): what --floor measures. The
# native floor's "edge" is Python's floor server in its edge mode: the native edge with Python passing each request
# on, the least a sidecar on the native edge costs
FLOORS = (("floor", "echo", False), ("floor", "proxy", False), ("native floor", "echo", True),
          ("native floor", "cq-echo", True), ("native floor", "proxy", True), ("native floor", "edge", False))
FLOOR_PROXY = "native proxy floor"  # at_rate's name for the C++ pass-through server (with --floor)
UNSTABLE_PCT = 1000  # perf_analyzer's stability threshold that accepts any spread between its windows
# what a sampled stack is part of: the first part whose marker names its innermost frame that has one (function or
# file). py-spy sees Python frames only (sampling native frames pauses the process at every sample and collapsed
# its throughput to 11 requests/s), so C code counts where Python called it: grpc.aio's C callbacks inside
# asyncio's Handle._run, gRPC's poller thread at threading's run (the only thread of the sidecar that runs C code
# from its start), upb inside protobuf's Python calls
PARTS = (
    ("metrics", ("prometheus_client",)),
    ("logging", ("logging/",)),
    ("protobuf", ("protobuf", "_pb2")),
    ("executor threads", ("concurrent/futures",)),
    ("grpc (poller thread, calls)", ("grpc", "threading.py")),
    ("aiohttp", ("aiohttp", "multidict", "yarl")),
    ("engine and policy", ("scheduler_sidecar/core/", "scheduler_sidecar/systems/")),
    ("driver", ("scheduler_sidecar/live/driver",)),
    ("Triton client call", ("scheduler_sidecar/live/workers",)),
    ("front end", ("scheduler_sidecar/server/",)),
    ("asyncio (with grpc.aio's C callbacks)", ("asyncio", "selectors")),
)


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("sidecar", help="latency and throughput through the sidecar vs direct to Triton",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=200.0, help="requests/s for the latency comparison (default 200)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[4, 16, 48],
                   help="concurrencies tried for peak throughput (default: 4 16 48)")
    p.add_argument("--window-ms", type=int, default=4000, help="perf_analyzer measurement window (default 4000)")
    p.add_argument("--slo-ms", type=float, default=1000.0, help="slo_us sent to the sidecar (default 1000 ms)")
    p.add_argument("--cpu-rate", type=float, default=1000.0,
                   help="requests/s for the CPU-per-request comparison (default 1000)")
    p.add_argument("--front-ends", nargs="+", choices=FRONT_ENDS, default=list(FRONT_ENDS),
                   help="front ends whose CPU per request is measured (default: all)")
    p.add_argument("--cprofile", type=Path, help="run the sidecar under cProfile, save the stats here, print a summary")
    p.add_argument("--edges", nargs="+", choices=("python", "native"), default=["python"],
                   help="the sidecar's gRPC edges to measure, each in a sidecar of its own beside the same Triton "
                        "(accscale serve --edge; default: python)")
    p.add_argument("--floor", action="store_true",
                   help="also measure a bare grpc.aio echo server and pass-through proxy (CPU per request)")
    p.add_argument("--fake-worker", action="store_true", dest="fake_worker",
                   help="also measure each edge's sidecar alone, before a worker that costs next to nothing (the C++ "
                        "floor's fake mode): CPU per request at --cpu-rate and 3x it, and peak throughput")
    p.add_argument("--py-spy", type=Path, dest="py_spy",
                   help="sample the sidecar with py-spy --native during the gRPC CPU run; save the stacks here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def trivial_model() -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper  # lazy: onnx (the sidecar's image has none)

    weights = np.random.default_rng(0).normal(size=(IMAGE_SIZE * IMAGE_SIZE, NUM_CLASSES)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["INPUT"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["LOGITS"])],
        MODEL, [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["N", 1, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        [numpy_helper.from_array(weights, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # not the installed onnx's (13 from 1.20 on): onnxruntime for Python 3.10 reads at most 11
    return model


def measure_profile(url: str, path: Path, repeats: int = 30, model: str = MODEL) -> None:
    """Profile a one-input 16x16 model directly (p50/p99 per batch size), as the sidecar's policy needs."""
    import tritonclient.grpc as grpcclient  # lazy: tritonclient


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


def perf_analyzer(binary: Path, url: str, window_ms: int, load: list[str], slo_us: int | None,
                  front_end: str = "grpc", stability_pct: int = 50) -> dict[str, float]:
    """One perf_analyzer measurement: throughput and latency percentiles (ms)."""
    protocol = ["-i", "http"] if front_end == "http" else ["-i", "grpc", *(["--streaming"] * (front_end == "streaming"))]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pa.csv"
        cmd = [str(binary), "-m", MODEL, "-u", url, *protocol, "-p", str(window_ms), "--max-trials", "4",
               "-s", str(stability_pct), "-f", str(out), *load]
        if slo_us is not None and front_end != "http":  # perf_analyzer sends parameters over gRPC only
            cmd += ["--request-parameter", f"slo_us:{slo_us}:int"]
        timeout_s = 60 + 10 * window_ms / 1000  # a target that never answers (a stream it refuses) hangs it
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"perf_analyzer gave no result in {timeout_s:.0f} s ({' '.join(cmd)})") from None
        if result.returncode != 0 or not out.exists():
            lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
            if stability_pct < UNSTABLE_PCT and "stable measurement" in (lines[-1] if lines else ""):
                # a busy 2-core machine: take the measurement, and say it was not stable
                return {**perf_analyzer(binary, url, window_ms, load, slo_us, front_end, UNSTABLE_PCT),
                        "unstable": True}
            raise RuntimeError(f"perf_analyzer failed ({' '.join(cmd)}): {lines[-1] if lines else 'no output'}")
        (row,) = list(csv.DictReader(out.open()))
    return {"throughput_qps": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads and its children (Triton's backend stubs); 0 for a
    process that is gone."""
    import psutil  # lazy: psutil

    total = 0.0
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        for p in (process, *process.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
    return total


def rows_served(grpc_url: str) -> int:
    """Rows Triton has run the trivial model on (its inference statistics; an echo floor's own count)."""
    import tritonclient.grpc as grpcclient  # lazy: tritonclient

    with grpcclient.InferenceServerClient(grpc_url) as client:
        return client.get_inference_statistics(MODEL).model_stats[0].inference_count


def constant_load(binary: Path, url: str, window_ms: int, rate: float, slo_us: int | None,
                  front_end: str = "grpc") -> dict[str, float]:
    # a CPU count needs the load, not a stable latency: any spread between windows is accepted
    return perf_analyzer(binary, url, window_ms, ["--request-rate-range", str(rate), "--request-distribution",
                                                  "constant"], slo_us, front_end, stability_pct=UNSTABLE_PCT)


def sample(binary: Path, url: str, window_ms: int, rate: float, slo_us: int, pid: int, stacks: Path) -> None:
    """The sidecar's busy stacks under a constant gRPC load, sampled by py-spy without pausing it."""
    sampler = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking",
                                "--format", "raw", "--rate", "250", "-o", str(stacks), "--pid", str(pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        constant_load(binary, url, window_ms, rate, slo_us)
    finally:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its stacks when interrupted
        sampler.wait(timeout=60)


@dataclass
class _Process:
    pid: int


@contextlib.contextmanager
def floor_server(triton_url: str, mode: str, processes: int = 1, native: bool = False):
    """A :mod:`.grpc_floor` server in front of Triton (``native``: its C++ counterpart, native/floor.cc), in
    ``processes`` processes on one port (gRPC binds with SO_REUSEPORT, so the kernel spreads connections over
    them); yields its gRPC URL and first process."""

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ([str(program("accscale-floor"))] if native else
              [sys.executable, "-m", "scheduler_sidecar.experiments.grpc_floor"])
    procs = [subprocess.Popen(wrap([*server, "--port", str(port), "--triton", triton_url, "--mode", mode]),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(processes)]
    url = f"127.0.0.1:{port}"
    try:
        for p in procs:  # each says so once it listens; one that failed to start ends its output instead
            if not p.stdout.readline().startswith("listening"):
                raise RuntimeError(f"the {mode} floor server did not start")
        yield url, _Process(procs[0].pid)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
            p.stdout.close()


def cpu_per_request(binary: Path, url: str, window_ms: int, rate: float, slo_us: int | None, front_end: str,
                    triton, sidecar, counted_at: str | None = None) -> dict:
    """CPU microseconds per request of the sidecar (when one is in the path) and of Triton, at ``rate``; the
    requests are the rows that ``counted_at``'s statistics count (Triton's by default)."""
    counted_at = counted_at or triton.grpc_url
    rows = rows_served(counted_at)
    pids = {"triton": triton.pid, **({"sidecar": sidecar.pid} if sidecar else {})}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    threads_before = thread_seconds(sidecar.pid) if sidecar else {}
    try:
        result = constant_load(binary, url, window_ms, rate, slo_us, front_end)
    except RuntimeError as exc:
        return {"error": str(exc).rsplit(": ", 1)[-1][:300]}
    served = rows_served(counted_at) - rows
    spent = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    used = {name: round(seconds / max(served, 1) * 1e6, 1) for name, seconds in spent.items()}
    threads = {}
    for key, (name, seconds) in (thread_seconds(sidecar.pid) if sidecar else {}).items():
        threads[name] = threads.get(name, 0.0) + seconds - threads_before.get(key, (name, 0.0))[1]
    if threads:  # threads that ended during the run took CPU no /proc entry shows any more
        threads["other"] = max(0.0, spent["sidecar"] - sum(threads.values()))
    return {**used, "total": round(sum(used.values()), 1), "requests": served,
            "throughput_qps": result["throughput_qps"],
            **({"sidecar_threads": {name: round(seconds / max(served, 1) * 1e6, 1)
                                    for name, seconds in sorted(threads.items(), key=lambda kv: -kv[1])
                                    if seconds > 0}} if threads else {})}


def thread_seconds(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """Each thread of a process, by (thread id, start time: an id the kernel hands out again is another thread):
    (its name, user + system CPU seconds). The main thread (the event loop's, in a sidecar) is named ``main``;
    gRPC's and the native edge's threads name themselves (``edge-outbox``, ...), and the rest keep the process's
    name. Empty for a process that is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                name = "main" if int(tid) == pid else Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                # after the name: utime and stime are fields 14 and 15 of stat(5), starttime 22
                out[int(tid), int(fields[19])] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def peak(binary: Path, url: str, window_ms: int, concurrency: list[int], slo_us: int | None, name: str,
         progress) -> dict:
    """The most requests/s ``url`` sustains, at its best concurrency of ``concurrency``."""
    runs = {}
    for c in concurrency:
        progress(f"{name}: throughput at concurrency {c}")
        runs[c] = perf_analyzer(binary, url, window_ms, ["--concurrency-range", str(c)], slo_us)
    best = max(runs, key=lambda c: runs[c]["throughput_qps"])
    return {"concurrency": best, **runs[best]}


def fake_worker(binary: Path, triton, profile: Path, edges: tuple[str, ...], window_ms: int, cpu_rate: float,
                concurrency: list[int], slo_us: int, progress) -> dict:
    """Each edge's sidecar alone: in front of a worker that costs next to nothing (native/floor.cc's fake mode, which
    passes only the first batch and the control calls to Triton), its CPU per request at ``cpu_rate`` and at three
    times it, and its peak. (The fake worker's own peak is not measured: perf_analyzer alone sends it 30,000 requests/s
    and more, and its trials there outran their timeout.)"""
    out: dict = {}
    with floor_server(triton.grpc_url, "fake", native=True) as (url, worker):
        for edge in edges:
            with SidecarServer(workers=[url], profile=profile,
                               extra_args=["--model-name", MODEL, "--edge", edge]) as sidecar:
                cpu = {}
                for rate in (cpu_rate, 3 * cpu_rate):
                    progress(f"{edge} edge before the fake worker: CPU per request over grpc at {rate:g} requests/s")
                    cpu[f"{rate:g}"] = cpu_per_request(binary, sidecar.grpc_url, window_ms, rate, slo_us, "grpc",
                                                       worker, sidecar, counted_at=url)
                low, high = (cpu[f"{r:g}"].get("sidecar") for r in (cpu_rate, 3 * cpu_rate))
                out[edge] = {"cpu_us_per_request": cpu,
                             "cpu_ratio_3x": round(high / low, 3) if low and high else None,
                             "peak": peak(binary, sidecar.grpc_url, window_ms, concurrency, slo_us,
                                          f"{edge} edge before the fake worker", progress)}
    return out


def bench(rate: float, concurrency: list[int], window_ms: int, slo_ms: float, cprofile: Path | None,
          cpu_rate: float = 1000.0, front_ends: tuple[str, ...] = FRONT_ENDS, py_spy: Path | None = None,
          floor: bool = False, progress=lambda msg: None, edges: tuple[str, ...] = ("python",),
          fake: bool = False) -> dict:
    from export.repository import write_static  # lazy: torch

    def profiled(tritons) -> None:
        progress("profiling the trivial model")
        measure_profile(tritons[0].grpc_url, profile)

    binary = ensure()
    if "native" in edges or floor or fake:  # built here, before a sidecar on it would wait out its start-up for it
        edge_module(), program("accscale-floor")
    with tempfile.TemporaryDirectory() as tmp:
        repository, profile = Path(tmp) / "repository", Path(tmp) / "profile.json"
        write_static(repository, MODEL, trivial_model(), NUM_CLASSES, MODEL)
        python_args = ["-m", "cProfile", "-o", str(cprofile)] if cprofile else []
        with contextlib.ExitStack() as stack:
            d = stack.enter_context(deploy(repository, [MODEL], profile=profile, before_sidecar=profiled,
                                           python_args=python_args, sidecar_args=["--model-name", MODEL, "--edge",
                                                                                  edges[0]]))
            (triton,), sidecar = d.tritons, d.sidecar
            # the first edge's sidecar is the deployment's; each other edge gets one of its own beside it, on the same
            # Triton, and every figure below is measured for each in turn
            sidecars = {edges[0]: sidecar, **{edge: stack.enter_context(SidecarServer(
                workers=[triton.grpc_url], profile=profile, extra_args=["--model-name", MODEL, "--edge", edge]))
                for edge in edges[1:]}}
            names = {edge: _target(edge, edges) for edge in edges}
            targets = {"direct": (triton.grpc_url, None),
                       **{names[e]: (s.grpc_url, round(slo_ms * 1e3)) for e, s in sidecars.items()}}
            http = {"direct": triton.http_url, **{names[e]: s.http_url for e, s in sidecars.items()}}
            processes = {names[e]: s for e, s in sidecars.items()}
            cpu: dict[str, dict] = {}
            proxy_peak: dict[str, dict] = {}  # front-end processes -> the proxy floor's peak (with --floor)
            for front_end in front_ends:
                for name, (url, slo) in targets.items():
                    progress(f"{name}: CPU per request over {front_end} at {cpu_rate:g} requests/s")
                    cpu.setdefault(front_end, {})[name] = cpu_per_request(
                        binary, http[name] if front_end == "http" else url, window_ms, cpu_rate, slo,
                        front_end, triton, processes.get(name))
            if floor:
                for key, mode, native in FLOORS:
                    progress(f"{mode} {key}: CPU per request over grpc at {cpu_rate:g} requests/s")
                    with floor_server(triton.grpc_url, mode, native=native) as (url, process):
                        cpu.setdefault(key, {})[mode] = cpu_per_request(
                            binary, url, window_ms, cpu_rate, None, "grpc", triton, process, counted_at=url)
                # do more front-end processes pay on this machine? and how far does one native process go?
                for label, processes, native in (("1", 1, False), ("2", 2, False), ("native", 1, True)):
                    with floor_server(triton.grpc_url, "proxy", processes, native) as (url, _):
                        proxy_peak[label] = peak(binary, url, window_ms, concurrency, None, f"proxy floor ({label})",
                                                 progress)
            alone = fake_worker(binary, triton, profile, edges, window_ms, cpu_rate, concurrency, round(slo_ms * 1e3),
                                progress) if fake else None
            if py_spy is not None:
                progress(f"sidecar: sampling its stacks over gRPC at {cpu_rate:g} requests/s")
                sample(binary, sidecar.grpc_url, window_ms, cpu_rate, targets["sidecar"][1], sidecar.pid, py_spy)
            at_rate, peaks = {}, {}
            for name, (url, slo) in targets.items():
                progress(f"{name}: latency at {rate:g} requests/s")
                at_rate[name] = perf_analyzer(binary, url, window_ms, [
                    "--request-rate-range", str(rate), "--request-distribution", "constant"], slo)
                peaks[name] = peak(binary, url, window_ms, concurrency, slo, name, progress)
            if floor:  # what a C++ server that passes each request on adds at the same rate: the added latency's bound
                progress(f"native proxy floor: latency at {rate:g} requests/s")
                with floor_server(triton.grpc_url, "proxy", native=True) as (url, _):
                    at_rate[FLOOR_PROXY] = perf_analyzer(binary, url, window_ms, [
                        "--request-rate-range", str(rate), "--request-distribution", "constant"], None)
    def added(name: str) -> dict:
        return {"added_p50_ms": round(at_rate[name]["p50_ms"] - at_rate["direct"]["p50_ms"], 3),
                "added_p99_ms": round(at_rate[name]["p99_ms"] - at_rate["direct"]["p99_ms"], 3)}

    def versus_direct(name: str) -> dict:
        return {**added(name),
                "throughput_ratio": round(peaks[name]["throughput_qps"] / peaks["direct"]["throughput_qps"], 3)}

    return {
        **versus_direct(names[edges[0]]),  # the first edge's, at the top level as before
        "edges": {edge: versus_direct(names[edge]) for edge in edges},
        "rate_qps": rate, "at_rate": at_rate, "peak": peaks,
        "cpu_rate_qps": cpu_rate, "cpu_us_per_request": cpu,
        **({"proxy_floor_peak_by_processes": proxy_peak} if proxy_peak else {}),
        **({"native_proxy_floor": added(FLOOR_PROXY)} if FLOOR_PROXY in at_rate else {}),
        **({"fake_worker": alone} if alone is not None else {}),
        **({"py_spy_parts": parts(py_spy)} if py_spy is not None and py_spy.exists() else {}),
    }


def _target(edge: str, edges: tuple[str, ...]) -> str:
    """A sidecar's name in the results: "sidecar" for the first edge measured, "sidecar (native)" and the like for
    the others (so a run of the Python edge alone reads as before)."""
    return "sidecar" if edge == edges[0] else f"sidecar ({edge})"


def parts(stacks: Path) -> dict[str, float]:
    """Share of the sampled busy stacks per part (:data:`PARTS`); "interpreter" where no frame names one."""
    counts: dict[str, int] = {}
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")[::-1]
        part = next((name for frame in frames for name, markers in PARTS if any(m in frame for m in markers)),
                    "interpreter")
        counts[part] = counts.get(part, 0) + int(count)
    total = sum(counts.values()) or 1
    return {name: round(n / total, 3) for name, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def _cpu_line(r: dict) -> str:
    if "error" in r:
        return f"failed ({r['error']})"
    return ", ".join(f"{k} {r[k]:.0f}" for k in ("sidecar", "triton", "total") if k in r)


def run(args: argparse.Namespace) -> int:
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    result = bench(args.rate, args.concurrency, args.window_ms, args.slo_ms, args.cprofile, args.cpu_rate,
                   tuple(args.front_ends), args.py_spy, args.floor, progress, tuple(args.edges), args.fake_worker)
    if args.json:
        print(json.dumps(result))
    else:
        for name in result["peak"]:  # the targets (the native proxy floor's latency is printed below)
            r, p = result["at_rate"][name], result["peak"][name]
            print(f"{name:<8} at {args.rate:g}/s: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms; "
                  f"peak {p['throughput_qps']:.0f}/s at concurrency {p['concurrency']}")
        for edge, r in result["edges"].items():
            print(f"{edge} edge: added p50 {r['added_p50_ms']:.2f} ms, added p99 {r['added_p99_ms']:.2f} ms, "
                  f"throughput ratio {r['throughput_ratio']:.2f}")
        print(f"CPU us per request at {args.cpu_rate:g}/s:")
        for front_end, sides in result["cpu_us_per_request"].items():
            print(f"  {front_end:<10} " + "; ".join(f"{name} {_cpu_line(r)}" for name, r in sides.items()))
        if "native_proxy_floor" in result:
            r = result["native_proxy_floor"]
            print(f"the native proxy floor: added p50 {r['added_p50_ms']:.2f} ms, added p99 {r['added_p99_ms']:.2f} ms")
        for label, peak in result.get("proxy_floor_peak_by_processes", {}).items():
            where = "the native proxy floor" if label == "native" else f"proxy floor in {label} process(es)"
            print(f"{where}: peak {peak['throughput_qps']:.0f}/s at concurrency {peak['concurrency']}")
    alone = result.get("fake_worker")
    if alone and not args.json:
        for edge in args.edges:
            r = alone[edge]
            print(f"{edge} edge before a fake worker: CPU us per request "
                  + ", ".join(f"at {rate}/s {_cpu_line(c)}" for rate, c in r["cpu_us_per_request"].items())
                  + f" (3x over 1x: {r['cpu_ratio_3x']}); peak {r['peak']['throughput_qps']:.0f}/s")
    if "py_spy_parts" in result and not args.json:
        print("where the sidecar's busy samples were (py-spy, gRPC at the CPU rate): "
              + ", ".join(f"{name} {share:.1%}" for name, share in result["py_spy_parts"].items()))
    if args.cprofile:
        print(f"\nwhere the sidecar's time went (cProfile, {args.cprofile}):", file=sys.stderr)
        pstats.Stats(str(args.cprofile), stream=sys.stderr).sort_stats("tottime").print_stats(15)
    return 0
