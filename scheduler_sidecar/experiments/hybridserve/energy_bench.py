"""``accscale bench energy``: HybridServe's energy per request (Table V), measured on the models of the family built
here, on a GPU where there is one.

Each model of the family runs full batches of ``--batch`` (default: the family's cost batch) for ``--seconds``: on
the GPU where torch finds one, else on one CPU thread. Its architecture is the family's; its weights are drawn at
random, since a batch's work does not depend on their values (the trained ones are in the ONNX files the CPU
Triton serves, which no GPU runtime here reads). Energy: the GPUs' NVML counters (:func:`.energy.nvml_meter`,
idle power included, as the paper's) when the models ran on a GPU; else the CPU power model over the process's
CPU seconds, named as such. Per mode (AP and EO as Algorithm 1 picks them, the largest model alone) a request's
energy is Σ ρ_i e_i over its cascade's models (ρ_i: the share of the test split reaching model i), and its
saving is the largest model's energy over it, beside Table V's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from export.presets import DEFAULT_BUILD_DIR
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.claims import at_least, least, table
from scheduler_sidecar.experiments.hybridserve.energy import CPU_MODEL, cpu_energy_j, nvml_meter
from scheduler_sidecar.experiments.hybridserve.reproduce import PAPER
from scheduler_sidecar.sim.results import markdown_table
from scheduler_sidecar.systems.hybridserve.family import Family
from scheduler_sidecar.systems.hybridserve.planner import MODES, operating_points

SYNC_EVERY = 16  # GPU batches queued between synchronisations: enough to keep it busy, few enough to stop on time


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("energy", help="HybridServe's energy per request (Table V): NVML on a GPU, else CPU "
                                        "worker-seconds", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="how long each model runs (default: 5)")
    p.add_argument("--batch", type=int, help="requests per batch (default: the family's cost batch, 32)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where builds are cached (default: build)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.seconds > 0 or (args.batch is not None and args.batch < 1):
        raise ConfigError(f"--seconds must be > 0 and --batch >= 1, got {args.seconds!r} and {args.batch!r}")
    import torch  # lazy: torch

    from export.cascade_models import CLASSES, FAMILY, SIDE, build  # lazy: onnx, torch
    from export.small_nets import cnn  # lazy: onnx

    family = Family.load(build(args.build_dir / "hybridserve"))
    batch = args.batch or family.cost_batch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    meter = nvml_meter() if device == "cuda" else None
    if device == "cpu":
        torch.set_num_threads(1)  # one worker: its CPU seconds are its worker-seconds
    source = meter.source if meter else CPU_MODEL
    torch.manual_seed(0)
    rows = []
    for model in family.models:
        net = cnn(FAMILY[model.name], CLASSES, SIDE).to(device).eval()
        x = torch.randn(batch, 1, SIDE, SIDE, device=device)
        rows.append({"model": model.name, **_measure(net, x, args.seconds, meter, torch), "device": device})
    e = {r["model"]: r["mj_per_request"] for r in rows}
    points = operating_points(family)
    modes = []
    for mode in MODES:
        p = points[mode]
        mj = sum(reach * e[m] for reach, m in zip(p.test.reach, p.cascade.models))
        modes.append({"mode": mode, "models": " ".join(p.cascade.models),
                      "reach": " ".join(f"{r:.3f}" for r in p.test.reach), "mj_per_request": round(mj, 5)})
    largest = next(m["mj_per_request"] for m in modes if m["mode"] == "largest")
    for m in modes:
        m["saving"] = round(largest / m["mj_per_request"], 3)
    saving = {m["mode"]: m["saving"] for m in modes}
    paper = PAPER["table5_vit_energy_saving"]
    found = [at_least(f"table5.{mode}_energy_saving", f"{mode.upper()}'s energy saving against the largest model "
                      f"({source}, {device})", f"{paper[mode]:g}x (ViT)", saving[mode], paper[mode], "x")
             for mode in ("ap", "eo")]
    found.append(least("table5.eo_saves_most_energy", f"EO saves more energy than AP ({source}, {device})",
                       f"EO {paper['eo']:g}x > AP {paper['ap']:g}x", {m: saving[m] for m in ("eo", "ap")}, "eo",
                       most=True))
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU: energy is the CPU power model"
    if args.json:
        print(json.dumps({"device": device, "gpu": gpu, "energy_source": source, "batch": batch, "models": rows,
                          "modes": modes, "claims": [c.as_dict() for c in found]}))
    else:
        print(f"{gpu}; energy: {source}; batches of {batch}\n")
        print(markdown_table(rows, list(rows[0])) + "\n\n" + markdown_table(modes, list(modes[0])) + "\n\n"
              + table(found))
    return 0


def _measure(net, x, seconds: float, meter, torch) -> dict:
    """Run ``net`` on ``x`` for ``seconds`` (after a warm-up): requests, seconds, joules and mJ per request."""
    cuda = x.is_cuda
    with torch.inference_mode():
        for _ in range(SYNC_EVERY):
            net(x)
        if cuda:
            torch.cuda.synchronize()
        joules0, cpu0, start = meter.joules() if meter else 0.0, time.process_time(), time.perf_counter()
        batches = 0
        while time.perf_counter() - start < seconds:
            for _ in range(SYNC_EVERY):
                net(x)
            batches += SYNC_EVERY
            if cuda:
                torch.cuda.synchronize()
        wall = time.perf_counter() - start
        joules = meter.joules() - joules0 if meter else cpu_energy_j(time.process_time() - cpu0)
    requests = batches * len(x)
    return {"requests": requests, "seconds": round(wall, 3), "joules": round(joules, 3),
            "mj_per_request": round(1000 * joules / requests, 5), "watts": round(joules / wall, 1)}
