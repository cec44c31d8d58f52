"""``accscale bench fidelity --system proteus``: Proteus live against Proteus simulated.

The Proteus demo's deployment (:mod:`scheduler_sidecar.experiments.proteus.demo`): its three families, one Triton
per device of its two emulated kinds, the sidecar with the Proteus planner, a logical model per query type. Each
type has its own trace (the demo's load: ``--base-qps`` each, digits at ``--burst-qps`` in the middle third),
replayed together as one schedule. Simulated: the same planner (ProteusPlanner with the sidecar config's
ProteusConfig and no initial demand, as the sidecar builds it), the same policies (built from the same config), the
same device kinds, every worker holding every variant at the start (as each Triton starts), and what the live run
measured, from the sidecar's log and the request logs: its clock (the simulation's is the sidecar's monotonic one
less whole seconds, so that it starts when the first plan was asked for, each query arrives when the replay sent it,
and periods and the planner's one-second counts fall as they did live); each plan's solve time (a plan asked for
when the sidecar asked for one comes into force as late); each model's load time (its mean 'loaded MODEL on WORKER
in N ms', the mean of all for a model only the simulation loads); and what a batch takes beyond its profiled p50,
added to every simulated batch: the RPC and Triton's own time (service time over p50 on the worker's kind, mean over
batches) and the sidecar's turnaround between one batch's answer and the next batch's start on a worker (the median
gap before full batches that were already queued). Scored over every query: live from the sidecar's /metrics summed
over the models, simulated from the SimResult; accuracy as superserve's. Not simulated: the sidecar's warm-up (a
request per worker and model after the first plan, seconds before the replay; not counted as the planner's demand) and
the spread of the per-batch overhead (a constant in the simulation). The planner asks for a burst plan at the arrival
that tips its sliding counts (the seconds back from each arrival; ``--burst-window whole-seconds``, the rule before,
decides only at a second's first arrival, so a count one query apart or a cooldown passed by a few ms, since the
sidecar takes a query a few ms after it was sent, could move a plan by a second and part the two runs from there):
``plans`` says how many of the simulated plans were asked for when the sidecar asked for one. The client's view adds the replay's send lag and gRPC both ways (``client_delay_ms``, p50 and
p99).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from loadtest.loadtest_cli import Replay, replay, save_payloads
from loadtest.requestlog import RequestLog
from loadtest.traces import compress
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Outcome
from scheduler_sidecar.experiments.proteus import demo
from scheduler_sidecar.experiments.proteus.demo import rate_qps
from scheduler_sidecar.server.config import load
from scheduler_sidecar.server.service import model_policy
from scheduler_sidecar.sim.results import OUTCOME_CODES
from scheduler_sidecar.sim.simulator import Simulator
from scheduler_sidecar.sim.world import SimWorker, World
from scheduler_sidecar.systems.proteus import milp
from scheduler_sidecar.systems.proteus.planner import ProteusPlanner

if TYPE_CHECKING:
    from loadtest.requestlog import RequestLog
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.server.config import SidecarConfig
    from scheduler_sidecar.sim.results import SimResult
from scheduler_sidecar.experiments.deployment import LOADED, ORIGIN
from scheduler_sidecar.experiments.fidelity.common import (
    BEYOND_REACH,
    Progress,
    at_load,
    client_delay_ms,
    gaps,
    sidecar_view,
    sim_view,
)

# the sidecar's log lines the simulations take their actuation from
PLANNED = re.compile(r"plan asked for at ([\d.]+) s, ready at ([\d.]+) s \(since the start\)")

PLAN_MATCH_S = 0.1  # a simulated plan asked for this close to a live one is the same plan


def proteus(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    """See the module notes."""
    repository, paths = demo.families(args.build_dir)
    profiles = {q: Profile.load(path) for q, path in paths.items()}
    capacity = planned_capacity(profiles, args)
    if args.load is not None:  # the burst third's mix at the load asked for
        scale = at_load(args, capacity) / sum(_burst_mix(profiles, args).values())
        args.base_qps, args.burst_qps = scale * args.base_qps, scale * args.burst_qps
    traces = {q: _demo_trace(q, args, tmp / f"trace-{q}.txt", seed) for seed, q in enumerate(paths)}
    replays = [Replay(q, traces[q], save_payloads(tmp / f"payloads-{q}.npz", *demo.samples(q))) for q in paths]
    with demo.deployment(repository, paths, tmp, slo_ms=args.slo_ms, period_s=args.period_s,
                         burst_window=getattr(args, "burst_window", "sliding")) as d:
        tritons, sidecar = d.tritons, d.sidecar
        progress(f"replaying {', '.join(paths)} through the sidecar, the Proteus planner and {len(tritons)} Tritons")
        client = replay(replays, sidecar.grpc_url, tmp / "run", slo_ms=args.slo_ms, progress_s=0 if args.json else 5.0)
        server = sidecar_view(sidecar.http_url)
        log = sidecar.log_path.read_text()
    (tmp / "sidecar.log").write_text(log)
    config = load(tmp / "sidecar.toml", workers=tuple(t.grpc_url for t in tritons))
    logs = {q: RequestLog.load(tmp / "run" / m["request_log"]) for q, m in client["models"].items()}
    measured = _measured(log, client["replay_start_monotonic_s"], list(logs.values()), profiles,
                         config.worker_devices)
    sim, names, plans = _simulate_proteus(config, profiles, logs, measured)
    return gaps({
        "system": "proteus", "queries": client["summary"]["queries"],
        "live_client": client["summary"], "live_sidecar": server, "simulated": sim_view(sim.summary()),
        "by_model": {q: {"live_sidecar": server["by_model"].get(q, {}), "simulated": _scores(sim, names == q)}
                     for q in paths},
        "deployment": {"workers": dict(config.worker_devices),
                       "models": {q: [v.id for v in p.variants] for q, p in profiles.items()},
                       "slo_ms": args.slo_ms, "period_s": args.period_s, "capacity_qps": round(capacity, 1),
                       "base_qps": round(args.base_qps, 1), "burst_qps": round(args.burst_qps, 1),
                       "burst_window": getattr(args, "burst_window", "sliding"),
                       "replay_after_first_plan_s": round(measured.replay_start_s - measured.plans[0][0], 3),
                       "plans": plans, "loads_live": measured.loads, "load_ms_simulated": measured.load_ms,
                       "service_overhead_ms": round(measured.service_overhead_ms, 2),
                       "turnaround_ms": round(measured.turnaround_ms, 2)},
        "differences": {"client_delay_ms": client_delay_ms(list(logs.values()))},
    })


def planned_capacity(profiles: Mapping[str, Profile], args: argparse.Namespace) -> float:
    """The most q/s the demo's devices serve in its burst third's mix (digits at ``--burst-qps``, every other type
    at ``--base-qps``) with each type on its most accurate variant, as the Proteus MILP plans: beyond it, accuracy
    scaling must serve. The largest share of a demand beyond reach that one placement serves for every type at
    once, times that demand."""
    planner = ProteusPlanner(profiles, list(enumerate(demo.DEVICES)), dict.fromkeys(profiles, args.slo_ms))
    pools, _ = planner.pools()
    best = {q: max(p.variants, key=lambda v: v.accuracy).id for q, p in profiles.items()}
    options = tuple(o for o in planner.options if o.variant == best[o.type])
    mix = _burst_mix(profiles, args)
    beyond = BEYOND_REACH * len(demo.DEVICES) * max(o.capacity_qps for o in options) / sum(mix.values())
    problem = milp.Problem(pools, options, {q: beyond * r for q, r in mix.items()})
    return milp.max_scale(problem) * beyond * sum(mix.values())


def _burst_mix(profiles: Mapping[str, Profile], args: argparse.Namespace) -> dict[str, float]:
    """Each type's rate in the demo's middle (burst) third."""
    return {q: rate_qps(q, args.duration_s / 2, args.duration_s, args.base_qps, args.burst_qps) for q in profiles}


@dataclass(frozen=True)
class Measured:
    """What the live run measured that the simulated world takes over."""
    plans: list[tuple[float, float]]  # the sidecar's: when each was asked for and ready, on the monotonic clock
    replay_start_s: float  # when the replay began, on the same clock
    loads: list[dict]  # the models loaded live: model, worker, ms
    load_ms: dict[str, float] | None  # model -> its load time in the simulation (None: the profiles')
    service_overhead_ms: float  # a batch's service time beyond its profiled latency: the RPC, Triton's own time
    turnaround_ms: float  # from a batch's answer to the next batch's start on its worker: the sidecar's own time

    @property
    def batch_overhead_ms(self) -> float:
        """What a batch takes, from its dispatch to its answer, beyond its profiled latency."""
        return self.service_overhead_ms + self.turnaround_ms


@dataclass(frozen=True)
class _Batch:
    """A batch a worker ran live, as the request log shows it (times in ms from the replay's start)."""
    worker: str
    variant: str
    size: int
    service_ms: float
    start_ms: float  # its requests' send time plus their queueing (the median: the send times are the client's)
    first_sent_ms: float


def _measured(log: str, replay_start_s: float, logs: list[RequestLog], profiles: Mapping[str, Profile],
              devices: Mapping[str, str]) -> Measured:
    """From the sidecar's log: its plans and loads (each model's mean load time, the mean of all for a model not
    loaded live). From the request logs: the mean over batches of their service time beyond the profiled p50 on
    their worker's device kind; and the median gap from a batch's end to the next batch's start on its worker,
    over next batches that were full and whose requests had all been sent before the first batch ended (so that
    only the sidecar held them back: its event loop, between the answer and the next dispatch)."""
    origin = ORIGIN.search(log)
    plans = [(float(asked), float(ready)) for asked, ready in PLANNED.findall(log)]
    if not plans or origin is None:
        raise RuntimeError("the sidecar logged no plan")
    plans = [(float(origin.group(1)) + asked, float(origin.group(1)) + ready) for asked, ready in plans]
    loads = [{"model": m, "worker": w, "ms": int(ms)} for m, w, ms in LOADED.findall(log)]
    load_ms = None
    if loads:
        by_model: dict[str, list[int]] = defaultdict(list)
        for load in loads:
            by_model[load["model"]].append(load["ms"])
        overall = float(np.mean([load["ms"] for load in loads]))
        load_ms = {v.actuation.model: float(np.mean(by_model[v.actuation.model])) if v.actuation.model in by_model
                   else overall for p in profiles.values() for v in p.variants}
    variants = {v.id: v for p in profiles.values() for v in p.variants}
    batches = _batches(logs)
    service = [b.service_ms - variants[b.variant].latency[devices[b.worker]].p50_at(b.size) for b in batches]
    largest: dict[tuple[str, str], int] = defaultdict(int)
    for b in batches:
        largest[b.worker, b.variant] = max(largest[b.worker, b.variant], b.size)
    gaps = [b.start_ms - (a.start_ms + a.service_ms) for a, b in zip(batches, batches[1:])
            if a.worker == b.worker and b.first_sent_ms < a.start_ms + a.service_ms
            and b.size == largest[b.worker, b.variant]]
    return Measured(plans, replay_start_s, loads, load_ms, max(0.0, float(np.mean(service))) if service else 0.0,
                    max(0.0, float(np.median(gaps))) if gaps else 0.0)


def _batches(logs: list[RequestLog]) -> list[_Batch]:
    """The batches the answered requests were served in, by worker and start; a batch's requests share its worker,
    variant, size and service time."""
    requests: dict[tuple[str, str, int, float], list[tuple[float, float]]] = defaultdict(list)
    for log in logs:
        for e in log.entries:
            if e.status == "ok":
                sent_ms = 1000 * e.scheduled_s + e.lag_ms
                requests[e.worker, e.variant, e.batch_size, e.service_ms].append((sent_ms, sent_ms + e.queue_ms))
    batches = [_Batch(*key, float(np.median([s for _, s in times])), min(t for t, _ in times))
               for key, times in requests.items()]
    return sorted(batches, key=lambda b: (b.worker, b.start_ms))


def _demo_trace(query_type: str, args: argparse.Namespace, path: Path, seed: int) -> Path:
    """The Proteus demo's load of one query type, its rate in each third of the trace, Poisson within each."""
    thirds = np.array([rate_qps(query_type, (k + 0.5) * args.duration_s / 3, args.duration_s, args.base_qps,
                                args.burst_qps) for k in range(3)])
    compress(thirds, 1.0, args.duration_s, float(thirds.mean()), seed=seed).save(path)
    return path


def _simulate_proteus(config: SidecarConfig, profiles: Mapping[str, Profile], logs: Mapping[str, RequestLog],
                      measured: Measured) -> tuple[SimResult, np.ndarray, dict]:
    """The sidecar's planner, policies and workers (``config``) in a world of what was ``measured``, over the
    queries the replay sent (``logs``: model -> its request log) as one trace: (its result, each query's type, its
    plans beside the sidecar's).

    The simulation's clock is the sidecar's less whole seconds: it starts when the first plan was asked for, the
    queries arrive when the replay sent them, and a plan asked for when the sidecar asked for one (within
    PLAN_MATCH_S) comes into force as late as the sidecar's did (the median of them otherwise), so that plans,
    periods and the planner's one-second counts fall as they did live."""
    (spec,) = config.planners
    kinds = [config.worker_devices[url] for url in config.workers]  # the sidecar's worker ids follow this order
    planner = ProteusPlanner(profiles, list(enumerate(kinds)), {m.name: m.default_slo_us / 1000 for m in config.models},
                             spec.settings)
    every = frozenset(v.actuation.model for p in profiles.values() for v in p.variants)
    world = World(tuple(SimWorker(kind, resident=every) for kind in kinds), load_ms=measured.load_ms,
                  batch_overhead_ms=measured.batch_overhead_ms)
    asked, ready = np.array(measured.plans).T
    delays = ready - asked
    origin_s = float(np.floor(asked[0]))
    matched: list[bool] = []

    def plan_delay_us(now_us: int) -> int:
        gap = np.abs(asked - origin_s - now_us / 1e6)
        matched.append(bool(gap.min() <= PLAN_MATCH_S))
        return round(1e6 * (delays[int(np.argmin(gap))] if matched[-1] else np.median(delays)))

    names = np.concatenate([np.full(len(log.entries), q) for q, log in logs.items()])
    # when each query was sent (its schedule and the client's lag; a trace's query near a second's end may have
    # been sent in the next one, and the planner counts it there)
    sent_s = np.concatenate([log.column("scheduled_s") + log.column("lag_ms") / 1000 for log in logs.values()])
    slo_ms = np.concatenate([log.column("slo_ms") for log in logs.values()])
    arrival = np.round((measured.replay_start_s - origin_s + sent_s) * 1e6).astype(np.int64)
    deadline = arrival + np.round(slo_ms * 1000).astype(np.int64)
    order = np.argsort(arrival, kind="stable")
    policies = {m.name: model_policy(m, profiles[m.name]) for m in config.models}
    # the demo's models share one admission setting (the sidecar's default)
    result = Simulator(policies, world, planners=[planner], plan_delay_us=plan_delay_us,
                       admission=config.models[0].admission).run(
        arrival[order], deadline[order], names[order].tolist(), start_us=round((asked[0] - origin_s) * 1e6))
    plans = {"live": len(asked), "simulated": planner.plans, "simulated_when_live": sum(matched),
             "live_solve_ms": [round(1000 * d) for d in delays]}
    return result, names[order], plans


def _scores(result: SimResult, mask: np.ndarray) -> dict:
    """SLO attainment and mean serving accuracy of the simulated queries ``mask`` selects."""
    met = result.outcome[mask] == OUTCOME_CODES[Outcome.MET]
    return {"queries": int(mask.sum()), "slo_attainment": float(met.mean()) if met.size else 0.0,
            "mean_serving_accuracy": float(result.accuracy[mask][met].mean()) if met.any() else 0.0}
