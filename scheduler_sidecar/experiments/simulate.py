"""``accscale simulate``: run one policy over one trace in the discrete-event simulator."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from pathlib import Path

import numpy as np

from loadtest.traces import Trace
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.systems import make_policy, option_names, policies, policy_class
from scheduler_sidecar.systems.loki.data import load_pipeline
from scheduler_sidecar.systems.loki.planner import DEFAULT_HEADROOM, LokiConfig
from scheduler_sidecar.systems.loki.policy import BUDGETS, DEFAULT_BUDGET, DEFAULT_DEQUEUE, DEQUEUES
from scheduler_sidecar.systems.ramsis.model_table import load_summary_csv, to_profile
from scheduler_sidecar.systems.superserve.optimal import solve_optimal

MAX_OPTIMAL_QUERIES = 200  # the time-indexed ZILP grows quickly; beyond this it is impractical



DEFAULT_SLO_MS = 36.0  # SuperServe Fig. 9's SLO, for a trace whose lines give none

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate a policy on a trace and a profile (discrete-event, profiled latencies)",
        description="Runs the same policy objects as the live sidecar on simulated time. Prints a summary; "
                    "--json prints one JSON object.")
    p.add_argument("--policy", choices=[*sorted(policies()), "optimal"], default="slackfit",
                   help="scheduling policy; 'optimal' solves the offline ZILP (small traces only)")
    p.add_argument("--profile", type=Path,
                   help="profile JSON (e.g. profiles/superserve_paper.json), or a RAMSIS latency summary CSV "
                        "(profiles/ramsis/ramsis_cpu_latency.csv; its p95, deterministic, as in RAMSIS' simulator)")
    p.add_argument("--profile-set", help="CSV profile only: which profile_set (e.g. image_cloud_cpu)")
    p.add_argument("--trace", type=Path, required=True, help="trace file: one 'arrival_s[,slo_ms[,payload]]' per line")
    p.add_argument("--workers", type=int, default=1, help="number of workers (default: 1)")
    p.add_argument("--slo-ms", type=float, default=None,
                   help="latency SLO for queries whose trace line has none (default: 36, SuperServe Fig. 9; with "
                        "--pipeline, every frame's end-to-end SLO, by default the pipeline's own)")
    p.add_argument("--device", help="device kind of the profile's latencies (default: its first)")
    p.add_argument("--variants", type=int, metavar="N",
                   help="keep N of the profile's variants, evenly spaced in accuracy (a smaller ZILP for optimal)")
    p.add_argument("--batch-sizes", metavar="B1,B2,...",
                   help="--policy optimal: the batch sizes the ZILP may use (default: every profiled one)")
    p.add_argument("--clipper-subnet", metavar="ID", help="the fixed variant of --policy clipper (default: most accurate)")
    p.add_argument("--fail-at", default="", metavar="T1,T2,...",
                   help="seconds at which one more worker fails (SuperServe Fig. 11a)")
    p.add_argument("--late-queries", choices=("drop", "serve"),
                   help="queries no option can serve in time: drop them or serve them late (default: drop; "
                        "serve for ramsis, jellyfish and modelswitching, which never drop in the paper)")
    p.add_argument("--num-buckets", type=int, default=32, help="SlackFit latency buckets (default: 32)")
    p.add_argument("--below-buckets", choices=("yield", "serve"), default="yield",
                   help="SlackFit below its smallest bucket: yield (serve only when nothing is queued behind; "
                        "the default) or serve (always)")
    p.add_argument("--admission", action="store_true",
                   help="refuse arrivals that the queue ahead makes infeasible, as the live sidecar does")
    p.add_argument("--latency-noise", choices=("none", "tail"), default="none",
                   help="batch latency: the profiled p50, or lognormal samples between p50 and p99")
    p.add_argument("--seed", type=int, default=0, help="seed of the latency noise (default: 0)")
    p.add_argument("--time-step-us", type=int, default=1000,
                   help="ZILP time grid for --policy optimal; with --bound upper at most the shortest latency")
    p.add_argument("--bound", choices=("upper", "feasible"), default="upper",
                   help="--policy optimal: 'upper' (default) rounds the grid outwards, so no policy can beat "
                        "its objective; 'feasible' rounds inwards, a runnable schedule and a lower bound on "
                        "the continuous-time optimum")
    r = p.add_argument_group("ramsis, jellyfish, modelswitching (RAMSIS, EuroSys '24)")
    r.add_argument("--ramsis-policies", type=Path, metavar="DIR",
                   help="ramsis: policy set from `accscale ramsis generate` for --workers and --slo-ms")
    r.add_argument("--ramsis-loads", metavar="L1,L2,...",
                   help="ramsis without --ramsis-policies: generate policies for these loads (q/s) now; "
                        "jellyfish/modelswitching: the load grid of their choices (default: every 100 q/s up to "
                        "the fastest model's peak throughput)")
    r.add_argument("--load-window-ms", type=float, default=500.0,
                   help="load monitor's moving-average window (default: 500, the paper's)")
    r.add_argument("--latency-stat", choices=("p50_ms", "p99_ms"), default="p99_ms",
                   help="profile latency the MDP and the baselines plan with (default: p99_ms; a CSV profile "
                        "holds its p95 in both)")
    r.add_argument("--ms-profile-s", type=float, default=300.0,
                   help="modelswitching: simulated seconds per (load, model) profiling run (default: 300, the "
                        "artifact's)")
    lk = p.add_argument_group("pipelines (Loki, HPDC '24): --pipeline instead of --profile and --policy")
    lk.add_argument("--pipeline", metavar="NAME|PATH",
                    help="traffic-analysis (the authors' profile), or a pipeline built here (its loki.json)")
    lk.add_argument("--system", default="loki", help="loki (default), inferline, proteus-per-task, or a dropping "
                                                     "mode: 'no dropping', 'last-task dropping', 'per-task dropping'")
    lk.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                    help=f"capacity planned per frame of demand (default: {DEFAULT_HEADROOM:g}; the paper: 1; bursty "
                         "traces need more)")
    lk.add_argument("--budget", choices=BUDGETS, default=DEFAULT_BUDGET,
                    help=f"a task's latency budget: paper (1 x l), artifact (2 x l), proportional (ours) (default: "
                         f"{DEFAULT_BUDGET})")
    lk.add_argument("--dequeue", choices=DEQUEUES, default=DEFAULT_DEQUEUE,
                    help=f"what early dropping also checks before a batch runs: none (the paper's), hopeless (ours: "
                         f"a query that can no longer meet its SLO), artifact (its task's budget) (default: "
                         f"{DEFAULT_DEQUEUE})")
    p.add_argument("--dynamics-csv", type=Path, help="write per-second dynamics (ingest, accuracy, batch, attainment)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def load_queries(trace_path: Path, slo_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """Arrival and deadline times in integer microseconds."""
    trace = Trace.load(trace_path)
    arrival_us = np.round(trace.arrival_s * 1e6).astype(np.int64)
    slo_us = np.round(np.where(np.isnan(trace.slo_ms), slo_ms, trace.slo_ms) * 1000).astype(np.int64)
    return arrival_us, arrival_us + slo_us


def load_profile(path: Path, profile_set: str | None = None):
    """A profile JSON, or a RAMSIS summary CSV turned into one (its p95 as p50 and p99, digest A7)."""
    if path.suffix.lower() == ".csv":
        return to_profile(load_summary_csv(path, profile_set))
    if profile_set:
        raise ConfigError("--profile-set applies to a RAMSIS summary CSV profile only")
    return Profile.load(path)


def run(args: argparse.Namespace) -> int:
    if args.pipeline:
        return _pipeline(args)
    if args.profile is None:
        raise ConfigError("--profile is required (or --pipeline for a pipeline)")
    if args.slo_ms is None:
        args.slo_ms = DEFAULT_SLO_MS
    profile = load_profile(args.profile, args.profile_set)
    if args.variants:
        profile = dataclasses.replace(profile, variants=tuple(profile.spread(args.variants)))
    arrival_us, deadline_us = load_queries(args.trace, args.slo_ms)
    fail_at = tuple(float(t) for t in args.fail_at.split(",") if t.strip())
    if args.policy == "optimal":
        summary = _optimal(args, profile, arrival_us, deadline_us, fail_at)
    else:
        summary = _simulate(args, profile, arrival_us, deadline_us, fail_at)
    summary = {"policy": args.policy, "workers": args.workers, **summary}
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:>24}: {value:.4f}" if isinstance(value, float) else f"{key:>24}: {value}")
    return 0


def _pipeline(args: argparse.Namespace) -> int:
    """A pipeline's frames through Loki or a baseline; every frame gets --slo-ms, or the pipeline's own SLO (the
    planner plans one end-to-end SLO: a trace line's own is not used)."""
    from scheduler_sidecar.experiments.loki.systems import (  # lazy: highspy, pulp
        ABLATIONS,
        SYSTEMS,
        Setup,
        metrics,
        simulate,
    )

    systems = SYSTEMS | ABLATIONS
    if args.system not in systems:
        raise ConfigError(f"unknown --system {args.system!r}; choose one of {sorted(systems)}")
    pipeline = load_pipeline(args.pipeline)
    if args.slo_ms is not None:  # the frames' SLO; the planner and the budgets plan for it
        if args.slo_ms <= 0:
            raise ConfigError(f"--slo-ms must be positive, got {args.slo_ms:g}")
        pipeline = dataclasses.replace(pipeline, slo_ms=args.slo_ms)
    arrival_us, _ = load_queries(args.trace, pipeline.slo_ms)
    first_s = arrival_us[arrival_us < 10_000_000]
    setup = Setup(pipeline, args.workers, LokiConfig(headroom=args.headroom), budget=args.budget,
                  dequeue=args.dequeue)
    run_ = simulate(systems[args.system], setup,
                    arrival_us, initial_demand_qps=len(first_s) / 10.0, seed=args.seed)
    summary = {"pipeline": pipeline.name, "system": args.system, "workers": args.workers, "slo_ms": pipeline.slo_ms,
               "headroom": args.headroom, "budget": args.budget, "dequeue": args.dequeue, **metrics(run_),
               "plans": len(run_.plans)}
    print(json.dumps(summary) if args.json else
          "\n".join(f"{k:>24}: {round(v, 4) if isinstance(v, float) else v}" for k, v in summary.items()))
    return 0


def _simulate(args, profile, arrival_us, deadline_us, fail_at) -> dict:
    if "policy_dir" in option_names(policy_class(args.policy)) and not (args.ramsis_policies or args.ramsis_loads):
        raise ConfigError(f"--policy {args.policy} needs --ramsis-policies DIR (from `accscale ramsis generate`) or "
                          "--ramsis-loads L1,L2,... (generate the policies now)")
    options = {"device": args.device, "late_queries": args.late_queries, "num_buckets": args.num_buckets,
               "below_buckets": args.below_buckets, "variant_id": args.clipper_subnet, "slo_ms": args.slo_ms,
               "window_ms": args.load_window_ms, "latency_stat": args.latency_stat, "profile_s": args.ms_profile_s,
               "policy_dir": args.ramsis_policies, "loads": None if args.ramsis_policies else args.ramsis_loads}
    config = SimConfig(workers=args.workers, seed=args.seed, latency_noise=args.latency_noise, fail_at_s=fail_at)
    result = simulated(args.policy, profile, arrival_us, deadline_us, config, admission=args.admission, **options)
    if args.dynamics_csv:
        write_dynamics(result.dynamics(), args.dynamics_csv)
    return result.summary()


def simulated(name: str, profile: Profile, arrival_us: np.ndarray, deadline_us: np.ndarray, config: SimConfig, *,
              admission: bool = False, **options):
    """Policy ``name`` on ``profile`` over the queries, simulated: each option goes to the policies whose
    constructors take it (None: the policy's default; late queries: the paper's rule unless given)."""
    cls = policy_class(name)
    options = {"workers": config.workers, **options}
    options["late_queries"] = options.get("late_queries") or cls.paper_late_queries
    accepted = option_names(cls)
    policy = make_policy(name, profile, **{k: v for k, v in options.items() if k in accepted and v is not None})
    return Simulator(policy, config, admission=admission).run(arrival_us, deadline_us)


def write_dynamics(dynamics: dict[str, np.ndarray], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(list(dynamics))
        for row in zip(*dynamics.values()):
            writer.writerow([f"{x:.6g}" for x in row])


def _optimal(args, profile, arrival_us, deadline_us, fail_at) -> dict:
    ignored = [flag for flag, used in (("--fail-at", fail_at),
                                       ("--late-queries serve", args.late_queries == "serve"),
                                       ("--latency-noise tail", args.latency_noise == "tail"),
                                       ("--dynamics-csv", args.dynamics_csv)) if used]
    if ignored:
        raise ConfigError(f"--policy optimal does not support {', '.join(ignored)}: the ZILP assumes healthy "
                         "workers, p50 latencies and late queries dropped, and has no dynamics; "
                         "remove the option")
    if len(arrival_us) > MAX_OPTIMAL_QUERIES:
        raise ConfigError(f"--policy optimal solves a time-indexed ZILP; {len(arrival_us)} queries is too many "
                         f"(at most {MAX_OPTIMAL_QUERIES}); cut the trace")
    sizes = [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else None
    result = solve_optimal(arrival_us.tolist(), deadline_us.tolist(), profile, workers=args.workers,
                           device=args.device, batch_sizes=sizes, time_step_us=args.time_step_us, bound=args.bound)
    n = len(arrival_us)
    # as the simulator's: the last completion or arrival (completions on the grid, relaxed for --bound upper)
    end_us = max([int(arrival_us.max(initial=0))] + [b.finish_us for b in result.batches])
    # late is 0 by construction: the ILP serves a query only within its deadline (1e), else drops it
    return {"queries": n, "met": result.served, "late": 0, "dropped": n - result.served,
            "slo_attainment": result.served / n if n else 0.0,
            "mean_serving_accuracy": result.objective / result.served if result.served else 0.0,
            "objective": result.objective, "best_bound": result.best_bound, "bound": result.bound,
            "time_step_us": result.time_step_us, "solver": result.solver, "status": result.status,
            "sim_seconds": end_us / 1e6}
