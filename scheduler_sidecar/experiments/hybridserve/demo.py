"""``accscale demo hybridserve``: HybridServe's cascade live, against the largest model alone on the same instances.

Builds (or reuses) the family trained here (:mod:`export.cascade_models`, four CNNs, each its own Triton model)
and the cascade's BLS model, and starts one Triton server whose models run ``--slowdown`` times slower than this
machine. Each batch sleeps to its profiled latency times that: an emulated slower device, so a model's cost is well
above a BLS hop's. By default the largest model takes two seconds over a batch of 32, whatever this machine's speed.
Then, for the largest model alone, and AP and EO each on the whole family and as Algorithm 2 prunes them (the
models it keeps, with skip connections where they pay), in turn:

1. plan: HybridServe's planner (the one ``[planner] kind = "hybridserve"`` runs in the sidecar) makes the
   deployment's plan: the cascade the BLS runs, and the replicas R ∝ ρl within ``--instances`` (the largest alone
   gets them all), rounded as ``--replicas`` says, as Triton instance counts (a reload with a config override);
2. saturation: ``--clients`` closed-loop clients send batches of 32 test images straight to Triton (the BLS, or
   the largest model alone); throughput over ``--saturate-s`` after ``--warmup-s``, and worker-seconds per request
   over the requests answered: busy (Triton's statistics, emulated sleep included) and compute (the models' own
   count, sleep left out), and energy per request: the GPUs' NVML counters where the host has them, whatever the
   emulation, else the CPU power model over the compute worker-seconds, named as such. Three predictions of the throughput against the largest alone: Algorithm 1's
   e_n / Σρe (every model at full batches), the batched one, where model i runs ⌈ρ_i 32⌉ rows of each batch of 32
   (§V-C), both with replicas in exact proportion to the work, and the deployed instances' (the busiest model's
   capacity);
3. replay: the sidecar in front, with the same planner (``[planner] kind = "hybridserve"``: it searches and prunes
   again, deterministically, and sends its cascade with every batch; the cascade is a logical model with an SLO,
   policy ``cascade``), a bursty trace of single images (gamma, CV² 4) at ``--rate-qps`` for ``--duration-s`` with
   ``tritonclient``: met, late, refused, accuracy, the share each model answered, and answers given early because
   the SLO left no time for the next model.

Written to --out: ``modes.csv``, ``pruning.csv`` (AP and EO, unpruned beside pruned), ``replay.csv`` and
``summary.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from export.presets import DEFAULT_BUILD_DIR
from loadtest.traces import gamma
from python_backend.cascade import EARLY
from python_backend.emulation import COMPUTE_METRIC
from scheduler_sidecar.core.plan import Demand
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.experiments.deployment import Request, open_loop
from scheduler_sidecar.experiments.hybridserve.energy import NvmlMeter, nvml_meter, per_request_mj
from scheduler_sidecar.processes.sidecar import SidecarServer
from scheduler_sidecar.processes.triton_launcher import TritonServer
from scheduler_sidecar.sim.results import markdown_table, write_rows
from scheduler_sidecar.systems.hybridserve.family import Family
from scheduler_sidecar.systems.hybridserve.live import DEFAULT_CONFIG, HybridServeConfig, HybridServePlanner
from scheduler_sidecar.systems.hybridserve.placement import BALANCED, NEAREST
from scheduler_sidecar.systems.hybridserve.planner import OperatingPoint, operating_points, pruned_point
from scheduler_sidecar.systems.hybridserve.pruning import prune
from scheduler_sidecar.systems.hybridserve.search import search

MODEL = "digits-cascade"  # the logical model clients call
BLS = "cascade"
# cascade batches in flight at once: a BLS instance holds its batch through every hop, so four per model instance,
# so that the bottleneck model seldom waits for one
BLS_INSTANCES = 64
# the default emulated device: long beside a BLS hop, short beside a measured window, and slow enough that the largest
# model alone cannot keep up with a replay this machine's two cores can send through the sidecar
LARGEST_BATCH_MS = 2000.0
ROWS = 32  # images per saturation request
# (row name, mode, pruned by Algorithm 2): the largest model alone, and AP and EO on the whole family and pruned
DEPLOYMENTS = (("largest", "largest", False), ("ap", "ap", False), ("ap-pruned", "ap", True), ("eo", "eo", False),
               ("eo-pruned", "eo", True))


def register(demos: argparse._SubParsersAction) -> None:
    p = demos.add_parser("hybridserve", help="HybridServe's cascade live behind the sidecar",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=16, help="model instances per mode (default: 16)")
    p.add_argument("--replicas", choices=(NEAREST, BALANCED), default=NEAREST,
                   help="how the replicas R ∝ ρl are rounded: as the paper does (nearest, the default) or with the "
                        "busiest model least busy (balanced)")
    p.add_argument("--slowdown", type=float,
                   help="models run this many times slower than measured here (default: the largest model's batch "
                        f"of {ROWS} takes {LARGEST_BATCH_MS:g} ms)")
    p.add_argument("--bls-instances", type=int, default=BLS_INSTANCES,
                   help=f"instances of the cascade's BLS model, each a batch through every hop at once (default: "
                        f"{BLS_INSTANCES})")
    p.add_argument("--clients", type=int,
                   help="closed-loop clients when saturating (default: one per BLS instance)")
    p.add_argument("--warmup-s", type=float, default=5.0,
                   help="seconds of saturation before the measured window (default: 5)")
    p.add_argument("--saturate-s", type=float, default=10.0, help="seconds measured per mode (default: 10)")
    p.add_argument("--rate-qps", type=float, default=400.0,
                   help="the replay's mean rate (default: 400, above the largest model's capacity alone)")
    p.add_argument("--duration-s", type=float, default=20.0, help="the replay's length per mode (default: 20)")
    p.add_argument("--slo-ms", type=float, default=4000.0, help="every request's SLO in the replay (default: 4000)")
    p.add_argument("--modes", type=_modes, default=("ap", "eo"),
                   help="the cascades run beside the largest model alone, each on the whole family and pruned: "
                        "'ap', 'eo' or 'ap,eo' (default: ap,eo)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where builds are cached (default: build)")
    p.add_argument("--out", type=Path, help="where the results go (default: runs/hybridserve-demo-<time>)")
    p.set_defaults(func=run)


def _modes(value: str) -> tuple[str, ...]:
    modes = tuple(dict.fromkeys(m.strip() for m in value.split(",") if m.strip()))
    if not modes or not set(modes) <= {"ap", "eo"}:
        raise argparse.ArgumentTypeError(f"--modes takes 'ap', 'eo' or 'ap,eo', got {value!r}")
    return modes


def run(args: argparse.Namespace) -> int:
    from export.cascade_models import build  # lazy: onnx, torch

    out = args.out or Path("runs") / time.strftime("hybridserve-demo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    stamp = build(args.build_dir / "hybridserve")
    family = Family.load(stamp)
    args.slowdown = args.slowdown or default_slowdown(family)
    period_s = args.slowdown * family.models[-1].latency.p50_at(ROWS) / 1000
    config = HybridServeConfig(args.instances, args.replicas, args.slowdown)
    deployed = planners(family, config, args.modes)
    args.clients = args.clients or args.bls_instances
    repo = write_bls(family, deployed[f"{args.modes[0]}-pruned"].bls_plan, args.bls_instances)
    images, labels = family.images("test")
    # the GPUs' counters wherever there are GPUs: an emulated device's sleep is read as the idle power it is
    meter = nvml_meter()
    if meter is None:
        print("no GPU with an NVML energy counter here: energy is the CPU power model over compute worker-seconds")
    modes, replays = [], []
    with TritonServer(repository=repo, models=[*family.names, BLS], emulate_slowdown=args.slowdown) as triton:
        for name, mode, prune in _deployments(args.modes):
            planner = deployed[name]
            point, plan = planner.point, planner.plan(0, Demand(0, 0, {}))
            set_instances(triton.grpc_url, plan.instances)
            replicas = tuple(planner.replicas.values())
            print(f"{name}: models {' '.join(point.cascade.models)}, skip {point.cascade.skip}, instances "
                  f"{dict(planner.replicas)}")
            params = {} if mode == "largest" else {"cascade_plan": json.dumps(plan.detail.bls)}
            measured = asyncio.run(_saturate(triton.grpc_url, triton.metrics_url, planner.bls, point.cascade.models,
                                             images, params, meter, period_s, args))
            modes.append({"mode": name, "models": " ".join(_short(m) for m in point.cascade.models),
                          "skip": point.cascade.skip, "instances": " ".join(map(str, replicas)),
                          "alg1_cost_us": round(1e6 * point.validation.cost, 3),
                          "batched_cost_us": round(1e6 * point.batched_cost(family, ROWS), 3),
                          "capacity_rps": round(point.capacity_rps(family, replicas, ROWS) / args.slowdown, 1),
                          **measured})
            path = out / f"sidecar-{name}.toml"
            path.write_text(sidecar_config(stamp, cascade_profile(out / f"profile-{name}.json", family, point,
                                                                  args.slowdown), mode, prune, config, args.slo_ms))
            with contextlib.ExitStack() as stack:
                sidecar = stack.enter_context(SidecarServer(workers=[triton.grpc_url], config=path))
                replays.append({"mode": name, **asyncio.run(_replay(sidecar.grpc_url, point.cascade.models,
                                                                    family.names, images, labels, args))})
    _write(out, modes, replays, args)
    return 0


def _deployments(modes: tuple[str, ...]) -> list[tuple[str, str, bool]]:
    """DEPLOYMENTS' entries for the largest model alone and ``modes``."""
    return [d for d in DEPLOYMENTS if d[1] == "largest" or d[1] in modes]


def planners(family, config, modes: tuple[str, ...] = ("ap", "eo")) -> dict:
    """The planners of the largest alone and each of ``modes``, whole and pruned, Algorithm 1 run once for all of
    them (the sidecar's, from the same family and search settings, finds the same cascades)."""
    search_split = family.predictions("search")
    result = search(search_split, family.costs)
    whole = operating_points(family, result=result)
    built = {}
    for name, mode, pruned in _deployments(modes):
        point = (pruned_point(family, prune(search_split, family.costs, mode, searched=result), mode) if pruned
                 else whole[mode])
        # the largest alone is served by its own Triton model, not through the BLS
        built[name] = HybridServePlanner(family, point, family.names[-1] if mode == "largest" else BLS, config)
    return built


def default_slowdown(family: Family) -> float:
    """The emulated device on which the largest model takes LARGEST_BATCH_MS over a batch of ROWS (a derived factor
    under 1, on a machine slower than that device, runs the models as they are)."""
    return max(1.0, LARGEST_BATCH_MS / family.models[-1].latency.p50_at(ROWS))


def write_bls(family: Family, plan: dict, instances: int = BLS_INSTANCES) -> Path:
    """The cascade's BLS model, ``plan`` its default, beside the family's models; returns their repository."""
    from export import repository  # lazy: onnx, torch

    repo = family.folder / "repository"
    repository.write_cascade(repo, BLS, plan, family.names, max_batch_size=ROWS, instances=instances)
    return repo


def sidecar_config(stamp: Path, profile: Path, mode: str, prune: bool, config: HybridServeConfig,
                   slo_ms: float, model: str = MODEL) -> str:
    """The sidecar's config: HybridServe's planner deploying ``mode`` of the family ``stamp`` with ``config`` (a
    ``[[planners]]`` entry), and the cascade (``profile``) the logical model ``model``, its only one."""
    # the planner's period and device speeds where they are not its defaults
    speeds = ", ".join(f"{json.dumps(kind)} = {speed}" for kind, speed in config.device_speeds.items())
    return (f'[[planners]]\nkind = "hybridserve"\nfamily = "{stamp.absolute()}"\nmode = "{mode}"\n'
            f'prune = {str(prune).lower()}\ninstances = {config.instances}\nrounding = "{config.rounding}"\n'
            f'slowdown = {config.slowdown}\n'
            + (f"period_s = {config.period_s}\n" if config.period_s != DEFAULT_CONFIG.period_s else "")
            + (f"device_speeds = {{ {speeds} }}\n" if speeds else "")
            + f'[[models]]\nname = "{model}"\nprofile = "{profile.absolute()}"\npolicy = "cascade"\n'
            # admission off: the cascade's simulation (which bench fidelity compares with this deployment) has
            # none at the cascade's door, and HybridServe's paper serves every request
            f'default_slo_us = {round(slo_ms * 1000)}\nlatency_calibration = false\nadmission = false\n')


def _short(model: str) -> str:
    return model.removeprefix("cascade_")


def set_instances(url: str, instances: dict[str, int], *, batcher: bool = True) -> None:
    """Each model's instance count, by a reload with a config override; without Triton's dynamic batcher where
    ``batcher`` is false (the sidecar forms every batch: the batcher would merge two of its batches that arrive
    together into one instance while another idles)."""
    import tritonclient.grpc as grpcclient  # lazy: tritonclient

    client = grpcclient.InferenceServerClient(url)
    for model, count in instances.items():
        config = client.get_model_config(model, as_json=True)["config"]
        config["instance_group"] = [{"count": count, "kind": "KIND_CPU"}]
        if not batcher:
            config.pop("dynamic_batching", None)
        client.load_model(model, config=json.dumps(config))


async def _busy_s(client, models: tuple[str, ...]) -> float:
    """The models' busy seconds so far, from Triton's statistics: input, infer and output time per batch executed
    (a request's own statistics would count a batch once per request merged into it)."""
    busy = 0
    for s in (await client.get_inference_statistics(as_json=True))["model_stats"]:
        if s["name"] in models:
            for b in s.get("batch_stats", []):
                busy += sum(int(b.get(k, {}).get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output"))
    return busy / 1e9


def _compute_s(metrics_url: str, models: tuple[str, ...]) -> float:
    """The models' compute seconds so far, emulated sleep left out: their counter on Triton's metrics endpoint."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy from the environment
    with opener.open(metrics_url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(COMPUTE_METRIC + "{") and any(f'model="{m}"' in name for m in models):
            total += float(value)
    return total


async def _saturate(url: str, metrics_url: str, target: str, models: tuple[str, ...], images: np.ndarray,
                    params: dict, meter: NvmlMeter | None, period_s: float, args) -> dict:
    """Closed-loop clients, started one after another over the first half of ``--warmup-s``, send batches of ROWS
    images until the measured window after the warm-up has passed, then stop.

    Throughput is the answers within the window over its length; the drain after it is not counted, where the
    cascade's models fall idle one after another while the largest alone stays busy. The window is a whole number
    of ``period_s``, the largest model's batch time (at least one, about ``--saturate-s``): its instances run
    fixed-time batches back to back and answer in clumps, once a period each, so a window of whole periods counts
    each of them the same number of times wherever it starts. Worker-seconds per request are the models' compute
    time (busy: Triton's, emulated sleep included) over every request of the run: nothing is in flight before the
    first or after the last, so each request's work is counted once. Energy per request likewise: the GPUs' where
    ``meter`` reads them, else the CPU power model's for the compute time
    (:mod:`~scheduler_sidecar.experiments.hybridserve.energy`)."""
    import tritonclient.grpc.aio as aioclient  # lazy: tritonclient

    output = "LOGITS" if target in models and len(models) == 1 else "LABEL"
    answers: list[float] = []  # when each request was answered
    running = True
    async with aioclient.InferenceServerClient(url) as client:
        async def loop(k: int) -> None:
            await asyncio.sleep(k * args.warmup_s / 2 / args.clients)
            i = k * ROWS
            while running:
                x = images[np.arange(i, i + ROWS) % len(images)]
                tensor = aioclient.InferInput("INPUT", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                await client.infer(target, [tensor], outputs=[aioclient.InferRequestedOutput(output)],
                                   parameters=params)
                answers.append(time.monotonic())
                i += ROWS * args.clients

        window_s = period_s * max(1, round(args.saturate_s / period_s))
        joules, busy = meter.joules() if meter else 0.0, await _busy_s(client, models)
        compute, start = await asyncio.to_thread(_compute_s, metrics_url, models), time.monotonic()
        clients = asyncio.gather(*(loop(k) for k in range(args.clients)))
        await asyncio.sleep(args.warmup_s + window_s)
        running = False
        await clients
        busy = await _busy_s(client, models) - busy
        compute = await asyncio.to_thread(_compute_s, metrics_url, models) - compute
        joules = meter.joules() - joules if meter else 0.0
    times = np.array(answers) - start
    in_window = np.count_nonzero((times > args.warmup_s) & (times <= args.warmup_s + window_s))
    energy_mj, source = per_request_mj(meter, joules, compute, ROWS * len(answers))
    return {"throughput_rps": round(ROWS * in_window / window_s, 1),
            "busy_ms_per_request": round(1000 * busy / (ROWS * len(answers)), 4),
            "worker_ms_per_request": round(1000 * compute / (ROWS * len(answers)), 4),
            "energy_mj_per_request": round(energy_mj, 3), "energy_source": source}


def cascade_profile(path: Path, family: Family, point: OperatingPoint, slowdown: float, bls: str = BLS,
                    speeds: Mapping[str, float] | None = None) -> Path:
    """The cascade as one variant, for the sidecar's admission and queue, written to ``path``: at batch b, the sum
    over its models of their latency at their share of the batch (escalations run one after another); served by
    the BLS model ``bls``; on each device kind of ``speeds`` at its speed (default: this machine's ``cpu``)."""
    index = [family.names.index(m) for m in point.cascade.models]
    curves = [family.models[i].latency for i in index]
    sizes = curves[0].batch_sizes
    ms = tuple(slowdown * sum(c.p50_at(max(1, int(np.ceil(rho * b)))) for c, rho in zip(curves, point.test.reach))
               for b in sizes)
    actuation = (Actuation("pipeline", bls, path=point.cascade.models) if len(index) > 1
                 else Actuation("model", point.cascade.models[0]))
    Profile(f"cascade-{point.mode}", f"{family.folder} x{slowdown:g}",
            (Variant("cascade", point.test.accuracy, actuation,
                     {kind: LatencyCurve(sizes, ms, ms).scaled(1 / speed)
                      for kind, speed in (speeds or {"cpu": 1.0}).items()}),)).save(path)
    return path


async def _replay(url: str, cascade: tuple[str, ...], names: list[str], images: np.ndarray, labels: np.ndarray,
                  args) -> dict:
    arrivals = gamma(args.rate_qps, 4.0, args.duration_s, seed=0).arrival_s
    answers = await open_loop(url, arrivals, lambda i: Request(MODEL, {"INPUT": images[i % len(images)][None]}, {}))
    counts: Counter = Counter()
    by_model: Counter = Counter()
    for a in answers:
        if a.result is None:
            counts["refused"] += 1
            continue
        counts["late" if a.latency_s > args.slo_ms / 1000 else "met"] += 1
        if len(cascade) == 1:
            label, model, reason = int(a.result.as_numpy("LOGITS")[0].argmax()), names.index(cascade[0]), 0
        else:
            label, model, reason = (int(a.result.as_numpy(k)[0, 0]) for k in ("LABEL", "MODEL", "REASON"))
        counts["right"] += label == labels[a.index % len(labels)]
        counts["early"] += reason == EARLY
        by_model[names[model]] += 1
    answered = counts["met"] + counts["late"]
    return {"sent": len(arrivals), "met": counts["met"], "late": counts["late"], "refused": counts["refused"],
            "accuracy": round(100 * counts["right"] / max(1, answered), 2),
            # every model that answered, the cascade's or not: what the sidecar's plan had the BLS run
            "answered_by": " ".join(f"{m}:{by_model[m]}" for m in names if by_model[m]),
            "answered_early": counts["early"]}


def _write(out: Path, modes: list[dict], replays: list[dict], args) -> None:
    largest = next(m for m in modes if m["mode"] == "largest")
    for m in modes:
        m["throughput_vs_largest"] = round(m["throughput_rps"] / largest["throughput_rps"], 2)
        m["alg1_predicts"] = round(largest["alg1_cost_us"] / m["alg1_cost_us"], 2)
        m["batched_predicts"] = round(largest["batched_cost_us"] / m["batched_cost_us"], 2)
        m["replicas_predicts"] = round(m["capacity_rps"] / largest["capacity_rps"], 2)
        m["measured_over_batched"] = round(m["throughput_vs_largest"] / m["batched_predicts"], 2)
        m["measured_over_replicas"] = round(m["throughput_vs_largest"] / m["replicas_predicts"], 2)
    pruning = _pruning_rows(modes)
    write_rows(modes, out / "modes.csv")
    write_rows(pruning, out / "pruning.csv")
    write_rows(replays, out / "replay.csv")
    summary = "\n\n".join([
        "# HybridServe live demo",
        f"Models emulated x{args.slowdown:g}; {args.instances} model instances per mode; saturation: {args.clients} "
        f"closed-loop clients, batches of {ROWS}, {args.saturate_s:g} s measured after {args.warmup_s:g} s; replay "
        f"through the sidecar: {args.rate_qps:g} requests/s (gamma, CV² 4), {args.duration_s:g} s, SLO "
        f"{args.slo_ms:g} ms.",
        "## Saturation (straight to Triton)\n\n" + markdown_table(modes, list(modes[0])),
        "`worker_ms_per_request`: the models' compute worker-seconds per request (their own counter, emulated sleep "
        "left out); `busy_ms_per_request`: Triton's busy time (sleep included). `energy_source` says where the "
        "energy comes from: `nvml` (the GPUs' counters) or the CPU power model over the compute worker-seconds "
        "(no GPU here).",
        "Predicted throughput ratios against the largest alone: `alg1` from Algorithm 1's cost (full batches "
        "everywhere), `batched` from each model's share of a batch, both as if replicas were exactly proportional "
        "to the work; `replicas` from the deployed instance counts (`capacity_rps`, the busiest model's).",
        "## Pruning (Algorithm 2) live: the whole family -> the models kept, with skips where they pay\n\n"
        + markdown_table(pruning, list(pruning[0])),
        "## Replay (behind the sidecar and its HybridServe planner)\n\n" + markdown_table(replays, list(replays[0])),
    ]) + "\n"
    (out / "summary.md").write_text(summary)
    print(summary)


def _pruning_rows(modes: list[dict]) -> list[dict]:
    """AP and EO, the whole family's cascade -> the pruned one, side by side."""
    by = {m["mode"]: m for m in modes}
    rows = []
    for mode in ("ap", "eo"):
        if mode not in by:
            continue
        whole, pruned = by[mode], by[f"{mode}-pruned"]
        rows.append({"mode": mode, **{k: f"{whole[k]} -> {pruned[k]}" for k in (
            "models", "skip", "instances", "alg1_cost_us", "batched_cost_us", "busy_ms_per_request", "worker_ms_per_request",
            "capacity_rps", "throughput_rps")},
            "throughput_pruned_over_whole": round(pruned["throughput_rps"] / whole["throughput_rps"], 2)})
    return rows
