"""``accscale bench ramsis``: policy-generation time (RAMSIS Table 2).

One policy (MDP build, value iteration, stationary expectations) for the imported image
profile's 9 Pareto models, FLD with D = 100 and N_w = 32, maximal batching; the paper reports
132.20 s for this row (hardware, K and load unstated). Side by side in the same run, as the
paper's own ratios: D = 10 (paper: 14.62 s, 9.0x faster) and, with --variable, variable
batching (paper: 3014.89 s, 22.8x slower). Single-threaded BLAS is advised for a one-core
figure (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from scheduler_sidecar.systems.ramsis import LATENCY_CSV
from scheduler_sidecar.systems.ramsis.model_table import load_summary_csv

PAPER_SECONDS = {"fld100_max": 132.20, "fld10_max": 14.62, "fld100_var": 3014.89}


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("ramsis", help="RAMSIS policy-generation time (Table 2: D=100, N_w=32, 9 models)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slo-ms", type=float, default=500.0,
                   help="SLO (default: 500, where the paper's B_w = 29 holds)")
    p.add_argument("--workers", type=int, default=60, help="K (default: 60, the constant-load set-up of §7.2)")
    p.add_argument("--load-qps", type=float, default=2000.0, help="load at the central queue (default: 2000)")
    p.add_argument("--repeats", type=int, default=3, help="timed generations per row; the median is reported")
    p.add_argument("--variable", action="store_true", help="also time variable batching (slower)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scheduler_sidecar.systems.ramsis.generate import generate_policy  # lazy: scipy
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec  # lazy: scipy

    table = load_summary_csv(LATENCY_CSV, "image_cloud_cpu").pareto()
    rows = {"fld100_max": MdpSpec(args.slo_ms, args.workers, args.load_qps),
            "fld10_max": MdpSpec(args.slo_ms, args.workers, args.load_qps, slack_steps=10)}
    if args.variable:
        rows["fld100_var"] = MdpSpec(args.slo_ms, args.workers, args.load_qps, batching="variable")
    out: dict[str, object] = {"models": len(table.model_ids), "slo_ms": args.slo_ms, "workers": args.workers,
                              "load_qps": args.load_qps}
    for name, spec in rows.items():
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            policy = generate_policy(table, spec)
            times.append(time.perf_counter() - started)
        seconds = statistics.median(times)
        out[name] = {"seconds": round(seconds, 3), "paper_seconds": PAPER_SECONDS[name],
                     "speedup_vs_paper": round(PAPER_SECONDS[name] / seconds, 1),
                     "states": policy.meta["num_states"], "sweeps": policy.meta["sweeps"],
                     "expected_accuracy_pct": round(100 * policy.expected_accuracy, 3)}
    base = out["fld100_max"]["seconds"]  # type: ignore[index]
    out["d100_over_d10"] = round(base / out["fld10_max"]["seconds"], 2)  # type: ignore[index]
    if args.variable:
        out["variable_over_maximal"] = round(out["fld100_var"]["seconds"] / base, 2)  # type: ignore[index]
    print(json.dumps(out) if args.json else "\n".join(f"{k:>22}: {v}" for k, v in out.items()))
    return 0
