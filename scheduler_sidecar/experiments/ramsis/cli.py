"""``accscale ramsis generate`` and ``accscale ramsis baseline``: RAMSIS's offline phase."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scheduler_sidecar.systems.ramsis.baselines import jellyfish_plus_choice, modelswitching_choice
from scheduler_sidecar.systems.ramsis.generate import GAP_POINTS, MIN_STEP_QPS, generate_set
from scheduler_sidecar.systems.ramsis.mdp import SLACK_STEPS, MdpSpec
from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, load_table
from scheduler_sidecar.systems.ramsis.solve import MAX_SWEEPS, TOLERANCE

PROFILE_HELP = ("a project profile JSON (scheduler_sidecar/core/profile.py) or a RAMSIS latency summary CSV "
                "(the authors' ramsis_cpu_latency_summary.csv, or profiles/ramsis/ramsis_cpu_latency.csv)")


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--loads {text!r}: expected numbers separated by commas") from None
    if not loads or min(loads) <= 0:
        raise argparse.ArgumentTypeError(f"--loads {text!r}: expected positive queries per second")
    return loads


def _add_table_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", type=Path, required=True, help=PROFILE_HELP)
    p.add_argument("--profile-set", help="CSV only: which profile_set (e.g. image_cloud_cpu); needed if it has several")
    p.add_argument("--device", help="profile JSON only: device kind of the latencies (default: its first)")
    p.add_argument("--latency-stat", help="latency statistic: p50_ms, p90_ms, p95_ms, p99_ms or mean_ms for a CSV "
                                          "(default p95_ms, the paper's), p50_ms or p99_ms for a JSON (default p99_ms)")
    p.add_argument("--models", help="comma-separated model ids to consider (default: all), before Pareto pruning")
    p.add_argument("--no-pareto", action="store_true", help="keep models off the accuracy-latency Pareto front (§4.3.3)")
    p.add_argument("--slo-ms", type=float, required=True, help="latency SLO in ms (paper: 150/300/500 image)")
    p.add_argument("--workers", type=int, required=True, help="K, workers behind the round-robin balancer")
    p.add_argument("--loads", type=_loads, required=True, metavar="L1,L2,...",
                   help="loads at the central queue in queries per second")
    p.add_argument("--max-queue", type=int, default=MAX_QUEUE, help=f"N_w, the longest modelled worker queue "
                                                                      f"(default: {MAX_QUEUE}, the paper's)")


def register(subparsers: argparse._SubParsersAction) -> None:
    top = subparsers.add_parser("ramsis", help="RAMSIS (EuroSys '24): offline MDP policies and its baselines",
                                description="RAMSIS's offline phase: per-worker MDP policies per load, and the "
                                            "load-granular baselines' static choices.")
    sub = top.add_subparsers(dest="kind", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="generate a policy set over a load grid",
                       description="Builds and solves the per-worker MDP (§4) for each load, refines the load grid "
                                   "until adjacent policies' expected accuracies differ by < --gap-points, and writes "
                                   "one load-<qps>.npz per policy plus index.json to --out.")
    _add_table_args(g)
    g.add_argument("--out", type=Path, required=True, help="directory for the policy files and index.json")
    g.add_argument("--slack-steps", type=int, default=SLACK_STEPS,
                   help=f"D, fixed-length slack discretisation steps (default: {SLACK_STEPS}, the paper's)")
    g.add_argument("--discretization", choices=("fld", "md"), default="fld",
                   help="fld: fixed-length, D steps (default); md: model-based, every profiled latency <= SLO")
    g.add_argument("--batching", choices=("maximal", "variable"), default="maximal",
                   help="maximal: serve the whole queue (default, the paper's); variable: any batch 1..n")
    g.add_argument("--reward", choices=("per_batch", "per_query"), default="per_batch",
                   help="per_batch: Accuracy x [SLO met] per decision (default, the paper's); per_query: times b")
    g.add_argument("--gap-points", type=float, default=GAP_POINTS,
                   help=f"refine until adjacent expected accuracies differ by less than this many percentage "
                        f"points (default: {GAP_POINTS})")
    g.add_argument("--min-step-qps", type=float, default=MIN_STEP_QPS,
                   help=f"never split loads closer than this (default: {MIN_STEP_QPS})")
    g.add_argument("--no-refine", action="store_true", help="generate exactly --loads")
    g.add_argument("--tolerance", type=float, default=TOLERANCE,
                   help=f"value iteration stops when the span of value changes is below this (default: {TOLERANCE})")
    g.add_argument("--max-sweeps", type=int, default=MAX_SWEEPS, help=f"value iteration cap (default: {MAX_SWEEPS})")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=run_generate)
    b = sub.add_parser("baseline", help="the static model of ModelSwitching or Jellyfish+ per load",
                       description="Load-granular baselines (§7): Jellyfish+ (throughput rule with latency <= SLO/2) "
                                   "and ModelSwitching (most accurate model with < 1 %% of queries late in a "
                                   "simulated profiling run).")
    _add_table_args(b)
    b.add_argument("--method", choices=("modelswitching", "jellyfish"), required=True, help="which baseline")
    b.add_argument("--duration-s", type=float, default=300.0,
                   help="ModelSwitching: simulated seconds per (load, model) (default: 300, the artifact's)")
    b.add_argument("--seed", type=int, default=0, help="ModelSwitching: arrival seed (default: 0)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=run_baseline)


def _table(args: argparse.Namespace):
    table = load_table(args.profile, profile_set=args.profile_set, device=args.device, stat=args.latency_stat,
                       max_batch=max(args.max_queue, MAX_QUEUE))
    if args.models:
        table = table.select([m.strip() for m in args.models.split(",") if m.strip()])
    return table if args.no_pareto else table.pareto()


def run_generate(args: argparse.Namespace) -> int:
    table = _table(args)
    spec = MdpSpec(args.slo_ms, args.workers, args.loads[0], args.slack_steps, args.max_queue, args.discretization,
                   args.batching, args.reward)
    policies, refinement = generate_set(table, spec, args.loads, args.out, refine=not args.no_refine,
                                        gap_points=args.gap_points, min_step_qps=args.min_step_qps,
                                        tolerance=args.tolerance, max_sweeps=args.max_sweeps)
    rows = [{"load_qps": p.load_qps, "expected_accuracy_pct": round(100 * p.expected_accuracy, 3),
             "expected_violation_pct": round(100 * p.meta["expected_violation_rate"], 4),
             "seconds": p.meta["seconds"]} for p in policies]
    out = {"profile": table.name, "models": list(table.model_ids), "out": str(args.out), "policies": rows,
           "unresolved": [list(x) for x in refinement.unresolved]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{len(policies)} policies for {table.name} ({len(table.model_ids)} models) in {args.out}")
        for r in rows:
            print(f"  {r['load_qps']:>9g} qps  accuracy {r['expected_accuracy_pct']:7.3f} %  "
                  f"violation {r['expected_violation_pct']:8.4f} %  ({r['seconds']} s)")
    return 0


def run_baseline(args: argparse.Namespace) -> int:
    table = _table(args)
    rows = []
    for load in args.loads:
        if args.method == "jellyfish":
            c = jellyfish_plus_choice(table, load, args.workers, args.slo_ms)
        else:
            c = modelswitching_choice(table, load, args.workers, args.slo_ms, duration_s=args.duration_s,
                                      seed=args.seed)
        rows.append({"load_qps": load, "model": c.model_id, "max_batch": c.max_batch,
                     "violation_rate": c.violation_rate})
    if args.json:
        print(json.dumps({"method": args.method, "profile": table.name, "choices": rows}))
    else:
        for r in rows:
            print(f"{r['load_qps']:>9g} qps  {r['model']:<24} max batch {r['max_batch']}")
    return 0
