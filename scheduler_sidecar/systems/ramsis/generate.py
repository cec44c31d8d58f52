"""RAMSIS's offline phase (§3.1, §6): one policy per load, over a load grid refined until
adjacent policies' expected accuracies differ by less than ``GAP_POINTS``.

# Ambiguity (digest A8): the paper states the stopping rule ("largest difference between the
# expected accuracies ... of adjacent policies ... below 1%") but no search. Chosen: start
# from the given loads and bisect every adjacent pair whose expected accuracies differ by
# GAP_POINTS percentage points or more, until none does or the pair is MIN_STEP_QPS apart
# (expected accuracy can jump where the optimal policy changes; such pairs are reported).
# "1%" is read as one percentage point of accuracy, the unit the paper reports gains in.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.systems.ramsis.mdp import MdpSpec, build_mdp
from scheduler_sidecar.systems.ramsis.model_table import ModelTable
from scheduler_sidecar.systems.ramsis.policy_file import RamsisPolicy
from scheduler_sidecar.systems.ramsis.solve import MAX_SWEEPS, TOLERANCE, solve

log = logging.getLogger(__name__)

GAP_POINTS = 1.0  # §6: adjacent policies' expected accuracy differs by less than 1 (percentage point)
MIN_STEP_QPS = 1.0  # refinement never splits loads closer than this
INDEX_FILE = "index.json"


def generate_policy(table: ModelTable, spec: MdpSpec, tolerance: float = TOLERANCE,
                    max_sweeps: int = MAX_SWEEPS) -> RamsisPolicy:
    """Build the MDP of ``spec``, solve it and score it (§4, §5.1)."""
    started = time.perf_counter()
    mdp = build_mdp(table, spec)
    solution, expected, _ = solve(mdp, tolerance, max_sweeps)
    if not solution.converged:
        log.warning("load %g qps: value iteration stopped after %d sweeps without converging",
                    spec.load_qps, solution.sweeps)
    rows = solution.row_of_state
    J, N = len(mdp.grid_ms), spec.max_queue
    model = mdp.row_model[rows]
    batch = mdp.row_batch[rows]
    meta = {"profile": table.name, "latency_stat": table.stat, "slo_ms": spec.slo_ms, "workers": spec.workers,
            "load_qps": spec.load_qps, "slack_steps": spec.slack_steps, "max_queue": N,
            "discretization": spec.discretization, "batching": spec.batching, "reward": spec.reward,
            "expected_accuracy": expected.accuracy, "expected_violation_rate": expected.violation_rate,
            "full_state_probability": expected.full_state_probability, "gain": solution.gain,
            "sweeps": solution.sweeps, "converged": solution.converged,
            "num_states": mdp.num_states, "seconds": round(time.perf_counter() - started, 3)}
    return RamsisPolicy(meta, table.model_ids, table.accuracy, table.latency_ms[:, :N], mdp.grid_ms,
                        model[: (N + 1) * J].reshape(N + 1, J), batch[: (N + 1) * J].reshape(N + 1, J),
                        int(model[-1]), int(batch[-1]))


@dataclass(frozen=True)
class Refinement:
    loads: tuple[float, ...]  # ascending, every load evaluated
    accuracy: tuple[float, ...]  # expected accuracy (fraction) at each load
    unresolved: tuple[tuple[float, float], ...]  # adjacent loads still >= gap apart at MIN_STEP_QPS


def refine_loads(accuracy_at: Callable[[float], float], loads: list[float], gap_points: float = GAP_POINTS,
                 min_step_qps: float = MIN_STEP_QPS) -> Refinement:
    """Bisect adjacent loads until their ``accuracy_at`` (a fraction) differs by < ``gap_points`` points."""
    if not loads or min(loads) <= 0:
        raise ConfigError("loads must be a non-empty list of positive queries per second")
    known = {float(x): accuracy_at(float(x)) for x in sorted(set(loads))}
    unresolved: set[tuple[float, float]] = set()
    while True:
        grid = sorted(known)
        split = [(a, b) for a, b in itertools.pairwise(grid)
                 if abs(known[a] - known[b]) * 100 >= gap_points and (a, b) not in unresolved]
        if not split:
            break
        for a, b in split:
            if b - a < 2 * min_step_qps:
                unresolved.add((a, b))
                continue
            mid = round((a + b) / 2, 3)
            known[mid] = accuracy_at(mid)
    grid = sorted(known)
    return Refinement(tuple(grid), tuple(known[x] for x in grid), tuple(sorted(unresolved)))


def generate_set(table: ModelTable, spec: MdpSpec, loads: list[float], out: Path | None = None, *,
                 refine: bool = True, gap_points: float = GAP_POINTS, min_step_qps: float = MIN_STEP_QPS,
                 tolerance: float = TOLERANCE, max_sweeps: int = MAX_SWEEPS) -> tuple[list[RamsisPolicy], Refinement]:
    """Policies for ``loads`` (refined unless ``refine`` is False), written to ``out`` if given.

    ``spec.load_qps`` is replaced per load. ``out`` receives ``load-<qps>.npz`` per policy and
    ``index.json`` listing them by load with their expectations.
    """
    policies: dict[float, RamsisPolicy] = {}

    def accuracy_at(load: float) -> float:
        policy = generate_policy(table, replace(spec, load_qps=load), tolerance, max_sweeps)
        policies[load] = policy
        log.info("load %8.1f qps: expected accuracy %.2f %%, violation %.3f %% (%.1f s)", load,
                 100 * policy.expected_accuracy, 100 * policy.meta["expected_violation_rate"], policy.meta["seconds"])
        return policy.expected_accuracy

    if refine:
        refinement = refine_loads(accuracy_at, loads, gap_points, min_step_qps)
    else:
        grid = sorted({float(x) for x in loads})
        refinement = Refinement(tuple(grid), tuple(accuracy_at(x) for x in grid), ())
    for a, b in refinement.unresolved:
        log.warning("expected accuracy jumps by >= %g points between %g and %g qps", gap_points, a, b)
    ordered = [policies[x] for x in refinement.loads]
    if out is not None:
        write_set(ordered, Path(out), refinement)
    return ordered, refinement


def policy_file_name(load_qps: float) -> str:
    return f"load-{load_qps:g}.npz"


def write_set(policies: list[RamsisPolicy], out: Path, refinement: Refinement) -> None:
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for p in policies:
        name = policy_file_name(p.load_qps)
        p.save(out / name)
        entries.append({"load_qps": p.load_qps, "file": name, "expected_accuracy": p.expected_accuracy,
                        "expected_violation_rate": p.meta["expected_violation_rate"]})
    first = policies[0].meta
    index = {"schema": "accscale/ramsis-policy-set/v1",
             **{k: first[k] for k in ("profile", "latency_stat", "slo_ms", "workers", "slack_steps", "max_queue",
                                      "discretization", "batching", "reward")},
             "max_adjacent_gap_points": max_gap_points(policies),
             "unresolved": [list(x) for x in refinement.unresolved], "policies": entries}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")


def load_set(directory: Path | str) -> list[RamsisPolicy]:
    """The policies of a directory written by :func:`generate_set`, ascending load."""
    directory = Path(directory)
    try:
        index = json.loads((directory / INDEX_FILE).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{directory}: no {INDEX_FILE}; generate it with `accscale ramsis generate`") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{directory / INDEX_FILE}: not JSON ({exc})") from None
    except OSError as exc:  # not a directory, unreadable
        raise ConfigError(f"{directory}: cannot read {INDEX_FILE} ({exc.strerror})") from None
    try:
        files = [e["file"] for e in index["policies"]]
    except (KeyError, TypeError):
        raise ConfigError(f"{directory / INDEX_FILE}: policies: expected a list of {{load_qps, file}}") from None
    return sorted((RamsisPolicy.load(directory / f) for f in files), key=lambda p: p.load_qps)


def max_gap_points(policies: list[RamsisPolicy]) -> float:
    acc = np.array([p.expected_accuracy for p in sorted(policies, key=lambda p: p.load_qps)])
    return float(np.abs(np.diff(acc)).max() * 100) if len(acc) > 1 else 0.0


def pick_policy(policies: list[RamsisPolicy], load_qps: float) -> tuple[RamsisPolicy, bool]:
    """The lowest-load policy whose load is >= ``load_qps`` (§3.2.2), and whether one was.

    # Ambiguity (digest A8): a load above every policy means "generate a new one" in the paper.
    # Chosen: the highest-load policy, flagged (False), because an online decision cannot wait
    # for a generation; the caller reports the condition.
    """
    if not policies:
        raise ConfigError("no RAMSIS policies to pick from")
    ordered = sorted(policies, key=lambda p: p.load_qps)
    for p in ordered:
        if p.load_qps >= load_qps:
            return p, True
    return ordered[-1], False
