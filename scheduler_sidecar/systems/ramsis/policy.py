"""RAMSIS (EuroSys '24) online, and its load-granular baselines Jellyfish+ and ModelSwitching.

NOTE on RAMSIS online (§3.2, Fig. 1). Every arrival goes round-robin to one worker's own
queue (``route``; the engine keeps the queues); a 500 ms load monitor picks the lowest-load
MDP policy at or above the observed load; a free worker with queued queries looks up (n,
slack of its earliest deadline) in that policy and runs the chosen model on its n earliest
queries (maximal batching).
The MDP policies come from ``policy_dir`` (``accscale ramsis generate``, the paper's offline
phase), or are generated in the constructor for ``loads`` (seconds per load: fine for the
simulator, too slow to do while a live sidecar starts with many workers).

NOTE on the baselines (§7, digest A13). Jellyfish+ and ModelSwitching keep no worker
queues: every free worker eagerly takes up to the adaptive-batching maximum of queries
from the central EDF queue and runs the one model its method chose for the current load
(the same 500 ms monitor, the lowest grid load at or above it). The per-load choices come
from ``baselines.py`` beside this module and are computed in the constructor. The driver-free
parts (load monitor, round-robin balancer) are in ``online.py``.

# Ambiguity (digest A6): a worker queue longer than N_w. Chosen: the policy's full-state
# action (the fastest model) on the N_w earliest queries, the rest stay queued; batches never
# exceed the profile's largest batch size, which a driver can run.
# Ambiguity (§4.3.1, §7): late queries. The paper serves them ("better served late than
# never"; no method drops), which ``late_queries="serve"`` does (``paper_late_queries``: ``accscale
# simulate`` and ``accscale reproduce ramsis`` pass it). Chosen class default: the project's ``drop`` (a live
# client gets DEADLINE_EXCEEDED at once): a worker's head queries whose slack is below the
# fastest model's batch-1 latency are dropped before the lookup.
# Ambiguity: the workers seen online differ from the K the policies were made for. Chosen:
# slot k is the k-th healthy worker by id; with fewer healthy workers than K, the slots beyond
# them are skipped by the round-robin; workers beyond K get no arrivals. A lost worker's queue
# is routed again round-robin, and every other worker keeps its queue (a worker pushed beyond K
# by one that came back still serves what it holds). Regenerate for K.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from scheduler_sidecar.core.policy import LateQueries, Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import EMPTY, Decision, Dispatch, Query, WorkerState
from scheduler_sidecar.systems.ramsis.baselines import (
    PROFILE_SECONDS,
    StaticChoice,
    jellyfish_plus_choice,
    modelswitching_choice,
)
from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, ModelTable, from_profile
from scheduler_sidecar.systems.ramsis.online import LOAD_WINDOW_MS, LoadMonitor, LoadTable, RoundRobin
from scheduler_sidecar.systems.ramsis.policy_file import RamsisPolicy

SLACK_STEPS = 100  # D (§6), as scheduler_sidecar.systems.ramsis.mdp (not imported here: it pulls in scipy)
LOAD_STEP_QPS = 100.0  # baselines' default load grid step (ModelSwitching's profiling grid, §7)


def _table(profile: Profile, device: str, latency_stat: str) -> ModelTable:
    """The profile's Pareto models (§4.3.3); the baselines choose among the same models."""
    sizes = profile.variants[0].latency[device].batch_sizes
    return from_profile(profile, device, latency_stat, max(MAX_QUEUE, sizes[-1])).pareto()


def _loads(loads: Sequence[float] | str | None) -> list[float] | None:
    if loads is None:
        return None
    values = [float(x) for x in (loads.split(",") if isinstance(loads, str) else loads)]
    if not values or min(values) <= 0:
        raise ValueError(f"loads must be positive queries per second, got {loads!r}")
    return sorted(set(values))


class Ramsis(Policy):
    """RAMSIS: arrivals round-robin to worker queues (the engine's), an MDP lookup per worker (see the module note).

    Options: ``policy_dir`` (a set from ``accscale ramsis generate``; it fixes K and the SLO,
    and ``workers``/``slo_ms``, if given, must match), or ``slo_ms``, ``workers`` and ``loads``
    (q/s, a list or "L1,L2") to generate now with ``slack_steps`` (D) from the profile's
    ``latency_stat`` curve; ``window_ms`` is the load monitor's window.
    """

    name = "ramsis"
    file_options = frozenset({"policy_dir"})
    paper_late_queries = LateQueries.SERVE
    routes = True

    def __init__(self, profile: Profile, *, policy_dir: str | Path | None = None, slo_ms: float | None = None,
                 workers: int | None = None, loads: Sequence[float] | str | None = None,
                 window_ms: float = LOAD_WINDOW_MS, latency_stat: str = "p99_ms", slack_steps: int = SLACK_STEPS,
                 **options) -> None:
        super().__init__(profile, **options)
        self.max_batch = profile.variants[0].latency[self.device].batch_sizes[-1]
        from scheduler_sidecar.systems.ramsis.generate import generate_set, load_set  # lazy: scipy
        from scheduler_sidecar.systems.ramsis.mdp import MdpSpec  # lazy: scipy

        if policy_dir is not None:
            policies = load_set(policy_dir)
        else:
            if slo_ms is None or workers is None or loads is None:
                raise ValueError("ramsis: give policy_dir (from `accscale ramsis generate`), or slo_ms, workers and "
                                 "loads to generate the policies now")
            table = _table(profile, self.device, latency_stat)
            spec = MdpSpec(float(slo_ms), int(workers), 1.0, slack_steps, min(MAX_QUEUE, self.max_batch))
            policies, _ = generate_set(table, spec, _loads(loads), refine=False)
        self.policies = policies
        self.workers = self._check(policies, workers, slo_ms, policy_dir)
        self.slo_ms = float(policies[0].meta["slo_ms"])
        self.table: LoadTable[RamsisPolicy] = LoadTable((p.load_qps, p) for p in policies)
        self.monitor = LoadMonitor(window_ms)
        self.balancer = RoundRobin(self.workers)
        self.picks: Counter[float] = Counter()  # policy load -> decisions that used it

    def _check(self, policies: list[RamsisPolicy], workers, slo_ms, source) -> int:
        variants = {v.id for v in self.profile.variants}
        for p in policies:
            missing = sorted(set(p.model_ids) - variants)
            if missing:
                raise ValueError(f"ramsis: policy {p.source or p.load_qps} names model(s) {missing} that profile "
                                 f"{self.profile.name!r} does not have")
        ks = {int(p.meta["workers"]) for p in policies}
        slos = {float(p.meta["slo_ms"]) for p in policies}
        if len(ks) != 1 or len(slos) != 1:
            raise ValueError(f"ramsis: {source}: policies for several worker counts {sorted(ks)} or SLOs "
                             f"{sorted(slos)}; a set is for one (K, SLO)")
        if workers is not None and int(workers) not in ks:
            raise ValueError(f"ramsis: {source} holds policies for K = {ks.pop()} workers, not {workers}; "
                             "generate them for this K (the transitions depend on it, digest A10)")
        if slo_ms is not None and float(slo_ms) not in slos:
            raise ValueError(f"ramsis: {source} holds policies for SLO {slos.pop()} ms, not {slo_ms}")
        return ks.pop()

    # ------------------------------------------------------------------ driver calls
    def route(self, now_us: int, query: Query, queue: QueueView, workers: Sequence[WorkerState]) -> int | None:
        slots = [w.id for w in workers if w.healthy][: self.workers]  # the engine lists workers by id
        slot = self.balancer.pick(len(slots))
        return slots[slot] if slot is not None else None

    def observe_arrival(self, now_us: int, query: Query) -> None:
        self.monitor.observe(now_us)

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        policy = self.table.pick(self.monitor.load_qps(now_us))
        fastest_us = self.quickest_us()
        dispatches, dropped = [], []
        for w in workers:
            mine = queue.at(w.id)
            if not mine or not w.is_free:
                continue
            late = 0
            if self.late_queries is LateQueries.DROP:
                for q in mine.scan():
                    if self.slack_us(now_us, q) >= fastest_us:
                        break
                    late += 1
                dropped.extend(q.id for q in mine.head(late))
                if late == len(mine):
                    continue
            head = mine.head(late + 1)[late]
            model, batch = policy.action(len(mine) - late, self.slack_us(now_us, head) / 1000.0)
            taken = mine.head(late + min(batch, self.max_batch))[late:]
            dispatches.append(Dispatch(w.id, model, tuple(q.id for q in taken)))
            self.picks[policy.load_qps] += 1
        return Decision(tuple(dispatches), tuple(dropped))


class _LoadGranular(Policy):
    """A baseline: one (model, max batch) per load; free workers eagerly pull from the central queue.

    Options: ``slo_ms`` and ``workers`` (K) are required, because the choice depends on both;
    ``loads`` is the grid the choices are computed on (default: every 100 q/s up to the
    fastest model's peak over K workers; ModelSwitching simulates ``profile_s`` seconds per
    (load, model) there, so give a short grid or ``profile_s`` where start-up time matters).
    """

    paper_late_queries = LateQueries.SERVE

    def __init__(self, profile: Profile, *, slo_ms: float | None = None, workers: int | None = None,
                 loads: Sequence[float] | str | None = None, window_ms: float = LOAD_WINDOW_MS,
                 latency_stat: str = "p99_ms", **options) -> None:
        super().__init__(profile, **options)
        if slo_ms is None or workers is None:
            raise ValueError(f"{self.name}: needs slo_ms and workers (its per-load choice depends on both)")
        self.slo_ms, self.workers = float(slo_ms), int(workers)
        self.max_batch = profile.variants[0].latency[self.device].batch_sizes[-1]
        table = _table(profile, self.device, latency_stat)
        grid = _loads(loads) or self.default_loads(table)
        self.table: LoadTable[StaticChoice] = LoadTable((x, self.choose(table, x)) for x in grid)
        self.monitor = LoadMonitor(window_ms)
        self.picks: Counter[str] = Counter()  # model -> batches it ran

    def default_loads(self, table: ModelTable) -> list[float]:
        """Every LOAD_STEP_QPS up to the fastest model's peak throughput over the K workers."""
        peak = self.workers * 1000.0 * max(b / table.latency(m, b) for m in range(len(table.model_ids))
                                           for b in range(1, table.max_batch + 1))
        return [LOAD_STEP_QPS * k for k in range(1, int(peak // LOAD_STEP_QPS) + 2)]

    @abc.abstractmethod
    def choose(self, table: ModelTable, load_qps: float) -> StaticChoice:
        """The (model, max batch) this baseline runs at ``load_qps``."""

    def observe_arrival(self, now_us: int, query: Query) -> None:
        self.monitor.observe(now_us)

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        free = [w for w in workers if w.is_free]
        if not free or not queue:
            return EMPTY
        dropped = self.drop_or_serve(now_us, queue, self.quickest_us())
        if dropped:
            return dropped
        choice = self.table.pick(self.monitor.load_qps(now_us))
        size = min(choice.max_batch, self.max_batch)
        heads = queue.head(size * len(free))
        dispatches = []
        for i, w in enumerate(free):
            ids = tuple(q.id for q in heads[i * size: (i + 1) * size])
            if not ids:
                break
            dispatches.append(Dispatch(w.id, choice.model_id, ids))
            self.picks[choice.model_id] += 1
        return Decision(tuple(dispatches))


class JellyfishPlus(_LoadGranular):
    """Jellyfish+: the most accurate model whose K-worker throughput covers the load at latency <= SLO/2."""

    name = "jellyfish"

    def choose(self, table: ModelTable, load_qps: float) -> StaticChoice:
        return jellyfish_plus_choice(table, load_qps, self.workers, self.slo_ms)


class ModelSwitching(_LoadGranular):
    """ModelSwitching: the most accurate model with < 1 % of queries late in a simulated profiling run."""

    name = "modelswitching"

    def __init__(self, profile: Profile, *, profile_s: float = PROFILE_SECONDS, seed: int = 0, **options) -> None:
        self.profile_s, self.seed = float(profile_s), int(seed)
        super().__init__(profile, **options)

    def choose(self, table: ModelTable, load_qps: float) -> StaticChoice:
        return modelswitching_choice(table, load_qps, self.workers, self.slo_ms, duration_s=self.profile_s,
                                     seed=self.seed)
