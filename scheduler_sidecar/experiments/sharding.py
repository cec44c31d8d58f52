"""``accscale bench sharding``: what scaling the sidecar out by shards costs, measured in the simulator.

One sidecar's scheduler sees all of its workers. Scaled out, K sidecars each own a shard: 1/K of the Triton
workers, and the clients a Kubernetes Service spreads over them, so 1/K of the arrivals, each request to a shard
drawn at random (a Service balances connections, not load). Each shard runs its own engine and, for Proteus,
its own planner over its own devices; nothing moves between shards. This runs K independent simulations over
the K parts of one trace, for each K, against K = 1 (one engine over everything), and reports the SLO attainment
and accuracy over all queries, and what each K loses against K = 1 in points.

- ``superserve``: SlackFit, the paper-scale profile, 8 workers, SuperServe's bursty trace (README's: base 1500
  q/s, variant 5550 q/s, CV² 8) at SLO 36 ms.
- ``proteus``: Proteus's planner and batching, the authors' profile and cluster (20 CPU, 10 Pascal, 10 Ampere),
  the medium-normal_load trace at SLO 300 ms. A shard gets every K-th device of each kind, so where K does not
  divide a kind's count the shards differ in capacity while their arrivals do not.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from loadtest.traces import bursty
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Outcome
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.proteus.data import (
    PAPER_CLUSTER,
    TRACE_SLO_MS,
    arrivals,
    load_counts,
    load_profiles,
)
from scheduler_sidecar.experiments.superserve.reproduce import PAPER_PROFILE
from scheduler_sidecar.sim.results import OUTCOME_CODES, SimResult, markdown_table
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.systems.superserve.slackfit import SlackFit

SHARDS = (1, 2, 4, 8)
MET = OUTCOME_CODES[Outcome.MET]


@dataclass(frozen=True)
class Queries:
    """One trace: arrival, deadline and query type (an index into ``types``) per query, in arrival order."""

    arrival_us: np.ndarray
    deadline_us: np.ndarray
    type_index: np.ndarray
    types: tuple[str, ...]

    def part(self, mask: np.ndarray) -> Queries:
        return Queries(self.arrival_us[mask], self.deadline_us[mask], self.type_index[mask], self.types)


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("sharding", help="K sidecars, each over 1/K of the workers and arrivals, against one "
                         "(simulated)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=("superserve", "proteus"), default="superserve",
                   help="whose trace, profile and scheduler (default: superserve)")
    p.add_argument("--shards", default=",".join(map(str, SHARDS)), help="values of K (default: 1,2,4,8)")
    p.add_argument("--duration-s", type=float, default=60.0,
                   help="the trace's length: SuperServe's generated one, or the first seconds of Proteus's "
                        "(default: 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the trace and of each request's shard (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        shards = sorted({int(k) for k in args.shards.split(",")})
    except ValueError:
        raise ConfigError(f"--shards takes whole numbers, got {args.shards!r}") from None
    if not shards or shards[0] < 1 or not args.duration_s > 0:
        raise ConfigError("--shards must be >= 1 and --duration-s > 0")
    queries, simulate, workers = SYSTEMS[args.system](args)
    if shards[-1] > workers:
        raise ConfigError(f"{args.system} has {workers} workers: at most that many shards")
    rows = table(queries, simulate, shards, args.seed)
    if args.json:
        print(json.dumps({"system": args.system, "queries": len(queries.arrival_us), "workers": workers,
                          "rows": rows}))
    else:
        print(markdown_table(rows, list(rows[0])))
    return 0


def table(queries: Queries, simulate: Callable[[Queries, int, int], SimResult], shards: Sequence[int],
          seed: int) -> list[dict]:
    """Per K: attainment and accuracy over every query of every shard, and their loss against the first K."""
    rows = []
    for k in shards:
        shard = np.random.default_rng(seed).integers(0, k, size=len(queries.arrival_us))
        results = [simulate(queries.part(shard == j), k, j) for j in range(k)]
        met = np.concatenate([r.outcome == MET for r in results])
        accuracy = np.concatenate([r.accuracy[r.outcome == MET] for r in results])
        rows.append({"shards": k, "queries": int(met.size), "slo_attainment": round(float(met.mean()), 4),
                     "accuracy": round(float(accuracy.mean()) if accuracy.size else 0.0, 4)})
    for row in rows:
        row["attainment_lost_points"] = round(100 * (rows[0]["slo_attainment"] - row["slo_attainment"]), 2)
        row["accuracy_lost_points"] = round(100 * (rows[0]["accuracy"] - row["accuracy"]), 2)
    return rows


def superserve(args: argparse.Namespace) -> tuple[Queries, Callable[[Queries, int, int], SimResult], int]:
    workers = 8
    trace = bursty(1500.0, 5550.0, 8.0, args.duration_s, seed=args.seed)
    arrival = np.round(trace.arrival_s * 1e6).astype(np.int64)
    queries = Queries(arrival, arrival + 36_000, np.zeros(len(arrival), np.int64), ("",))
    profile = Profile.load(PAPER_PROFILE)

    def simulate(part: Queries, k: int, j: int) -> SimResult:
        # the j-th of k shards: every k-th worker
        return Simulator(SlackFit(profile), SimConfig(workers=len(range(j, workers, k)), seed=args.seed)).run(
            part.arrival_us, part.deadline_us)
    return queries, simulate, workers


def proteus(args: argparse.Namespace) -> tuple[Queries, Callable[[Queries, int, int], SimResult], int]:
    from scheduler_sidecar.experiments.proteus.systems import SYSTEMS as PROTEUS  # lazy: PuLP
    from scheduler_sidecar.experiments.proteus.systems import Setup, simulate_queries

    counts = load_counts()
    counts = type(counts)(counts.families, counts.per_second[:int(args.duration_s)])
    arrival, deadline, names = arrivals(counts, TRACE_SLO_MS, seed=args.seed)
    types = tuple(counts.families)
    index = {f: i for i, f in enumerate(types)}
    queries = Queries(arrival, deadline, np.array([index[n] for n in names], dtype=np.int64), types)
    profiles = load_profiles()
    initial = dict(zip(counts.families, counts.per_second[:10].mean(axis=0).tolist()))

    def simulate(part: Queries, k: int, j: int) -> SimResult:
        # the j-th of k shards: every k-th device of each kind, and 1/k of the starting demand
        cluster = {kind: len(range(j, n, k)) for kind, n in PAPER_CLUSTER.items()}
        setup = Setup(profiles, {kind: n for kind, n in cluster.items() if n}, TRACE_SLO_MS)
        return simulate_queries(PROTEUS["proteus"], setup, types, part.arrival_us, part.deadline_us,
                                [types[t] for t in part.type_index], {f: q / k for f, q in initial.items()},
                                seed=args.seed).result
    return queries, simulate, sum(PAPER_CLUSTER.values())


SYSTEMS = {"superserve": superserve, "proteus": proteus}
