"""``accscale bench fidelity``: each system live (the sidecar in front of real Tritons) against the simulator on the
same trace, profile, policy, planner and workers.

The trace is replayed open loop through the sidecar (Locust) and simulated with the profiles' p50 latencies. The
live side is scored in the sidecar (its /metrics, from arrival at the sidecar, which is what the simulator models)
and at the client too (from each request's scheduled arrival, the client's own delays included). SLO attainments
and accuracies are printed side by side with their gaps in points (live minus simulated).

Each system is a function of one module here, ``SYSTEM(args, folder, progress) -> result``: ``superserve`` and
``ramsis`` in :mod:`.supernet`, and :mod:`.proteus`, :mod:`.loki` and :mod:`.hybridserve`, each with how it deploys,
simulates and scores its system; :mod:`.common` holds what they share.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import tempfile
from pathlib import Path

from export.presets import DEFAULT_BUILD_DIR
from scheduler_sidecar.systems.hybridserve.placement import BALANCED, NEAREST
from scheduler_sidecar.systems.hybridserve.planner import MODES

# system -> the module of this package that runs it (imported when it runs: each brings its system's code)
SYSTEMS = {"superserve": "supernet", "ramsis": "supernet", "proteus": "proteus", "loki": "loki",
           "hybridserve": "hybridserve"}

SLO_MS = {"superserve": 30.0, "ramsis": 30.0, "proteus": 100.0, "loki": 200.0, "hybridserve": 4000.0}  # defaults


def register_bench(kinds: argparse._SubParsersAction) -> None:
    f = kinds.add_parser("fidelity", help="each system live (sidecar + Triton) against the simulator, one trace",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--system", choices=SYSTEMS, default="superserve", help="which system (default: superserve)")
    f.add_argument("--profile", type=Path, default=Path("build/full/profile.json"),
                   help="superserve, ramsis: profile measured through Triton (default: build/full/profile.json, "
                        "`accscale profile`)")
    f.add_argument("--repository", type=Path, default=Path("model_repository"),
                   help="superserve, ramsis: Triton repository exported with that profile (default: model_repository)")
    f.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR,
                   help="proteus, loki, hybridserve: where their models are built (default: build)")
    f.add_argument("--trace", type=Path,
                   help="superserve, ramsis, hybridserve: trace to replay (default: generated, --duration-s long; "
                        "hybridserve draws payloads for a trace without them)")
    f.add_argument("--duration-s", type=float, default=30.0, help="length of a generated trace (default: 30)")
    f.add_argument("--policy", default="slackfit", help="superserve: the policy of both drivers (default: slackfit)")
    f.add_argument("--workers", type=int, default=1, help="superserve, ramsis: Triton servers, one worker each "
                                                          "(default: 1)")
    f.add_argument("--slo-ms", type=float, help="SLO of trace lines without one (default: " + ", ".join(
        f"{s} {ms:g}" for s, ms in SLO_MS.items()) + ")")
    f.add_argument("--base-qps", type=float, default=20.0, help="proteus: each query type's rate (default: 20)")
    f.add_argument("--burst-qps", type=float, default=250.0,
                   help="proteus: digits' rate in the middle third (default: 250)")
    f.add_argument("--period-s", type=float, default=10.0, help="proteus: the planner's period (default: 10)")
    f.add_argument("--burst-window", choices=("sliding", "whole-seconds"), default="sliding",
                   help="proteus: the planner's burst rule (default: sliding; whole-seconds, the rule before)")
    f.add_argument("--rate-qps", type=float, default=300.0, help="hybridserve: the trace's mean rate (default: 300)")
    f.add_argument("--mode", choices=MODES, default="ap", help="hybridserve: the planner's mode (default: ap)")
    f.add_argument("--no-prune", dest="prune", action="store_false",
                   help="hybridserve: the whole family's cascade, not Algorithm 2's")
    f.add_argument("--instances", type=int,
                   help="loki: the replica budget (default: 6); hybridserve: the model instances the replicas share "
                        "(default: 16)")
    f.add_argument("--bls-instances", type=int,
                   help="hybridserve: instances of the cascade's BLS model (default: the demo's, "
                        "each a batch through every hop at once)")
    f.add_argument("--rounding", choices=(NEAREST, BALANCED), default=NEAREST,
                   help="hybridserve: how the replicas are rounded (default: nearest)")
    f.add_argument("--out", type=Path, help="keep the run's files here: traces, configs, request logs, the sidecar's "
                                            "log (default: a temporary folder)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    args.slo_ms = args.slo_ms or SLO_MS[args.system]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(args.out) if args.out else tempfile.TemporaryDirectory() as tmp:
        system = importlib.import_module(f"{__name__}.{SYSTEMS[args.system]}")
        result = getattr(system, args.system)(args, Path(tmp), progress)
    if args.json:
        print(json.dumps(result))
        return 0
    accuracy = result["accuracy_metric"]
    views = [(f"live, {side}", result[f"live_{side}"]) for side in ("client", "sidecar") if f"live_{side}" in result]
    print(f"{args.system}: {result['queries']} queries; accuracy: {accuracy}")
    print(f"{'':<26} {'attainment':>10} {'accuracy':>9}")
    for name, r in (*views, ("simulated", result["simulated"])):
        print(f"{name:<26} {r['slo_attainment']:>10.4f} {100 * r[accuracy]:>8.2f}%")
    for side, gap in result["attainment_gap_pts"].items():
        print(f"gap (points), {side:<12} {gap:>10.2f} {result['accuracy_gap_pts'][side]:>9.2f}")
    for model, by in result.get("by_model", {}).items():
        for name, r in (("live, sidecar", by["live_sidecar"]), ("simulated", by["simulated"])):
            print(f"{model + ', ' + name:<26} {r['slo_attainment']:>10.4f} {100 * r[accuracy]:>8.2f}%")
    for key in ("deployment", "differences"):
        for name, value in result.get(key, {}).items():
            print(f"{name}: {json.dumps(value)}")
    return 0
