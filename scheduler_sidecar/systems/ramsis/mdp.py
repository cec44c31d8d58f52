"""RAMSIS's per-worker MDP (§4): states, actions, rewards and the transitions of Eqs. 1-3.

NOTE on the model. A worker's queue is the state s = (n, T_j): n queued queries (0..N_w) and
the earliest deadline's slack rounded down onto the grid T (§4.2), plus the full state
(phi, 0) for n > N_w. Time is in ms, the load lambda in queries per ms. Actions are (model m,
batch b): with maximal batching b = n (§4.3.2), valid when l(m, b) <= T_j; when none is, only
the fastest model on the whole queue, late (§4.3.1). An empty queue has only the arrival
action, which leads to (1, SLO) with probability 1 (Eq. 1). The reward is
Accuracy(m) * [l(m, b) <= T_j] (§4.1).

Transitions (Eq. 2). The central queue is Poisson and round-robin hands a worker every K-th
arrival, so the worker sees an Erlang-K process whose phase r = k_A mod K (central arrivals
since its last query) is conditioned on the state through interval A: P(r | n, T_j) is
proportional to PF((n-1)K + r, SLO - T_j). Given r and the action's latency l, the paper's
quadruple sum over k_B, k_C, k_D is evaluated in closed form with Poisson CDFs: with
u = r + k_B < K (no query reaches the worker in B),

    P(n', j' | r) = sum_u PF(u - r, T_B) * [ P(floor((u + X_CD) / K) = n')
                                             - sum_{y=u}^{K-1} PF(y - u, T_C) P(floor((y + X_D) / K) = n') ]

which is "n' queries in C and D, the first of them in C". The tests check it against the
literal sum. Everything beyond n' = N_w goes to the full state (Eq. 3).

# Ambiguity (digest A4): T_{j'+1} for the top bin, and slack below 0. Chosen: T_{j'+1} := SLO
# for the top bin, so (n' > 0, SLO) is reached only through Eq. 1, and T_B := 0 for bin 0, so
# bin 0 absorbs every slack below T_1 (a late fallback batch leaves queries with negative
# slack; online they map to bin 0 too), as the artifact does.
# Ambiguity (digest A5): n' = 0 does not depend on j', so summing Eq. 2 over j' counts it
# |T| times. Chosen: one event, P(no query reaches the worker within l), which is Eq. 2 at
# the top bin, landing in the empty state (0, SLO); every empty state then takes Eq. 1.
# Ambiguity (digest A11): the phase is conditioned on interval A alone. Chosen: the paper's
# formula. At T_A = 0 (slack SLO) with n > 1 the weights are all 0/0; chosen: their limit
# T_A -> 0, phase 0 with probability 1.
# Ambiguity (§4.3.1): "the lowest latency model". Chosen: the model with the lowest l(m, n)
# for the batch at hand (ties: lowest index), the same as the batch-1 fastest on the paper's set.
# Ambiguity (variable batching, §4.3.2): the paper derives transitions for b = n only. For
# b < n, the n - b left behind keep the head's place: chosen, s' = (n - b + arrivals in l,
# bin(T_j - l)), a lower bound on the new head's slack, in FLD's conservative spirit (§4.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, ModelTable

SLACK_STEPS = 100  # D (§6): fixed-length discretisation of the SLO into D steps
PROB_FLOOR = 1e-15  # transition entries below this are left out of the sparse matrix

Discretization = Literal["fld", "md"]
Batching = Literal["maximal", "variable"]
Reward = Literal["per_batch", "per_query"]


@dataclass(frozen=True)
class MdpSpec:
    """What one policy is specialised to (§3.1.3, digest A10): load, SLO, K and the MDP's shape."""

    slo_ms: float
    workers: int  # K: workers behind the round-robin balancer
    load_qps: float  # lambda at the central queue
    slack_steps: int = SLACK_STEPS  # D, used by FLD
    max_queue: int = MAX_QUEUE  # N_w
    discretization: Discretization = "fld"  # "fld" (§4.2.2) or "md", model-based (§4.2.1)
    batching: Batching = "maximal"  # "maximal" (b = n, the paper's default) or "variable" (1 <= b <= n)
    # Ambiguity (digest A1): the reward is per decision (the paper's Accuracy * SLOSatisfied).
    # Chosen default: per_batch, as written; per_query weights it by b for comparison.
    reward: Reward = "per_batch"

    def __post_init__(self) -> None:
        if not (self.slo_ms > 0 and self.workers >= 1 and self.load_qps > 0 and self.slack_steps >= 1
                and self.max_queue >= 1):
            raise ValueError(f"invalid MDP spec {self}: slo_ms, load_qps > 0; workers, slack_steps, max_queue >= 1")
        if self.discretization not in ("fld", "md") or self.batching not in ("maximal", "variable") \
                or self.reward not in ("per_batch", "per_query"):
            raise ValueError(f"invalid MDP spec {self}: discretization fld|md, batching maximal|variable, "
                             "reward per_batch|per_query")


def slack_grid(table: ModelTable, spec: MdpSpec) -> np.ndarray:
    """T_w in ms, strictly increasing, from 0 to SLO (§4.2.1, §4.2.2).

    # Ambiguity (digest A3): MD's grid. Chosen: every unique l(m, b) <= SLO for b <= N_w, as
    # the paper says, plus 0 (the full state) and SLO (the arrival action's target).
    """
    if spec.discretization == "fld":
        return spec.slo_ms * np.arange(spec.slack_steps + 1) / spec.slack_steps
    lat = table.latency_ms[:, : spec.max_queue].ravel()
    return np.unique(np.concatenate([[0.0, spec.slo_ms], lat[lat <= spec.slo_ms]]))


def num_states(spec: MdpSpec, num_slacks: int) -> int:
    """|S| = (N_w + 1) * |T_w| + 1: every (n, T_j) and the full state (§4.2.3)."""
    return (spec.max_queue + 1) * num_slacks + 1


@dataclass(frozen=True)
class Mdp:
    """The MDP as arrays; rows are (state, action) pairs sorted by state."""

    spec: MdpSpec
    grid_ms: np.ndarray  # [J] T_w
    transitions: sp.csr_matrix  # [rows, S] P_a(s, s')
    reward: np.ndarray  # [rows]
    row_state: np.ndarray  # [rows] state index: n * J + j, or S - 1 for the full state
    row_model: np.ndarray  # [rows] model index, -1 for the arrival action
    row_batch: np.ndarray  # [rows] batch size, 0 for the arrival action
    row_satisfied: np.ndarray  # [rows] bool: l(m, b) <= T_j

    @property
    def num_states(self) -> int:
        return self.transitions.shape[1]

    @property
    def full_state(self) -> int:
        return self.num_states - 1

    def state(self, n: int, j: int) -> int:
        return n * len(self.grid_ms) + j


def _poisson(mu: np.ndarray, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """pmf and cdf of Poisson(mu) at k = 0..kmax, along a new last axis."""
    mu = np.asarray(mu, dtype=float)[..., None]
    k = np.arange(kmax + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        pmf = np.exp(k * np.log(mu) - mu - gammaln(k + 1))
    pmf = np.where(mu > 0, pmf, (k == 0).astype(float))
    return pmf, np.minimum(np.cumsum(pmf, axis=-1), 1.0)


def phase_weights(grid_ms: np.ndarray, spec: MdpSpec) -> np.ndarray:
    """[n, j, r]: P(phase r | state (n, T_j)) from interval A (Eq. 2's denominator); row n = 0 unused."""
    K, N, lam = spec.workers, spec.max_queue, spec.load_qps / 1000.0
    mu = lam * (spec.slo_ms - grid_ms)  # [J] lambda * T_A
    k = (np.arange(1, N + 1)[:, None] - 1) * K + np.arange(K)[None, :]  # [n-1, r] = k_A
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = k[:, None, :] * np.log(mu)[None, :, None] - gammaln(k + 1)[:, None, :]
    logp = np.where(mu[None, :, None] > 0, logp, np.where(np.arange(K) == 0, 0.0, -np.inf))
    w = np.exp(logp - logp.max(axis=2, keepdims=True))
    w /= w.sum(axis=2, keepdims=True)
    return np.concatenate([np.zeros((1, len(grid_ms), K)), w])


def next_state_given_phase(latency_ms: float, grid_ms: np.ndarray, spec: MdpSpec) -> np.ndarray:
    """[r, s']: P(s' | phase r, action latency l) after a maximal batch (Eq. 2, Eq. 3)."""
    K, N, J, lam, slo = spec.workers, spec.max_queue, len(grid_ms), spec.load_qps / 1000.0, spec.slo_ms
    hi = np.append(grid_ms[1:], slo)  # T_{j'+1}; SLO for the top bin (A4)
    tb = np.maximum(0.0, latency_ms + grid_ms - slo)
    tb[0] = 0.0  # bin 0 absorbs negative slack (A4)
    tc = np.maximum(0.0, latency_ms + hi - slo - tb)
    td = np.maximum(0.0, latency_ms - tb - tc)
    kmax = (N + 1) * K
    pmf_b, _ = _poisson(lam * tb, K - 1)  # [J, K]
    pmf_c, _ = _poisson(lam * tc, K - 1)
    _, cdf_cd = _poisson(lam * (tc + td), kmax)  # [J, kmax + 1]
    _, cdf_d = _poisson(lam * td, kmax)
    gap = np.arange(K)[None, :] - np.arange(K)[:, None]  # [u or r, u or y]: y - u
    upper = gap >= 0
    toeplitz_b = np.where(upper, pmf_b[:, np.maximum(gap, 0)], 0.0)  # [J, r, u]
    toeplitz_c = np.where(upper, pmf_c[:, np.maximum(gap, 0)], 0.0)  # [J, u, y]
    counts = np.arange(1, N + 1)
    top = (counts[None, :] + 1) * K - 1 - np.arange(K)[:, None]  # [u, n'-1] >= 0
    bottom = counts[None, :] * K - 1 - np.arange(K)[:, None]
    s = cdf_cd[:, top] - cdf_cd[:, bottom]  # [J, u, n'-1]: n' queries in C and D
    r = cdf_d[:, top] - cdf_d[:, bottom]  # [J, y, n'-1]: n' queries in D
    q = np.clip(toeplitz_b @ (s - toeplitz_c @ r), 0.0, None)  # [J, r, n'-1]
    out = np.zeros((K, (N + 1) * J + 1))
    out[:, J: (N + 1) * J] = q.transpose(1, 2, 0).reshape(K, N * J)
    _, cdf_l = _poisson(lam * latency_ms, K - 1)
    out[:, J - 1] = cdf_l[K - 1 - np.arange(K)]  # n' = 0 (A5): nobody reached the worker
    out[:, -1] = np.clip(1.0 - out[:, :-1].sum(axis=1), 0.0, None)  # Eq. 3
    return out


def arrivals_given_phase(latency_ms: float, spec: MdpSpec) -> np.ndarray:
    """[r, a]: P(a queries reach the worker within l | phase r), a = 0..N_w."""
    K, N = spec.workers, spec.max_queue
    _, cdf = _poisson(spec.load_qps / 1000.0 * latency_ms, (N + 1) * K)
    a = np.arange(N + 1)[None, :]
    r = np.arange(K)[:, None]
    low = a * K - 1 - r
    return cdf[(a + 1) * K - 1 - r] - np.where(low >= 0, cdf[np.maximum(low, 0)], 0.0)


def _actions(table: ModelTable, spec: MdpSpec, grid_ms: np.ndarray) -> list[tuple[int, int, int, int, bool]]:
    """(state, n, model, batch, satisfied) rows in state order; the full state is (N_w, 0) with fallback only."""
    J, N = len(grid_ms), spec.max_queue
    lat = table.latency_ms
    rows: list[tuple[int, int, int, int, bool]] = [(j, 0, -1, 0, False) for j in range(J)]
    for n in range(1, N + 1):
        fastest = int(np.argmin(lat[:, n - 1]))
        batches = [n] if spec.batching == "maximal" else list(range(1, n + 1))
        for j, slack in enumerate(grid_ms):
            valid = [(n * J + j, n, m, b, True) for m in range(len(table.model_ids)) for b in batches
                     if lat[m, b - 1] <= slack]
            rows.extend(valid or [(n * J + j, n, fastest, n, False)])
    rows.append(((N + 1) * J, N, int(np.argmin(lat[:, N - 1])), N, False))
    return rows


def build_mdp(table: ModelTable, spec: MdpSpec) -> Mdp:
    """The MDP of one worker for ``spec`` over the models of ``table`` (prune them first)."""
    if table.max_batch < spec.max_queue:
        raise ValueError(f"{table.name}: latencies up to batch {table.max_batch}, the MDP needs {spec.max_queue}")
    grid = slack_grid(table, spec)
    J, N, S = len(grid), spec.max_queue, num_states(spec, len(grid))
    rows = _actions(table, spec, grid)
    state = np.array([r[0] for r in rows])
    n_of = np.array([r[1] for r in rows])
    model = np.array([r[2] for r in rows])
    batch = np.array([r[3] for r in rows])
    sat = np.array([r[4] for r in rows])
    acc = np.where(model >= 0, table.accuracy[np.maximum(model, 0)], 0.0)
    reward = np.where(sat, acc * (batch if spec.reward == "per_query" else 1), 0.0)
    j_of = np.where(state < S - 1, state % J, 0)  # the full state transitions as (N_w, 0)
    weights = phase_weights(grid, spec)  # [n, j, r]
    lat = np.where(model >= 0, table.latency_ms[np.maximum(model, 0), np.maximum(batch, 1) - 1], 0.0)

    blocks: list[tuple[np.ndarray, sp.csr_matrix]] = []
    arrival = np.flatnonzero(model < 0)
    blocks.append((arrival, sp.csr_matrix((np.ones(len(arrival)), (np.arange(len(arrival)),
                                                                   np.full(len(arrival), J + J - 1))),
                                          shape=(len(arrival), S))))
    maximal = np.flatnonzero((model >= 0) & (batch == n_of))
    for latency in np.unique(lat[maximal]):
        idx = maximal[lat[maximal] == latency]
        dense = weights[n_of[idx], j_of[idx]] @ next_state_given_phase(float(latency), grid, spec)
        blocks.append((idx, _sparse(dense)))
    partial = np.flatnonzero((model >= 0) & (batch < n_of))
    for latency in np.unique(lat[partial]):
        idx = partial[lat[partial] == latency]
        count = weights[n_of[idx], j_of[idx]] @ arrivals_given_phase(float(latency), spec)  # [rows, a]
        left = n_of[idx] - batch[idx]
        head = np.maximum(np.searchsorted(grid, grid[j_of[idx]] - latency, side="right") - 1, 0)
        dense = np.zeros((len(idx), S))
        for a in range(N + 1):
            ok = left + a <= N
            dense[np.flatnonzero(ok), (left[ok] + a) * J + head[ok]] = count[ok, a]
        dense[:, -1] = np.clip(1.0 - dense[:, :-1].sum(axis=1), 0.0, None)
        blocks.append((idx, _sparse(dense)))
    order = np.concatenate([b[0] for b in blocks])
    transitions = sp.vstack([b[1] for b in blocks], format="csr")[np.argsort(order)]
    return Mdp(spec, grid, transitions.tocsr(), reward, state, model, batch, sat)


def _sparse(dense: np.ndarray) -> sp.csr_matrix:
    dense[dense < PROB_FLOOR] = 0.0
    return sp.csr_matrix(dense)
