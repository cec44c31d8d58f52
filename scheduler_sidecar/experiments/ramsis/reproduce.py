"""``accscale reproduce ramsis``: RAMSIS §7.1 (Fig. 5) in simulation, image task, SLO 150 ms.

RAMSIS, Jellyfish+ and ModelSwitching serve the authors' Twitter load curve (27 points, 10 s
apart, 1617-3905 q/s, Poisson arrivals within each interval) with the authors' image CPU
profile (9 Pareto models, deterministic p95 latency, as the paper's simulator), for each
worker count. Written to --out: ``fig5.csv`` (one row per method and worker count),
``fig5.png`` (accuracy per satisfied query and violation rate against workers),
``summary.md`` (the paper's claims checked on the run, :func:`claims`; tables, the resource saving at equal
accuracy and the accuracy gain at equal workers, side by side with the paper; ``--json`` prints the rows and the
claims), and the policy sets under ``policies/K<k>/``
(reused by a later run with the same settings).

Where the paper is silent or differs from its artifact, the choices made here:

- the trace's length (paper: 5 min, 554,395 queries; artifact: 270 s).
  Chosen: the artifact's 27 rates, each held for --bin-s seconds; the default 2 s per point
  (54 s, about 150 k queries) keeps the run near 5 minutes on 2 cores; --bin-s 10 is the
  artifact's full length. The rates, not the time scale, decide the policies.
- the policy grid. Chosen default: every --load-step (400) q/s from
  1200 to 4400 without refinement, for time; --load-step 200 --refine is the paper's rule.
- ModelSwitching's profiling runs. Chosen default: 60 simulated
  seconds per (load, model) on a 100 q/s grid; --ms-profile-s 300 is the artifact's.
- "X% fewer resources at the same accuracy". Chosen: for each
  baseline worker count W_b (violation < 5 %), the fewest workers W_R at which RAMSIS
  (violation < 5 %) reaches the baseline's accuracy; saving = (W_b - W_R) / W_b.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from loadtest.traces import compress
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.claims import Claim, at_least, least, table
from scheduler_sidecar.sim.results import write_rows
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.systems import make_policy
from scheduler_sidecar.systems.ramsis import LATENCY_CSV, MODELSWITCHING_CSV, TWITTER_CURVE
from scheduler_sidecar.systems.ramsis.load_curve import load_curve
from scheduler_sidecar.systems.ramsis.model_table import load_summary_csv, to_profile

log = logging.getLogger(__name__)

PROFILE_SET = "image_cloud_cpu"
SLO_MS = 150.0  # §7: the image task's lowest SLO
WORKERS = (30, 40, 50, 60, 70, 80, 90, 100)  # §7.1 uses 20-100; at 20 no method can keep up (App. F)
VIOLATION_CAP = 0.05  # Fig. 5 plots only points with violation rate < 5 %
PAPER = {  # §7.1 (prototype) and App. A.4.2 (the artifact's simulator, 60/70/80 workers)
    "saving_max": {"modelswitching": 50.00, "jellyfish": 42.86},
    "saving_mean": {"modelswitching": 20.01, "jellyfish": 17.53},
    "gain_max": {"modelswitching": 15.09, "jellyfish": 15.08},
    "gain_mean": {"modelswitching": 4.43, "jellyfish": 4.35},
    "sim_gain_mean": {"modelswitching": 3.48, "jellyfish": 5.70},
    "sim_gain_max": {"modelswitching": 4.63, "jellyfish": 8.07},
    "violation_pct": {"ramsis": 0.14, "modelswitching": 0.24, "jellyfish": 0.21},
}
METHODS = ("ramsis", "jellyfish", "modelswitching")
BASELINES = ("jellyfish", "modelswitching")
MAGNITUDE = 0.25  # a mean of ours "matches" the artifact simulator's within this fraction of it


def register(papers: argparse._SubParsersAction) -> None:
    p = papers.add_parser("ramsis", help="RAMSIS Fig. 5: Twitter trace, image task, SLO 150 ms, 30-100 workers",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default=",".join(map(str, WORKERS)), metavar="K1,K2,...",
                   help="worker counts (default: 30,...,100; the paper also runs 20, where every method fails)")
    p.add_argument("--bin-s", type=float, default=2.0,
                   help="seconds each of the 27 Twitter rates lasts (default: 2, a 54 s trace; 10 is the "
                        "artifact's 270 s)")
    p.add_argument("--load-step", type=float, default=400.0,
                   help="RAMSIS policy grid step in q/s, from 1200 to 4400 (default: 400; artifact: 200)")
    p.add_argument("--refine", action="store_true",
                   help="refine each policy grid until adjacent expected accuracies differ by < 1 point (§6)")
    p.add_argument("--ms-profile-s", type=float, default=60.0,
                   help="ModelSwitching: simulated seconds per (load, model) (default: 60; artifact: 300)")
    p.add_argument("--seed", type=int, default=0, help="arrival seed (default: 0, the artifact's)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (default: all cores)")
    p.add_argument("--out", type=Path, default=Path("runs/ramsis"), help="output folder (default: runs/ramsis)")
    p.add_argument("--json", action="store_true", help="print the rows and the claims as one JSON object at the end")
    p.set_defaults(func=run)


def _table():
    return load_summary_csv(LATENCY_CSV, PROFILE_SET)


def policy_loads(step: float) -> list[float]:
    return [float(x) for x in np.arange(1200.0, 4400.0 + 1e-9, step)]


def _generate(k: int, load: float):
    from scheduler_sidecar.systems.ramsis.generate import generate_policy  # lazy: scipy
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec  # lazy: scipy

    return generate_policy(_table().pareto(), MdpSpec(SLO_MS, k, load))


def _generate_refined(k: int, loads: list[float], out: Path) -> None:
    from scheduler_sidecar.systems.ramsis.generate import generate_set  # lazy: scipy
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec  # lazy: scipy

    generate_set(_table().pareto(), MdpSpec(SLO_MS, k, loads[0]), loads, out)


def ensure_policies(workers: list[int], loads: list[float], refine: bool, out: Path, pool) -> dict[int, Path]:
    """Policy sets per K under ``out/policies/K<k>``, generated unless a set for the same loads is there."""
    from scheduler_sidecar.systems.ramsis.generate import Refinement, load_set, write_set  # lazy: scipy

    dirs, todo = {}, []
    for k in workers:
        d = out / "policies" / f"K{k}"
        dirs[k] = d
        try:
            have = {p.load_qps for p in load_set(d)}
        except ValueError:
            have = set()
        if not set(loads) <= have:
            todo.append(k)
    if refine:
        list(pool.map(_generate_refined, todo, [loads] * len(todo), [dirs[k] for k in todo]))
    elif todo:
        tasks = [(k, x) for k in todo for x in loads]
        log.info("generating %d RAMSIS policies (%d worker counts x %d loads)", len(tasks), len(todo), len(loads))
        made = list(pool.map(_generate, *zip(*tasks)))
        for k in todo:
            mine = [p for (kk, _), p in zip(tasks, made) if kk == k]
            write_set(mine, dirs[k], Refinement(tuple(loads), tuple(p.expected_accuracy for p in mine), ()))
    return dirs


def _rates():
    return load_curve(TWITTER_CURVE).qps


def twitter_trace(bin_s: float, seed: int):
    rates = load_curve(TWITTER_CURVE).qps
    return compress(rates, 10.0, bin_s * len(rates), float(rates.mean()), seed)


def simulate(method: str, k: int, policy_dir: Path, bin_s: float, seed: int, ms_profile_s: float) -> dict:
    profile = to_profile(_table())
    options: dict[str, object] = {"slo_ms": SLO_MS, "workers": k, "late_queries": "serve"}  # no method drops (§7)
    if method == "ramsis":
        options["policy_dir"] = policy_dir
    else:
        options["loads"] = [float(x) for x in np.arange(1200.0, 4500.0, 100.0)]  # MS's 100 q/s grid (§7)
        if method == "modelswitching":
            options["profile_s"] = ms_profile_s
    policy = make_policy(method, profile, **options)
    trace = twitter_trace(bin_s, seed)
    arrival_us = np.round(trace.arrival_s * 1e6).astype(np.int64)
    result = Simulator(policy, SimConfig(workers=k, seed=seed)).run(arrival_us, arrival_us + round(SLO_MS * 1000))
    s = result.summary()
    row = {"method": method, "workers": k, "queries": s["queries"], "late": s["late"], "dropped": s["dropped"],
           "violation_rate": (s["late"] + s["dropped"]) / s["queries"],
           "accuracy_per_satisfied_query": s["mean_serving_accuracy"], "mean_batch_size": s["mean_batch_size"],
           "out_of_range_picks": policy.table.out_of_range, "wall_seconds": round(s["wall_seconds"], 2)}
    if method != "ramsis":
        row["choices"] = {load: c.model_id for load, c in zip(policy.table.loads, policy.table.values)}
    return row


def run(args: argparse.Namespace) -> int:
    try:
        workers = sorted({int(x) for x in args.workers.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"--workers {args.workers!r}: expected integers separated by commas") from None
    if not workers or min(workers) < 1 or args.bin_s <= 0 or args.load_step <= 0:
        raise ConfigError("--workers must be >= 1, --bin-s and --load-step > 0")
    loads = policy_loads(args.load_step)
    args.out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(args.jobs) as pool:
        dirs = ensure_policies(workers, loads, args.refine, args.out, pool)
        jobs = [(m, k) for k in sorted(workers, reverse=True) for m in ("modelswitching", "ramsis", "jellyfish")]
        log.info("simulating %d runs of the Twitter trace (%g s)", len(jobs), 27 * args.bin_s)
        rows = list(pool.map(simulate, *zip(*[(m, k, dirs[k], args.bin_s, args.seed, args.ms_profile_s)
                                               for m, k in jobs])))
    rows.sort(key=lambda r: (METHODS.index(r["method"]), r["workers"]))
    write_rows(rows, args.out / "fig5.csv", skip="choices")
    _plot(rows, args.out / "fig5.png")
    found = claims(rows)
    report = _summary(rows, found, args, dirs)
    (args.out / "summary.md").write_text(report + "\n")
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if k != "choices"} for r in rows],
                          "claims": [c.as_dict() for c in found]}))
    else:
        print(report)
        print(f"\nwrote {args.out}/summary.md, fig5.csv, fig5.png")
    return 0


def by_method(rows: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {m: {} for m in METHODS}
    for r in rows:
        out[r["method"]][r["workers"]] = r
    return out


def resource_saving(ramsis: dict[int, dict], baseline: dict[int, dict], cap: float = VIOLATION_CAP) -> list[tuple]:
    """(W_b, W_R, saving %) per baseline worker count with violation < cap (the module note)."""
    out = []
    for wb, b in sorted(baseline.items()):
        if b["violation_rate"] >= cap:
            continue
        fits = [w for w, r in sorted(ramsis.items()) if r["violation_rate"] < cap
                and r["accuracy_per_satisfied_query"] >= b["accuracy_per_satisfied_query"] - 1e-12]
        if fits:
            out.append((wb, fits[0], 100.0 * (wb - fits[0]) / wb))
    return out


def accuracy_gains(ramsis: dict[int, dict], baseline: dict[int, dict], cap: float = VIOLATION_CAP) -> dict[int, float]:
    """RAMSIS minus baseline accuracy in points at equal workers, where both violate < cap."""
    return {w: 100 * (ramsis[w]["accuracy_per_satisfied_query"] - b["accuracy_per_satisfied_query"])
            for w, b in baseline.items() if w in ramsis and b["violation_rate"] < cap
            and ramsis[w]["violation_rate"] < cap}


def _ms_agreement(rows: list[dict]) -> str:
    """How often our ModelSwitching picks the authors' model at the loads and K they published."""
    theirs: dict[tuple[int, float], str] = {}
    with open(MODELSWITCHING_CSV, newline="") as f:
        for r in csv.DictReader(f):
            if float(r["slo_ms"]) == SLO_MS:
                theirs[(int(r["workers"]), float(r["load_qps"]))] = r["chosen_model"]
    same = total = 0
    for r in rows:
        if r["method"] != "modelswitching":
            continue
        for load, model in r["choices"].items():
            if (r["workers"], load) in theirs:
                total += 1
                same += theirs[(r["workers"], load)] == model
    return (f"- ModelSwitching's static choice equals the authors' published one at {same}/{total} "
            f"(K, load) points they list (K = 60, 70, 80)") if total else ""


def _saving_cause(served: list[int], workers: list[int], baseline: str, paper: float) -> str:
    """Why the largest saving falls short: the fewest workers any method serves the trace on bounds it."""
    if not served:
        return "unclassified: no worker count run keeps any method's violations below 5%"
    bound = 100.0 * (workers[-1] - served[0]) / workers[-1]
    if bound >= paper:
        return (f"unclassified: savings up to {bound:.0f}% were possible on these worker counts (no method serves "
                f"the trace on fewer than {served[0]})")
    return (f"inputs: the hardware: the paper's savings are its prototype's (§7.1; its simulator reports none); on the "
            f"authors' profile here no method keeps violations below 5% on fewer than {served[0]} workers, so no "
            f"saving against {baseline} on up to {workers[-1]} can exceed {bound:.0f}%")


def claims(rows: list[dict]) -> list[Claim]:
    """RAMSIS' claims against each baseline, over the worker counts where the methods compared violate < 5 %."""
    m = by_method(rows)
    out = []
    ok = [w for w in sorted(m["ramsis"]) if all(m[x][w]["violation_rate"] < VIOLATION_CAP for x in METHODS)]
    served = [w for w in sorted(m["ramsis"]) if any(m[x][w]["violation_rate"] < VIOLATION_CAP for x in METHODS)]
    for b in BASELINES:
        savings = [s for _, _, s in resource_saving(m["ramsis"], m[b])]
        gains = accuracy_gains(m["ramsis"], m[b])
        sim = [gains[w] for w in (60, 70, 80) if w in gains]
        out.append(at_least(f"saving_max.{b}", f"RAMSIS needs fewer workers than {b} for its accuracy (the largest "
                            "saving)", f"{PAPER['saving_max'][b]:.2f}%", max(savings, default=float("-inf")),
                            PAPER["saving_max"][b], "%").because(_saving_cause(served, sorted(m["ramsis"]), b,
                                                                                PAPER["saving_max"][b])))
        sim_max = max(sim, default=float("-inf"))
        out.append(at_least(f"gain_max.{b}", f"RAMSIS serves more accuracy than {b} on as many workers (the largest "
                            "gain)", f"{PAPER['gain_max'][b]:.2f} points", max(gains.values(), default=float("-inf")),
                            PAPER["gain_max"][b], " points").because(
            f"the paper: its {PAPER['gain_max'][b]:.2f} points is its prototype's (§7.1); its authors' simulator "
            f"(App. A.4.2) gains at most {PAPER['sim_gain_max'][b]:.2f} points over {b} at 60-80 workers, where ours "
            f"gains at most {sim_max:.2f}" if sim_max >= (1 - MAGNITUDE) * PAPER["sim_gain_max"][b] else
            f"unclassified: at 60-80 workers ours gains at most {sim_max:.2f} points over {b}, the authors' simulator "
            f"{PAPER['sim_gain_max'][b]:.2f} (its prototype: {PAPER['gain_max'][b]:.2f})"))
        paper = PAPER["sim_gain_mean"][b]
        mean = float(np.mean(sim)) if sim else float("nan")
        out.append(Claim(f"sim_gain_mean.{b}", f"the mean gain over {b} at 60/70/80 workers matches the artifact "
                         "simulator's (within 25%)", f"{paper:.2f} points", f"{mean:.2f} points",
                         abs(mean - paper) <= MAGNITUDE * paper))
        out.append(Claim(f"more_accurate_everywhere.{b}", f"RAMSIS is at least as accurate as {b} at every worker "
                         "count where both keep violations < 5%", "Fig. 5",
                         ", ".join(f"{w}: {100 * (m['ramsis'][w]['accuracy_per_satisfied_query'] - m[b][w]['accuracy_per_satisfied_query']):+.2f}"
                                   for w in ok),
                         all(m["ramsis"][w]["accuracy_per_satisfied_query"] >= m[b][w]["accuracy_per_satisfied_query"]
                             for w in ok)))
    if ok:
        out.append(least("fewest_violations", "RAMSIS violates least (mean over the worker counts where all three "
                         "keep violations < 5%)", " < ".join(f"{x} {PAPER['violation_pct'][x]:g}%" for x in METHODS),
                         {x: float(np.mean([m[x][w]["violation_rate"] for w in ok])) for x in METHODS}, "ramsis",
                         strict=True))
    return out


def _summary(rows: list[dict], found: list[Claim], args: argparse.Namespace, dirs: dict[int, Path]) -> str:
    from scheduler_sidecar.systems.ramsis.generate import load_set, max_gap_points  # lazy: scipy

    m = by_method(rows)
    workers = sorted(m["ramsis"])
    queries = rows[0]["queries"]
    gap = max(max_gap_points(load_set(d)) for d in dirs.values())
    setup = (f"Trace: the artifact's 27 Twitter rates (1617-3905 q/s), {args.bin_s:g} s each, Poisson within each "
             f"({27 * args.bin_s:g} s, {queries} queries; paper: 5 min, 554,395). Latency: deterministic p95 "
             f"(authors' CPU profile). RAMSIS policies: {len(load_set(dirs[workers[0]]))} loads per K "
             f"({'refined, ' if args.refine else ''}step {args.load_step:g} q/s; largest adjacent expected-accuracy "
             f"gap {gap:.2f} points; paper: < 1). ModelSwitching profiling: {args.ms_profile_s:g} s per (load, "
             "model). Load monitor: 500 ms sliding window for all three.")
    lines = ["# RAMSIS Fig. 5 in simulation: Twitter trace, image task (9 Pareto models), SLO 150 ms", "", setup, "",
             "## The paper's claims, on this run", "", table(found), "",
             "| workers | RAMSIS acc. | JF+ acc. | MS acc. | RAMSIS viol. | JF+ viol. | MS viol. |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for w in workers:
        acc = [f"{100 * m[x][w]['accuracy_per_satisfied_query']:.2f}%" for x in METHODS]
        vio = [f"{100 * m[x][w]['violation_rate']:.3f}%" for x in METHODS]
        lines.append(f"| {w} | " + " | ".join(acc + vio) + " |")
    lines += ["", "Accuracy is per satisfied query; violation = late queries / all (no method drops).", "",
              "## Headline numbers vs the paper", "",
              "Worker counts where a method violates >= 5 % are left out of every comparison (as Fig. 5).", "",
              "| claim (image, vs baseline) | measured vs JF+ | paper vs JF+ | measured vs MS | paper vs MS |",
              "|---|---:|---:|---:|---:|"]
    savings = {b: resource_saving(m["ramsis"], m[b]) for b in ("jellyfish", "modelswitching")}
    gains = {b: accuracy_gains(m["ramsis"], m[b]) for b in ("jellyfish", "modelswitching")}

    def stat(values, fn):
        return f"{fn(values):.2f}" if values else "n/a"

    s_vals = {b: [s for _, _, s in savings[b]] for b in savings}
    g_vals = {b: list(gains[b].values()) for b in gains}
    sim_k = [w for w in (60, 70, 80) if w in workers]
    g_sim = {b: [gains[b][w] for w in sim_k if w in gains[b]] for b in gains}
    headline = [("fewer workers at equal accuracy, max (%)", s_vals, max, "saving_max"),
             ("fewer workers at equal accuracy, mean (%)", s_vals, np.mean, "saving_mean"),
             ("higher accuracy at equal workers, max (points)", g_vals, max, "gain_max"),
             ("higher accuracy at equal workers, mean (points)", g_vals, np.mean, "gain_mean"),
             ("same at 60/70/80 workers, mean (artifact simulator)", g_sim, np.mean, "sim_gain_mean"),
             ("same at 60/70/80 workers, max (artifact simulator)", g_sim, max, "sim_gain_max")]
    for label, values, fn, key in headline:
        lines.append(f"| {label} | {stat(values['jellyfish'], fn)} | {PAPER[key]['jellyfish']:.2f} | "
                     f"{stat(values['modelswitching'], fn)} | {PAPER[key]['modelswitching']:.2f} |")
    both = s_vals["jellyfish"] + s_vals["modelswitching"]
    mean_of_means = [np.mean(v) for v in s_vals.values() if v]
    pairs = "; ".join(f"{b}: " + ", ".join(f"{wb}->{wr}" for wb, wr, _ in savings[b]) for b in savings)
    ok = [w for w in workers if all(m[x][w]["violation_rate"] < VIOLATION_CAP for x in METHODS)]
    violations = ", ".join(f"{x} {100 * np.mean([m[x][w]['violation_rate'] for w in ok]):.3f} %" for x in METHODS) \
        if ok else "n/a"
    above = sum(r["out_of_range_picks"] for r in m["ramsis"].values())
    pareto = _table().pareto()
    fits = [b for b in range(1, pareto.max_batch + 1) if pareto.latency(0, b) <= SLO_MS]
    per_worker = max(1000.0 * b / pareto.latency(0, b) for b in fits)
    b_best = max(fits, key=lambda b: b / pareto.latency(0, b))
    peak = float(max(_rates()))
    lines += ["",
              (f"- Resource saving over both baselines: as low as {stat(both, max)} % fewer workers, on average "
              f"{stat(mean_of_means, np.mean)} % (paper, image: as low as 50.00 %, on average 18.77 %)."),
              f"- Pairs (baseline workers -> RAMSIS workers reaching its accuracy): {pairs}.",
              (f"- Mean violation over the worker counts where all three stay < 5 % ({', '.join(map(str, ok))}): "
               f"{violations} (paper, prototype, 30-100 workers: RAMSIS 0.14 %, MS 0.24 %, "
              "JF+ 0.21 %)."),
              f"- RAMSIS decisions above the highest policy load: {above} (it used the highest-load policy).",
              (f"- Capacity: within the SLO the fastest model ({pareto.model_ids[0]}) serves at most "
               f"{per_worker:.1f} q/s per worker (batch {b_best}, p95 {pareto.latency(0, b_best):.1f} ms), so fewer "
               f"than {peak / per_worker:.0f} workers cannot carry the trace's {peak:.0f} q/s peak. The paper's "
               "prototype reports < 1 % violation from 30 workers (Table 3); the published p95 profiles are not "
               "exactly Fig. 3's data (digest A16), and the artifact's own simulation uses 60-80 workers."),
              _ms_agreement(rows)]
    return "\n".join(x for x in lines if x is not None)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    m = by_method(rows)
    names = {"ramsis": "RAMSIS", "jellyfish": "Jellyfish+", "modelswitching": "ModelSwitching"}
    fig, (ax_acc, ax_vio) = plt.subplots(1, 2, figsize=(11, 4))
    for method, marker in zip(METHODS, "o^s"):
        ws = sorted(m[method])
        ok = [w for w in ws if m[method][w]["violation_rate"] < VIOLATION_CAP]
        ax_acc.plot(ok, [100 * m[method][w]["accuracy_per_satisfied_query"] for w in ok], marker=marker,
                    label=names[method])
        ax_vio.plot(ws, [100 * m[method][w]["violation_rate"] for w in ws], marker=marker, label=names[method])
    ax_acc.set_xlabel("workers")
    ax_acc.set_ylabel("accuracy per satisfied query (%)")
    ax_acc.set_title("violation < 5 % only (as Fig. 5)")
    ax_vio.set_xlabel("workers")
    ax_vio.set_ylabel("SLO violation rate (%)")
    ax_vio.set_yscale("symlog", linthresh=0.1)
    for ax in (ax_acc, ax_vio):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("RAMSIS Fig. 5 (simulation): Twitter trace, image, SLO 150 ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["accuracy_gains", "register", "resource_saving"]
