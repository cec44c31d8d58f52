"""``accscale loadtest``: replay a trace with Locust (headless) and keep everything in one run folder.

The run folder gets ``requests.csv`` (one line per trace entry, see ``loadtest.requestlog``),
``run.json`` (what was run, its summary, and when the replay started on this machine's monotonic
clock, to align it with a server's log), Locust's own ``locust_stats.csv`` and friends,
``locust.html`` and ``locust.log``. ``accscale report`` turns run folders into a report.
:func:`replay` replays several models' traces at once, one request log each.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadtest.requestlog import RequestLog
from scheduler_sidecar.errors import ConfigError

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"


@dataclass(frozen=True)
class Replay:
    """One model's part of a replay: its trace, and the samples it sends (an .npz of ``images`` and ``labels``,
    indexed by the trace's payload indices; None: held-out digits at the model's input size)."""

    model: str
    trace: Path
    payloads: Path | None = None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("loadtest", help="replay a trace open loop with Locust and log every request",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="trace file (`accscale trace gen` writes them)")
    p.add_argument("--target", default="127.0.0.1:8101", help="gRPC host:port (default: the sidecar's)")
    p.add_argument("--model", default="digits", help="model name (default: digits)")
    p.add_argument("--slo-ms", type=float, default=36.0, help="SLO of trace lines without one (default: 36)")
    p.add_argument("--out", type=Path, help="run folder (default: runs/loadtest-<time>)")
    p.add_argument("--name", help="run name in reports (default: the folder's name)")
    p.set_defaults(func=run)


def write_payloads(path: Path, image_size: int) -> None:
    """Held-out digits and their labels: the samples the replay sends."""
    from export import data  # lazy: torch

    heldout = data.load(image_size)["heldout"]
    save_payloads(path, heldout.images, heldout.labels)


def save_payloads(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """A replay's payload file: the samples a trace's payload indices name, and their labels."""
    np.savez(path, images=images, labels=labels)
    return path


def loadtest(trace: Path, target: str, out: Path, *, name: str | None = None, model: str = "digits",
             slo_ms: float = 36.0, progress_s: float = 5.0) -> dict:
    """Run one replay into ``out``; returns its ``run.json`` content."""
    return replay([Replay(model, trace)], target, out, name=name, slo_ms=slo_ms, progress_s=progress_s)


def replay(replays: Sequence[Replay], target: str, out: Path, *, name: str | None = None, slo_ms: float = 36.0,
           progress_s: float = 5.0) -> dict:
    """Replay every model's trace at once, from one start, into ``out``: model M's request log is
    ``requests-M.csv`` (``requests.csv`` with one model); returns ``run.json``'s content, whose ``summary`` is
    over every request."""
    if importlib.util.find_spec("locust") is None:
        raise OSError("locust is not installed (pip install locust)")
    models = [r.model for r in replays]
    if not models or len(set(models)) != len(models):
        raise ConfigError(f"a replay needs one or more distinct models, got {models}")
    out.mkdir(parents=True, exist_ok=True)
    logs = [out / ("requests.csv" if len(replays) == 1 else f"requests-{r.model}.csv") for r in replays]
    payloads = [r.payloads or _payloads(r, target, out) for r in replays]
    start_file = out / "start.json"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", "-u", "1",
           "-r", "1", "--loglevel", "WARNING", "--exit-code-on-error", "0", "--csv", str(out / "locust"),
           "--html", str(out / "locust.html"), "--target", target, "--trace", *map(str, (r.trace for r in replays)),
           "--payloads", *map(str, payloads), "--model", *models, "--slo-ms", str(slo_ms),
           "--request-log", *map(str, logs), "--start-file", str(start_file), "--progress-s", str(progress_s)]
    started = time.time()
    with open(out / "locust.log", "w") as log:  # progress lines on stdout; Locust's own output in the log
        result = subprocess.run(cmd, stdout=None if progress_s > 0 else log, stderr=log)
    if result.returncode != 0 or not all(path.exists() for path in logs):
        raise RuntimeError(f"locust failed (status {result.returncode}); see {out / 'locust.log'}")
    for path, r in zip(payloads, replays):
        if r.payloads is None:
            path.unlink()
    loaded = [RequestLog.load(path) for path in logs]
    run = {"name": name or out.name, "target": target, "slo_ms": slo_ms, "started_unix_s": round(started, 3),
           "replay_start_monotonic_s": json.loads(start_file.read_text())["start_monotonic_s"],
           "models": {r.model: {"trace": str(r.trace), "request_log": path.name, "summary": log.summary()}
                      for r, path, log in zip(replays, logs, loaded)},
           "summary": RequestLog([e for log in loaded for e in log.entries]).summary()}
    start_file.unlink()
    (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    return run


def _payloads(replay: Replay, target: str, out: Path) -> Path:
    """Held-out digits as large as the model's input, written for the replay."""
    import tritonclient.grpc as grpcclient  # lazy: tritonclient

    with grpcclient.InferenceServerClient(target) as client:
        (tensor,) = client.get_model_metadata(replay.model, as_json=True)["inputs"]
    path = out / f"payloads-{replay.model}.npz"
    write_payloads(path, int(tensor["shape"][-1]))
    return path


def run(args: argparse.Namespace) -> int:
    out = args.out or Path("runs") / time.strftime("loadtest-%Y%m%d-%H%M%S")
    result = loadtest(args.trace, args.target, out, name=args.name, model=args.model, slo_ms=args.slo_ms)
    for key, value in result["summary"].items():
        print(f"{key:<22} {value}")
    print(f"run folder: {out}")
    return 0
