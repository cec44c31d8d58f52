"""``accscale demo loki``: the Loki pipeline live, behind the sidecar, through a burst.

Builds (or reuses) the pipeline trained here (:mod:`export.loki_models`: a detector, then a digit and a shape
classifier, every variant its own Triton model) and its BLS model, starts one Triton server whose stage models
run ``--slowdown`` times slower than this machine (each batch sleeps to its profiled latency times that: an
emulated slower device, so the plans have something to trade), and the sidecar with Loki's live controller in
front of it. The controller re-plans every ``--period-s`` and on a 20% demand change within a budget of
``--instances`` stage-model instances: hardware scaling first (the fewest instances that serve the demand at the
best accuracy), accuracy scaling when the budget is not enough. Each planned variant's replicas become its
Triton instance count and the variants a plan leaves out are unloaded, so a quiet period holds fewer instances
than a burst; Triton starts with the BLS model alone and the first plan loads its variants. The sidecar sends
each batch of frames to the BLS with the plan's tables and each frame's time in the sidecar. Frames are held-out
scenes, sent with ``tritonclient`` (gRPC, open loop, Poisson) at ``--base-qps``, ``--burst-qps`` in the middle
third. Per window: frames sent, served within the SLO, answered as dropped, late, refused; the share of the
objects in the frames found and labelled right; the instances of the newest plan that served a frame sent in
the window, and the stage-model instances Triton had loaded at its end; the share of stage runs (the detector's
and each crop's classifier's) on their task's most accurate variant, which accuracy scaling lowers; which detector
served; crops rerouted; and frames met in the simulation of the same frames beside it (Loki's controller and
per-task policies over as many workers as the budget, the pipeline at the emulated device's speed, the load times
the sidecar measured), so the report shows whether live met the burst as the simulator says it should.
Written to --out: ``windows.csv`` and ``summary.md``.

What the plans do not see: the BLS model answers a batch of frames when its last frame's crops are labelled, so its
own instances (BLS_INSTANCES, the sidecar's slots on the server) bound the frame batches in flight, and the client,
the sidecar and Triton share this machine. The summary says where a served frame's time went, stage by stage, live
and simulated (:mod:`~scheduler_sidecar.experiments.loki.stages`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from export.presets import DEFAULT_BUILD_DIR
from export.scenes import generate
from python_backend.pipeline import read_answers
from scheduler_sidecar.core.plan import Demand
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.deployment import (
    LOADED,
    Answer,
    Device,
    Request,
    deploy,
    open_loop,
    since_start_s,
)
from scheduler_sidecar.experiments.loki import stages
from scheduler_sidecar.sim.results import markdown_table, write_rows
from scheduler_sidecar.systems.loki.data import trained
from scheduler_sidecar.systems.loki.live import LivePlanner
from scheduler_sidecar.systems.loki.planner import DEFAULT_HEADROOM, LokiConfig

MODEL = "scenes"  # the logical model clients call
BLS = "loki_pipeline"
# frame batches in flight (the sidecar's slots; each BLS execution has its stages' batches in flight at once). A frame
# waits for a slot, then for the other frames of its batch (LokiPipeline's max_batch): bench fidelity at 1x, 3 runs,
# gap -14.67 (-47.72..-14.33) points with 4 of up to 8 frames, -3.37 (-14.50..+3.71) with 8 of up to 4 (1.3x:
# -24.25 against -10.55); with 16, two runs in three the BLS instances outran the detectors' (-78.6, -78.8)
BLS_INSTANCES = 8
INSTANCES = 6  # the default budget: twice the tasks, so that hardware scaling has room to show


def register(demos: argparse._SubParsersAction) -> None:
    p = demos.add_parser("loki", help="Loki live: a detector -> classifiers pipeline as a BLS model, a burst",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=60.0, help="how long to send (default: 60)")
    p.add_argument("--base-qps", type=float, default=10.0, help="frames per second (default: 10)")
    p.add_argument("--burst-qps", type=float, default=150.0,
                   help="frames per second in the middle third (default: 150)")
    p.add_argument("--window-s", type=float, default=5.0, help="the reported windows' length (default: 5)")
    p.add_argument("--slo-ms", type=float, default=200.0, help="every frame's SLO (default: 200)")
    p.add_argument("--slowdown", type=float,
                   help="the emulated device: stage models run this many times slower (default: slow enough that "
                        "one frame's slowest path takes half the SLO, whatever this machine's speed)")
    p.add_argument("--instances", type=int, default=INSTANCES,
                   help=f"the budget of replicas the resource manager places: Triton instances of the stage models "
                        f"(default: {INSTANCES}; 3, one per task, leaves only accuracy scaling)")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                   help=f"capacity planned per frame of demand (default: {DEFAULT_HEADROOM:g}; the paper: 1)")
    p.add_argument("--period-s", type=float, default=5.0, help="the resource manager's period (default: 5)")
    p.add_argument("--recipe", choices=("full", "small"), default="full",
                   help="how the stage models are trained: small builds in seconds, a few points less accurate "
                        "(default: full)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where builds are cached (default: build)")
    p.add_argument("--out", type=Path, help="where the results go (default: runs/loki-demo-<time>)")
    p.set_defaults(func=run)


def build_pipeline(folder: Path, slo_ms: float, slowdown: float | None, instances: int,
           recipe: str, *, trained_in: Path | None = None,
           bls_instances: int = BLS_INSTANCES) -> tuple[Path, Path, list[str], float]:
    """Build the pipeline with ``recipe`` (cached), write its BLS model with a first plan, and the logical model's
    profile: (loki.json, the profile's path, the stage models, the slowdown: ``slowdown``, or where None the factor
    that makes one frame's slowest path take half of ``slo_ms``). The models are trained in ``folder``, or reused
    from ``trained_in`` and copied into ``folder``'s repository (one training for every deployment of a recipe)."""
    from export import repository  # lazy: onnx, torch
    from export.loki_models import RECIPES, build, copy_stage_models  # lazy: onnx, torch

    stamp = build(trained_in or folder, RECIPES[recipe])
    if trained_in is not None and trained_in != folder:
        copy_stage_models(trained_in, folder / "repository")
    measured = trained(stamp)
    slowdown = slowdown or max(1.0, slo_ms / 2 / _slowest_path_ms(measured)[0])
    pipeline = measured.scaled(slowdown)
    models = [v.id for t in pipeline.tasks for v in t.variants]
    planner = LivePlanner(pipeline, instances, LokiConfig(min_demand_qps=1.0))
    first = planner.plan(0, Demand(0, 1, {})).detail.bls
    repository.write_loki_pipeline(folder / "repository", BLS, first, models, instances=bls_instances)
    # the whole pipeline as one variant, for the sidecar's admission and queue
    batches, ms = pipeline.root.top.latency.batch_sizes, _slowest_path_ms(pipeline)
    profile = folder / "pipeline-profile.json"
    Profile("loki-pipeline", f"{stamp} x{slowdown:g}", (Variant("pipeline", 1.0, Actuation("pipeline", BLS, path=tuple(t.name for t in pipeline.tasks)),
                                                                 {"cpu": LatencyCurve(batches, ms, ms)}),)).save(profile)
    return stamp, profile, models, slowdown


def _slowest_path_ms(pipeline) -> tuple[float, ...]:
    """The pipeline's slowest path at each of the detector's profiled batch sizes b: its slowest variant, then the
    slowest classifier over 4 crops a frame."""
    root = pipeline.root
    batches = root.top.latency.batch_sizes
    return tuple(max(v.latency.p50_ms[i] for v in root.variants) + max(
        v.latency.p50_at(min(batches[-1], b * 4)) for t in pipeline.tasks[1:] for v in t.variants)
        for i, b in enumerate(batches))


def run(args: argparse.Namespace) -> int:
    for key in ("duration_s", "window_s", "base_qps", "burst_qps", "slo_ms"):
        if not getattr(args, key) > 0:
            raise ConfigError(f"--{key.replace('_', '-')} must be > 0, got {getattr(args, key)!r}")
    out = args.out or Path("runs") / time.strftime("loki-demo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    folder = args.build_dir / ("loki-demo" if args.recipe == "full" else f"loki-demo-{args.recipe}")
    stamp, profile, models, args.slowdown = build_pipeline(folder, args.slo_ms, args.slowdown, args.instances,
                                                           args.recipe)
    measured = json.loads(stamp.read_text())
    for model in models:
        print(f"{model:<20} accuracy {100 * measured['accuracy'][model]:.1f}%")
    # the BLS model alone: the plans load and unload the stage models
    with deploy(folder / "repository", [BLS], [Device(args.slowdown)], config=sidecar_config(stamp, profile, args),
                config_path=out / "sidecar.toml") as d:
        (triton,), sidecar = d.tritons, d.sidecar
        print(f"sidecar at {sidecar.grpc_url}, Triton at {triton.grpc_url} (x{args.slowdown:g})")
        best = {v.id for t in trained(stamp).tasks for v in t.variants if v.accuracy == t.variants[0].accuracy}
        arrival_s = arrivals(args)
        started: list[float] = []  # the replay's zero, on the monotonic clock
        rows, frames = asyncio.run(drive(sidecar.grpc_url, triton.grpc_url, models, best, arrival_s, args,
                                         started.append))
        log = sidecar.log_path.read_text()
        (out / "sidecar.log").write_text(log)
    load_ms = [float(ms) for _, _, ms in LOADED.findall(log)]
    # simulated from the sidecar's start, the frames arriving when the replay sent them (the first plan's models load
    # meanwhile), so that Loki's controller re-plans at the instants the sidecar's did
    offset_s = since_start_s(log, started[0])
    simulated = simulate_beside(stamp, args, arrival_s + offset_s, load_ms)
    sim = simulated.frames
    window = ((sim.arrival_us - round(offset_s * 1e6)) // round(args.window_s * 1e6)).astype(np.int64)
    met = Counter(window[sim.met].tolist())
    for r in rows:
        r["sim_met"] = met[round(r["window_s"] / args.window_s)]
    served = [f for f in frames if f.answer is not None and f.answer["status"] == "served"]
    by_stage = {"live": stages.live(served),
                "simulated": stages.simulated(simulated.result, ~np.isnan(sim.accuracy))}
    write(out, rows, args, by_stage)
    return 0


def sidecar_config(stamp: Path, profile: Path, args, model: str = MODEL) -> str:
    """Loki's planner over the pipeline ``stamp`` (a ``[[planners]]`` entry), and the pipeline (``profile``) the
    logical model ``model``."""
    # admission off: Loki sheds overload itself, by early dropping per task, and its simulation (which bench
    # fidelity compares with this deployment) has no admission at the pipeline's door
    return (f'[[planners]]\nkind = "loki"\npipeline = "{stamp.absolute()}"\ninstances = {args.instances}\n'
            f'slowdown = {args.slowdown}\nperiod_s = {args.period_s}\nmin_demand_qps = 1.0\n'
            f'headroom = {args.headroom}\n'
            f'[[models]]\nname = "{model}"\nprofile = "{profile.absolute()}"\npolicy = "loki"\n'
            f'default_slo_us = {round(args.slo_ms * 1000)}\nlatency_calibration = false\nadmission = false\n')


@dataclass(frozen=True)
class Frame:
    """What came back for one frame sent to the pipeline behind the sidecar."""

    sent_s: float  # when it was sent, from the start
    answer: dict | None  # python_backend.pipeline.read_answers' dict; None: refused
    client_s: float  # request to answer, at the client
    sidecar_us: int  # arrival at the sidecar to its answer, as the sidecar reports (queue_us + service_us); 0: refused
    objects: int  # objects in the scene
    right: int  # of those, found and labelled right


def sent_scenes():
    """The held-out scenes :func:`send` sends: frame i of a trace is scene i mod 300."""
    return generate(300, "heldout", seed=21)


async def send(url: str, arrivals_s, models: list[str], slo_ms: float,
               started: Callable[[float], None] | None = None) -> list[Frame]:
    """Send held-out scenes to the sidecar at ``url``, open loop, at ``arrivals_s`` (seconds from the replay's zero,
    which ``started`` is told: see :func:`open_loop`); each frame's answer, in order."""
    from export.loki_models import match  # lazy: onnx, torch

    scenes = sent_scenes()
    slo = {"slo_us": round(slo_ms * 1000)}

    def frame(a: Answer) -> Frame:
        objects = scenes.objects[a.index % len(scenes)]
        if a.result is None:
            return Frame(a.sent_s, None, a.latency_s, 0, len(objects), 0)
        params = a.result.get_response().parameters
        (answer,) = read_answers(a.result.as_numpy("OBJECTS"), a.result.as_numpy("STATUS"), models,
                                 a.result.as_numpy("STAGE_MS"))
        found = np.array([[o["row"], o["col"], o["kind"]] for o in answer["objects"]]).reshape(-1, 3)
        hits = match(found, objects)
        labels = [answer["objects"][h]["label"] for h in hits if h >= 0]
        right = sum(lab == obj[3] for lab, obj in zip(labels, objects[hits >= 0]))
        return Frame(a.sent_s, answer, a.latency_s, params["queue_us"].int64_param + params["service_us"].int64_param,
                     len(objects), int(right))

    answers = await open_loop(url, arrivals_s, lambda i: Request(MODEL, {"FRAME": scenes.frames[i % len(scenes)][None]},
                                                                 slo), started)
    return [frame(a) for a in answers]


def arrivals(args) -> np.ndarray:
    """Poisson arrivals at ``base_qps``, ``burst_qps`` in the middle third of ``duration_s``."""
    rng = np.random.default_rng(0)
    out, t = [], rng.exponential(1 / args.base_qps)
    while t < args.duration_s:
        out.append(t)
        burst = args.duration_s / 3 <= t < 2 * args.duration_s / 3
        t += rng.exponential(1 / (args.burst_qps if burst else args.base_qps))
    return np.array(out)


def simulate_beside(stamp: Path, args, arrival_s: np.ndarray, load_ms: list[float], *, own_fanout: bool = True):
    """The frames sent at ``arrival_s`` (seconds from the sidecar's start, when the caller knows it: its controller
    starts at 0) through Loki simulated as the sidecar runs it: its controller over
    ``args.instances`` workers (period, headroom and demand floor as the sidecar's config), the pipeline at the
    emulated device's speed and the demo's SLO, a variant's load time the mean the sidecar measured, and each frame's
    own fan-out, the objects its detector finds in the scene :func:`send` sent (``own_fanout`` False: drawn from the
    detector's mean, as a simulation of frames unknown)."""
    from export.loki_models import frame_fanout  # lazy: onnxruntime
    from scheduler_sidecar.experiments.loki import systems  # lazy: highspy, pulp

    pipeline = replace(trained(stamp).scaled(args.slowdown), slo_ms=args.slo_ms)
    config = LokiConfig(period_s=args.period_s, headroom=args.headroom, min_demand_qps=1.0)
    setup = systems.Setup(pipeline, workers=args.instances, config=config,
                          load_ms=float(np.mean(load_ms)) if load_ms else None,
                          fanout="frames" if own_fanout else "poisson",
                          frame_fanout=frame_fanout(stamp, sent_scenes().frames) if own_fanout else None)
    return systems.simulate(systems.SYSTEMS["loki"], setup, np.round(arrival_s * 1e6).astype(np.int64),
                            initial_demand_qps=0.0)


async def drive(url: str, triton_url: str, models: list[str], best: set[str], arrival_s: np.ndarray,
                args, started: Callable[[float], None] | None = None) -> tuple[list[dict], list[Frame]]:
    """Send the frames to the sidecar at ``url`` at ``arrival_s``: per window, what came back, and what the
    Triton at ``triton_url`` had loaded at its end; and each frame. ``best``: each task's most accurate variants;
    ``started``: told the replay's zero (:func:`send`)."""
    import tritonclient.grpc.aio as aioclient  # gRPC: not for `accscale --help`

    loaded: dict[int, int] = {}  # window -> the stage-model instances Triton had loaded at its end
    async with aioclient.InferenceServerClient(triton_url) as triton:
        async def sample(window: int) -> None:
            await asyncio.sleep(max(0.0, begin + (window + 1) * args.window_s - time.monotonic()))
            loaded[window] = await loaded_instances(triton, models)

        begin = time.monotonic()
        frames, *_ = await asyncio.gather(send(url, arrival_s, models, args.slo_ms, started),
                                          *(sample(w) for w in range(math.ceil(args.duration_s / args.window_s))))
    stats: dict[int, Counter] = defaultdict(Counter)
    detectors: dict[int, Counter] = defaultdict(Counter)
    plans: dict[int, tuple[int, int]] = {}  # window -> (the newest plan that served a frame, its instances)
    for f in frames:
        window = int(f.sent_s // args.window_s)
        s = stats[window]
        s["sent"] += 1
        if f.answer is None:
            s["refused"] += 1
            continue
        s["objects"] += f.objects
        s["right"] += f.right
        s["rerouted"] += sum(o["outcome"] == "rerouted" for o in f.answer["objects"])
        runs = [m for m in (f.answer["detector"], *(o["model"] for o in f.answer["objects"])) if m]
        s["runs"] += len(runs)
        s["best"] += sum(m in best for m in runs)
        if f.answer["detector"]:  # none for a frame the pipeline dropped before its detector ran
            detectors[window][f.answer["detector"]] += 1
        plans[window] = max(plans.get(window, (-1, 0)), (f.answer["plan"], f.answer["instances"]))
        if f.answer["status"] == "dropped":
            s["dropped"] += 1
        elif f.client_s > args.slo_ms / 1000:
            s["late"] += 1
        else:
            s["met"] += 1
    rows = []
    for w, s in sorted(stats.items()):
        rows.append({"window_s": w * args.window_s, "sent": s["sent"], "met": s["met"], "dropped": s["dropped"],
                     "late": s["late"], "refused": s["refused"],
                     "objects_right_pct": round(100 * s["right"] / s["objects"], 1) if s["objects"] else "",
                     "instances": plans[w][1] if w in plans else "", "loaded": loaded.get(w, ""),
                     "best_pct": round(100 * s["best"] / s["runs"], 1) if s["runs"] else "",
                     "rerouted": s["rerouted"],
                     "detectors": " ".join(f"{d.removeprefix('loki_detect_')}:{n}"
                                           for d, n in detectors[w].most_common())})
    return rows, frames


async def loaded_instances(triton, models: list[str]) -> int:
    """The instances of ``models`` the Triton server (an asyncio gRPC client) has loaded."""
    index = await triton.get_model_repository_index()
    ready = [m.name for m in index.models if m.name in models and m.state == "READY"]
    # a model unloaded since the index was read is not counted
    configs = await asyncio.gather(*(triton.get_model_config(m) for m in ready), return_exceptions=True)
    return sum(g.count for c in configs if not isinstance(c, Exception) for g in c.config.instance_group)


def released(rows: list[dict], duration_s: float) -> tuple[int, int, int]:
    """The plans' instances in use: in the last window before the burst, the most in it, in the last window."""
    def used(first: float, last: float) -> list[int]:
        return [r["instances"] for r in rows if first <= r["window_s"] < last and r["instances"] != ""]

    before, burst, after = (used(0, duration_s / 3), used(duration_s / 3, 2 * duration_s / 3),
                            used(2 * duration_s / 3, duration_s))
    return before[-1] if before else 0, max(burst, default=0), after[-1] if after else 0


def stage_rows(by_stage: dict[str, dict[str, list[float]]]) -> list[dict]:
    """One row per side: each stage's p50 / p99, or "-" where no frame was served."""
    return [{"side": side, **{k: " / ".join(f"{v:g}" for v in ms) or "-" for k, ms in table.items()}}
            for side, table in by_stage.items()]


def write(out: Path, rows: list[dict], args, by_stage: dict[str, dict[str, list[float]]]) -> None:
    write_rows(rows, out / "windows.csv")
    total = {k: sum(r[k] for r in rows) for k in ("sent", "met", "dropped", "late", "refused", "rerouted")}
    before, burst, after = released(rows, args.duration_s)
    in_burst = [r for r in rows if args.duration_s / 3 <= r["window_s"] < 2 * args.duration_s / 3]
    live, sim = sum(r["met"] for r in in_burst), sum(r["sim_met"] for r in in_burst)
    short = {k: sum(r[k] for r in in_burst) for k in ("refused", "dropped", "late")}
    verdict = ("live met the burst as the simulator says it should" if live >= 0.9 * sim else
               "live fell short of the simulation; of the burst's frames live did not meet, "
               + ", ".join(f"{v} {k}" for k, v in short.items())
               + " (refused: the sidecar dropped them before the pipeline ran, having too little time left for "
                 "its slowest path; dropped: by the pipeline, a frame or "
                 "crop without the time left for its stage and the fastest rest, or a crop past its task's budget "
                 "with no backup to take it, its wait in the sidecar and the detector's queue counted; late: "
                 "answered after the SLO)")
    summary = (f"# Loki live demo\n\n{args.base_qps:g} frames/s, {args.burst_qps:g} in the middle third, SLO "
               f"{args.slo_ms:g} ms, {args.duration_s:g} s; stage models emulated x{args.slowdown:g}; a budget of "
               f"{args.instances} instances.\n\n"
               + ", ".join(f"{k} {v}" for k, v in total.items()) + ".\n\n"
               f"Instances in use (the plans'): {before} before the burst, up to {burst} in it, {after} at the end: "
               f"{burst - after} released in the quiet period.\n\n"
               f"Simulated beside it: {sum(r['sim_met'] for r in rows)} of {total['sent']} met. In the burst live met "
               f"{live} frames, the simulation {sim}: {verdict}.\n\n" + markdown_table(rows, list(rows[0])) + "\n\n"
               "Where a served frame's time went, from its arrival at the sidecar, ms (p50 / p99; queue: to its "
               "sending to the pipeline, detect: then to its detector's result, classify: then to its last label, "
               "answer: then to the sidecar's answer):\n\n"
               + markdown_table(stage_rows(by_stage), ["side", *stages.STAGES]) + "\n")
    (out / "summary.md").write_text(summary)
    print(summary)
