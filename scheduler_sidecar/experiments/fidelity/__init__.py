"""``accscale bench fidelity``: each system live (the sidecar in front of real Tritons) against the simulator on the
same trace, profile, policy, planner and workers.

The trace is replayed open loop through the sidecar (Locust) and simulated with the profiles' p50 latencies. The
live side is scored in the sidecar (its /metrics, from arrival at the sidecar, which is what the simulator models)
and at the client too (from each request's scheduled arrival, the client's own delays included). SLO attainments
and accuracies are printed side by side with their gaps in points (live minus simulated).

``--load 0.5 1 1.3 --runs 3`` runs each system at those multiples of its planned capacity, three times each, and
reports the spread of each gap (min, median, max). A system's planned capacity is what its own planner would plan
for on its most accurate configuration, so that beyond 1x accuracy scaling must serve (each module's
``planned_capacity``): the most accurate subnet's rate within SLO/2 (superserve, ramsis), the Proteus MILP's in the
demo's burst mix with each type on its most accurate variant, Loki's hardware scaling alone, and HybridServe's cost
model on its cascade's replicas. The trace keeps each system's shape and takes that rate as its mean (Proteus: its
burst third's).

Each system is a function of one module here, ``SYSTEM(args, folder, progress) -> result``: ``superserve`` and
``ramsis`` in :mod:`.supernet`, and :mod:`.proteus`, :mod:`.loki` and :mod:`.hybridserve`, each with how it deploys,
simulates and scores its system; :mod:`.common` holds what they share.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

from export.presets import DEFAULT_BUILD_DIR
from scheduler_sidecar.systems.hybridserve.placement import BALANCED, NEAREST
from scheduler_sidecar.systems.hybridserve.planner import MODES

# system -> the module of this package that runs it (imported when it runs: each brings its system's code)
SYSTEMS = {"superserve": "supernet", "ramsis": "supernet", "proteus": "proteus", "loki": "loki",
           "hybridserve": "hybridserve"}

# the systems --slowdown emulates a device for, their default SLO scaled with it (the others bring their own)
EMULATED = ("superserve", "ramsis", "hybridserve")
SLO_MS = {"superserve": 30.0, "ramsis": 30.0, "proteus": 100.0, "loki": 200.0, "hybridserve": 4000.0}  # defaults


def register_bench(kinds: argparse._SubParsersAction) -> None:
    f = kinds.add_parser("fidelity", help="each system live (sidecar + Triton) against the simulator, one trace",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--system", choices=SYSTEMS, nargs="+", default=["superserve"],
                   help="which systems (default: superserve)")
    f.add_argument("--load", type=float, nargs="+",
                   help="the trace's rate as multiples of the deployment's planned capacity, one run each (e.g. 0.5 "
                        "1 1.3; default: each system's own rates): superserve, ramsis, loki and hybridserve the "
                        "mean rate, proteus its burst third's")
    f.add_argument("--runs", type=int, default=1, help="runs of each system at each load (default: 1); with more "
                                                       "than one run, the spread of each gap is reported")
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
    f.add_argument("--slowdown", type=float, default=1.0, metavar="F",
                   help="superserve, ramsis: serve on an emulated device F times slower than this machine (its "
                        "profile's latencies F times longer, the default SLO too), so that the model, not this "
                        "machine's cores, bounds the capacity (default: 1); hybridserve: F times slower than the "
                        "demo's emulated device (the default SLO too), so that the cascade's capacity, not these "
                        "cores, bounds a load of 1.3x (a family built here planned 1,132 requests/s at F = 1)")
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
    f.add_argument("--serving", choices=("staged", "bls"), default="staged",
                   help="hybridserve: each cascade model a logical model of the sidecar, an escalation queued at the "
                        "next model (staged, the default, as the paper and the simulator serve it), or the cascade's "
                        "BLS model, whose instance holds a batch through every model (bls)")
    f.add_argument("--bls-instances", type=int,
                   help="loki, hybridserve --serving bls: instances of the BLS model, each a batch through every "
                        "hop at once, and the sidecar's slots on it (default: the demo's: loki 8, hybridserve 64)")
    f.add_argument("--rounding", choices=(NEAREST, BALANCED), default=NEAREST,
                   help="hybridserve: how the replicas are rounded (default: nearest)")
    f.add_argument("--out", type=Path, help="keep the run's files here: traces, configs, request logs, the sidecar's "
                                            "log, its result.json (default: a temporary folder; with several runs, "
                                            "a folder each)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    if args.runs < 1 or any(not load > 0 for load in args.load or ()) or not args.slowdown >= 1:
        raise SystemExit("accscale bench fidelity: --runs must be >= 1, every --load > 0 and --slowdown >= 1")
    if args.load and args.trace:
        raise SystemExit("accscale bench fidelity: --load sets the trace's rate; it takes no --trace")
    cells = [(system, load, k) for system in args.system for load in (args.load or [None]) for k in range(args.runs)]
    results = []
    for system, load, k in cells:
        one = argparse.Namespace(**{**vars(args), "system": system, "load": load,
                                    "slo_ms": args.slo_ms or SLO_MS[system] * (
                                        args.slowdown if system in EMULATED else 1)})
        if len(cells) > 1:
            progress(f"== {system}" + (f" at {load:g}x its planned capacity" if load else "") + f", run {k + 1}")
        out = args.out / f"{system}-{load or 'rates'}-{k + 1}" if args.out and len(cells) > 1 else args.out
        results.append(_one(one, out, progress) | ({"load": load, "run": k + 1} if len(cells) > 1 else {}))
    if len(results) == 1:
        (result,) = results
        if args.json:
            print(json.dumps(result))
        else:
            _print(args.system[0], result)
        return 0
    table = spread(results)
    if args.json:
        print(json.dumps({"runs": results, "summary": table}))
        return 0
    print(_table(table))
    return 0


def _one(args: argparse.Namespace, out: Path | None, progress) -> dict:
    if out:
        out.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(out) if out else tempfile.TemporaryDirectory() as tmp:
        system = importlib.import_module(f"{__name__}.{SYSTEMS[args.system]}")
        result = getattr(system, args.system)(args, Path(tmp), progress)
    if out:  # kept as each run ends: a matrix of runs that stops part way keeps what it measured
        (out / "result.json").write_text(json.dumps(result))
    return result


SIDES = ("sidecar", "client")


def spread(results: list[dict]) -> list[dict]:
    """Per system and load, over its runs: the live (sidecar's view) and simulated attainment, and each view's
    attainment and accuracy gaps in points, as [min, median, max]."""
    cells: dict[tuple[str, float | None], list[dict]] = {}
    for r in results:
        cells.setdefault((r["system"], r.get("load")), []).append(r)

    def over(values: list[float]) -> list[float]:
        return [round(float(f(values)), 2) for f in (min, statistics.median, max)]

    return [{"system": system, "load": load, "runs": len(rs),
             "live_attainment": over([r["live_sidecar"]["slo_attainment"] for r in rs]),
             "simulated_attainment": over([r["simulated"]["slo_attainment"] for r in rs]),
             **{f"{what}_gap_pts_{side}": over([r[f"{what}_gap_pts"][side] for r in rs])
                for what in ("attainment", "accuracy") for side in SIDES},
             **({MEASURED: over([r["with_live_batch_times"]["attainment_gap_pts"]["sidecar"] for r in rs])}
                if all("with_live_batch_times" in r for r in rs) else {})}
            for (system, load), rs in cells.items()]


# the sidecar's attainment gap against a simulation whose batches took what the live run's did (superserve, ramsis)
MEASURED = "attainment_gap_pts_sidecar_live_batch_times"


def _table(rows: list[dict]) -> str:
    """:func:`spread` as a Markdown table, each spread as median (min..max)."""
    def cell(x: list[float]) -> str:
        return f"{x[1]:.2f} ({x[0]:.2f}..{x[2]:.2f})" if x[0] != x[2] else f"{x[1]:.2f}"

    measured = any(MEASURED in r for r in rows)
    head = ["system", "load", "runs", "attainment live / simulated",
            *(f"{what} gap, {side}" for side in SIDES for what in ("attainment", "accuracy")),
            *(["attainment gap, sidecar, simulated with the live batch times"] if measured else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["system"], f"{r['load']:g}x" if r["load"] else "-", str(r["runs"]),
            f"{r['live_attainment'][1]:.3f} / {r['simulated_attainment'][1]:.3f}",
            *(cell(r[f"{what}_gap_pts_{side}"]) for side in SIDES for what in ("attainment", "accuracy")),
            *([cell(r[MEASURED]) if MEASURED in r else "-"] if measured else [])]) + " |")
    return "\n".join(lines)


def _print(system: str, result: dict) -> None:
    accuracy = result["accuracy_metric"]
    views = [(f"live, {side}", result[f"live_{side}"]) for side in ("client", "sidecar") if f"live_{side}" in result]
    print(f"{system}: {result['queries']} queries; accuracy: {accuracy}")
    print(f"{'':<26} {'attainment':>10} {'accuracy':>9}")
    for name, r in (*views, ("simulated", result["simulated"])):
        print(f"{name:<26} {r['slo_attainment']:>10.4f} {100 * r[accuracy]:>8.2f}%")
    for side, gap in result["attainment_gap_pts"].items():
        print(f"gap (points), {side:<12} {gap:>10.2f} {result['accuracy_gap_pts'][side]:>9.2f}")
    for model, by in result.get("by_model", {}).items():
        for name, r in (("live, sidecar", by["live_sidecar"]), ("simulated", by["simulated"])):
            print(f"{model + ', ' + name:<26} {r['slo_attainment']:>10.4f} {100 * r[accuracy]:>8.2f}%")
    if "with_live_batch_times" in result:
        m = result["with_live_batch_times"]
        print(f"simulated with the live batch times (over their p50: p50/p90/p99 {m['batch_time_over_p50']}): "
              f"attainment {m['simulated']['slo_attainment']:.4f}, gap (points) {m['attainment_gap_pts']}")
    for key in ("deployment", "differences"):
        for name, value in result.get(key, {}).items():
            print(f"{name}: {json.dumps(value)}")
