"""The scheduling core's benchmarks: ``accscale bench simulator``, ``slackfit``, ``overload-rules`` and
``optimal-gap`` (each one's description below is its ``--help``)."""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from loadtest.traces import bursty, gamma
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.core.queue import EdfQueue
from scheduler_sidecar.core.records import Outcome, Query, WorkerState
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.superserve.reproduce import PAPER_PROFILE
from scheduler_sidecar.sim.results import OUTCOME_CODES
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.systems import make_policy
from scheduler_sidecar.systems.superserve import optimal
from scheduler_sidecar.systems.superserve.slackfit import SlackFit

SIMULATOR = """Queries simulated per wall-clock second, and per CPU-minute of this process, on a bursty trace of exactly
--queries queries (default 1,000,000; SlackFit, the paper-scale profile, 8 workers, SLO 36 ms); the goal is
10,000,000 per CPU-minute."""
SLACKFIT = """The time of one SlackFit decide() with a synthetic profile of many Pareto subnets and batch sizes 1..16, on
a queue of queued queries (paper: well under 1 ms); median and p99."""
OVERLOAD_RULES = """SlackFit's rules below its smallest latency bucket (serve; yield to the queries behind), each with and
without admission, simulated under overload: queries met per rule, side by side."""
OPTIMAL_GAP = """Each policy's objective (profiled accuracy summed over queries that meet their SLO, Eq. 1) over the ZILP
optimum, on small random traces. The instances take turns in shape (one burst, a gamma renewal process of CV² 1 or
4, two bursts) and draw their rate and SLO from their own seeds. The profile is the paper-scale one cut to a few
subnets and batch sizes, with latencies rounded up to the ILP's time grid so that simulated schedules and the ILP
live on the same grid. Only instances the solver proves optimal enter the ratios; the others (time limit hit, no
solution) are listed and counted, never averaged."""


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("simulator", help="simulated queries per wall-clock second on a 1M-query trace",
                         description=SIMULATOR, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", type=int, default=1_000_000,
                   help="queries in the trace, exactly (default: 1,000,000)")
    p.add_argument("--profile", type=Path, default=PAPER_PROFILE, help="profile (default: the paper-scale one)")
    p.add_argument("--workers", type=int, default=8, help="workers (default: 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_simulator)
    s = kinds.add_parser("slackfit", help="SlackFit decision time with many Pareto subnets",
                         description=SLACKFIT, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--subnets", type=int, default=1000, help="Pareto subnets in the profile (default: 1000)")
    s.add_argument("--decisions", type=int, default=20_000, help="decide() calls timed (default: 20,000)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=run_slackfit)
    r = kinds.add_parser("overload-rules", help="SlackFit's below-bucket rules, with and without admission, "
                         "simulated under overload", description=OVERLOAD_RULES,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--profile", type=Path, default=PAPER_PROFILE, help="profile (default: the paper-scale one)")
    r.add_argument("--duration-s", type=float, default=20.0, help="length of each trace (default: 20)")
    r.add_argument("--slo-ms", type=float, default=36.0, help="every query's SLO (default: 36)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=run_overload_rules)
    g = kinds.add_parser("optimal-gap", help="policies' objective over the offline ZILP optimum on small traces",
                         description=OPTIMAL_GAP, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--traces", type=int, default=8, help="random traces (default: 8)")
    g.add_argument("--queries", type=int, default=24, help="queries per trace (default: 24)")
    g.add_argument("--workers", type=int, default=2, help="workers (default: 2)")
    g.add_argument("--seed", type=int, default=0, help="seed of the instances (default: 0)")
    g.add_argument("--time-limit-s", type=float, default=20.0,
                   help="solver time limit per instance; an instance that hits it is reported, not averaged "
                        "(default: 20)")
    g.add_argument("--profile", type=Path, default=PAPER_PROFILE, help="profile to cut down (default: the paper's)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=run_optimal_gap)


def run_simulator(args: argparse.Namespace) -> int:
    if args.queries < 1:
        raise ConfigError(f"--queries must be >= 1, got {args.queries}")
    profile = Profile.load(args.profile)
    base_qps, variant_qps = 1500.0, 5550.0
    # a trace of the mean length holds fewer queries about half the time: lengthen it until it holds them all
    duration_s = 1.01 * args.queries / (base_qps + variant_qps)
    while len(trace := bursty(base_qps, variant_qps, cv2=8, duration_s=duration_s, seed=0)) < args.queries:
        duration_s *= 1.01
    arrival_us = np.round(trace.arrival_s[: args.queries] * 1e6).astype(np.int64)
    cpu_started = time.process_time()
    result = Simulator(make_policy("slackfit", profile), SimConfig(workers=args.workers)).run(
        arrival_us, arrival_us + 36_000)
    cpu_s = time.process_time() - cpu_started  # a shared machine's other load does not count against it
    s = result.summary()
    if s["queries"] != args.queries:
        raise RuntimeError(f"simulated {s['queries']} queries, not the {args.queries} asked for")
    out = {"queries": s["queries"], "trace_seconds": float(arrival_us[-1] / 1e6), "wall_seconds": s["wall_seconds"],
           "queries_per_wall_second": s["queries_per_wall_second"],
           "queries_per_wall_minute": 60 * s["queries_per_wall_second"], "cpu_seconds": cpu_s,
           "queries_per_cpu_minute": 60 * s["queries"] / cpu_s,
           "slo_attainment": s["slo_attainment"], "decisions": s["decisions"]}
    print(json.dumps(out) if args.json else "\n".join(f"{k:>24}: {v}" for k, v in out.items()))
    return 0


# (name, workers, [(rate q/s, share of the trace)]): issue 26's overload traces on the paper profile
OVERLOAD_TRACES = (("gamma 7000 q/s, CV2 8", 4, ((7000.0, 1.0),)),
                   ("step 1000 -> 9000 q/s", 5, ((1000.0, 0.5), (9000.0, 0.5))))


def run_overload_rules(args: argparse.Namespace) -> int:
    """Queries met under overload by SlackFit's two below-bucket rules, each with the engine's admission off and
    on, on the same traces (gamma with CV2 8; Poisson steps), side by side."""
    profile = Profile.load(args.profile)
    rows = []
    for name, workers, phases in OVERLOAD_TRACES:
        parts, start_s = [], 0.0
        for seed, (rate, share) in enumerate(phases):
            length_s = share * args.duration_s
            parts.append(start_s + gamma(rate, 8.0 if len(phases) == 1 else 1.0, length_s, seed=seed).arrival_s)
            start_s += length_s
        arrival_us = np.round(np.concatenate(parts) * 1e6).astype(np.int64)
        for rule in ("serve", "yield"):
            for admission in (False, True):
                policy = make_policy("slackfit", profile, below_buckets=rule)
                s = Simulator(policy, SimConfig(workers), admission=admission).run(
                    arrival_us, arrival_us + round(args.slo_ms * 1000)).summary()
                rows.append({"trace": name, "workers": workers, "rule": rule, "admission": admission,
                             "queries": s["queries"], "met": s["met"], "slo_attainment": round(s["slo_attainment"], 4),
                             "mean_serving_accuracy": round(s["mean_serving_accuracy"], 4),
                             "rejected": s["rejected"], "dropped": s["dropped"], "late": s["late"]})
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(f"{r['trace']:<24} {r['workers']} workers  rule {r['rule']:<5}  admission {'on ' if r['admission'] else 'off'}"
                  f"  met {r['met']:>7} of {r['queries']}  accuracy {r['mean_serving_accuracy']:.4f}  "
                  f"rejected {r['rejected']:>6}  dropped {r['dropped']:>6}  late {r['late']:>5}")
    return 0


def synthetic_pareto_profile(num_subnets: int, batch_sizes: tuple[int, ...] = tuple(range(1, 17))):
    """A Pareto profile: accuracy 0.70..0.80 and latency both rising with the subnet index."""
    variants = []
    for i in range(num_subnets):
        per_sample_ms = 0.5 + 4.5 * i / max(num_subnets - 1, 1)
        p50 = tuple(1.0 + per_sample_ms * b ** 0.8 for b in batch_sizes)
        variants.append(Variant(f"s{i:04d}", 0.70 + 0.10 * i / max(num_subnets - 1, 1),
                                Actuation("model", f"s{i:04d}"),
                                {"sim": LatencyCurve(batch_sizes, p50, tuple(1.05 * x for x in p50))}))
    return Profile("synthetic", "scheduler_sidecar/experiments/bench.py", tuple(variants))


def run_slackfit(args: argparse.Namespace) -> int:
    profile = synthetic_pareto_profile(args.subnets)
    started = time.perf_counter()
    policy = SlackFit(profile)
    policy.menu()  # the offline phase: the buckets of the device kind, built on first use
    offline_ms = (time.perf_counter() - started) * 1e3
    rng = np.random.default_rng(0)
    workers = [WorkerState(0, device=policy.device)]  # the synthetic profile's device kind
    samples = np.empty(args.decisions)
    for i in range(args.decisions):
        queue = EdfQueue()  # a fresh queue of 64 queries with a random head slack each time
        slack_us = int(rng.integers(1_000, 120_000))
        for j in range(64):
            queue.push(Query(slack_us + j, j, j, 0))
        view = queue.view()
        start = time.perf_counter()
        policy.decide(0, view, workers)
        samples[i] = time.perf_counter() - start
    out = {"subnets": args.subnets, "buckets": len(policy.buckets), "offline_ms": offline_ms,
           "decide_median_us": float(np.median(samples) * 1e6), "decide_p99_us": float(np.percentile(samples, 99) * 1e6)}
    print(json.dumps(out) if args.json else "\n".join(f"{k:>18}: {v}" for k, v in out.items()))
    return 0


GAP_POLICIES = ("slackfit", "maxacc", "maxbatch", "infaas", "clipper")
GAP_STEP_MS = 1


def gridded(profile, num_variants: int = 4, batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)):
    """``profile`` cut to a few variants and batch sizes, latencies rounded up to whole GAP_STEP_MS."""

    variants = []
    for v in profile.spread(num_variants):
        curve = v.latency[profile.device_kinds[0]]
        p50 = tuple(float(GAP_STEP_MS * math.ceil(curve.p50_at(b) / GAP_STEP_MS)) for b in batch_sizes)
        variants.append(replace(v, latency={"grid": LatencyCurve(batch_sizes, p50, p50)}))
    return replace(profile, name=f"{profile.name}-grid", variants=tuple(variants))


GAP_SHAPES = ("burst", "gamma", "two_bursts")
GAP_SLOS_MS = (16, 20, 24, 30, 36)
GAP_RATE_PER_WORKER_QPMS = (1.0, 8.0)  # offered load per worker, queries per ms, drawn log-uniformly


def gap_instance(seed: int, index: int, queries: int, workers: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Instance ``index``: arrivals and deadlines (us, on the 1 ms grid) and what was drawn for them.

    The shape cycles with ``index``; rate, SLO and arrivals come from the instance's own seed. "burst"
    spreads the queries uniformly over queries / rate ms; "gamma" is a renewal process of that rate with
    CV² 1 or 4; "two_bursts" is two such bursts of half the queries each, the second 0.5 to 2 SLOs after
    the first.
    """
    rng = np.random.default_rng([seed, index])
    shape = GAP_SHAPES[index % len(GAP_SHAPES)]
    slo_ms = int(rng.choice(GAP_SLOS_MS))
    lo, hi = GAP_RATE_PER_WORKER_QPMS
    rate_qpms = float(np.exp(rng.uniform(np.log(lo), np.log(hi)))) * workers
    info: dict[str, object] = {"shape": shape, "slo_ms": slo_ms, "rate_qps": round(1000 * rate_qpms, 1)}
    if shape == "burst":
        t_ms = rng.uniform(0, queries / rate_qpms, queries)
    elif shape == "gamma":
        cv2 = float(rng.choice([1.0, 4.0]))
        t_ms = np.cumsum(rng.gamma(1 / cv2, cv2 / rate_qpms, queries))
        t_ms -= t_ms[0]
        info["cv2"] = cv2
    else:
        first = queries // 2
        gap_ms = float(rng.uniform(0.5, 2.0)) * slo_ms
        t_ms = np.concatenate([rng.uniform(0, first / rate_qpms, first),
                               gap_ms + rng.uniform(0, (queries - first) / rate_qpms, queries - first)])
        info["gap_ms"] = round(gap_ms, 1)
    arrival = np.sort(np.floor(t_ms).astype(np.int64)) * 1000
    return arrival, arrival + slo_ms * 1000, info


def run_optimal_gap(args: argparse.Namespace) -> int:
    if args.traces < 1 or args.queries < 1:
        raise ConfigError("--traces and --queries must be >= 1")
    profile = gridded(Profile.load(args.profile))
    ratios: dict[str, list[float]] = {p: [] for p in GAP_POLICIES}
    instances, optima = [], []
    for i in range(args.traces):
        arrival, deadline, info = gap_instance(args.seed, i, args.queries, args.workers)
        result = optimal.solve_optimal(arrival.tolist(), deadline.tolist(), profile, workers=args.workers,
                               time_step_us=GAP_STEP_MS * 1000, time_limit_s=args.time_limit_s)
        # objective: the best schedule found (the optimum only when status is "optimal"; None: none found)
        instances.append({**info, "status": result.status,
                          "objective": None if result.status == "no_solution" else result.objective,
                          "best_bound": result.best_bound})
        if result.status != "optimal":
            # a time-limited objective is only a lower bound on the optimum, and no solution is none at all:
            # either would make the ratios meaningless, so the instance is reported and left out
            continue
        optima.append(result.objective)
        for name in GAP_POLICIES:
            sim = Simulator(make_policy(name, profile), SimConfig(workers=args.workers)).run(arrival, deadline)
            met = sim.outcome == OUTCOME_CODES[Outcome.MET]
            objective = float(sim.accuracy[met].sum())
            ratios[name].append(objective / result.objective if result.objective else 1.0)
    not_optimal = [dict(instance=i, **x) for i, x in enumerate(instances) if x["status"] != "optimal"]
    out = {"traces": args.traces, "queries": args.queries, "workers": args.workers, "seed": args.seed,
           "optimal_instances": len(optima), "not_optimal": not_optimal, "instances": instances,
           "objective_over_optimum": {p: {"mean": float(np.mean(r)), "min": float(np.min(r))} if r else None
                                      for p, r in ratios.items()}}
    if args.json:
        print(json.dumps(out))
        return 0
    for i, x in enumerate(instances):
        drawn = ", ".join(f"{k}={x[k]}" for k in ("shape", "slo_ms", "rate_qps", "cv2", "gap_ms") if k in x)
        found = (f"optimum {x['objective']:.3f}" if x["status"] == "optimal" else
                 f"{x['status']} (best found {x['objective']}, bound {x['best_bound']}): left out")
        print(f"instance {i}: {drawn}: {found}")
    print(f"{len(optima)} of {args.traces} instances solved to proven optimality"
          + (f"; {len(not_optimal)} left out of the ratios (status not optimal)" if not_optimal else ""))
    for p, r in out["objective_over_optimum"].items():
        print(f"{p:>10}: objective / ZILP optimum = " + (f"{r['mean']:.3f} mean, {r['min']:.3f} worst" if r
                                                          else "n/a (no instance solved to optimality)"))
    return 0
