"""``accscale bench overload``, ``bench goodput`` and ``bench soak``: the sidecar under more load than it can serve,
goodput against offered load, and a long run.

Each starts ``--workers`` Triton servers and the sidecar in front of them, by default on the bench's own
model: a small convolutional net on 16x16 inputs whose cost grows with every row (about 3 ms a row on
one core), profiled directly in this run. Its capacity is modest (a few hundred requests a second), so
that this process's own gRPC client can offer three times it on a 2-core machine that also runs Triton
and the sidecar. ``--profile``/``--repository`` (and ``--model-name``) run a real build instead. Every
request is one row of zeros of the model's input (its metadata says the shape) with ``slo_us`` set
to ``--slo-ms``; the client waits ``--slo-ms`` + 30 s before it gives up.

Capacity: a closed loop of N clients, each sending again as soon as it has an answer, for
``--capacity-s`` at each N of ``--concurrency`` (after a short warm-up run); the capacity is the best
rate of requests *met* (answered within the SLO at the client). ``--capacity-qps`` sets it instead (to
offer two builds the same load; capacity measured in one run varies by tens of percent between runs),
and the measured one is still reported.

Load after that is open loop: requests are sent at evenly spaced times whatever the earlier ones did
(a sender that falls behind sends what is due at once). The client can be the limit: beside each
phase's target rate are the rate really sent and the p99 lag of the sends behind their schedule, and
the CPU each process used (cores: this client, the sidecar, Triton with its backend stubs, and the
rest of the machine, i.e. other people's work).

overload:
  1. ``--factor`` (3) x capacity for ``--overload-s`` (30 s);
  2. recovery, straight after, at ``--recovery-load`` (0.5) x capacity until a 1 s window of sends has
     >= 99% of its requests met, then ``--confirm-s`` (5 s) more; ``--recovery-s`` (60 s) at most.
  Per phase: ``sent`` (and ``sent_qps`` beside ``target_qps``, ``send_lag_p99_ms``), ``met`` and
  ``late`` (answered within / after the SLO), ``goodput_qps`` (met per second of the phase),
  ``refused`` by gRPC status code (an explicit answer of the sidecar: UNAVAILABLE for a full queue,
  DEADLINE_EXCEEDED for what its policy drops, ...), ``lost`` (no answer at all, by cause: ``timeout``,
  nothing before the client gave up; ``transport``, the connection failed, e.g. reset or refused:
  statuses that the gRPC library made up, not the sidecar; ``client``, an exception in this client)
  and one example message per code or cause (``details``). ``sent == met + late + sum(refused) + lost``.
  Over the run: ``peak_rss_mb`` of the sidecar (psutil, every 0.2 s) beside ``rss_start_mb``, and
  the request-size limit it runs with (``max_request_bytes``, its default: the bench sets none; null
  where the sidecar has no such limit); ``peak_queue_depth`` (its /metrics gauge
  ``accscale_queue_depth``, every 0.2 s); ``false_worker_down``: times a worker whose Triton still
  runs was marked down (its counter ``accscale_worker_failures``), and ``worker_down_samples``,
  /metrics samples with such a worker's ``accscale_worker_healthy`` at 0; ``triton_exits``: each
  Triton that ended during the run, with the line of its log that says why (on a starved 2-core
  machine the python backend's one-second stub health check can fail and abort Triton: a worker
  really down, which the sidecar is right to mark and is not counted as false);
  ``recovery_s``: seconds from the end of the overload to the start of the first 1 s window of
  sends with >= 99% met (null: not within ``--recovery-s``), and ``after_recovery_met``, the
  share met in the recovery phase after that window; ``sidecar_outcomes``: how the sidecar itself
  counted the overload's and recovery's requests (its ``accscale_requests_total`` by outcome).
  Targets: 0 lost, 0 false worker-down.

goodput:
  each of ``--factors`` (0.5 1 1.5 2 3 4) x capacity for ``--phase-s`` (10 s), drained before the next;
  per factor ``sent_qps``, ``goodput_qps`` (met per second), ``goodput_over_capacity``, ``late`` and
  ``refused`` by code (RESOURCE_EXHAUSTED: shed at admission). ``--plot FILE`` draws the curve.

soak:
  ``--load`` (0.7) x capacity for ``--duration-s`` (1800 s). Reported: the sidecar's RSS, sampled
  every second (``rss_mb_per_window``: the last sample of each window); ``rss_growth_pct``, from the
  end of the warm-up (``--warm-up-s``; default 10% of the run, at least 60 s, at most half of it) to
  the end of the run, each the median of 10 s of samples; ``rss_slope_mb_per_h``, a least-squares
  line through the samples after the warm-up; ``attainment_per_window`` (share met of the requests
  sent in each ``--window-s``) and the run's counts as in overload. Target: RSS growth under 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np

from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.deployment import Device, deploy
from scheduler_sidecar.experiments.sidecar_bench import cpu_seconds, measure_profile
from scheduler_sidecar.processes.triton_launcher import TritonServer
from scheduler_sidecar.server.grpc_frontend import ERROR_METADATA

MODEL = "convnet"
IMAGE_SIZE, CHANNELS, LAYERS, NUM_CLASSES = 16, 96, 8, 10
LOST_GRACE_S = 30.0  # the client waits this long past the SLO before it calls a request lost
MET_TARGET = 0.99  # a window of sends counts as recovered at this share met
GOODPUT_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)  # bench goodput: offered loads over capacity
PROFILE_REPEATS = 10


def register_bench(kinds: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile", type=Path, help="profile of a real build (default: the bench's own model, "
                        "profiled in this run)")
    common.add_argument("--repository", type=Path, help="Triton repository of that build")
    common.add_argument("--model-name", default="digits", help="logical model name with --profile (default digits)")
    common.add_argument("--workers", type=int, default=1, help="Triton servers, one worker each (default 1)")
    common.add_argument("--slo-ms", type=float, default=100.0, help="SLO of every request (default 100)")
    common.add_argument("--concurrency", type=int, nargs="+", default=[8, 16, 32, 64],
                        help="closed-loop clients tried for the capacity (default 8 16 32 64)")
    common.add_argument("--capacity-s", type=float, default=3.0, help="capacity run at each concurrency (default 3)")
    common.add_argument("--capacity-qps", type=float, help="use this capacity (requests met/s) instead of the "
                        "measured one, e.g. to offer two builds the same load")
    common.add_argument("--edge", choices=("auto", "python", "native"), default="auto",
                        help="the sidecar's gRPC edge (accscale serve --edge; default auto)")
    common.add_argument("--json", action="store_true", help="print one JSON object")
    o = kinds.add_parser("overload", parents=[common], help="3x capacity for 30 s, then recovery: nothing lost, "
                         "no worker falsely down, memory bounded", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("--factor", type=float, default=3.0, help="offered load over capacity (default 3)")
    o.add_argument("--overload-s", type=float, default=30.0, help="length of the overload (default 30)")
    o.add_argument("--recovery-load", type=float, default=0.5, help="recovery load over capacity (default 0.5)")
    o.add_argument("--recovery-s", type=float, default=60.0, help="longest recovery phase (default 60)")
    o.add_argument("--confirm-s", type=float, default=5.0, help="recovery load kept after the first recovered "
                   "window (default 5)")
    o.set_defaults(func=run_overload)
    g = kinds.add_parser("goodput", parents=[common], help="goodput against offered load, 0.5x to 4x capacity",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--factors", type=float, nargs="+", default=list(GOODPUT_FACTORS),
                   help="offered loads over capacity (default: 0.5 1 1.5 2 3 4)")
    g.add_argument("--phase-s", type=float, default=10.0, help="length of each load (default 10)")
    g.add_argument("--plot", type=Path, help="write the curve as a PNG here")
    g.set_defaults(func=run_goodput)
    s = kinds.add_parser("soak", parents=[common], help="a long run below capacity: RSS growth and attainment",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--load", type=float, default=0.7, help="offered load over capacity (default 0.7)")
    s.add_argument("--duration-s", type=float, default=1800.0, help="length of the run (default 1800)")
    s.add_argument("--warm-up-s", type=float, help="RSS growth is counted from here (default: 10%% of the run, "
                   "at least 60 s, at most half)")
    s.add_argument("--window-s", type=float, default=60.0, help="attainment window (default 60)")
    s.set_defaults(func=run_soak)


def convnet_model():
    """8 3x3 convolutions of 96 channels on a 16x16 image, then a linear layer: 170 M multiply-adds a
    row, all of them per row (batching saves little), with 0.6 MB of weights."""
    from onnx import TensorProto, helper, numpy_helper  # lazy: onnx

    rng = np.random.default_rng(0)
    nodes, weights, x, channels = [], [], "INPUT", 1
    for i in range(LAYERS):
        w = (rng.normal(size=(CHANNELS, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"W{i}"))
        nodes += [helper.make_node("Conv", [x, f"W{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x, channels = f"r{i}", CHANNELS
    head = (rng.normal(size=(CHANNELS, NUM_CLASSES)) / np.sqrt(CHANNELS)).astype(np.float32)
    weights.append(numpy_helper.from_array(head, "WH"))
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]), helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("MatMul", ["flat", "WH"], ["LOGITS"])]
    graph = helper.make_graph(
        nodes, MODEL, [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["N", 1, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["N", NUM_CLASSES])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # not the installed onnx's (13 from 1.20 on): onnxruntime for Python 3.10 reads at most 11
    return model


# ----------------------------------------------------------------------------- load
class Phase:
    """What one open-loop phase sent and got back: per request its send time (s from the phase start),
    its lag behind the schedule and its outcome (met, late, lost:<cause> or a gRPC status name)."""

    def __init__(self, name: str, target_qps: float, slo_s: float) -> None:
        self.name, self.target_qps, self.slo_s = name, target_qps, slo_s
        self.times: list[float] = []
        self.lags: list[float] = []
        self.outcomes: list[str | None] = []
        self.details: dict[str, str] = {}  # one message per refusal code / lost cause
        self.sent_per_s: Counter[int] = Counter()
        self.met_per_s: Counter[int] = Counter()
        self.send_s = 0.0  # from the first send to the end of sending
        self.recovered_window: int | None = None  # first whole second of sends with >= MET_TARGET met

    def record(self, i: int, outcome: str, detail: str) -> None:
        self.outcomes[i] = outcome
        if outcome == "met":
            self.met_per_s[int(self.times[i])] += 1
        elif outcome != "late" and detail:
            self.details.setdefault(outcome, detail[:200])

    def check_recovered(self, now_s: float) -> int | None:
        """The first whole second of sends, all sent by ``now_s``, with >= MET_TARGET of them met yet."""
        if self.recovered_window is None:
            for w in range(int(now_s)):
                if self.sent_per_s[w] and self.met_per_s[w] >= MET_TARGET * self.sent_per_s[w]:
                    self.recovered_window = w
                    break
        return self.recovered_window

    def windows(self, width_s: float) -> list[tuple[float, float]]:
        """(window start, share met) per whole window of sends."""
        t, met = np.asarray(self.times), np.asarray([o == "met" for o in self.outcomes])
        out = []
        for start in np.arange(0.0, self.send_s - width_s + 1e-9, width_s):
            inside = (t >= start) & (t < start + width_s)
            out.append((round(float(start), 3), float(met[inside].mean()) if inside.any() else 0.0))
        return out

    def summary(self) -> dict:
        counts = Counter(self.outcomes)
        refused = {k: v for k, v in sorted(counts.items()) if k not in ("met", "late") and not k.startswith("lost:")}
        lost = {k.removeprefix("lost:"): v for k, v in sorted(counts.items()) if k.startswith("lost:")}
        elapsed = max(self.send_s, 1e-9)
        return {"target_qps": round(self.target_qps, 1), "duration_s": round(self.send_s, 2),
                "sent": len(self.outcomes), "sent_qps": round(len(self.outcomes) / elapsed, 1),
                "send_lag_p99_ms": round(float(np.percentile(self.lags, 99)) * 1e3, 1) if self.lags else 0.0,
                "met": counts["met"], "late": counts["late"], "goodput_qps": round(counts["met"] / elapsed, 1),
                "refused": refused, "lost": sum(lost.values()), "lost_by_cause": lost, "details": self.details}


class Client:
    """Sends one well-formed single-row request over one gRPC channel (raw stubs: little CPU per call)."""

    def __init__(self, url: str, model: str, slo_us: int) -> None:
        import grpc  # lazy: grpc
        from tritonclient.grpc import service_pb2_grpc  # lazy: tritonclient

        self.model, self.slo_us = model, slo_us
        self.timeout_s = slo_us / 1e6 + LOST_GRACE_S
        self._grpc = grpc
        self._channel = grpc.aio.insecure_channel(url)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._request = None
        self._pending: set[asyncio.Task] = set()

    async def prepare(self) -> None:
        """The request: zeros of the model's inputs as its metadata describes them, one row."""
        from tritonclient.grpc import service_pb2 as pb  # lazy: tritonclient
        from tritonclient.utils import triton_to_np_dtype  # lazy: tritonclient

        meta = await self._stub.ModelMetadata(pb.ModelMetadataRequest(name=self.model), timeout=30)
        request = pb.ModelInferRequest(model_name=self.model)
        for tensor in meta.inputs:
            shape = [1, *(max(1, d) for d in tensor.shape[1:])]
            request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=shape)
            request.raw_input_contents.append(np.zeros(shape, triton_to_np_dtype(tensor.datatype)).tobytes())
        request.parameters["slo_us"].int64_param = self.slo_us
        self._request = request

    async def one(self) -> tuple[str, str]:
        """(outcome, detail) of one request: met, late, lost:timeout, lost:transport or a status name."""
        start = time.perf_counter()
        try:
            await self._stub.ModelInfer(self._request, timeout=self.timeout_s)
        except self._grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            if time.perf_counter() - start >= self.timeout_s - 0.05:
                return "lost:timeout", details
            # the sidecar marks every error it answers; one without its mark is the connection's
            if not any(key == ERROR_METADATA for key, _ in exc.trailing_metadata() or ()):
                return "lost:transport", f"{exc.code().name}: {details}"
            return exc.code().name, details
        return ("met" if time.perf_counter() - start <= self.slo_us / 1e6 else "late"), ""

    async def closed(self, concurrency: int, duration_s: float) -> float:
        """Requests met per second with ``concurrency`` clients each sending again on every answer."""
        end = time.perf_counter() + duration_s
        met = 0

        async def loop() -> None:
            nonlocal met
            while time.perf_counter() < end:
                outcome, _ = await self.one()  # not `met += ...`: that reads `met` before the await
                met += outcome == "met"

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return met / (time.perf_counter() - start)

    async def open(self, phase: Phase, duration_s: float, stop=None) -> None:
        """Send at ``phase.target_qps`` for ``duration_s`` or until ``stop(seconds since start)``; answers
        are recorded in ``phase`` as they come (``drain()`` waits for the last ones)."""
        rate = phase.target_qps
        start = time.perf_counter()
        i = 0
        while i / rate < duration_s:
            due = start + i / rate
            now = time.perf_counter()
            if stop is not None and stop(now - start):
                break
            if due > now:
                await asyncio.sleep(due - now)
                now = time.perf_counter()
            t = now - start
            phase.times.append(t)
            phase.lags.append(now - due)
            phase.outcomes.append(None)
            phase.sent_per_s[int(t)] += 1
            task = asyncio.ensure_future(self.one())
            self._pending.add(task)
            task.add_done_callback(lambda task, i=i: self._done(phase, i, task))
            i += 1
        phase.send_s = max(time.perf_counter() - start, i / rate)  # the schedule's length when on time

    def _done(self, phase: Phase, i: int, task: asyncio.Task) -> None:
        self._pending.discard(task)
        if task.cancelled():
            phase.record(i, "lost:client", "cancelled")
        elif task.exception() is not None:
            phase.record(i, "lost:client", repr(task.exception()))
        else:
            phase.record(i, *task.result())

    async def drain(self) -> None:
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
            await asyncio.sleep(0)  # let the done callbacks run

    async def close(self) -> None:
        await self._channel.close()


# ----------------------------------------------------------------------------- the processes, watched
class Watch:
    """Samples the sidecar's RSS and its /metrics on threads, and the CPU of every process, while a run goes on."""

    def __init__(self, sidecar_pid: int, triton_pids: list[int], http_url: str, interval_s: float = 0.2) -> None:
        import psutil  # lazy: psutil

        self._psutil = psutil
        self._sidecar = psutil.Process(sidecar_pid)
        self._triton_pids = triton_pids
        self._url = f"http://{http_url}/metrics"
        self._interval_s = interval_s
        self.rss: list[tuple[float, float]] = []  # (time s, MiB)
        self.queue_depth: list[float] = []
        self.down: list[frozenset[str]] = []  # per /metrics sample, the endpoints it had down
        self.scrape_failures = 0
        self.start = time.perf_counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample_rss, daemon=True),
                         threading.Thread(target=self._sample_metrics, daemon=True)]

    def metrics(self) -> dict[str, dict[tuple, float]]:
        """Every sample of the sidecar's /metrics: name -> {labels: value}."""
        from prometheus_client.parser import text_string_to_metric_families  # lazy: prometheus_client

        with urllib.request.urlopen(self._url, timeout=5) as response:
            text = response.read().decode()
        out: dict[str, dict[tuple, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return out

    def _sample_rss(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(self._psutil.Error):
                self.rss.append((time.perf_counter() - self.start, self._sidecar.memory_info().rss / 2**20))

    def _sample_metrics(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                m = self.metrics()
            except Exception:  # a scrape that fails or times out under load is counted, not fatal
                self.scrape_failures += 1
                continue
            self.queue_depth.append(sum(m.get("accscale_queue_depth", {}).values()))
            self.down.append(frozenset(dict(labels)["endpoint"] for labels, healthy in
                                       m.get("accscale_worker_healthy", {}).items() if healthy == 0))

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of this process (the client), the sidecar, Triton with its children, and the
        machine (busy time of every core), with the wall clock."""
        client = self._psutil.Process().cpu_times()  # this process alone: its children are the servers
        machine = self._psutil.cpu_times()
        return {"wall": time.perf_counter(), "client": client.user + client.system,
                "sidecar": cpu_seconds(self._sidecar.pid), "triton": sum(cpu_seconds(pid) for pid in self._triton_pids),
                "machine": sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)}

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def cores(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Cores each process used between two ``Watch.cpu()`` readings; ``other``: the rest of the machine."""
    wall = max(after["wall"] - before["wall"], 1e-9)
    used = {k: (after[k] - before[k]) / wall for k in ("client", "sidecar", "triton", "machine")}
    used["other"] = max(0.0, used["machine"] - used["client"] - used["sidecar"] - used["triton"])
    return {k: round(v, 2) for k, v in used.items()}


def outcomes(before: dict, after: dict) -> dict[str, int]:
    """How the requests between two /metrics scrapes ended as the sidecar counted them (met, late,
    dropped, rejected, ...: ``accscale_requests_total``), to set beside what the client saw."""
    def by_outcome(m: dict) -> Counter:
        counts: Counter[str] = Counter()
        for labels, value in m.get("accscale_requests_total", {}).items():
            counts[dict(labels)["outcome"]] += value
        return counts

    return {k: int(v) for k, v in sorted((by_outcome(after) - by_outcome(before)).items())}


def exit_cause(triton: TritonServer) -> str:
    """Why a Triton that ended on its own did: its exit status and the line of its log's tail that says most (an
    abort's exception before its signal, before any other error), if any."""
    status = triton.returncode
    lines = triton.log_tail(40).splitlines()
    said = next((line.strip() for key in ("terminate called", "what():", "Signal (", "error", "Error")
                 for line in lines if key in line), "")
    how = f"signal {-status}" if status < 0 else f"exit status {status}"
    return f"{how}: {said}" if said else how


def request_limit() -> int | None:
    """The request-size limit the bench's sidecar runs with (its default), if this build has one."""
    try:
        from scheduler_sidecar.server.protocol import Limits  # lazy: grpc
    except ImportError:
        return None
    return getattr(Limits, "max_request_bytes", None)


@contextlib.contextmanager
def deployment(args: argparse.Namespace, progress):
    """Triton(s) and the sidecar on the bench's model (profiled now) or on ``--profile``/``--repository``;
    yields the sidecar, the logical model name and the Triton servers."""
    from export.repository import write_static  # lazy: torch

    if (args.profile is None) != (args.repository is None):
        raise ConfigError("--profile and --repository go together")
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile is None:
            repository, profile, name, models = Path(tmp) / "repository", Path(tmp) / "profile.json", MODEL, [MODEL]
            write_static(repository, MODEL, convnet_model(), NUM_CLASSES, MODEL)
        else:
            repository, profile, name = args.repository, args.profile, args.model_name
            models = sorted({v.actuation.model for v in Profile.load(profile).variants})

        def profiled(tritons) -> None:
            if args.profile is None:
                progress("profiling the bench's model")
                measure_profile(tritons[0].grpc_url, profile, repeats=PROFILE_REPEATS, model=MODEL)

        with deploy(repository, models, [Device()] * args.workers, profile=profile, before_sidecar=profiled,
                    sidecar_args=["--model-name", name, "--edge", getattr(args, "edge", "auto")]) as d:
            yield d.sidecar, name, d.tritons


async def _capacity(client: Client, args: argparse.Namespace, progress) -> dict:
    await client.prepare()
    progress(f"capacity: closed loops of {', '.join(map(str, args.concurrency))} clients, {args.capacity_s:g} s each")
    await client.closed(max(args.concurrency), min(2.0, args.capacity_s))  # warm the path and the calibration
    measured = {c: await client.closed(c, args.capacity_s) for c in args.concurrency}
    best = max(measured.values())
    if args.capacity_qps is None and best <= 0:
        raise RuntimeError("no request was met in the capacity runs; raise --slo-ms")
    return {"capacity_qps": round(args.capacity_qps or best, 1), "measured_capacity_qps": round(best, 1),
            "met_qps_by_concurrency": {str(c): round(v, 1) for c, v in measured.items()}}


def overload(args: argparse.Namespace, progress=lambda msg: None) -> dict:
    slo_s = args.slo_ms / 1e3
    with deployment(args, progress) as (sidecar, name, tritons), \
            Watch(sidecar.pid, [t.pid for t in tritons], sidecar.http_url) as watch:
        async def main() -> tuple[dict, Phase, Phase, dict]:
            client = Client(sidecar.grpc_url, name, round(slo_s * 1e6))
            try:
                capacity = await _capacity(client, args, progress)
                rate = capacity["capacity_qps"]
                hot = Phase("overload", args.factor * rate, slo_s)
                cool = Phase("recovery", args.recovery_load * rate, slo_s)
                progress(f"overload: {args.factor:g} x {rate:.0f}/s for {args.overload_s:g} s")
                scraped.append(await asyncio.to_thread(watch.metrics))
                cpu = [watch.cpu()]
                await client.open(hot, args.overload_s)
                cpu.append(watch.cpu())
                progress(f"recovery: {cool.target_qps:.0f}/s until a second of sends is {MET_TARGET:.0%} met, "
                         f"then {args.confirm_s:g} s more ({args.recovery_s:g} s at most)")

                def recovered(t: float) -> bool:
                    w = cool.check_recovered(t)
                    return w is not None and t >= w + 1 + args.confirm_s

                await client.open(cool, args.recovery_s, recovered)
                cpu.append(watch.cpu())
                await client.drain()
                scraped.append(await asyncio.to_thread(watch.metrics))
            finally:
                await client.close()
            return capacity, hot, cool, {"overload": cores(cpu[0], cpu[1]), "recovery": cores(cpu[1], cpu[2])}

        scraped: list[dict] = []  # /metrics before the overload and after the last answer
        capacity, hot, cool, used = asyncio.run(main())
        exits = {t.grpc_url: exit_cause(t) for t in tritons if t.returncode is not None}  # before they are stopped
    before, after = scraped
    windows = cool.windows(1.0)
    recovered = next((start for start, share in windows if share >= MET_TARGET), None)
    rest = [o for t, o in zip(cool.times, cool.outcomes) if recovered is not None and t >= recovered + 1]

    def marked_down(m: dict) -> Counter[str]:
        return Counter({dict(labels)["endpoint"]: v for labels, v in m.get("accscale_worker_failures_total",
                                                                           {}).items()})

    failures = marked_down(after) - marked_down(before)
    summaries = {"overload": hot.summary(), "recovery": cool.summary()}
    for phase, summary in summaries.items():
        summary["cpu_cores"] = used[phase]
    return {
        **capacity, "factor": args.factor, "slo_ms": args.slo_ms, "workers": args.workers, "model": name,
        **summaries,
        "recovery_s": recovered,
        "after_recovery_met": round(sum(o == "met" for o in rest) / len(rest), 4) if rest else None,
        "recovery_met_per_s": [round(share, 3) for _, share in windows],
        "sidecar_outcomes": outcomes(before, after),
        "lost": summaries["overload"]["lost"] + summaries["recovery"]["lost"],
        "false_worker_down": int(sum(n for url, n in failures.items() if url not in exits)),
        "worker_down_samples": sum(bool(down - exits.keys()) for down in watch.down),
        "triton_exits": exits,
        "peak_queue_depth": max(watch.queue_depth, default=None), "queue_samples": len(watch.queue_depth),
        "scrape_failures": watch.scrape_failures,
        "rss_start_mb": round(watch.rss[0][1], 1), "peak_rss_mb": round(max(r for _, r in watch.rss), 1),
        "max_request_bytes": request_limit(),
        "targets": {"lost": 0, "false_worker_down": 0},
    }


def goodput(args: argparse.Namespace, progress=lambda msg: None) -> dict:
    """Each factor of capacity offered open loop for ``--phase-s``, one after the other, each drained before the
    next: per factor, what was sent, met (goodput), late and refused by code, and the goodput over capacity."""
    slo_s = args.slo_ms / 1e3
    with deployment(args, progress) as (sidecar, name, _):
        async def main() -> tuple[dict, list[dict]]:
            client = Client(sidecar.grpc_url, name, round(slo_s * 1e6))
            try:
                capacity = await _capacity(client, args, progress)
                points = []
                for factor in args.factors:
                    phase = Phase(f"{factor:g}x", factor * capacity["capacity_qps"], slo_s)
                    progress(f"{factor:g} x {capacity['capacity_qps']:.0f}/s for {args.phase_s:g} s")
                    await client.open(phase, args.phase_s)
                    await client.drain()
                    summary = phase.summary()
                    points.append({"factor": factor, **{k: summary[k] for k in (
                        "target_qps", "sent_qps", "send_lag_p99_ms", "sent", "met", "late", "goodput_qps",
                        "refused", "lost")},
                        "goodput_over_capacity": round(summary["goodput_qps"] / capacity["capacity_qps"], 3)})
                return capacity, points
            finally:
                await client.close()

        capacity, points = asyncio.run(main())
    return {**capacity, "slo_ms": args.slo_ms, "workers": args.workers, "model": name, "phase_s": args.phase_s,
            "points": points}


def plot_goodput(result: dict, path: Path) -> None:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    factors = [p["factor"] for p in result["points"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(factors, [p["goodput_over_capacity"] for p in result["points"]], marker="o", label="goodput")
    ax.plot(factors, [min(f, 1.0) for f in factors], linestyle=":", color="0.5", label="ideal")
    ax.axhline(0.8, linestyle="--", color="C3", linewidth=0.8, label="goal at 3x: 0.8")
    ax.set_xlabel(f"offered load / capacity ({result['capacity_qps']:.0f} requests/s)")
    ax.set_ylabel("goodput / capacity (met within the SLO)")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def soak(args: argparse.Namespace, progress=lambda msg: None) -> dict:
    slo_s = args.slo_ms / 1e3
    warm_s = args.warm_up_s if args.warm_up_s is not None else min(max(60.0, args.duration_s / 10),
                                                                  args.duration_s / 2)
    with deployment(args, progress) as (sidecar, name, tritons), \
            Watch(sidecar.pid, [t.pid for t in tritons], sidecar.http_url, 1.0) as watch:
        async def main() -> tuple[dict, Phase, dict]:
            client = Client(sidecar.grpc_url, name, round(slo_s * 1e6))
            try:
                capacity = await _capacity(client, args, progress)
                run = Phase("soak", args.load * capacity["capacity_qps"], slo_s)
                progress(f"soak: {run.target_qps:.0f}/s for {args.duration_s:g} s")
                watch.start = time.perf_counter()
                watch.rss.clear()
                before = watch.cpu()
                await client.open(run, args.duration_s)
                used = cores(before, watch.cpu())
                await client.drain()
            finally:
                await client.close()
            return capacity, run, used

        capacity, run, used = asyncio.run(main())
    t = np.asarray([s for s, _ in watch.rss])
    rss = np.asarray([r for _, r in watch.rss])
    after = t >= warm_s
    start_rss = float(np.median(rss[after & (t < t[after][0] + 10)]))
    end_rss = float(np.median(rss[t >= t[-1] - 10]))
    slope = float(np.polyfit(t[after], rss[after], 1)[0]) * 3600 if after.sum() >= 2 else math.nan
    summary = run.summary()
    summary["cpu_cores"] = used
    width = args.window_s
    return {
        **capacity, "load": args.load, "slo_ms": args.slo_ms, "workers": args.workers, "model": name,
        "duration_s": args.duration_s, "warm_up_s": warm_s, "run": summary,
        "rss_after_warm_up_mb": round(start_rss, 1), "rss_end_mb": round(end_rss, 1),
        "rss_peak_mb": round(float(rss.max()), 1), "rss_growth_pct": round(100 * (end_rss - start_rss) / start_rss, 2),
        "rss_slope_mb_per_h": round(slope, 1),
        "attainment_per_window": [(start, round(share, 4)) for start, share in run.windows(width)],
        "rss_mb_per_window": [(round(float(end)), round(float(rss[t <= end][-1]), 1))
                              for end in np.arange(width, args.duration_s + 1e-9, width) if (t <= end).any()],
        "targets": {"rss_growth_pct": 5.0},
    }


# ----------------------------------------------------------------------------- output
def _printer(args: argparse.Namespace):
    return (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print


def _phase_line(name: str, r: dict) -> str:
    c = r["cpu_cores"]
    return (f"{name:<9} target {r['target_qps']:.0f}/s for {r['duration_s']:g} s, sent {r['sent']} "
            f"({r['sent_qps']:.0f}/s, p99 send lag {r['send_lag_p99_ms']:g} ms): met {r['met']} "
            f"({r['goodput_qps']:.0f}/s), late {r['late']}, refused {r['refused']}, lost {r['lost']} "
            f"{r['lost_by_cause'] or ''}\n{'':<10}cores: client {c['client']}, sidecar {c['sidecar']}, "
            f"triton {c['triton']}, rest of the machine {c['other']}")


def _capacity_line(result: dict, slo_ms: float) -> str:
    chosen = "" if result["capacity_qps"] == result["measured_capacity_qps"] else f" (set: {result['capacity_qps']:.0f}/s)"
    return (f"capacity {result['measured_capacity_qps']:.0f}/s met at SLO {slo_ms:g} ms{chosen}; met/s by "
            f"concurrency {result['met_qps_by_concurrency']}")


def run_overload(args: argparse.Namespace) -> int:
    result = overload(args, _printer(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(_capacity_line(result, args.slo_ms))
    for phase in ("overload", "recovery"):
        print(_phase_line(phase, result[phase]))
        for code, message in result[phase]["details"].items():
            print(f"{'':<10}{code}: {message}")
    recovered = (f"recovered {result['recovery_s']:g} s after the overload ({result['after_recovery_met']} met after)"
                 if result["recovery_s"] is not None else f"not recovered within {result['recovery']['duration_s']} s")
    print(f"{recovered}; met per second of recovery {result['recovery_met_per_s']}")
    print(f"as the sidecar counted overload and recovery: {result['sidecar_outcomes']}")
    print(f"peak queue {result['peak_queue_depth']} ({result['queue_samples']} samples, {result['scrape_failures']} "
          f"failed scrapes); sidecar RSS {result['rss_start_mb']} -> peak {result['peak_rss_mb']} MiB "
          f"(request limit {result['max_request_bytes']} B)")
    print(f"lost {result['lost']} (target 0), false worker-down {result['false_worker_down']} (target 0; "
          f"{result['worker_down_samples']} samples with a worker down)")
    for url, cause in result["triton_exits"].items():
        print(f"Triton {url} ended during the run: {cause}")
    return 0


def run_goodput(args: argparse.Namespace) -> int:
    result = goodput(args, _printer(args))
    if args.plot:
        plot_goodput(result, args.plot)
    if args.json:
        print(json.dumps(result))
        return 0
    print(_capacity_line(result, args.slo_ms))
    print(f"{'offered':>8} {'sent/s':>8} {'met/s':>8} {'goodput/capacity':>17}  late  refused")
    for p in result["points"]:
        print(f"{p['factor']:>7g}x {p['sent_qps']:>8.0f} {p['goodput_qps']:>8.0f} {p['goodput_over_capacity']:>17.3f}"
              f"  {p['late']:>4}  {p['refused']}")
    return 0


def run_soak(args: argparse.Namespace) -> int:
    result = soak(args, _printer(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(_capacity_line(result, args.slo_ms))
    print(_phase_line("soak", result["run"]))
    print(f"RSS {result['rss_after_warm_up_mb']} MiB after {result['warm_up_s']:g} s of warm-up -> "
          f"{result['rss_end_mb']} MiB at the end: {result['rss_growth_pct']:+.2f}% (target < 5%), "
          f"slope {result['rss_slope_mb_per_h']:+.1f} MiB/h, peak {result['rss_peak_mb']} MiB")
    print("RSS per window:", ", ".join(f"{t}s {r}" for t, r in result["rss_mb_per_window"]))
    print("attainment per window:", ", ".join(f"{t:g}s {share:.3f}" for t, share in result["attainment_per_window"]))
    return 0
