"""Where a subnet's time goes in the supernet graph, against the same subnet exported statically.

Both run in onnxruntime on one thread with every graph optimisation, as the python-backend models do, with
onnxruntime's profiler on; each run's kernel time is summed per operator type into CATEGORIES. What a run takes
beyond its kernels is the executor's (``executor``): for the supernet mostly its control flow, the ``If`` nodes of
LayerSelect and WeightSlice, whose own profiler events contain their branches' kernels and are not summed. Triton,
the python backend and the request path are left out: this is the graph alone.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from python_backend.runners import MODEL_FILE, SUBNETS_FILE, SubnetTable, make_session

# operator type -> category; a type not listed is "other"
CATEGORIES = {
    **dict.fromkeys(("Conv", "FusedConv", "NchwcConv"), "conv"),
    "BatchNormalization": "norm",  # SubnetNorm; the static graph folds its norms into the convolutions
    "Gather": "gather",  # SubnetNorm's statistics rows and the control vector's entries
    **dict.fromkeys(("ReorderInput", "ReorderOutput"), "layout"),  # NCHW <-> NCHWc around unfused operators
    **dict.fromkeys(("Relu", "Add", "Sum"), "elementwise"),
    **dict.fromkeys(("Less", "Greater", "Identity"), "control"),  # the If conditions and skipped blocks
}
NESTING = {"If"}  # events that contain their branches' kernels
WARMUP_RUNS = 5


def breakdown(supernet_dir: Path, static_dir: Path, subnet_id: str, images: np.ndarray, runs: int) -> dict:
    """``subnet_id`` on the batch ``images``: microseconds per run of the static export and of the supernet
    (version folders of a Triton repository), their ratio, and per category each one's microseconds per run."""
    table = SubnetTable.from_json((supernet_dir / SUBNETS_FILE).read_text())
    index = next(i for i, row in enumerate(table.rows) if table.layout.subnet_id(row) == subnet_id)
    static_us, static = _profiled(static_dir / MODEL_FILE, images, runs)
    supernet_us, supernet = _profiled(supernet_dir / MODEL_FILE, images, runs, table, index)
    row = {"subnet": subnet_id, "batch": len(images), "static_us": round(static_us, 1),
           "supernet_us": round(supernet_us, 1), "ratio": round(supernet_us / static_us, 3)}
    for category in sorted(set(static) | set(supernet)):
        row[f"static_{category}_us"] = round(static.get(category, 0.0), 1)
        row[f"supernet_{category}_us"] = round(supernet.get(category, 0.0), 1)
    return row


def _profiled(path: Path, inputs: np.ndarray, runs: int, table: SubnetTable | None = None,
              subnet: int = 0) -> tuple[float, dict[str, float]]:
    """Microseconds per run (onnxruntime's ``model_run``) of the graph at ``path`` on ``inputs`` (running ``table``'s
    subnet ``subnet`` if it is a supernet), and kernel microseconds per run by category (``executor``: the rest),
    over ``runs`` runs after WARMUP_RUNS."""
    with tempfile.TemporaryDirectory(prefix="accscale-ort-profile-") as tmp:
        session = make_session(path, 1, profile_prefix=str(Path(tmp) / "run"))
        feeds = {"INPUT": inputs, **(table.feeds(session)[subnet] if table else {})}
        for _ in range(WARMUP_RUNS + runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    timed = sorted((e for e in events if e["name"] == "model_run"), key=lambda e: e["ts"])[WARMUP_RUNS:]
    kernels: Counter[str] = Counter()
    for e in events:
        op = e.get("args", {}).get("op_name")
        if (e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and op not in NESTING
                and e["ts"] >= timed[0]["ts"]):
            kernels[CATEGORIES.get(op, "other")] += e["dur"]
    run_us = sum(e["dur"] for e in timed) / runs
    per_run = {k: v / runs for k, v in kernels.items()}
    per_run["executor"] = max(0.0, run_us - sum(per_run.values()))
    return run_us, per_run

