"""HybridServe's dataflow planner (§V): replicas per model (§V-C) and their placement onto devices (Eqs. 2-4, Alg. 3).

**Replicas.** §V-C wants every model equally busy, ρ_i l_i / (R_i S_i) equal along the chain, and prints the
replicas as "(ρ_1 l_1, …, ρ_n l_n)/R_m", rounded "to the nearest positive integer". Reconstruction:
R_i = max(1, round(λ ρ_i l_i)) with λ the largest scale whose replicas fit the instance budget. Partitions S_i are
1: every model of our family fits on one device (the paper partitions giant models by GPU memory).

**Placement.** Eq. 2 minimises the transfer cost 𝒯(g, g') x_i^g x_j^{g'} summed over pairs of instances; Eq. 3
puts each instance on one device within its memory; Eq. 4 keeps each device's kernel utilisation Σu <= 1.
Decisions:
- Eq. 2 as printed sums over every pair of instances; only pairs that exchange requests cost anything, so the
  sum runs over the dataflow's edges (model i to a later model j it forwards to), each weighted by the share of
  requests on that edge, spread evenly over the pairs of their replicas.
- 𝒯 is 0 on one device (zero-copy, §V-B), SAME_SERVER_COST between devices of one server and NETWORK_COST, ten
  times that, between servers (§V-A: local DMA has at least 10x the network's bandwidth).
- The products are linearised exactly: y >= x_i^g + x_j^{g'} - 1, y >= 0 (a minimisation keeps y at the product).
- An instance's utilisation is its share of the time busy, u = rate ρ_i l_i / R_i.
- Alg. 3 keeps the feasible plan "with the maximum objective value" though Eq. 2 is a minimum: read as the most
  replicas (the throughput the planner is after), placed at the least transfer cost.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler_sidecar.systems import milp_solver

SAME_SERVER_COST = 1.0
NETWORK_COST = 10.0 * SAME_SERVER_COST
TIME_LIMIT_S = 10.0  # the incumbent after that


def replicas(reach: Sequence[float], latency_s: Sequence[float], budget: int) -> tuple[int, ...]:
    """R_i = max(1, round(λ ρ_i l_i)) for the largest λ with Σ R_i <= ``budget``."""
    work = np.asarray(reach, dtype=np.float64) * np.asarray(latency_s, dtype=np.float64)
    if budget < len(work):
        raise ValueError(f"{len(work)} models need at least {len(work)} instances, the budget is {budget}")
    if not np.all(work > 0):
        return tuple(1 for _ in work)
    # round(λ w) steps up where λ w crosses k + 1/2: the candidate scales are those crossings
    scales = sorted({(k + 0.5) / w for w in work for k in range(budget + 1)})
    best = tuple(1 for _ in work)
    for lam in scales:
        r = tuple(max(1, int(np.floor(lam * w + 0.5 + 1e-9))) for w in work)
        if sum(r) > budget:
            break
        best = r
    return best


@dataclass(frozen=True)
class Device:
    name: str
    server: str
    memory_mb: float
    speed: float = 1.0  # its kind's speed: an instance's service time is l / speed


@dataclass(frozen=True)
class Instance:
    model: int  # index in the cascade, small to large
    replica: int
    memory_mb: float
    utilisation: float  # on a speed-1 device


@dataclass(frozen=True)
class Placement:
    devices: tuple[str, ...]  # the device of each instance
    instances: tuple[Instance, ...]
    cost: float  # Eq. 2's transfer cost
    status: str  # "Optimal", "Feasible" (the incumbent at the time limit) or why there is no placement
    solver: str
    solve_s: float

    @property
    def feasible(self) -> bool:
        return self.status in ("Optimal", "Feasible")


def transfer_cost(a: Device, b: Device) -> float:
    if a.name == b.name:
        return 0.0
    return SAME_SERVER_COST if a.server == b.server else NETWORK_COST


def instances_of(reps: Sequence[int], reach: Sequence[float], latency_s: Sequence[float],
                 memory_mb: Sequence[float], rate_qps: float) -> tuple[Instance, ...]:
    return tuple(Instance(i, r, memory_mb[i], rate_qps * reach[i] * latency_s[i] / reps[i])
                 for i in range(len(reps)) for r in range(reps[i]))


def place(instances: Sequence[Instance], devices: Sequence[Device], flow: np.ndarray,
          time_limit_s: float = TIME_LIMIT_S) -> Placement:
    """Eqs. 2-4: each instance on one device, within memory and Σu <= 1, least transfer cost; ``flow[i, j]``
    is the share of requests model i forwards to model j."""
    import pulp  # type: ignore[import-untyped, unused-ignore]

    started = time.perf_counter()
    prob = pulp.LpProblem("hybridserve_placement", pulp.LpMinimize)
    var = milp_solver.variable
    x = {(k, g): var(prob, f"x_{k}_{g}", 0, 1, "Binary") for k in range(len(instances)) for g in range(len(devices))}
    copies = np.bincount([s.model for s in instances], minlength=flow.shape[0])
    terms = []
    for (a, s), (b, t) in itertools.permutations(enumerate(instances), 2):
        weight = flow[s.model, t.model] / (copies[s.model] * copies[t.model]) if s.model < t.model else 0.0
        if weight <= 0:
            continue
        for g, h in itertools.product(range(len(devices)), repeat=2):
            c = transfer_cost(devices[g], devices[h])
            if c > 0:
                y = var(prob, f"y_{a}_{b}_{g}_{h}", 0, None)
                prob += y >= x[a, g] + x[b, h] - 1
                terms.append(weight * c * y)
    prob += pulp.lpSum(terms)
    for k in range(len(instances)):
        prob += pulp.lpSum(x[k, g] for g in range(len(devices))) == 1
    for g, d in enumerate(devices):
        prob += pulp.lpSum(s.memory_mb * x[k, g] for k, s in enumerate(instances)) <= d.memory_mb
        prob += pulp.lpSum(s.utilisation / d.speed * x[k, g] for k, s in enumerate(instances)) <= 1
    solver, name = milp_solver.pick_solver(time_limit_s)
    milp_solver.solve(prob, solver)
    found = {1: "Optimal", 2: "Feasible"}.get(getattr(prob, "sol_status", 1 if prob.status == 1 else 0))
    status = found or pulp.LpStatus[prob.status]
    chosen = tuple(next((devices[g].name for g in range(len(devices)) if (pulp.value(x[k, g]) or 0) > 0.5), "")
                   for k in range(len(instances))) if found else ()
    cost = float(pulp.value(prob.objective) or 0.0) if found else float("inf")
    return Placement(chosen, tuple(instances), cost, status, name, time.perf_counter() - started)


def plan(reach: Sequence[float], latency_s: Sequence[float], memory_mb: Sequence[float], flow: np.ndarray,
         devices: Sequence[Device], rate_qps: float, max_instances: int | None = None) -> Placement:
    """Alg. 3: for each instance budget, replicas R ∝ ρl; skip those over the devices' total memory (line 7) or
    speed; place the others (Eqs. 2-4), the most replicas first, and keep the first that fits."""
    candidates: list[tuple[int, ...]] = []
    for budget in range(len(reach), (max_instances or 4 * len(devices)) + 1):
        reps = replicas(reach, latency_s, budget)
        insts = instances_of(reps, reach, latency_s, memory_mb, rate_qps)
        if reps not in candidates and sum(s.memory_mb for s in insts) <= sum(d.memory_mb for d in devices) and \
                sum(s.utilisation for s in insts) <= sum(d.speed for d in devices):
            candidates.append(reps)
    for reps in reversed(candidates):
        placed = place(instances_of(reps, reach, latency_s, memory_mb, rate_qps), devices, flow)
        if placed.feasible:
            return placed
    return Placement((), (), float("inf"), "Infeasible: no replica count fits the devices", "", 0.0)


def chain_flow(reach: Sequence[float], answered: Sequence[float]) -> np.ndarray:
    """Without skips: model i forwards what reaches it and it does not answer to model i + 1."""
    n = len(reach)
    flow = np.zeros((n, n))
    for i in range(n - 1):
        flow[i, i + 1] = reach[i] - answered[i]
    return flow
