"""``accscale bench milp --system proteus``: the MILP's solve times (§6.8) along the reproduction's trace, and as
the cluster grows.

Along the trace: Proteus on the authors' profile, the paper's 40-device cluster and medium-normal_load (as
``accscale reproduce proteus``), every plan's wall time. The grid: the same cluster times 1, 2, 4, 8 (40 to 320
devices) with the trace's mean mix at its peak rate times the same factor, one plan each from cold. The paper:
4.2 s on average (Gurobi), and solvable in under 60 s up to 160 devices (450 variants, 17 query types).
"""

from __future__ import annotations

import argparse
import statistics
import time

from scheduler_sidecar.experiments.claims import Claim
from scheduler_sidecar.experiments.proteus.data import (
    PAPER_CLUSTER,
    TRACE_SLO_MS,
    Counts,
    load_counts,
    load_profiles,
)
from scheduler_sidecar.experiments.proteus.systems import SYSTEMS, Setup, simulate
from scheduler_sidecar.systems.proteus.planner import ProteusConfig, ProteusPlanner

PAPER_MEAN_SOLVE_S = 4.2
PAPER_LARGEST_DEVICES, PAPER_LARGEST_S = 160, 60.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=int, default=None, help="proteus: only the trace's first N seconds (default: all)")
    p.add_argument("--scales", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 2, 4, 8),
                   help="proteus: the cluster sizes of the grid, as multiples of the paper's 40 devices "
                        "(default: 1,2,4,8)")


def run(args: argparse.Namespace) -> dict:
    profiles = load_profiles()
    counts = load_counts()
    if args.seconds:
        counts = Counts(counts.families, counts.per_second[:args.seconds])
    config = ProteusConfig()
    r = simulate(SYSTEMS["proteus"], Setup(profiles, PAPER_CLUSTER, TRACE_SLO_MS, config), counts)
    solves = r.result.plan_solve_s
    mix, peak = counts.mean_mix(), float(counts.per_second.sum(axis=1).max())
    grid = []
    for scale in args.scales:
        workers = [(i, kind) for i, kind in enumerate(k for k, n in PAPER_CLUSTER.items() for _ in range(n * scale))]
        demand = {f: share * peak * scale for f, share in mix.items()}
        planner = ProteusPlanner(profiles, workers, dict.fromkeys(profiles, TRACE_SLO_MS), config,
                                 initial_demand=demand)
        started = time.perf_counter()
        planner.plan(0, None)
        grid.append({"devices": len(workers), "variants": len(planner.options), "query_types": len(profiles),
                     "demand_qps": round(sum(demand.values()), 1), "solve_s": round(time.perf_counter() - started, 3)})
    largest = [g for g in grid if g["devices"] >= PAPER_LARGEST_DEVICES]
    mean = statistics.mean(solves)
    claims = [Claim("mean_solve", "a plan takes the paper's average solve time or less (mean along the trace)",
                    f"{PAPER_MEAN_SOLVE_S:g} s", f"{mean:.3f} s", mean <= PAPER_MEAN_SOLVE_S)]
    if largest:
        at = min(largest, key=lambda g: g["devices"])
        claims.append(Claim("largest_cluster", f"{at['devices']} devices are planned in under "
                            f"{PAPER_LARGEST_S:g} s", f"up to {PAPER_LARGEST_DEVICES} devices in under "
                            f"{PAPER_LARGEST_S:g} s", f"{at['solve_s']:g} s", at["solve_s"] < PAPER_LARGEST_S))
    return {"system": "proteus", "trace_s": len(counts.per_second), "plans": len(solves),
            "max_solve_s": round(max(solves), 3), "median_solve_s": round(statistics.median(solves), 3),
            "mean_solve_s": round(statistics.mean(solves), 3), "grid": grid,
            "claims": [c.as_dict() for c in claims]}


def report(out: dict) -> None:
    print(f"along the trace ({out['trace_s']} s, {out['plans']} plans): median {out['median_solve_s']:.3f} s, mean "
          f"{out['mean_solve_s']:.3f} s, max {out['max_solve_s']:.3f} s (paper: {PAPER_MEAN_SOLVE_S:g} s on average)")
    for g in out["grid"]:
        print(f"{g['devices']:>4} devices, {g['variants']} options, {g['demand_qps']:.0f} q/s: {g['solve_s']:.3f} s")
    for c in out["claims"]:
        print(f"{'holds' if c['holds'] else 'does not hold'}: {c['statement']} (paper {c['paper']}, ours {c['ours']})")


__all__ = ["add_arguments", "report", "run"]
