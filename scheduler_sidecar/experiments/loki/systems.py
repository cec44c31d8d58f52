"""Loki and the systems it is compared with (§6.1), run in the simulator over one pipeline; the paper's
metrics per frame (§6.1).

| system | resource manager | data path |
|---|---|---|
| loki | hardware scaling, then accuracy scaling (:mod:`.milp`), every period and on a demand change | MostAccurateFirst, early dropping with rerouting |
| inferline | hardware scaling with the most accurate variants only, else the largest servable fraction | MostAccurateFirst (one variant per task), no early dropping |
| proteus-per-task | Proteus' MILP with each task a query type, per-task demand, the SLO split equally over the stages, every worker in use | Proteus' routing and adaptive batching, per stage |

A frame's fan-out is drawn per query: each child gets Poisson(fan-out of the served variant) queries (the
artifact replays a per-frame detection trace that it does not publish); ``Setup(fanout="mean")`` gives each child
exactly the fan-out, rounded, so that a run is deterministic end to end (the tests' second simulation); and
``Setup(fanout="frames", frame_fanout=...)`` gives each frame its own: the queries its detector's variant creates for
that very frame (frame i of the trace is frame i mod n of the table), as a live run of the same frames does
(``bench fidelity --system loki``). A query the table does not cover (another variant, a deeper stage) is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from scheduler_sidecar.core.records import Batch, BatchResult, Outcome, Query
from scheduler_sidecar.sim.results import OUTCOME_CODES, SimResult
from scheduler_sidecar.sim.simulator import Simulator
from scheduler_sidecar.sim.world import SimWorker, World
from scheduler_sidecar.systems.loki.pipeline import DEVICE, Pipeline
from scheduler_sidecar.systems.loki.planner import LokiConfig, LokiPlanner, PlanRecord
from scheduler_sidecar.systems.loki.policy import DEFAULT_BUDGET, DEFAULT_DEQUEUE, DropMode, LokiTask, Router
from scheduler_sidecar.systems.proteus.planner import ProteusConfig, ProteusPlanner
from scheduler_sidecar.systems.proteus.policy import Proteus


@dataclass(frozen=True)
class System:
    name: str
    planner: str = "loki"  # "loki" or "proteus" (per task)
    drop: DropMode = DropMode.REROUTING
    top_only: bool = False


SYSTEMS = {s.name: s for s in (
    System("loki"),
    System("inferline", drop=DropMode.NONE, top_only=True),
    System("proteus-per-task", planner="proteus"),
)}
ABLATIONS = {s.name: s for s in (  # Fig. 7, the load balancer's dropping modes
    System("no dropping", drop=DropMode.NONE),
    System("last-task dropping", drop=DropMode.LAST_TASK),
    System("per-task dropping", drop=DropMode.PER_TASK),
    System("rerouting", drop=DropMode.REROUTING),
)}


@dataclass(frozen=True)
class Setup:
    pipeline: Pipeline
    workers: int = 20  # §6.1: 20 GPU workers
    config: LokiConfig = field(default_factory=LokiConfig)
    budget: str = DEFAULT_BUDGET  # a task's latency budget (:mod:`.policy`): the artifact's 2 x l unless a run names another
    load_ms: float | None = None  # a variant swap's load time (digest A15); None: measured where known, else 0 (the artifact's)
    fail_at_s: tuple[float, ...] = ()  # one worker (the lowest id still healthy) fails at each time
    fanout: str = "poisson"  # queries per child per query: "poisson" (drawn), "mean" (the fan-out, rounded), "frames"
    # fanout "frames": per root variant, each frame's queries per child (the module notes)
    frame_fanout: Mapping[str, Sequence[Mapping[str, int]]] | None = None
    dequeue: str = DEFAULT_DEQUEUE  # what early dropping checks before a batch runs (:mod:`.policy`)


class Fanout:
    """The simulator's result model for a pipeline: what each served query creates for the child tasks."""

    def __init__(self, pipeline: Pipeline, *, split_slo: bool = False, seed: int = 0, draw: str = "poisson",
                 frames: Mapping[str, Sequence[Mapping[str, int]]] | None = None) -> None:
        if draw not in ("poisson", "mean", "frames"):
            raise ValueError(f"fan-out draw must be 'poisson', 'mean' or 'frames', got {draw!r}")
        if (draw == "frames") != bool(frames) or any(not table for table in (frames or {}).values()):
            raise ValueError("fan-out 'frames' needs each frame's fan-out (frame_fanout), and only it takes one")
        self.pipeline, self.split_slo, self.draw, self.frames = pipeline, split_slo, draw, frames or {}
        self.depth = max(len(pipeline.chain(t.name)) for t in pipeline.leaves)
        self.rng = np.random.default_rng(seed + 7919)
        self.root: dict[int, tuple[int, int]] = {}  # follow-up id -> (its frame's id, the frame's arrival)

    def __call__(self, batch: Batch, now_us: int, new_id) -> BatchResult:
        variant = self.pipeline.variant(batch.variant_id)
        if not variant.fanout:
            return BatchResult()
        out = []
        own = self.frames.get(batch.variant_id)
        for q in batch.queries:
            frame, frame_arrival = self.root.get(q.id, (q.id, q.arrival_us))
            counts = own[frame % len(own)] if own is not None and frame == q.id else None  # a frame's root query
            for child, mean in variant.fanout.items():
                n = counts.get(child, 0) if counts is not None else \
                    int(self.rng.poisson(mean)) if self.draw != "mean" else round(mean)
                for _ in range(n):
                    qid = new_id()
                    self.root[qid] = (frame, frame_arrival)
                    deadline = q.deadline_us
                    if self.split_slo:  # Proteus per task: each stage has an equal share of the SLO
                        deadline = frame_arrival + round((q.stage + 2) * self.pipeline.slo_ms * 1000 / self.depth)
                    out.append(Query(deadline, qid, qid, now_us, child, parent=q.id, stage=q.stage + 1))
        return BatchResult(follow_ups=tuple(out))


@dataclass
class Run:
    system: str
    result: SimResult
    frames: FrameOutcomes
    plans: Sequence[PlanRecord]  # Loki's and InferLine's plans (empty for Proteus)
    rerouted: int


@dataclass(frozen=True)
class FrameOutcomes:
    """Per frame: whether it met the SLO end to end (every query it created answered by its deadline), and
    its accuracy (the mean Â of the paths that served its leaf queries; NaN unless all its queries were served)."""

    arrival_us: np.ndarray
    met: np.ndarray
    dropped: np.ndarray  # some query of the frame was dropped
    accuracy: np.ndarray
    queries: int  # every query of every stage
    queries_met: int


def frame_outcomes(pipeline: Pipeline, result: SimResult, fanout: Fanout) -> FrameOutcomes:
    n = len(result.outcome)
    met_code, late_code, dropped_code = (OUTCOME_CODES[o] for o in (Outcome.MET, Outcome.LATE, Outcome.DROPPED))
    deadline = result.arrival_us + round(pipeline.slo_ms * 1000)
    met = (result.outcome == met_code) & (result.finish_us <= deadline)
    served = (result.outcome == met_code) | (result.outcome == late_code)
    dropped = result.outcome == dropped_code
    variant = {i: v for i, v in enumerate(result.variant)}
    parent: dict[int, int] = {}
    leaf_sum, leaf_n = np.zeros(n), np.zeros(n)
    queries_met = int(np.count_nonzero(result.outcome == met_code))
    leaves = {t.name for t in pipeline.leaves}
    for r in result.follow_ups:
        variant[r.query_id] = r.variant_id
        parent[r.query_id] = r.parent
    for r in result.follow_ups:
        frame = fanout.root[r.query_id][0]
        ok = r.outcome is Outcome.MET and r.finish_us <= deadline[frame]
        queries_met += r.outcome is Outcome.MET
        met[frame] &= ok
        served[frame] &= r.outcome in (Outcome.MET, Outcome.LATE)
        dropped[frame] |= r.outcome is Outcome.DROPPED
        if r.variant_id is not None and pipeline.task_of(r.variant_id).name in leaves:
            path, q = [r.variant_id], r.query_id
            while q in parent:
                q = parent[q]
                path.append(variant[q])
            if None not in path:
                leaf_sum[frame] += pipeline.accuracy(tuple(reversed(path)))
                leaf_n[frame] += 1
    root_accuracy = np.array([pipeline.variant(v).accuracy if v is not None else np.nan for v in result.variant])
    accuracy = np.where(leaf_n > 0, leaf_sum / np.maximum(leaf_n, 1), root_accuracy)
    accuracy[~served] = np.nan
    return FrameOutcomes(result.arrival_us, met, dropped, accuracy, n + len(result.follow_ups), queries_met)


def simulate(system: System, setup: Setup, arrival_us: np.ndarray, *, initial_demand_qps: float,
             seed: int = 0) -> Run:
    """Run ``system`` over frames arriving at ``arrival_us`` (each with the pipeline's SLO)."""
    pipeline = setup.pipeline
    world = World(tuple(SimWorker(DEVICE, resident=frozenset()) for _ in range(setup.workers)), seed=seed,
                  load_ms=setup.load_ms, fail_at_s=setup.fail_at_s)
    slo_us = round(pipeline.slo_ms * 1000)
    fanout = Fanout(pipeline, split_slo=system.planner == "proteus", seed=seed, draw=setup.fanout,
                    frames=setup.frame_fanout)
    names = [t.name for t in pipeline.tasks]
    router = None
    if system.planner == "proteus":
        stage_slo = pipeline.slo_ms / fanout.depth
        profiles = {t: pipeline.profile(t) for t in names}
        initial = _initial_per_task(pipeline, initial_demand_qps)
        planner = ProteusPlanner(profiles, [(i, DEVICE) for i in range(setup.workers)], dict.fromkeys(names, stage_slo),
                                 _proteus_config(setup.config), initial_demand=initial)
        policies = {t: Proteus(p, query_type=t, device=DEVICE) for t, p in profiles.items()}
        deadline_us = arrival_us + round(stage_slo * 1000)
    else:
        config = replace(setup.config, top_only=system.top_only)
        planner = LokiPlanner(pipeline, range(setup.workers), config, initial_demand_qps=initial_demand_qps)
        router = Router(pipeline, system.drop, budget=setup.budget, dequeue=setup.dequeue, seed=seed)
        policies = {t: LokiTask(pipeline, t, router, device=DEVICE) for t in names}
        deadline_us = arrival_us + slo_us
    result = Simulator(policies, world, planners=[planner], result_model=fanout).run(
        arrival_us, deadline_us, [pipeline.root.name] * len(arrival_us))
    frames = frame_outcomes(pipeline, result, fanout)
    return Run(system.name, result, frames, list(getattr(planner, "history", ())),
               router.rerouted if router is not None else 0)


def _initial_per_task(pipeline: Pipeline, frames_qps: float) -> dict[str, float]:
    """Each task's demand when every task runs its most accurate variant (Proteus' per-task start)."""
    rates = {pipeline.root.name: frames_qps}
    for t in pipeline.tasks:
        for child in t.children:
            rates[child] = rates[t.name] * t.top.fanout[child]
    return rates


def settings(name: str, system: System, setup: Setup) -> dict:
    """What ``system`` runs with under ``setup``, as :func:`simulate` applies it: a comparison's settings side by
    side, read from the run's own objects."""
    proteus = system.planner == "proteus"
    config = _proteus_config(setup.config) if proteus else setup.config
    return {"system": name, "workers": setup.workers, "slo_ms": setup.pipeline.slo_ms,
            "headroom": config.headroom, "period_s": config.period_s, "ewma_com": config.ewma_com,
            "variants": "top only" if system.top_only else "all",
            "dropping": "per task, its share of the SLO" if proteus else system.drop.value,
            "latency_budget": "" if proteus or system.drop == DropMode.NONE else setup.budget,  # what drops use
            "before_a_batch": "" if proteus or system.drop not in (DropMode.PER_TASK, DropMode.REROUTING)
            else setup.dequeue}


def _proteus_config(config: LokiConfig) -> ProteusConfig:
    """Proteus with Loki's control loop (period, EWMA) and headroom, as the comparison runs them on equal terms."""
    return ProteusConfig(period_s=config.period_s, ewma_com=config.ewma_com, ewma_window_s=config.ewma_window_s,
                         headroom=config.headroom)


def metrics(run: Run, *, window_s: int = 10) -> dict[str, float]:
    """Per frame (§6.1): violation ratio (late or dropped), accuracy over served frames, drops; and per query of
    any stage (digest A16), the violation ratio the artifact counts."""
    f = run.frames
    n = len(f.met)
    served = ~np.isnan(f.accuracy)
    return {
        "frames": n,
        "violation_ratio": float(1 - f.met.mean()) if n else 0.0,
        "dropped_frames": int(f.dropped.sum()),
        "accuracy": float(100 * np.nanmean(f.accuracy)) if served.any() else 0.0,
        "query_violation_ratio": 1 - f.queries_met / f.queries if f.queries else 0.0,
        "rerouted": run.rerouted,
    }


def windows(run: Run, window_s: int = 10) -> dict[str, np.ndarray]:
    """Per ``window_s`` window of arrival time: frames, violation ratio and accuracy (Fig. 5's time series)."""
    f = run.frames
    w = (f.arrival_us // (window_s * 1_000_000)).astype(np.int64)
    k = int(w.max(initial=-1)) + 1
    count = np.bincount(w, minlength=k).astype(float)
    violated = np.bincount(w, ~f.met, minlength=k)
    served = ~np.isnan(f.accuracy)
    acc = np.bincount(w[served], f.accuracy[served], minlength=k)
    acc_n = np.bincount(w[served], minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"frames_qps": count / window_s, "violation_ratio": np.where(count > 0, violated / count, 0.0),
                "accuracy": np.where(acc_n > 0, 100 * acc / np.maximum(acc_n, 1), np.nan)}


def workers_used(run: Run, setup: Setup, end_us: int, window_s: int = 10) -> np.ndarray:
    """Workers the plan in force uses, sampled per window (Proteus uses them all)."""
    k = max(1, -(-end_us // (window_s * 1_000_000)))
    if not run.plans:
        return np.full(k, float(setup.workers))
    times = np.array([p.at_us for p in run.plans])
    used = np.array([p.workers for p in run.plans], dtype=float)
    at = np.arange(k) * window_s * 1_000_000
    return used[np.maximum(np.searchsorted(times, at, side="right") - 1, 0)]


__all__ = ["ABLATIONS", "SYSTEMS", "Fanout", "Run", "Setup", "System",
           "frame_outcomes", "metrics", "simulate", "windows", "workers_used"]
