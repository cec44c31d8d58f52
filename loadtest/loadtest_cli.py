"""``accscale loadtest``: replay a trace with Locust (headless) and keep everything in one run folder.

The run folder gets ``requests.csv`` (one line per trace entry, see ``loadtest.requestlog``),
``run.json`` (what was run and its summary), Locust's own ``locust_stats.csv`` and friends,
``locust.html`` and ``locust.log``. ``accscale report`` turns run folders into a report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from loadtest.requestlog import RequestLog

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"


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
    from export import data

    heldout = data.load(image_size)["heldout"]
    np.savez(path, images=heldout.images, labels=heldout.labels)


def loadtest(trace: Path, target: str, out: Path, *, name: str | None = None, model: str = "digits",
             slo_ms: float = 36.0, progress_s: float = 5.0) -> dict:
    """Run one replay into ``out``; returns its ``run.json`` content."""
    if importlib.util.find_spec("locust") is None:
        raise OSError("locust is not installed (pip install locust)")
    out.mkdir(parents=True, exist_ok=True)
    payloads = out / "payloads.npz"
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(target) as client:  # payloads as large as the model's input
        (tensor,) = client.get_model_metadata(model, as_json=True)["inputs"]
    write_payloads(payloads, int(tensor["shape"][-1]))
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", "-u", "1",
           "-r", "1", "--loglevel", "WARNING", "--exit-code-on-error", "0", "--csv", str(out / "locust"),
           "--html", str(out / "locust.html"), "--target", target, "--trace", str(trace), "--payloads",
           str(payloads), "--model", model, "--slo-ms", str(slo_ms), "--request-log", str(out / "requests.csv"),
           "--progress-s", str(progress_s)]
    started = time.time()
    with open(out / "locust.log", "w") as log:  # progress lines on stdout; Locust's own output in the log
        result = subprocess.run(cmd, stdout=None if progress_s > 0 else log, stderr=log)
    if result.returncode != 0 or not (out / "requests.csv").exists():
        raise RuntimeError(f"locust failed (status {result.returncode}); see {out / 'locust.log'}")
    payloads.unlink()
    run = {"name": name or out.name, "trace": str(trace), "target": target, "model": model, "slo_ms": slo_ms,
           "started_unix_s": round(started, 3), "summary": RequestLog.load(out / "requests.csv").summary()}
    (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    return run


def run(args: argparse.Namespace) -> int:
    out = args.out or Path("runs") / time.strftime("loadtest-%Y%m%d-%H%M%S")
    result = loadtest(args.trace, args.target, out, name=args.name, model=args.model, slo_ms=args.slo_ms)
    for key, value in result["summary"].items():
        print(f"{key:<22} {value}")
    print(f"run folder: {out}")
    return 0
