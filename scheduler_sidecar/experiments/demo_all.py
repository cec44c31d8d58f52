"""``accscale demo all``: the five systems on one deployment, each with its own burst, one report.

One sidecar in front of ``--tritons`` Triton servers, every model at this machine's speed (device kind ``cpu``),
serves five logical models, one per system:

- ``supernet``: the fast supernet's subnets, actuated in place, under SlackFit (SuperServe);
- ``wine``: the wine family of the Proteus demo's builder, under RAMSIS, its MDP policies generated at start for
  the model's loads;
- ``digits``: the digits family of static subnets, under Proteus's planner and adaptive batching;
- ``scenes``: Loki's pipeline (the small recipe) in its BLS model, under Loki's planner;
- ``cascade``: HybridServe's cascade (its AP point, pruned) in its BLS model, under HybridServe's planner.

SlackFit and RAMSIS share slots of their own on every Triton; each planner owns the slots the config gives it
there (``[[planners]]``): Proteus one per Triton (a device), Loki and HybridServe their BLS models' instances.
Every model gets ``--base-qps``, and ``--burst-qps`` in its own sixth of the run, the bursts one after another.
Printed and written to ``--out``: per window and model, what was sent, met, late and refused and the accuracy
served (``windows.csv``), the totals per model and in its burst (``summary.md``), the config and the sidecar's log.
Builds are cached in ``--build-dir`` (the first run: about two minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export.presets import DEFAULT_BUILD_DIR, get_preset
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.deployment import Answer, Device, Request, deploy, open_loop
from scheduler_sidecar.experiments.hybridserve import demo as hybridserve_demo
from scheduler_sidecar.experiments.loki import demo as loki_demo
from scheduler_sidecar.experiments.proteus import demo as proteus_demo
from scheduler_sidecar.sim.results import markdown_table
from scheduler_sidecar.systems.hybridserve.family import Family
from scheduler_sidecar.systems.hybridserve.live import HybridServeConfig
from scheduler_sidecar.systems.loki.planner import DEFAULT_HEADROOM

WINDOW_S = 5.0
SLO_MS = {"supernet": 100.0, "wine": 100.0, "digits": 300.0, "scenes": 400.0, "cascade": 1000.0}
# Loki's pipeline is one variant standing for every path through it (accuracy 1 in its profile): a frame's
# accuracy is its objects', which `accscale demo loki` scores
UNSCORED = frozenset({"scenes"})
SYSTEMS = {"supernet": "superserve", "wine": "ramsis", "digits": "proteus", "scenes": "loki", "cascade": "hybridserve"}
CASCADE_BLS = "all_cascade"  # its own name: the HybridServe demo writes its `cascade` beside the family's models
BLS_INSTANCES = 4  # the slots of each BLS model (frames or image batches in flight)
LOKI_INSTANCES = 6  # Loki's budget of stage-model replicas
CASCADE_INSTANCES = 8  # HybridServe's budget of model instances per server
PROTEUS_GUARD_US = 20_000  # as tests/test_proteus_live.py's: timer and RPC jitter on a busy machine


@dataclass(frozen=True)
class Model:
    """One logical model of the deployment: its config entry, and what its clients send."""

    name: str
    toml: str  # its [[models]] entry (and its planner's [[planners]] entry, if it has one)
    triton_models: tuple[str, ...]  # loaded when the Tritons start
    inputs: Callable[[int], dict[str, np.ndarray]]  # the i-th request's tensors


def register(demos: argparse._SubParsersAction) -> None:
    p = demos.add_parser("all", help="the five systems on one deployment, each with its own burst, one report",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tritons", type=int, default=2, help="Triton servers the systems share (default: 2)")
    p.add_argument("--duration-s", type=float, default=60.0, help="length of the run (default: 60)")
    p.add_argument("--base-qps", type=float, default=4.0, help="every model's steady rate (default: 4)")
    p.add_argument("--burst-qps", type=float, default=100.0, help="a model's rate in its burst (default: 100)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where builds are cached (default: build)")
    p.add_argument("--out", type=Path, help="where the results go (default: runs/demo-all-<time>)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.tritons < 1 or not args.duration_s > 0 or not 0 < args.base_qps <= args.burst_qps:
        raise ConfigError("--tritons >= 1, --duration-s > 0 and 0 < --base-qps <= --burst-qps")
    out = args.out or Path("runs") / time.strftime("demo-all-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    folder = args.build_dir / "demo-all"
    repositories, models = build(folder, args.build_dir, args.tritons)
    config = "".join(m.toml for m in models)
    times, names = schedule([m.name for m in models], args)
    print(f"{len(times)} requests over {args.duration_s:g} s to {', '.join(m.name for m in models)}; "
          f"{args.tritons} Triton(s) shared by {', '.join(SYSTEMS.values())}")
    with deploy(repositories, [t for m in models for t in m.triton_models], [Device()] * args.tritons,
                config=config, config_path=out / "sidecar.toml") as d:
        print(f"sidecar at {d.sidecar.grpc_url}; Tritons at {', '.join(t.grpc_url for t in d.tritons)}")
        inputs = {m.name: m.inputs for m in models}
        answers = asyncio.run(open_loop(d.sidecar.grpc_url, times, lambda i: Request(
            names[i], inputs[names[i]](i), {"slo_us": round(SLO_MS[names[i]] * 1000)})))
        (out / "sidecar.log").write_text(d.sidecar.log_path.read_text())
    rows = windows(answers, names)
    write(out, rows, totals(answers, names, args), args)
    return 0


def build(folder: Path, build_dir: Path, tritons: int) -> tuple[list[Path], list[Model]]:
    """Every system's models, built unless cached: (the Triton repositories, the logical models)."""
    from export import data  # lazy: torch
    from export.artifacts import Artifacts  # lazy: onnx, torch
    from export.profiler import SUPERNET_MODEL, export_supernet  # lazy: onnx, torch

    artifacts = Artifacts(get_preset("fast"), build_dir)
    act = artifacts.supernet()
    _, kept = artifacts.profiled(act, artifacts.calibration(act))
    export_supernet(act, kept, folder / "supernet")
    # the Proteus demo's families, whose profiles have this machine's kind (cpu) beside its emulated ones
    families_repository, families = proteus_demo.families(build_dir)
    images = data.load(act.spec.image_size)["heldout"].images
    wine, digits = proteus_demo.samples("wine")[0], proteus_demo.samples("digits")[0]
    family_models = {q: tuple(v.actuation.model for v in Profile.load(families[q]).variants) for q in ("wine", "digits")}
    models = [
        Model("supernet", _model("supernet", artifacts.profile_path, "slackfit"), (SUPERNET_MODEL,),
              lambda i: {"INPUT": images[i % len(images)][None]}),
        # RAMSIS' MDP policies for the unplanned slots (one per Triton) and the loads the run offers
        Model("wine", _model("wine", families["wine"], "ramsis", "latency_calibration = false\n"
                             f"[models.policy_options]\ndevice = \"cpu\"\nslo_ms = {SLO_MS['wine']}\n"
                             f"workers = {tritons}\n"
                             "loads = [2.0, 5.0, 10.0, 20.0, 40.0, 80.0]\n"), family_models["wine"],
              lambda i: {"INPUT": wine[i % len(wine)][None].astype(np.float32)}),
        Model("digits", '[[planners]]\nkind = "proteus"\nperiod_s = 10.0\n'
              # a waiting worker keeps a margin for its timer's lateness: the loop runs five systems' requests
              + _model("digits", families["digits"], "proteus", "latency_calibration = false\n"
                       f"[models.policy_options]\ndevice = \"cpu\"\nguard_us = {PROTEUS_GUARD_US}\n"),
              family_models["digits"], lambda i: {"INPUT": digits[i % len(digits)][None].astype(np.float32)}),
        _loki(folder / "loki", build_dir), _cascade(folder / "cascade", build_dir)]
    repositories = [folder / "supernet", families_repository, folder / "loki" / "repository",
                    build_dir / "hybridserve" / "repository", folder / "cascade" / "repository"]
    return repositories, models


def _model(name: str, profile: Path, policy: str, extra: str = "") -> str:
    return (f'[[models]]\nname = "{name}"\nprofile = "{profile.absolute()}"\npolicy = "{policy}"\n'
            f'default_slo_us = {round(SLO_MS[name] * 1000)}\n{extra}')


def _loki(folder: Path, build_dir: Path) -> Model:
    """Loki's pipeline, the small recipe (trained where ``demo loki --recipe small`` trains it), at this machine's
    speed: its BLS model alone is loaded at start (the plans load the stage models)."""
    from export.scenes import generate  # lazy: torch

    stamp, profile, _, _ = loki_demo.build_pipeline(folder, SLO_MS["scenes"], 1.0, LOKI_INSTANCES, "small",
                                                    trained_in=build_dir / "loki-demo-small",
                                                    bls_instances=BLS_INSTANCES)
    frames = generate(300, "heldout", seed=21).frames
    settings = argparse.Namespace(instances=LOKI_INSTANCES, slowdown=1.0, period_s=5.0, headroom=DEFAULT_HEADROOM,
                                  slo_ms=SLO_MS["scenes"])
    return Model("scenes", loki_demo.sidecar_config(stamp, profile, settings, "scenes"), (loki_demo.BLS,), lambda i: {"FRAME": frames[i % len(frames)][None]})


def _cascade(folder: Path, build_dir: Path) -> Model:
    """HybridServe's cascade (AP, pruned) in a BLS model of its own, beside the family HybridServe's demo builds."""
    from export import repository  # lazy: onnx, torch
    from export.cascade_models import build as build_family  # lazy: onnx, torch

    stamp = build_family(build_dir / "hybridserve")
    family = Family.load(stamp)
    planner = hybridserve_demo.planners(family, HybridServeConfig(CASCADE_INSTANCES))["ap-pruned"]
    repository.write_cascade(folder / "repository", CASCADE_BLS, planner.bls_plan, family.names,
                             max_batch_size=hybridserve_demo.ROWS, instances=BLS_INSTANCES)
    profile = hybridserve_demo.cascade_profile(folder / "profile.json", family, planner.point, 1.0, CASCADE_BLS)
    images = family.images("test")[0]
    toml = hybridserve_demo.sidecar_config(stamp, profile, "ap", True, HybridServeConfig(CASCADE_INSTANCES),
                                           SLO_MS["cascade"], "cascade")
    return Model("cascade", toml, (*family.names, CASCADE_BLS), lambda i: {"INPUT": images[i % len(images)][None]})


def schedule(names: Sequence[str], args: argparse.Namespace) -> tuple[list[float], list[str]]:
    """Each model's Poisson stream, ``burst_qps`` in its own sixth of the run (the k-th model's is the (k+1)-th
    sixth) and ``base_qps`` otherwise, merged: (times, models)."""
    sixth = args.duration_s / 6
    sent = []
    for k, name in enumerate(names):
        rng, t = np.random.default_rng(k), 0.0
        while True:
            burst = (k + 1) * sixth <= t < (k + 2) * sixth
            t += rng.exponential(1 / (args.burst_qps if burst else args.base_qps))
            if t >= args.duration_s:
                break
            sent.append((t, name))
    sent.sort()
    return [t for t, _ in sent], [name for _, name in sent]


def _outcome(answer: Answer, name: str) -> str:
    if answer.result is None:
        return "refused"
    return "late" if answer.latency_s > SLO_MS[name] / 1000 else "met"


def _accuracy(answer: Answer, name: str) -> float | None:
    """The profiled accuracy of the variant that served ``answer`` (None where that says nothing, UNSCORED)."""
    params = answer.result.get_response().parameters
    return params["accuracy"].double_param if "accuracy" in params and name not in UNSCORED else None


def windows(answers: Sequence[Answer], names: Sequence[str]) -> list[dict]:
    """Per window and model: sent, met, late, refused, and the mean profiled accuracy of what was met."""
    stats: dict[tuple[int, str], dict] = defaultdict(lambda: {"sent": 0, "met": 0, "late": 0, "refused": 0,
                                                              "accuracy": []})
    for a in answers:
        s = stats[int(a.sent_s // WINDOW_S), names[a.index]]
        s["sent"] += 1
        outcome = _outcome(a, names[a.index])
        s[outcome] += 1
        if outcome == "met" and (accuracy := _accuracy(a, names[a.index])) is not None:
            s["accuracy"].append(accuracy)
    return [{"window_s": w * WINDOW_S, "model": name, **{k: s[k] for k in ("sent", "met", "late", "refused")},
             "accuracy": round(100 * float(np.mean(s["accuracy"])), 2) if s["accuracy"] else ""}
            for (w, name), s in sorted(stats.items())]


def totals(answers: Sequence[Answer], names: Sequence[str], args: argparse.Namespace) -> list[dict]:
    """Per model: its system, what it was sent and met over the run and within its burst, and the refusals'
    reasons."""
    sixth = args.duration_s / 6
    order = list(dict.fromkeys(SYSTEMS))
    rows = []
    for k, name in enumerate(order):
        mine = [a for a in answers if names[a.index] == name]
        burst = [a for a in mine if (k + 1) * sixth <= a.sent_s < (k + 2) * sixth]
        met = [a for a in mine if _outcome(a, name) == "met"]
        accuracy = [x for a in met if (x := _accuracy(a, name)) is not None]
        reasons = sorted({a.error.split(":")[0][:60] for a in mine if a.result is None})
        rows.append({"model": name, "system": SYSTEMS[name], "slo_ms": SLO_MS[name], "sent": len(mine),
                     "met": len(met), "attainment": round(len(met) / max(1, len(mine)), 4),
                     "burst_sent": len(burst),
                     "burst_attainment": round(sum(_outcome(a, name) == "met" for a in burst) / max(1, len(burst)), 4),
                     "accuracy": round(100 * float(np.mean(accuracy)), 2) if accuracy else "",
                     "refused": len(mine) - sum(a.result is not None for a in mine), "refusals": "; ".join(reasons)})
    return rows


def write(out: Path, rows: list[dict], per_model: list[dict], args: argparse.Namespace) -> None:
    with open(out / "windows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = (f"# accscale demo all\n\nFive systems on one sidecar and {args.tritons} shared Triton(s): every model "
            f"{args.base_qps:g} q/s, {args.burst_qps:g} q/s in its own sixth of {args.duration_s:g} s (supernet's "
            "the second, ..., cascade's the last). Met: answered within its SLO at the client. Accuracy: the "
            "profiled accuracy of what was met, per request.\n\n" + markdown_table(per_model, list(per_model[0]))
            + f"\n\nPer {WINDOW_S:g} s window: `windows.csv`. The sidecar's config: `sidecar.toml`; its log: "
            "`sidecar.log`.\n")
    (out / "summary.md").write_text(text)
    print(text)
    print(f"report: {out / 'summary.md'}")

