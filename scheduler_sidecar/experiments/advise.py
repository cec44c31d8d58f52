"""``accscale advise``: which system serves this profile and this traffic best, decided by simulating them all.

Every online policy of the five systems that takes the profile runs over the trace in the simulator (the engine
the sidecar runs live), with the same workers and SLO, once per ``--seeds`` seed of the latency noise (each
batch's latency drawn between the profile's p50 and p99), as the sidecar would serve it: with admission, late
queries dropped, and a query met when it ends ``--overhead-ms`` before its deadline (the time a client's request
spends outside the sidecar's view: what the client sees). SlackFit and its baselines (MaxAcc, MaxBatch, Clipper+,
INFaaS), RAMSIS with its MDP policies generated now for the trace's loads, Jellyfish+ and ModelSwitching, and
Proteus's planner (its MILP placing variants on the workers, re-planning on its period and on bursts, models
loading in the profile's load times) with its adaptive batching. Loki and HybridServe plan a pipeline and a
cascade, which a family's profile does not describe: they are listed as not applicable, as is a policy that
refuses the profile, with the reason. The rest are ranked by mean SLO
attainment, then mean accuracy; each figure's spread over the seeds is its min..max, and a system whose
attainment spread overlaps the one above's is marked tied.

The simulations run ``--jobs`` at a time, a process each. The traffic is a trace file, or a trace generator's
settings (``--trace-gen``, as ``accscale trace gen`` takes them).

Written to ``--out``: ``advise.csv``, ``summary.md``, ``attainment.png`` and ``advised.toml``, the winner's sidecar
config, ready for ``accscale serve --config``.

``--replay N`` then checks the prediction live: the top N systems in turn (the winner, the runner-up, ...) are
served by a sidecar on their config in front of the ``--triton`` workers, and the trace is replayed through it
with Locust, sending ``--data``'s rows. The table gets each one's SLO attainment and accuracy at the client
beside the simulated ones, and ``live/<policy>/`` keeps each replay's request log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from loadtest.commands import generated
from loadtest.loadtest_cli import Replay, replay, save_payloads
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.simulate import load_queries, simulated
from scheduler_sidecar.processes.sidecar import SidecarServer
from scheduler_sidecar.sim.results import markdown_table, write_rows
from scheduler_sidecar.sim.simulator import SimConfig
from scheduler_sidecar.systems import option_names, policy_class, systems

SEEDS = 3
OVERHEAD_MS = 0.3  # the sidecar's default overhead_us
RAMSIS_LOAD_QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)  # of the trace's per-second rate: the loads RAMSIS plans for
# the planned policies advise simulates on a family's profile; what the others' planners plan instead
PLANNED = frozenset({"proteus"})
PLANS = {"loki": "pipeline (a BLS model of tasks; `accscale demo loki`)",
         "hybridserve": "cascade (a BLS model over a family; `accscale demo hybridserve`)"}
FIRST_GRPC_PORT, PORT_STEP = 8001, 10  # where advised.toml expects the Tritons: `accscale triton --grpc-port`


@dataclass(frozen=True)
class Ranked:
    system: str
    policy: str
    attainment: tuple[float, ...]  # one per seed
    accuracy: tuple[float, ...]
    options: dict  # what the policy was built with beyond the profile
    planner: str | None = None  # the planner it routes for (a [planner] of its config)
    live: dict | None = None  # its replay's summary at the client (``--replay``)

    @property
    def mean_attainment(self) -> float:
        return float(np.mean(self.attainment))

    @property
    def mean_accuracy(self) -> float:
        return float(np.mean(self.accuracy))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("advise", help="simulate every system on your profile and traffic; the best one's "
                                             "sidecar config", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, required=True, help="the family's profile (e.g. `accscale profile triton`)")
    traffic = p.add_mutually_exclusive_group(required=True)
    traffic.add_argument("--trace", type=Path,
                         help="arrivals, one 'arrival_s[,slo_ms[,payload]]' per line (`accscale trace gen` writes one)")
    traffic.add_argument("--trace-gen", metavar="SETTINGS",
                         help="a trace generator's settings instead, as `accscale trace gen` takes them, e.g. "
                              "\"bursty --base-qps 30 --variant-qps 70 --cv2 8 --duration-s 86400\" (written to "
                              "OUT/trace.txt)")
    p.add_argument("--slo-ms", type=float, required=True, help="the SLO of trace lines without one")
    p.add_argument("--workers", type=int, default=1, help="Triton workers, one model at a time each (default: 1)")
    p.add_argument("--device", help="the profile's device kind to plan on (default: its first)")
    p.add_argument("--overhead-ms", type=float, default=OVERHEAD_MS,
                   help="time per request outside the sidecar's view (client, network), taken off every deadline in "
                        f"the simulation and given to the sidecar as overhead_us (default: {OVERHEAD_MS:g}, the "
                        "sidecar's; a replay measures it: live_unseen_p90_ms)")
    p.add_argument("--seeds", type=int, default=SEEDS, help=f"seeds of the latency noise per system (default: {SEEDS})")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="simulations run at once, a process each (default: this machine's cores)")
    p.add_argument("--policies", help="comma-separated policies to compare (default: every one that takes the profile)")
    p.add_argument("--triton", action="append", metavar="HOST:PORT",
                   help="a Triton worker's gRPC endpoint, once per worker, for the configs and --replay (default: "
                        f"127.0.0.1:{FIRST_GRPC_PORT}, then every {PORT_STEP} ports)")
    p.add_argument("--replay", type=int, default=0, metavar="N",
                   help="serve the top N systems in turn in front of the Tritons and replay the trace with Locust: "
                        "live SLO attainment and accuracy beside the simulated (default: 0, none)")
    p.add_argument("--data", type=Path, help="with --replay: the rows to send, an .npz of the model's one input "
                                             "and 'labels' (as `accscale profile triton --data` reads)")
    p.add_argument("--out", type=Path, required=True, help="where the table, report and config go")
    p.add_argument("--json", action="store_true", help="print one JSON object: the ranking and the config's path")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.seeds < 1 or args.workers < 1 or args.jobs < 1 or args.replay < 0 or not args.overhead_ms >= 0:
        raise ConfigError("--seeds, --workers and --jobs must be >= 1, --replay and --overhead-ms >= 0")
    tritons = args.triton or [f"127.0.0.1:{FIRST_GRPC_PORT + PORT_STEP * k}" for k in range(args.workers)]
    if len(tritons) != args.workers:
        raise ConfigError(f"--workers is {args.workers} but --triton names {len(tritons)}: one per worker")
    if args.replay and args.data is None:
        raise ConfigError("--replay sends rows of --data (an .npz of the model's input and 'labels'); give one")
    profile = Profile.load(args.profile)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.trace_gen is not None:
        args.trace = args.out / "trace.txt"
        generated(args.trace_gen).save(args.trace)
    arrival_us, deadline_us = load_queries(args.trace, args.slo_ms)
    if not len(arrival_us):
        raise ConfigError(f"{args.trace}: no arrivals")
    # the sidecar takes overhead_us off every slack; so does an earlier deadline, which also judges each query as
    # its client would (one overhead later)
    client_deadline_us = deadline_us - round(args.overhead_ms * 1000)
    registry = systems()
    owner = {p.name: s.name for s in registry for p in s.policies}
    planned = {s.planner.policy: s.planner.kind for s in registry if s.planner is not None}
    names = args.policies.split(",") if args.policies else list(owner)
    loads = ramsis_loads(arrival_us)
    refused, runs = {}, {}
    for name in names:
        if name in planned and name not in PLANNED:
            refused[name] = (f"routes for {planned[name]}'s planner, which plans a {PLANS[planned[name]]}: "
                             "this profile is a family of separate models")
            continue
        options = {"device": args.device, "slo_ms": args.slo_ms, "workers": args.workers, "loads": loads}
        runs[name] = {k: v for k, v in options.items() if k in option_names(policy_class(name)) and v is not None}
    tasks = [(name, seed, options) for name, options in runs.items() for seed in range(args.seeds)]
    _progress(f"simulating {len(runs)} policies x {args.seeds} seed(s) over {len(arrival_us)} queries, "
              f"{min(args.jobs, len(tasks))} at a time")
    simulate = partial(_simulate, profile=profile, arrival_us=arrival_us, deadline_us=client_deadline_us, args=args)
    with contextlib.ExitStack() as stack:
        # forkserver, not fork: a process that already holds gRPC's threads (a test, or a caller that profiled
        # through Triton) forks children that spin in them
        pool = (stack.enter_context(ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context(
            "forkserver"))) if args.jobs > 1 and len(tasks) > 1 else None)
        results = list(pool.map(simulate, tasks) if pool else map(simulate, tasks))
    ranked = []
    for name, options in runs.items():
        mine = [r for (task_name, _, _), r in zip(tasks, results) if task_name == name]
        failed = next((r for r in mine if isinstance(r, str)), None)
        if failed is not None:
            refused[name] = failed
            continue
        ranked.append(Ranked(owner[name], name, tuple(r["slo_attainment"] for r in mine),
                             tuple(r["mean_serving_accuracy"] for r in mine),
                             {k: v for k, v in options.items() if k != "device"}, planned.get(name)))
    if not ranked:
        raise ConfigError(f"no policy takes {args.profile}: " + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    ranked.sort(key=lambda r: (-r.mean_attainment, -r.mean_accuracy))
    configs = [args.out / ("advised.toml" if k == 0 else f"rank-{k + 1}.toml") for k in range(max(1, args.replay))]
    for r, path in zip(ranked, configs):
        path.write_text(sidecar_config(r, args.profile, profile, tritons, args))
    config_path = configs[0]
    if args.replay:
        payloads = save_payloads(args.out / "payloads.npz", *_rows(args.data))
        ranked[:args.replay] = [_live(r, path, profile.name, payloads, tritons, args)
                                for r, path in zip(ranked, configs)]
    rows = table(ranked)
    write_rows(rows, args.out / "advise.csv")
    _plot(args.out / "attainment.png", ranked)
    (args.out / "summary.md").write_text(_summary(rows, refused, args, len(arrival_us), config_path))
    if args.json:
        print(json.dumps({"ranking": rows, "not_applicable": refused, "config": str(config_path)}))
    else:
        print(markdown_table(rows, list(rows[0])))
        print(f"\nadvised: {ranked[0].policy} ({ranked[0].system}); its sidecar config: {config_path}")
    return 0


def _simulate(task: tuple[str, int, dict], *, profile: Profile, arrival_us: np.ndarray, deadline_us: np.ndarray,
              args: argparse.Namespace) -> dict | str:
    """One policy and seed simulated: its summary, or why the policy does not take the profile."""
    name, seed, options = task
    started = time.perf_counter()
    try:
        summary = (_planned if name in PLANNED else _unplanned)(name, profile, arrival_us, deadline_us, seed, args,
                                                                 options)
    except ConfigError as exc:
        _progress(f"{name}: does not take this profile ({exc})")
        return str(exc)
    _progress(f"{name}: seed {seed + 1} of {args.seeds}: SLO attainment {summary['slo_attainment']:.4f} "
              f"({time.perf_counter() - started:.1f} s)")
    return summary


def _unplanned(name: str, profile: Profile, arrival_us: np.ndarray, deadline_us: np.ndarray, seed: int,
               args: argparse.Namespace, options: dict) -> dict:
    """A policy that needs no planner, on ``args.workers`` workers holding every model."""
    config = SimConfig(workers=args.workers, seed=seed, latency_noise="tail")
    return simulated(name, profile, arrival_us, deadline_us, config, admission=True, late_queries="drop",
                     **options).summary()


def _planned(name: str, profile: Profile, arrival_us: np.ndarray, deadline_us: np.ndarray, seed: int,
             args: argparse.Namespace, options: dict) -> dict:
    """Proteus: its planner places the profile's models on ``args.workers`` devices of the profile's kind, from the
    trace's first 10 s of demand, each load taking the profile's load time; its policy routes and batches."""
    from scheduler_sidecar.experiments.proteus.systems import SYSTEMS as PROTEUS  # lazy: PuLP
    from scheduler_sidecar.experiments.proteus.systems import Setup, simulate_queries

    device = args.device or profile.device_kinds[0]
    start_s = (arrival_us - arrival_us[0]) / 1e6
    initial = {profile.name: float(np.count_nonzero(start_s < 10.0)) / min(10.0, max(1.0, start_s[-1]))}
    setup = Setup({profile.name: profile}, {device: args.workers}, args.slo_ms, latency_noise="tail", admission=True)
    return simulate_queries(PROTEUS[name], setup, [profile.name], arrival_us, deadline_us,
                            [profile.name] * len(arrival_us), initial, seed=seed).result.summary()


def _rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The rows a replay sends, and their labels: an .npz of one input array and ``labels``."""
    try:
        data = np.load(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not an .npz ({exc})") from None
    inputs = [k for k in data.files if k != "labels"]
    if "labels" not in data.files or len(inputs) != 1:
        raise ConfigError(f"{path}: --replay needs one input array and 'labels'; it has {data.files}")
    return data[inputs[0]], data["labels"]


def _live(ranked: Ranked, config: Path, model: str, payloads: Path, tritons: list[str],
          args: argparse.Namespace) -> Ranked:
    """``ranked`` served live on ``config`` in front of ``tritons``, the trace replayed with Locust."""
    out = args.out / "live" / ranked.policy
    _progress(f"{ranked.policy}: serving it live on {config.name}, replaying {args.trace.name} with Locust")
    with SidecarServer(workers=tritons, config=config) as sidecar:
        run = replay([Replay(model, args.trace, payloads)], sidecar.grpc_url, out, name=ranked.policy,
                     slo_ms=args.slo_ms, progress_s=0)
    return replace(ranked, live=run["summary"])


def ramsis_loads(arrival_us: np.ndarray) -> list[float]:
    """Loads (q/s) for RAMSIS's MDP policies: quantiles of the trace's rate per second, at least 1 q/s."""
    seconds = np.bincount(arrival_us // 1_000_000)
    return sorted({max(1.0, round(float(np.quantile(seconds, q)), 1)) for q in RAMSIS_LOAD_QUANTILES})


def table(ranked: list[Ranked]) -> list[dict]:
    """One row per system, best first; ``tied``: its attainment's min..max overlaps the one above's; with a replay,
    the live figures and how many points the live attainment is above the simulated mean."""
    rows = []
    for i, r in enumerate(ranked):
        above = ranked[i - 1] if i else None
        tied = above is not None and max(r.attainment) >= min(above.attainment)
        rows.append({"rank": i + 1, "system": r.system, "policy": r.policy,
                     "slo_attainment": round(r.mean_attainment, 4),
                     "attainment_min": round(min(r.attainment), 4), "attainment_max": round(max(r.attainment), 4),
                     "accuracy": round(r.mean_accuracy, 4), "tied_with_above": tied, "seeds": len(r.attainment)})
        if any(x.live for x in ranked):  # replayed: its figures at the client, blank for those not replayed
            live = r.live or {}
            attained = live.get("slo_attainment")
            rows[-1].update(live_attainment="" if attained is None else round(attained, 4),
                            live_accuracy=round(live["mean_serving_accuracy"], 4) if live else "",
                            live_minus_simulated_points="" if attained is None else
                            round(100 * (attained - r.mean_attainment), 2),
                            # what the sidecar met by its own clock, and the time its requests spent outside it
                            live_sidecar_attainment=round(live["server_attainment"], 4) if live else "",
                            live_unseen_p90_ms=round(live["unseen_p90_ms"], 2) if live else "")
    return rows


def sidecar_config(best: Ranked, profile_path: Path, profile: Profile, tritons: list[str],
                   args: argparse.Namespace) -> str:
    """A system behind the sidecar: its policy built with the options it was simulated with (RAMSIS's MDP
    policies are generated again from them when the sidecar starts), in front of ``tritons``."""
    workers = ", ".join(json.dumps(url) for url in tritons)
    options = "".join(f"{k} = {json.dumps(v)}\n" for k, v in sorted(best.options.items()))
    planner = f'[planner]\nkind = "{best.planner}"\n' if best.planner else ""
    return (f"# advised by `accscale advise` for {args.trace} at an SLO of {args.slo_ms:g} ms on {args.workers} "
            f"worker(s):\n# {best.policy} ({best.system}), SLO attainment {best.mean_attainment:.4f}, accuracy "
            f"{best.mean_accuracy:.4f} simulated. Start the Tritons, then: accscale serve --config <this file>\n"
            f"workers = [{workers}]  # Triton gRPC endpoints\n{planner}\n"
            f"[[models]]\nname = {json.dumps(profile.name)}\nprofile = {json.dumps(str(profile_path.absolute()))}\n"
            f"policy = {json.dumps(best.policy)}\ndefault_slo_us = {round(args.slo_ms * 1000)}\n"
            f"overhead_us = {round(args.overhead_ms * 1000)}\n"
            + (f"[models.policy_options]\n{options}" if options else ""))


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def spread(ranked: list[Ranked]) -> list[list[float]]:
    """Each policy's error bar below and above its mean attainment: to its seeds' min and max, clipped at 0, since
    seeds that agree leave a float mean a rounding error outside their min..max (and matplotlib refuses a negative
    bar)."""
    means = [r.mean_attainment for r in ranked]
    return [[max(0.0, m - min(r.attainment)) for m, r in zip(means, ranked)],
            [max(0.0, max(r.attainment) - m) for m, r in zip(means, ranked)]]


def _plot(path: Path, ranked: list[Ranked]) -> None:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r.policy for r in ranked], [r.mean_attainment for r in ranked], yerr=spread(ranked), capsize=3,
           color="tab:blue")
    ax.set_ylabel("SLO attainment (simulated)")
    ax.set_ylim(0, 1.02)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _summary(rows: list[dict], refused: dict[str, str], args: argparse.Namespace, queries: int,
             config_path: Path) -> str:
    lines = [f"# accscale advise: {args.profile.name} on {args.trace.name}", "",
             f"{queries} queries, SLO {args.slo_ms:g} ms, {args.workers} worker(s), {args.seeds} seed(s) of the "
             "latency noise per system; ranked by mean SLO attainment, then mean accuracy.", "",
             markdown_table(rows, list(rows[0])), "", "![attainment](attainment.png)", "",
             f"Advised: **{rows[0]['policy']}** ({rows[0]['system']}); its sidecar config: `{config_path.name}`."]
    if refused:
        lines += ["", "Not applicable to this profile:", ""] + [f"- {k}: {v}" for k, v in refused.items()]
    return "\n".join(lines) + "\n"
