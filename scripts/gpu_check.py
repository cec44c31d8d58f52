#!/usr/bin/env python3
"""The GPU check: every GPU test and bench of the project in one command, its results as one JSON file.

    python3 scripts/gpu_check.py bundle [--out gpu-check/bundle]      # here, where the supernets are built
    python3 scripts/gpu_check.py run [--device cuda] [--bundle gpu-check/bundle] [--out gpu-check/result.json]

``bundle`` exports what the check needs (``make gpu-bundle``): each family's full supernet, its 6 spread static
subnets and held-out inputs (:func:`export.bench_torch.write_bench_set`). ``run`` (``make gpu-check``) needs only
Python, torch, numpy, onnx, onnxruntime, psutil and pytest, no tritonserver and no network: it runs the GPU tests
(``pytest -m gpu``, the python-backend models through :mod:`python_backend.standin`), then ``bench subnetact``'s
GPU comparisons for each family, and writes the JSON after every step, so a run cut short keeps what it measured.
``--device cpu`` is the dry run on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bundle(args: argparse.Namespace) -> int:
    from export.bench_torch import write_bench_set
    from export.presets import FAMILIES

    # the benches' sets, the GPU runtime's files alone; and the fast presets' with their ONNX graphs, on which the
    # tests compare the GPU with onnxruntime (the full CNN's graphs would not fit the 64 MiB a GPU machine is sent)
    sets = [(args.out / family, family, args.preset, args.spread, False) for family in FAMILIES]
    sets += [(args.out / "fast" / family, family, "fast", 3, True) for family in FAMILIES]
    for out, family, preset, spread, onnx in sets:
        out.mkdir(parents=True, exist_ok=True)
        write_bench_set(family, preset, args.build_dir, spread, out, onnx=onnx)
        print(f"{out}: {sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 2**20:.1f} MiB")
    return 0


def _environment(device: str) -> dict:
    import numpy as np
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
           "cpus": os.cpu_count(), "device": device}
    if device == "cuda":
        env |= {"cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
                "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
    return env


def _tests(bundle_dir: Path, device: str, report: Path) -> dict:
    """``pytest -m gpu`` on the GPU tests, with the bench sets of ``bundle_dir`` (on ``--device cpu`` they are
    collected and skipped: the file's CPU tests are the suite's)."""
    # -W default: warnings are reported, not raised as CI's pins raise them (the GPU machine has its own versions)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--noconftest", "-m", "gpu", "-q",
           "-W", "default", f"--junitxml={report}", "tests/test_torch_runtime.py"]
    from export.bench_torch import BUNDLE_ENV

    started = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, BUNDLE_ENV: str(bundle_dir.resolve())})
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0:
        raise RuntimeError(f"pytest exited {out.returncode}: {summary}\n{(out.stdout + out.stderr)[-4000:]}")
    return {"command": " ".join(cmd[1:]), "returncode": out.returncode, "summary": summary,
            "seconds": round(time.monotonic() - started, 1), "output_tail": (out.stdout + out.stderr)[-4000:]}


def run(args: argparse.Namespace) -> int:
    from export.bench_torch import bench
    from export.presets import FAMILIES
    from python_backend.torch_runtime import WEIGHT_LAYOUTS

    started = time.monotonic()
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": {}}

    def save() -> None:
        result["seconds"] = round(time.monotonic() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))

    def step(name: str, call) -> None:
        t = time.monotonic()
        try:
            result["steps"][name] = {"ok": True, "result": call()}
        except Exception as exc:  # noqa: BLE001 - one failed step must not cost the others' results
            result["steps"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-3000:]}
        result["steps"][name]["seconds"] = round(time.monotonic() - t, 1)
        print(f"== {name}: {'ok' if result['steps'][name]['ok'] else 'FAILED'} "
              f"({result['steps'][name]['seconds']} s)", flush=True)
        save()

    step("environment", lambda: _environment(args.device))
    step("tests", lambda: _tests(args.bundle, args.device, args.out.with_suffix(".junit.xml")))
    parts = tuple(args.parts.split(","))
    for family in FAMILIES:
        for layout in WEIGHT_LAYOUTS:  # the default layout in full, the other's execution alone
            step(f"bench-{family}-{layout}", lambda family=family, layout=layout: bench(
                args.bundle / family, args.device, repeats=args.repeats, loads=args.loads, layout=layout,
                parts=parts if layout == WEIGHT_LAYOUTS[0] else ("execution",)))
    result["ok"] = all(s["ok"] for s in result["steps"].values())
    save()
    for name, s in result["steps"].items():
        if name.startswith("bench-") and s["ok"]:
            print(name, json.dumps(s["result"]["goals"]))
    print(f"gpu check: {'ok' if result['ok'] else 'FAILED'} in {result['seconds']} s; results in {args.out}")
    return 0 if result["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="export the bench sets the check needs (here, where the supernets are built)")
    b.add_argument("--out", type=Path, default=Path("gpu-check/bundle"))
    b.add_argument("--preset", default="full")
    b.add_argument("--build-dir", type=Path, default=Path("build"))
    b.add_argument("--spread", type=int, default=6)
    b.set_defaults(func=bundle)
    r = sub.add_parser("run", help="run the GPU tests and benches")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    r.add_argument("--bundle", type=Path, default=Path("gpu-check/bundle"))
    r.add_argument("--out", type=Path, default=Path("gpu-check/result.json"))
    r.add_argument("--repeats", type=int, default=30)
    r.add_argument("--loads", type=int, default=5)
    r.add_argument("--parts", default="actuation,memory,execution",
                   help="the default layout's comparisons (the other layout's execution is always measured)")
    r.set_defaults(func=run)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
