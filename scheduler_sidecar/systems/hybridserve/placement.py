"""HybridServe's dataflow planner (§V-A..§V-D): replicas per model (§V-C) and their placement onto devices
(Eqs. 2-4), searched by Algorithm 3.

**Replicas (§V-C).** The paper wants every model equally busy, ρ_1 l_1 / (R_1 S_1) = … = ρ_n l_n / (R_n S_n), and
prints the replicas garbled, "(R_1, …, R_n) should be (ρ_1 l_1, …, ρ_n l_n)/R_m", rounded "to the nearest positive
integer". Reconstruction (digest §2.6): R_i = max(1, round(λ ρ_i l_i)) with λ the largest scale whose replicas fit
the instance budget (``NEAREST``, the default). Rounding each model on its own can leave the busiest one an instance
short, and the cascade keeps up only with its busiest model (on the family built here, EO's 16 instances went 3/7/4/2,
the largest model short, where 3/6/4/3 served 15% more live). ``BALANCED``, a variant of ours, takes the paper's goal
rather than its rounding: the integer replicas within the budget whose busiest model is least busy
(min max ρ_i l_i / R_i), found greedily (each next instance to the model busiest per instance, which a brute force
confirms in the tests). Partitions S_i are 1: every model of our family fits on one device (the paper partitions
giant models by GPU memory), so no partitioning is implemented.

**Placement (§V-A, §V-B).** Eq. 2 minimises the transfer cost Σ 𝒯(g, g') x_i^g x_j^{g'}; Eq. 3 puts each instance
on exactly one device, within the device's memory; Eq. 4 keeps each device's kernel utilisation Σ u <= 1.
Decisions:
- Eq. 2 as printed sums over every pair of instances. Only pairs that exchange requests cost anything, so the sum
  runs over the dataflow's edges: an instance of model i to one of a later model j it forwards to (the successor,
  and with skips any j > i). Each edge weighs the share of requests going from i to j (``flow[i, j]``), spread
  evenly over the R_i R_j pairs of their replicas.
- 𝒯 is 0 on one device (zero-copy, §V-B), SAME_SERVER_COST between devices of one server, and NETWORK_COST, ten
  times that, between servers (§V-A: "local DMA offers at least 10x the bandwidth of network transmission").
- The products are linearised: y >= x_i^g + x_j^{g'} - 1, y >= 0. A minimisation keeps y at max(0, x + x' - 1),
  which is the product for binaries, so the program is exact.
- An instance's utilisation is its share of the time busy (digest §7, item 23): u = rate ρ_i l_i / R_i on a device
  of speed 1, u / speed on a faster or slower kind.

**Algorithm 3 (§V-D).** For growing instance budgets: the replicas, the prefilter of line 7 (the paper's
dimensionally broken "‖R P‖_1 <= ‖ω‖_1" read as total memory within the devices' total, plus Σ u within the
devices' total speed), then Eq. 2. The paper keeps the plan "with the maximum objective value", though Eq. 2 is a
minimum: read as the most throughput, i.e. the most replicas, and among those the least transfer cost.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from scheduler_sidecar.systems import milp_solver

SAME_SERVER_COST = 1.0  # 𝒯 between two devices of one server (local DMA)
NETWORK_COST = 10.0 * SAME_SERVER_COST  # 𝒯 between servers
TIME_LIMIT_S = 10.0  # per placement solve; the incumbent after that (the paper sets none)
_HALF_TOL = 1e-9  # λ w within this below k + 1/2 counts as on the breakpoint: both models of a tie step together


NEAREST, BALANCED = "nearest", "balanced"  # how replicas are rounded (module docstring)


def replicas(reach: Sequence[float], latency_s: Sequence[float], budget: int,
             rounding: str = NEAREST) -> tuple[int, ...]:
    """Instances per model within ``budget`` (§V-C, S_i = 1). ``reach`` is ρ_i, the share of requests that reach model
    i; ``latency_s`` is l_i, its service time per request. A model no request reaches keeps its one replica.

    NEAREST: R_i = max(1, round(λ ρ_i l_i)) for the largest λ with Σ R_i <= budget. The replicas only change where
    some λ ρ_i l_i crosses k + 1/2, so the largest λ is found exactly by walking those breakpoints upwards until the
    budget breaks. Halves round up: at a breakpoint the count is the larger one, so the largest scale within the
    budget is attained. BALANCED: every instance of the budget, each to the model with the most work per instance.
    """
    work = np.asarray(reach, dtype=np.float64) * np.asarray(latency_s, dtype=np.float64)
    if budget < len(work):
        raise ValueError(f"{len(work)} models need at least {len(work)} instances, the budget is {budget}")
    if not np.all(np.isfinite(work) & (work >= 0)):
        raise ValueError(f"reach and latency must be finite and non-negative, got work {work}")
    if rounding == BALANCED:
        counts = np.ones(len(work), dtype=int)
        for _ in range(budget - len(work)):
            counts[np.argmax(work / counts)] += 1
        return tuple(counts.tolist())
    if rounding != NEAREST:
        raise ValueError(f"rounding must be {NEAREST!r} or {BALANCED!r}, got {rounding!r}")
    best = (1,) * len(work)
    for scale in sorted({(k + 0.5) / w for w in work[work > 0] for k in range(budget)}):
        counts = tuple(max(1, math.floor(scale * w + 0.5 + _HALF_TOL)) for w in work)
        if sum(counts) > budget:
            break
        best = counts
    return best


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator of a server. Its kind runs at ``speed``, as the simulator's workers (sim/world.py): a
    service time l on the reference kind takes l / speed here."""

    name: str
    server: str
    memory_mb: float
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class Instance:
    """One replica of model ``model`` (index in the cascade, small to large)."""

    model: int
    replica: int
    memory_mb: float  # ω
    utilisation: float  # u on a device of speed 1


@dataclass(frozen=True)
class Placement:
    devices: tuple[str, ...]  # the device of each instance; empty without a placement
    instances: tuple[Instance, ...]
    cost: float  # Eq. 2's transfer cost; inf without a placement
    status: str  # "Optimal", "Feasible" (the incumbent at the time limit), else why there is no placement
    solver: str
    solve_s: float  # the solve; for plan(), the whole search

    @property
    def feasible(self) -> bool:
        return self.status in ("Optimal", "Feasible")

    @property
    def replicas(self) -> tuple[int, ...]:
        """R_i: the instances of each model."""
        return tuple(np.bincount([s.model for s in self.instances]).tolist()) if self.instances else ()


def transfer_cost(a: Device, b: Device) -> float:
    """𝒯(g, g')."""
    if a.name == b.name:
        return 0.0
    return SAME_SERVER_COST if a.server == b.server else NETWORK_COST


def instances_of(reps: Sequence[int], reach: Sequence[float], latency_s: Sequence[float],
                 memory_mb: Sequence[float], rate_qps: float) -> tuple[Instance, ...]:
    """R_i instances of each model, each busy rate ρ_i l_i / R_i of the time (its share of model i's requests)."""
    return tuple(Instance(i, r, float(memory_mb[i]), rate_qps * reach[i] * latency_s[i] / reps[i])
                 for i in range(len(reps)) for r in range(reps[i]))


def edges(instances: Sequence[Instance], flow: np.ndarray) -> dict[tuple[int, int], float]:
    """Eq. 2's pairs: (a, b) -> traffic, for instance a of model i and b of a later model j with flow[i, j] > 0;
    the share of requests from i to j spread evenly over the R_i R_j pairs of replicas."""
    flow = np.asarray(flow, dtype=np.float64)
    models = 1 + max((s.model for s in instances), default=-1)
    if flow.ndim != 2 or flow.shape[0] < models or flow.shape[1] < models:
        raise ValueError(f"flow must be at least {models}x{models}, got shape {flow.shape}")
    copies = np.bincount([s.model for s in instances], minlength=models)
    return {(a, b): flow[s.model, t.model] / (copies[s.model] * copies[t.model])
            for (a, s), (b, t) in itertools.permutations(enumerate(instances), 2)
            if s.model < t.model and flow[s.model, t.model] > 0}


def place(instances: Sequence[Instance], devices: Sequence[Device], flow: np.ndarray,
          time_limit_s: float = TIME_LIMIT_S) -> Placement:
    """Eqs. 2-4: each instance on one device, within memory and Σ u <= 1, at the least transfer cost.

    ``flow[i, j]`` is the share of requests model i forwards to model j > i. No placement is a result whose
    ``status`` says why (``feasible`` false), not an exception.
    """
    import pulp  # type: ignore[import-untyped, unused-ignore]

    started = time.perf_counter()
    traffic = edges(instances, flow)
    prob = pulp.LpProblem("hybridserve_placement", pulp.LpMinimize)
    var = milp_solver.variable
    x = {(k, g): var(prob, f"x_{k}_{g}", 0, 1, "Binary")
         for k, g in itertools.product(range(len(instances)), range(len(devices)))}
    terms = []
    for (a, b), weight in traffic.items():
        for g, h in itertools.product(range(len(devices)), repeat=2):
            cost = transfer_cost(devices[g], devices[h])
            if cost > 0:  # on one device the product costs nothing: no y needed
                y = var(prob, f"y_{a}_{b}_{g}_{h}", 0, None)
                prob += y >= x[a, g] + x[b, h] - 1
                terms.append(weight * cost * y)
    prob += pulp.lpSum(terms)
    for k in range(len(instances)):
        prob += pulp.lpSum(x[k, g] for g in range(len(devices))) == 1
    for g, d in enumerate(devices):
        prob += pulp.lpSum(s.memory_mb * x[k, g] for k, s in enumerate(instances)) <= d.memory_mb
        prob += pulp.lpSum(s.utilisation / d.speed * x[k, g] for k, s in enumerate(instances)) <= 1
    solver, name = milp_solver.pick_solver(time_limit_s)
    milp_solver.solve(prob, solver)
    status = {1: "Optimal", 2: "Feasible"}.get(prob.sol_status) or pulp.LpStatus[prob.status]
    if status not in ("Optimal", "Feasible"):
        return Placement((), tuple(instances), math.inf, status, name, time.perf_counter() - started)
    chosen = [max(range(len(devices)), key=lambda g, k=k: pulp.value(x[k, g]) or 0.0) for k in range(len(instances))]
    cost = sum(w * transfer_cost(devices[chosen[a]], devices[chosen[b]]) for (a, b), w in traffic.items())
    return Placement(tuple(devices[g].name for g in chosen), tuple(instances), cost, status, name,
                     time.perf_counter() - started)


def plan(reach: Sequence[float], latency_s: Sequence[float], memory_mb: Sequence[float], flow: np.ndarray,
         devices: Sequence[Device], rate_qps: float, max_instances: int | None = None,
         time_limit_s: float = TIME_LIMIT_S) -> Placement:
    """Algorithm 3: the placement of the most replicas that fit ``devices`` at ``rate_qps`` requests/s.

    Budgets run from one instance per model to ``max_instances`` (4 per device by default). R grows with λ in
    every model, so distinct candidates differ in their total, there are no ties to break by cost, and the most
    replicas are also the most bottleneck throughput, min_i R_i / (ρ_i l_i). Candidates over the devices' total
    memory or speed are skipped (line 7); the others are placed from the largest down, and the first that fits wins.
    """
    started = time.perf_counter()
    budgets = range(len(reach), (max_instances or 4 * len(devices)) + 1)
    shapes = dict.fromkeys(replicas(reach, latency_s, budget) for budget in budgets)  # distinct, in order
    candidates = [insts for insts in (instances_of(reps, reach, latency_s, memory_mb, rate_qps) for reps in shapes)
                  if _within_totals(insts, devices)]
    for insts in reversed(candidates):
        placed = place(insts, devices, flow, time_limit_s)
        if placed.feasible:
            return replace(placed, solve_s=time.perf_counter() - started)
    return Placement((), (), math.inf, "Infeasible: no replica count fits the devices", "",
                     time.perf_counter() - started)


def _within_totals(instances: Sequence[Instance], devices: Sequence[Device]) -> bool:
    """Algorithm 3's line 7: the instances' memory and utilisation within the devices' totals."""
    return sum(s.memory_mb for s in instances) <= sum(d.memory_mb for d in devices) and \
        sum(s.utilisation for s in instances) <= sum(d.speed for d in devices)

