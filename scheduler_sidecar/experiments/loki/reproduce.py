"""``accscale reproduce loki``: Loki Figs. 1, 5, 6, 7 and 8 in simulation, on the authors' traffic-analysis and
social-media profiles.

Written to --out:

- ``fig1.csv``, ``fig1.png``: the resource manager alone over a demand sweep (Fig. 1's two-task pipeline,
  detector -> car classifier, 20 workers): workers, system accuracy and each task's accuracy per demand;
  the three phases (hardware scaling, classifier degraded, detector degraded) and where each ends.
- ``fig5.csv``, ``fig5.png``: Loki, InferLine and Proteus-per-task on the full tree (detector -> cars,
  faces) over a bursty trace (the Azure trace is not published: the Proteus artifact's per-second totals
  scaled into [50, 425] q/s, the artifact's recipe): violations, accuracy and workers per 10 s; and each
  system's effective capacity, the largest constant demand it serves with at most 1% violations.
- ``fig6.csv``, ``fig6.png``: the same three systems on the social-media pipeline (source -> detector,
  captioner) over the same trace: violations, accuracy, the maximum accuracy drop (below the most accurate plan
  the cluster can run, at the trace's lowest rate), workers per 10 s. Its effective capacity is not swept.
- ``fig7.csv``, ``fig7.png``: the load balancer's dropping modes under one plan made for ``--fig7-qps`` and kept,
  with arrivals at 1.0-1.3x its capacity (the demand times the headroom), averaged over ``--fig7-seeds`` runs (3),
  under each latency budget: the paper's (1 x l), the artifact's (2 x l) and ours (proportional); under the
  artifact's budget also at 1.0-1.3x its demand (within the headroom), and as the artifact plans Fig. 7 (beta 1,
  and 1.05 for rerouting) beside per-task dropping and rerouting at equal beta.

Every system of a comparison gets the same workers, SLO, load, re-planning period and headroom; Loki's latency
budget is ``--budget`` (the artifact's 2 x l by default) in Fig. 5, with Loki beside it under the other two, under
each check before a batch runs, with the paper's headroom, and as the paper's text reads (headroom 1, 1 x l, a
query checked only once it has run).
- ``fig8.csv``, ``fig8.png``: Loki on the same trace at each end-to-end SLO of ``--fig8-slos`` (150 to 400 ms by
  50: the paper's increments of 50 ms around its 200 and 400): violations, accuracy and the maximum accuracy drop
  (the top variants' path accuracy less the lowest 10 s window's); re-planning every ``--period-s`` (10, the
  paper's) and again at each of ``--fig8-periods`` (1, the artifact's).
- ``summary.md``: the paper's claims checked on this run (:func:`claims`; ``--json`` carries them too), then the
  tables.

Where the paper is silent or differs from its artifact, the choices made here:

- headroom. The paper plans capacity for exactly the demand (beta = 1): the MILP fills every
  replica to 100% of its batch throughput and MostAccurateFirst loads the most accurate ones fully. Under
  Poisson arrivals such a worker's queue grows without bound. --headroom (default 1.25, the controller's) is applied equally to
  Loki, InferLine and Proteus-per-task; --headroom 1 is the paper's, Loki's row with it is reported as well.
- early dropping also checks before a batch runs: a query that can no longer meet its frame's SLO is dropped
  (ours, see scheduler_sidecar/systems/loki/policy.py); the paper's check (once run) and the artifact's (at the
  head of the queue, against the task's budget) are reported beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from scheduler_sidecar.experiments.claims import Claim, at_least, in_order, least, table
from scheduler_sidecar.experiments.loki.systems import (
    ABLATIONS,
    SYSTEMS,
    Run,
    Setup,
    System,
    metrics,
    settings,
    simulate,
    windows,
    workers_used,
)
from scheduler_sidecar.experiments.plots import line_panels, pyplot, timelines
from scheduler_sidecar.experiments.proteus.data import load_counts
from scheduler_sidecar.sim.results import markdown_table, write_rows
from scheduler_sidecar.systems.loki import milp
from scheduler_sidecar.systems.loki.data import (
    CARS,
    DETECTOR,
    SOCIAL_MEDIA_SLO_MS,
    social_media,
    traffic_analysis,
)
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.planner import DEFAULT_HEADROOM, LokiConfig
from scheduler_sidecar.systems.loki.policy import BUDGETS, DEFAULT_BUDGET, DEQUEUES

TRACE_RANGE_QPS = (50.0, 425.0)  # the artifact's min-max scaling of the Azure trace
SMOOTH_S = 10  # moving average over the per-second totals (see trace_arrivals)
# finer where the systems' capacities lie on the authors' profile (InferLine about 160, Loki about 350)
CAPACITY_LEVELS_QPS = (10, 20, 30, 40, 50, 60, 80, 100, 125, 150, 160, 170, 180, 200, 250, 300, 325, 350, 375, 400,
                       500, 650, 800, 1000)
MAX_VIOLATIONS = 0.01  # effective capacity: the largest demand served with at most this many violations
# The paper leaves "effective capacity" undefined (its §6.2 gives only the ratio); the sweep also reports the
# capacity at this looser bar, so a reader sees how much the 2.5x claim rests on the bar chosen
LOOSE_VIOLATIONS = 0.05
WINDOW_S = 10
PAPERS_READING = "loki (the paper's reading: headroom 1, 1 x l, checked once run)"
PAPER = {
    "fig1": {"hardware_end_qps": 560, "classifier_end_qps": 1550, "max_qps": 1765, "phase2_gain": 2.7,
             "max_gain": 3.15},
    "fig5_capacity_over_inferline": 2.5,
    "fig6_inferline_peak_violations_over_loki": 5.0,  # "more than 5x"
    "fig6_accuracy_sacrifice": 10.0,  # "sacrificing ~10% accuracy" at peak
    "milp_s": 0.5,  # ~500 ms per plan with Gurobi
}
MAGNITUDE = 0.25  # a number of ours "matches" the paper's within this fraction of it
ARTIFACT_PERIOD_S = 1.0  # the artifact's simulator re-plans every second; the paper's text every 10 s (§4.2)
# Fig. 7's order, most frame violations first (the text gives no numbers)
FIG7_ORDER = ("no dropping", "last-task dropping", "per-task dropping", "rerouting")
# Fig. 7's load, as a multiple of the plan's demand (the paper does not give it). Decision (issue 44): the claims are
# checked over the plan's capacity (demand x headroom), where the paper's mechanism works: "wast[ing] resources on
# requests that are not on target [...] delaying and potentially timing out other requests" needs more work than
# the plan can do. Within the headroom (1.0-1.3x the demand, 0.8-1.04x the capacity at 1.25), a late frame mostly
# catches up and dropping it loses a frame: reported under the artifact's budget, not claimed.
OVER_CAPACITY, WITHIN_HEADROOM, AS_THE_ARTIFACT = "over capacity", "within headroom", "the artifact's beta"
FIG7_LOADS = (OVER_CAPACITY, WITHIN_HEADROOM)  # 1.0-1.3x the demand times the headroom, or the demand alone
# The artifact's Fig. 7 configs plan exactly the demand (beta 1) but the rerouting one's 1.05 (milp.ARTIFACT_HEADROOM):
# run with beta as the controller's headroom (the artifact applies it to the fan-out only, milp.ARTIFACT_HEADROOM), and
# per-task dropping at 1.05 too, to separate rerouting from its 5% more capacity
ARTIFACT_BETA = (("per-task dropping", 1.0), ("rerouting", 1.0), ("per-task dropping", milp.ARTIFACT_HEADROOM),
                 ("rerouting", milp.ARTIFACT_HEADROOM))


def register(papers: argparse._SubParsersAction) -> None:
    p = papers.add_parser("loki", help="Loki Figs. 1, 5-8: the authors' traffic-analysis and social-media profiles",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=20, help="cluster size (default: 20, §6.1)")
    p.add_argument("--fig1-step", type=int, default=10, help="Fig. 1's demand step in frames/s (default: 10)")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                   help=f"capacity planned per frame of demand, for every system (default: {DEFAULT_HEADROOM:g}; paper: 1)")
    p.add_argument("--budget", choices=BUDGETS, default=DEFAULT_BUDGET,
                   help="Loki's latency budget per task: paper (1 x l), artifact (2 x l, the default), proportional "
                        "(ours); Fig. 5 shows Loki under the other two as well, Fig. 7 every mode under each")
    p.add_argument("--period-s", type=float, default=10.0, help="re-planning period (default: 10, §4.2)")
    p.add_argument("--seconds", type=int, default=None, help="only the trace's first N seconds (default: all 292)")
    p.add_argument("--capacity-s", type=float, default=20.0,
                   help="seconds simulated per demand level of the capacity sweep (default: 20)")
    p.add_argument("--levels", type=lambda s: tuple(int(x) for x in s.split(",")), default=CAPACITY_LEVELS_QPS,
                   help="the capacity sweep's demands, comma-separated (default: 10 to 1000 frames/s)")
    p.add_argument("--fig7-qps", type=float, default=300.0,
                   help="the demand Fig. 7's plan is made for (default: 300, in the accuracy-scaling phase)")
    p.add_argument("--fig7-s", type=float, default=30.0, help="Fig. 7's length in seconds (default: 30)")
    p.add_argument("--fig7-seeds", type=int, default=3, help="Fig. 7's runs per mode, averaged (default: 3)")
    p.add_argument("--fig8-slos", type=lambda s: tuple(float(x) for x in s.split(",")),
                   default=(150.0, 200.0, 250.0, 300.0, 350.0, 400.0),
                   help="Fig. 8's end-to-end SLOs in ms (default: 150 to 400 by 50)")
    p.add_argument("--fig8-periods", type=lambda s: tuple(float(x) for x in s.split(",") if x), default=(ARTIFACT_PERIOD_S,),
                   help="Fig. 8 again at each of these re-planning periods in s, comma-separated (default: 1, the "
                        "artifact's; '' for none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/loki"), help="output folder (default: runs/loki)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object at the end")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    args.out.mkdir(parents=True, exist_ok=True)
    progress("fig1: the resource manager over a demand sweep (two-task pipeline)")
    fig1 = demand_sweep(traffic_analysis(serial=True), args.workers, np.arange(10, 2401, args.fig1_step))
    phases = phase_ends(fig1)
    tree = traffic_analysis()
    config = LokiConfig(period_s=args.period_s, headroom=args.headroom)
    setup = Setup(tree, args.workers, config, budget=args.budget)
    progress("fig5: Loki, InferLine and Proteus-per-task on the bursty trace")
    arrival_us, per_second = trace_arrivals(args.seconds, args.seed)
    initial = float(per_second[:10].mean())
    fig5, series = [], {}
    compared = [settings(name, system, setup) for name, system in SYSTEMS.items()]
    for name, system in SYSTEMS.items():
        r = simulate(system, setup, arrival_us, initial_demand_qps=initial, seed=args.seed)
        series[name] = _series(r, setup, len(per_second))
        fig5.append({"system": name, **_rounded(metrics(r)), **_peaks(series[name], per_second),
                     "plans": len(r.plans), "milp_median_s": round(float(np.median([p.solve_s for p in r.plans])), 3)
                     if r.plans else ""})
        progress(f"  {name}: {fig5[-1]}")
    paper_config = replace(config, headroom=1.0)
    others = [("loki (headroom 1, the paper's)", replace(setup, config=paper_config)),
              *((f"loki ({budget} budget)", replace(setup, budget=budget)) for budget in BUDGETS if budget != args.budget),
              *((f"loki (checked before a batch: {dequeue})", replace(setup, dequeue=dequeue))
                for dequeue in DEQUEUES if dequeue != setup.dequeue),
              (PAPERS_READING, replace(setup, config=paper_config, budget="paper", dequeue="none"))]
    for label, variant in others:
        other = simulate(SYSTEMS["loki"], variant, arrival_us, initial_demand_qps=initial, seed=args.seed)
        compared.append(settings(label, SYSTEMS["loki"], variant))
        fig5.append({"system": label, **_rounded(metrics(other)),
                     **_peaks(_series(other, setup, len(per_second)), per_second), "plans": len(other.plans),
                     "milp_median_s": ""})
    progress("fig5: effective capacity (constant demand sweep)")
    capacity = {name: effective_capacity(system, setup, args.capacity_s, args.seed, args.levels)
                for name, system in SYSTEMS.items()}
    for row in fig5:
        best, ratios = capacity.get(row["system"], ({}, {}))
        row["effective_capacity_qps"] = best.get(MAX_VIOLATIONS, "")
        row["capacity_at_5pct_qps"] = best.get(LOOSE_VIOLATIONS, "")
        row["violations_by_demand"] = " ".join(f"{q}:{v}" for q, v in ratios.items())
    progress("fig6: the same systems on the social-media pipeline")
    fig6, series6 = social_media_run(replace(setup, pipeline=social_media()), arrival_us, per_second, initial,
                                     args.seed)
    progress("fig7: dropping modes at 1.0-1.3x the plan's capacity (and, under the artifact's budget, its demand)")
    fig7 = ablation(setup, args.fig7_qps, args.fig7_s, tuple(range(args.fig7_seeds)))
    write_rows(fig1, args.out / "fig1.csv")
    write_rows(fig5, args.out / "fig5.csv")
    write_rows(fig6, args.out / "fig6.csv")
    progress("fig8: Loki at each SLO")
    fig8 = slo_sweep(setup, arrival_us, initial, args.fig8_slos, args.seed, args.fig8_periods)
    write_rows(fig7, args.out / "fig7.csv")
    write_rows(fig8, args.out / "fig8.csv")
    _plot(args.out, fig1, phases, series, fig7)
    _plot_series(args.out / "fig6.png", series6, "Fig. 6: the social-media pipeline (source -> detector, captioner)")
    _plot_fig8(args.out / "fig8.png", fig8)
    found = claims(phases, fig5, fig6, fig7, fig8)
    summary = _summary(fig1, phases, fig5, fig6, fig7, fig8, found, args, compared)
    (args.out / "summary.md").write_text(summary)
    progress(summary)
    progress(f"wrote {args.out}/summary.md, fig1/5/6/7/8 .csv and .png")
    if args.json:
        print(json.dumps({"fig1": phases, "fig5": fig5, "fig6": fig6, "fig7": fig7, "fig8": fig8,
                          "claims": [c.as_dict() for c in found]}))
    return 0


# ---------------------------------------------------------------------- Fig. 1
def demand_sweep(pipeline: Pipeline, workers: int, demands: np.ndarray) -> list[dict]:
    """The resource manager's plan per demand: workers, step, system accuracy and each task's accuracy (%)."""
    rows = []
    for d in demands:
        s = milp.plan(pipeline, float(d), workers)
        rows.append({"demand_qps": int(d), "step": s.step, "workers": s.workers, "served": round(s.served, 4),
                     "accuracy": round(100 * s.accuracy, 3),
                     "detector_accuracy": round(100 * s.task_accuracy(pipeline, DETECTOR), 3),
                     "classifier_accuracy": round(100 * s.task_accuracy(pipeline, CARS), 3),
                     "solve_s": round(s.solve_s, 4)})
    return rows


def phase_ends(rows: list[dict]) -> dict[str, float]:
    """Where hardware scaling ends, where the detector starts to degrade, and the largest demand served in full."""
    top = rows[0]["detector_accuracy"]
    hw = max(r["demand_qps"] for r in rows if r["step"] == "hardware")
    classifier = max((r["demand_qps"] for r in rows if r["step"] == "accuracy" and r["detector_accuracy"] >= top - 1e-6),
                     default=hw)
    full = max(r["demand_qps"] for r in rows if r["served"] >= 1.0)
    return {"hardware_end_qps": hw, "classifier_end_qps": classifier, "max_qps": full,
            "phase2_gain": round(classifier / hw, 2), "max_gain": round(full / hw, 2),
            "accuracy_at_phase2_end": next(r["accuracy"] for r in rows if r["demand_qps"] == classifier),
            "milp_median_s": round(float(np.median([r["solve_s"] for r in rows if r["step"] != "hardware"])), 3),
            "hardware_max_s": round(max(r["solve_s"] for r in rows if r["step"] == "hardware"), 4)}


# ---------------------------------------------------------------------- Fig. 5
def trace_arrivals(seconds: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The Proteus artifact's per-second totals, smoothed over SMOOTH_S seconds and min-max scaled into
    TRACE_RANGE_QPS, Poisson within each second.

    Decision: the smoothing. The artifact scales a per-minute Azure series and plays one entry per second; the
    per-second Twitter counts carry second-scale noise that series does not (scaled raw, one second jumps from
    50 to 214 frames/s), which no planner working at the paper's granularity of seconds could follow."""
    totals = np.convolve(load_counts().per_second.sum(axis=1).astype(float), np.ones(SMOOTH_S) / SMOOTH_S, "valid")
    if seconds is not None:
        totals = totals[:seconds]
    lo, hi = TRACE_RANGE_QPS
    rates = lo + (totals - totals.min()) / max(totals.max() - totals.min(), 1e-9) * (hi - lo)
    return poisson_seconds(rates, seed), rates


def poisson_seconds(rates: np.ndarray, seed: int) -> np.ndarray:
    """Arrival times: Poisson(rate) arrivals placed uniformly within each second."""
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rates)
    times = [rng.integers(s * 1_000_000, (s + 1) * 1_000_000, size=n) for s, n in enumerate(counts)]
    return np.sort(np.concatenate(times)) if times else np.zeros(0, np.int64)


def effective_capacity(system: System, setup: Setup, seconds: float, seed: int,
                       levels: tuple[int, ...] = CAPACITY_LEVELS_QPS) -> tuple[dict[float, float], dict[int, float]]:
    """Per bar (MAX_VIOLATIONS and LOOSE_VIOLATIONS), the largest constant demand of ``levels`` served with at most
    that share of frames violated (0 if none is), and the violation ratio at each level tried. A bar stops rising
    after three misses in a row: the system is past its capacity there (a single miss below it is a burst a small
    plan did not absorb); the sweep ends when the loosest bar has stopped."""
    bars = (MAX_VIOLATIONS, LOOSE_VIOLATIONS)
    best, misses, ratios = dict.fromkeys(bars, 0.0), dict.fromkeys(bars, 0), {}
    for qps in levels:
        arrivals = poisson_seconds(np.full(int(seconds), float(qps)), seed)
        m = metrics(simulate(system, setup, arrivals, initial_demand_qps=qps, seed=seed))
        ratios[qps] = round(m["violation_ratio"], 4)
        for bar in bars:
            if misses[bar] < 3:
                misses[bar] = misses[bar] + 1 if m["violation_ratio"] > bar else 0
                best[bar] = float(qps) if not misses[bar] else best[bar]
        if misses[LOOSE_VIOLATIONS] == 3:
            break
    return best, ratios


def _series(r: Run, setup: Setup, seconds: int) -> dict[str, np.ndarray]:
    w = windows(r, WINDOW_S)
    return {**w, "workers": workers_used(r, setup, seconds * 1_000_000, WINDOW_S)[:len(w["frames_qps"])]}


def _peaks(series: dict[str, np.ndarray], rates: np.ndarray) -> dict[str, float]:
    """Violations in the busiest windows (demand at or above the 90th percentile) and workers in the quietest
    (at or below the 25th)."""
    k = len(series["frames_qps"])
    demand = np.array([rates[i * WINDOW_S:(i + 1) * WINDOW_S].mean() for i in range(k)])
    peak, quiet = demand >= np.percentile(demand, 90), demand <= np.percentile(demand, 25)
    return {"peak_violation_ratio": round(float(series["violation_ratio"][peak].mean()), 4),
            "offpeak_workers": round(float(series["workers"][quiet].mean()), 2)}


# ---------------------------------------------------------------------- Fig. 6
def social_media_run(setup: Setup, arrival_us: np.ndarray, rates: np.ndarray, initial_qps: float,
                     seed: int) -> tuple[list[dict], dict[str, dict]]:
    """Every system on the social-media pipeline over the Fig. 5 trace. The maximum drop is below the most accurate
    plan the cluster runs at the trace's lowest rate: the two large CLIP variants take longer than the SLO at batch
    1 (287 and 695 ms against 250), so the pipeline's top variants are out of reach for any system."""
    best = 100 * milp.plan(setup.pipeline, float(rates.min()), setup.workers).accuracy
    rows, series = [], {}
    for name, system in SYSTEMS.items():
        r = simulate(system, setup, arrival_us, initial_demand_qps=initial_qps, seed=seed)
        series[name] = _series(r, setup, len(rates))
        accuracy = series[name]["accuracy"]
        lowest = float(np.nanmin(accuracy)) if np.isfinite(accuracy).any() else float("nan")
        rows.append({"system": name, **_rounded(metrics(r)), **_peaks(series[name], rates),
                     "best_plan_accuracy": round(best, 4), "max_accuracy_drop": round(best - lowest, 4),
                     "plans": len(r.plans)})
    return rows, series


# ---------------------------------------------------------------------- Fig. 8
def slo_sweep(setup: Setup, arrival_us: np.ndarray, initial_qps: float, slos_ms: tuple[float, ...],
              seed: int, periods_s: tuple[float, ...] = ()) -> list[dict]:
    """Loki over the trace at each end-to-end SLO, re-planning every ``setup``'s period and each of ``periods_s``.
    The maximum drop is the best top-variant path's accuracy less the lowest 10 s window's (an upper bound on the
    paper's "from its highest possible value"). ``over_plan_share``: the share of the violations whose frame arrived in
    a second of more frames than the plan in force was made to carry (its demand x headroom), which no SLO absorbs."""
    top = 100 * max(setup.pipeline.accuracy(path) for path in _top_paths(setup.pipeline))
    rows = []
    ends = {slo: hardware_end_qps(replace(setup, pipeline=replace(setup.pipeline, slo_ms=slo))) for slo in slos_ms}
    for period in dict.fromkeys((setup.config.period_s, *periods_s)):  # the period does not move hardware_end_qps
        for slo in slos_ms:
            at = replace(setup, pipeline=replace(setup.pipeline, slo_ms=slo),
                         config=replace(setup.config, period_s=period))
            r = simulate(SYSTEMS["loki"], at, arrival_us, initial_demand_qps=initial_qps, seed=seed)
            m, w = metrics(r), windows(r, WINDOW_S)
            lowest = float(np.nanmin(w["accuracy"])) if np.isfinite(w["accuracy"]).any() else float("nan")
            rows.append({"period_s": period, "slo_ms": slo, "violation_ratio": round(m["violation_ratio"], 4),
                         "accuracy": round(m["accuracy"], 4), "max_accuracy_drop": round(top - lowest, 4),
                         "over_plan_share": round(_over_plan_share(r, at.config.headroom), 3),
                         "hardware_end_qps": ends[slo], "peak_qps": float(w["frames_qps"].max())})
    return rows


def _over_plan_share(run: Run, headroom: float) -> float:
    """The share of ``run``'s violated frames that arrived in a second with more frames than the plan in force was
    made for (its demand times ``headroom``)."""
    f = run.frames
    second = (f.arrival_us // 1_000_000).astype(np.int64)
    counts = np.bincount(second)
    if not run.plans:
        return 0.0
    times = np.array([p.at_us for p in run.plans])
    planned = np.array([p.demand_qps * p.served * headroom for p in run.plans])
    at = np.maximum(np.searchsorted(times, np.arange(len(counts)) * 1_000_000, side="right") - 1, 0)
    over = (counts > planned[at])[second]
    violated = ~f.met
    return float(np.count_nonzero(violated & over) / max(1, np.count_nonzero(violated)))


def hardware_end_qps(setup: Setup) -> int:
    """The largest demand, in whole frames/s, that hardware scaling serves (the top variants on the cluster, with
    the controller's headroom)."""
    def hardware(qps: int) -> bool:
        return milp.plan(setup.pipeline, qps, setup.workers, headroom=setup.config.headroom, top_only=True,
                         batch_sizes=setup.config.batch_sizes, hop_ms=setup.config.hop_ms).step == "hardware"

    lo, hi = 0, 1
    while hardware(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if hardware(mid) else (lo, mid)
    return lo


def _top_paths(pipeline: Pipeline) -> list[tuple[str, ...]]:
    """The root-to-leaf paths of every task's most accurate variant."""
    return [tuple(t.top.id for t in pipeline.chain(leaf.name)) for leaf in pipeline.leaves]


# ---------------------------------------------------------------------- Fig. 7
def ablation(setup: Setup, planned_qps: float, seconds: float, seeds: tuple[int, ...]) -> list[dict]:
    """Each dropping mode under one plan made for ``planned_qps`` and kept, with per-second demand drawn from
    1.0-1.3x of a load (FIG7_LOADS): under each latency budget over the plan's capacity (the claims' rows); under
    the artifact's budget also within the headroom, and with the artifact's overprovisioning (ARTIFACT_BETA). Every
    mode of a seed and load sees the same arrivals, so a mode's dropped frames are compared one by one with
    last-task dropping's outcome for them (``dropped_met_by_last_task``)."""
    static = replace(setup, config=replace(setup.config, period_s=1e9, change_threshold=float("inf")))
    runs = [(budget, load, setup.config.headroom, label) for budget in BUDGETS for load in FIG7_LOADS
            if load == OVER_CAPACITY or budget == "artifact" for label in ABLATIONS]
    runs += [("artifact", AS_THE_ARTIFACT, beta, label) for label, beta in ARTIFACT_BETA]
    done = {}  # (budget, load, headroom, mode) -> per seed: (metrics, frames)
    for budget, load, headroom, label in runs:
        scale = headroom if load == OVER_CAPACITY else 1.0
        at = replace(static, budget=budget, config=replace(static.config, headroom=headroom))
        done[budget, load, headroom, label] = []
        for seed in seeds:
            rates = np.random.default_rng(100 + seed).uniform(1.0, 1.3, int(seconds)) * planned_qps * scale
            r = simulate(ABLATIONS[label], at, poisson_seconds(rates, seed), initial_demand_qps=planned_qps,
                         seed=seed)
            done[budget, load, headroom, label].append((metrics(r), r.frames))
    rows = []
    for (budget, load, headroom, label), mine in done.items():
        found = [m for m, _ in mine]
        against = done.get((budget, load, headroom, "last-task dropping"), ())
        rescued = [int(np.count_nonzero(f.dropped & other.met)) for (_, f), (_, other) in zip(mine, against)]
        rows.append({"system": label, "budget": budget, "load": load, "headroom": headroom,
                     **{k: round(float(np.mean([m[k] for m in found])), 4)
                        for k in ("violation_ratio", "query_violation_ratio", "accuracy", "dropped_frames",
                                  "rerouted")},
                     "dropped_met_by_last_task": round(float(np.mean(rescued)), 1) if rescued else "",
                     "violation_ratio_per_seed": " ".join(f"{m['violation_ratio']:.4f}" for m in found)})
    return rows


# ---------------------------------------------------------------------- output
def _rounded(m: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}


def _plot(out: Path, fig1: list[dict], phases: dict, series: dict, fig7: list[dict]) -> None:
    plt = pyplot()

    d = [r["demand_qps"] for r in fig1]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(d, [r["workers"] for r in fig1], "k-")
    a.set(ylabel="workers used")
    for key in ("accuracy", "detector_accuracy", "classifier_accuracy"):
        b.plot(d, [r[key] for r in fig1], label=key.replace("_", " "))
    for ax in (a, b):
        for key in ("hardware_end_qps", "classifier_end_qps", "max_qps"):
            ax.axvline(phases[key], color="grey", ls=":")
    b.set(xlabel="demand (frames/s)", ylabel="accuracy (%)", title="")
    b.legend(fontsize=7)
    a.set(title="Fig. 1: hardware scaling, then the classifier, then the detector (20 workers)")
    fig.tight_layout()
    fig.savefig(out / "fig1.png", dpi=110)
    plt.close(fig)
    _plot_series(out / "fig5.png", series, "Fig. 5: traffic analysis (detector -> cars, faces)")
    fig, ax = plt.subplots(figsize=(9, 7))
    ax.barh([f"{r['system']} ({r['budget']}, {r['load']}, {r['headroom']:g})" for r in fig7],
            [r["violation_ratio"] for r in fig7])
    ax.tick_params(axis="y", labelsize=6)
    ax.set(xlabel="SLO violation ratio", title="Fig. 7: dropping modes (budget, load, headroom)")
    fig.tight_layout()
    fig.savefig(out / "fig7.png", dpi=110)
    plt.close(fig)


def claims(phases: dict, fig5: list[dict], fig6: list[dict], fig7: list[dict], fig8: list[dict]) -> list[Claim]:
    """The paper's statements about Figs. 1, 5, 6, 7 and 8, checked on this run."""
    p1 = PAPER["fig1"]

    def near(key: str, statement: str) -> Claim:
        ours, paper = phases[key], p1[key]
        return Claim(f"fig1.{key}", statement, f"{paper:g}", f"{ours:g}", abs(ours - paper) <= MAGNITUDE * paper)

    serial = traffic_analysis(serial=True)
    cars = {v.id: v.fanout[CARS] for v in serial.root.variants}
    strongest, weakest = serial.root.variants[0].id, serial.root.variants[-1].id
    top_path = " -> ".join(t.top.id for t in serial.tasks)
    by = {r["system"]: r for r in fig5}
    loki, inferline, proteus = by["loki"], by["inferline"], by["proteus-per-task"]
    capacity = loki["effective_capacity_qps"] / max(inferline["effective_capacity_qps"], 1e-9)
    out = [
        in_order("fig1.phase_order", "hardware scaling, then the classifier degraded, then the detector",
                 "560 < 1550 < 1765 frames/s", {k: phases[k] for k in ("hardware_end_qps", "classifier_end_qps",
                                                                       "max_qps")},
                 ("hardware_end_qps", "classifier_end_qps", "max_qps")),
        near("hardware_end_qps", "hardware scaling ends at the paper's demand (within 25%)").because(
            f"inputs: on the authors' published profile the top variants ({top_path}) serve {phases['hardware_end_qps']:g} "
            "frames/s on the cluster; its three device columns are one profile, so the paper's GPUs are not in it"),
        near("max_gain", "accuracy scaling serves the paper's multiple of hardware scaling's demand (within 25%)").because(
            f"inputs: in the authors' profile {weakest} finds {cars[weakest]:.1f} cars a frame against {strongest}'s "
            f"{cars[strongest]:.1f}, so degrading the detector cuts the classifier's load {cars[strongest] / cars[weakest]:.1f}x"),
        Claim("fig1.milp_time", "an accuracy-scaling plan takes about the paper's time or less",
              f"~{PAPER['milp_s']:g} s (Gurobi)", f"median {phases['milp_median_s']:g} s",
              phases["milp_median_s"] <= PAPER["milp_s"]),
        at_least("fig5.capacity_over_inferline", "Loki's effective capacity over InferLine's",
                 f"{PAPER['fig5_capacity_over_inferline']:g}x", capacity, PAPER["fig5_capacity_over_inferline"], "x"
                 ).because(_capacity_cause(loki, inferline)),
        least("fig5.fewer_violations_than_proteus", "Loki has fewer violations than Proteus-per-task",
              "up to 10x fewer", {"loki": loki["violation_ratio"], "proteus-per-task": proteus["violation_ratio"]},
              "loki"),
        least("fig5.fewest_offpeak_workers", "Loki uses the fewest workers off-peak", "up to 2.67x fewer",
              {s: by[s]["offpeak_workers"] for s in SYSTEMS}, "loki"),
    ]
    social = {r["system"]: r for r in fig6}
    loki6, inferline6 = social["loki"]["peak_violation_ratio"], social["inferline"]["peak_violation_ratio"]
    ratio = inferline6 / loki6 if loki6 else (float("inf") if inferline6 else 1.0)
    sacrifice = social["loki"]["max_accuracy_drop"]
    out += [
        at_least("fig6.inferline_peak_violations_over_loki", "at peak, InferLine's violations over Loki's (social "
                 "media)", f"more than {PAPER['fig6_inferline_peak_violations_over_loki']:g}x", ratio,
                 PAPER["fig6_inferline_peak_violations_over_loki"], "x"),
        least("fig6.fewer_violations_than_proteus", "Loki has fewer violations than Proteus-per-task (social media)",
              "up to 10x fewer", {s: social[s]["violation_ratio"] for s in ("loki", "proteus-per-task")}, "loki"),
        least("fig6.fewest_offpeak_workers", "Loki uses the fewest workers off-peak (social media)",
              "about 2.67x fewer than Proteus", {s: social[s]["offpeak_workers"] for s in SYSTEMS}, "loki"),
        Claim("fig6.accuracy_sacrifice", "Loki meets the peak by giving up about the paper's accuracy (its largest "
              "drop, within 25%)", f"~{PAPER['fig6_accuracy_sacrifice']:g}%", f"{sacrifice:.2f} points",
              abs(sacrifice - PAPER["fig6_accuracy_sacrifice"]) <= MAGNITUDE * PAPER["fig6_accuracy_sacrifice"]).because(
            "inputs: the artifact's social-media app (a detector and a captioner, no ResNet) is the only one published, "
            "not the paper's pipeline; on it the peak costs Loki this much accuracy"),
        least("fig6.less_drop_than_proteus", "Loki drops less accuracy than Proteus-per-task (social media)",
              "up to 20% less", {s: social[s]["max_accuracy_drop"] for s in ("loki", "proteus-per-task")}, "loki"),
    ]
    by_period: dict[float, list[dict]] = {}
    for r in fig8:
        by_period.setdefault(r["period_s"], []).append(r)
    periods = list(by_period)  # the --period-s one first
    if len(fig8) > 1 and len(by_period[periods[0]]) > 1:
        def falls(rows: list[dict], id: str, when: str) -> Claim:
            slos = {f"{r['slo_ms']:g} ms": r["violation_ratio"] for r in rows}
            return in_order(id, f"violations fall as the SLO grows ({when})", "sharply over the first 50 ms steps, "
                            "then less", slos, list(slos), descending=True)

        ours, artifact = by_period[periods[0]], by_period.get(ARTIFACT_PERIOD_S, [])
        claim = falls(ours, "fig8.violations_fall", f"re-planning every {periods[0]:g} s")
        share = [r["over_plan_share"] for r in ours]
        if artifact and periods[0] != ARTIFACT_PERIOD_S:
            then = falls(artifact, "fig8.artifact_period.violations_fall",
                         f"re-planning every {ARTIFACT_PERIOD_S:g} s, the artifact's")
            claim = claim.because(
                f"{'the paper' if then.holds else 'unclassified'}: re-planning every {periods[0]:g} s (§4.2), "
                f"{min(share):.0%}-{max(share):.0%} of the violations at each SLO fall in seconds with more frames than "
                "the plan in force carries (the plan trails the trace, and no SLO absorbs that); re-planning every "
                f"{ARTIFACT_PERIOD_S:g} s, as the authors' artifact does, the violations "
                f"{'fall' if then.holds else 'still do not fall'} at every step: {then.ours}")
            out += [claim, then]
        else:
            out.append(claim.because(f"unclassified: {min(share):.0%}-{max(share):.0%} of the violations at each SLO "
                                     "fall in seconds with more frames than the plan in force carries"))
        fig8 = ours
        drops = {f"{r['slo_ms']:g} ms": r["max_accuracy_drop"] for r in fig8}
        out.append(in_order("fig8.drop_falls", "the maximum accuracy drop falls as the SLO grows",
                            "replicas and batches first, accuracy only when the SLO is tight", drops, list(drops),
                            descending=True).because(
            f"inputs: on the authors' profile hardware scaling ends at {min(r['hardware_end_qps'] for r in fig8):g}-"
            f"{max(r['hardware_end_qps'] for r in fig8):g} frames/s at these SLOs, and the trace peaks at "
            f"{max(r['peak_qps'] for r in fig8):g}: every SLO scales accuracy at the peak, by about as much"))
    for budget in BUDGETS:
        modes = {r["system"]: r for r in fig7 if r["budget"] == budget and r["load"] == OVER_CAPACITY}
        for key, count in (("violation_ratio", "frame"), ("query_violation_ratio", "query")):
            out.append(in_order(f"fig7.{budget}.{count}_violation_order", f"dropping modes by {count} violations "
                                f"over the plan's capacity, no dropping the most and rerouting the fewest ({budget} "
                                "budget)", " > ".join(FIG7_ORDER), {s: modes[s][key] for s in FIG7_ORDER}, FIG7_ORDER,
                                descending=True).because(_fig7_cause(budget, modes, fig7)))
    return out


def _capacity_cause(loki: dict, inferline: dict) -> str:
    """Why Loki's capacity over InferLine's falls short at the 1% bar: how flat Loki's violations are past it, and
    the ratio at the looser bar. "The paper" when the looser bar meets the paper's ratio: the claim then rests on a
    definition the paper does not give."""
    ratios = {float(q): float(v) for q, v in (x.split(":") for x in str(loki["violations_by_demand"]).split())}
    low, high = loki["effective_capacity_qps"], loki["capacity_at_5pct_qps"]
    plateau = [v for q, v in ratios.items() if low <= q <= high] or [0.0]
    loose = high / max(inferline["capacity_at_5pct_qps"], 1e-9)
    cause = "the paper" if loose >= PAPER["fig5_capacity_over_inferline"] else "unclassified"
    return (f"{cause}: the paper does not define effective capacity; from {low:g} to {high:g} frames/s Loki violates "
            f"{min(plateau):.1%}-{max(plateau):.1%} of frames, a plateau (Poisson bursts against plans at their "
            f"latency limit, not a cliff) that the 1% bar cuts; at a {LOOSE_VIOLATIONS:.0%} bar Loki serves {high:g} "
            f"frames/s, {loose:.2f}x InferLine's {inferline['capacity_at_5pct_qps']:g}")


def _fig7_cause(budget: str, modes: dict[str, dict], fig7: list[dict]) -> str:
    """Why Fig. 7's order fails on this run, read from its rows. Under the paper's budget: the modes that check a
    stage's budget violate more than no dropping at all. Otherwise: in how many seeds the order holds, what per-task
    dropping loses that last-task dropping meets, and how little rerouting adds at equal capacity (the artifact's
    beta rows)."""
    kept, dropping = modes["no dropping"]["violation_ratio"], modes["per-task dropping"]["violation_ratio"]
    if budget == "paper" and dropping > kept:
        return (f"the paper: its text's budget (1 x l) is overrun by any query that waits behind a batch, so per-task "
                f"dropping violates {dropping:.1%} of frames and rerouting {modes['rerouting']['violation_ratio']:.1%}"
                f", against {kept:.1%} with no dropping; the authors' artifact budgets 2 x l")
    seeds = {s: [float(x) for x in modes[s]["violation_ratio_per_seed"].split()] for s in FIG7_ORDER}
    n = len(seeds[FIG7_ORDER[0]])
    holds = sum(all(seeds[a][i] >= seeds[b][i] for a, b in zip(FIG7_ORDER, FIG7_ORDER[1:])) for i in range(n))
    per_task, rerouting = modes["per-task dropping"], modes["rerouting"]
    beta = {(r["system"], r["headroom"]): r["violation_ratio"] for r in fig7 if r["load"] == AS_THE_ARTIFACT}
    equal = [f"at beta {b:g} per-task dropping {beta[('per-task dropping', b)]:.1%}, rerouting "
             f"{beta[('rerouting', b)]:.1%}" for b in sorted({b for _, b in ARTIFACT_BETA}) if ("rerouting", b) in beta]
    return (f"unclassified: the order holds in {holds} of {n} seeds; per-task dropping drops "
            f"{per_task['dropped_frames']:g} frames a run, {per_task['dropped_met_by_last_task']} of which last-task "
            f"dropping meets (late at a stage, they would have caught up: the paper's own caveat, §5.2); rerouting "
            f"moves {rerouting['rerouted']:g} crops and drops {rerouting['dropped_frames']:g} frames, since one crop "
            f"no backup takes fails its frame; under the artifact's budget {'; '.join(equal) or 'not run'}")


def _plot_series(path: Path, series: dict, title: str) -> None:
    """Demand, then each system's accuracy, workers and violations per window."""
    first = next(iter(series.values()))
    demand = (np.arange(len(first["frames_qps"])) * WINDOW_S, first["frames_qps"], "demand (frames/s)")
    timelines(path, series, WINDOW_S, [("accuracy", "accuracy (%)"), ("workers", "workers used"),
                                       ("violation_ratio", "SLO violation ratio")], demand, title=title)


def _plot_fig8(path: Path, rows: list[dict]) -> None:
    line_panels(path, rows, "slo_ms", [("accuracy", "system accuracy (%)"),
                                       ("max_accuracy_drop", "maximum accuracy drop (points)"),
                                       ("violation_ratio", "SLO violation ratio")],
                xlabel="end-to-end SLO (ms)", title="Fig. 8: Loki's SLO sensitivity (traffic analysis, the Fig. 5 trace)",
                series="period_s")


def _summary(fig1: list[dict], phases: dict, fig5: list[dict], fig6: list[dict], fig7: list[dict],
             fig8: list[dict], found: list[Claim], args: argparse.Namespace, compared: list[dict]) -> str:
    return "\n\n".join([
        "# Loki in simulation: the authors' traffic-analysis and social-media profiles",
        f"Cluster: {args.workers} workers; SLO {traffic_analysis().slo_ms:g} ms; headroom {args.headroom:g} (paper: 1); "
        f"re-planning every {args.period_s:g} s and on a 20% demand change.",
        "## The paper's claims, on this run",
        table(found),
        "## Fig. 1: the resource manager over a demand sweep (detector -> car classifier)",
        markdown_table([{"": "ours", **{k: phases[k] for k in PAPER["fig1"]}},
                        {"": "paper", **PAPER["fig1"]}], ["", *PAPER["fig1"]]),
        f"Accuracy at the end of phase 2: {phases['accuracy_at_phase2_end']}% (paper: a 13% drop). MILP: median "
        f"{phases['milp_median_s'] * 1000:.0f} ms per accuracy-scaling plan, hardware scaling at most "
        f"{phases['hardware_max_s'] * 1000:.0f} ms.",
        "## Settings of Figs. 5 and 6, side by side (each system over the same arrivals; Fig. 6 the same on the "
        "social-media pipeline)",
        markdown_table(compared, list(compared[0])),
        "## Fig. 5: against InferLine and Proteus-per-task on a bursty trace (detector -> cars, faces)",
        markdown_table(fig5, ["system", "violation_ratio", "accuracy", "peak_violation_ratio", "offpeak_workers",
                              "effective_capacity_qps", "capacity_at_5pct_qps", "dropped_frames", "rerouted", "plans"]),
        "Effective capacity: the largest constant demand with at most 1% of frames late or dropped (the paper does "
        "not define it; `capacity_at_5pct_qps` is the same at 5%). A frame counts "
        "as met only if every query it created (one per detected object) is answered within the SLO; "
        "`query_violation_ratio` in fig5.csv is the per-query view the artifact counts.",
        f"## Fig. 6: the social-media pipeline (source -> detector, captioner; SLO {SOCIAL_MEDIA_SLO_MS:g} ms)",
        markdown_table(fig6, ["system", "violation_ratio", "accuracy", "peak_violation_ratio", "offpeak_workers",
                              "best_plan_accuracy", "max_accuracy_drop", "plans"]),
        "The maximum drop is below `best_plan_accuracy`, the most accurate plan this cluster runs at the trace's "
        "lowest rate.",
        "## Fig. 7: the load balancer's dropping modes",
        markdown_table(fig7, ["system", "budget", "load", "headroom", "violation_ratio", "query_violation_ratio", "accuracy",
                              "dropped_frames", "dropped_met_by_last_task", "rerouted", "violation_ratio_per_seed"]),
        "## Fig. 8: Loki's SLO sensitivity",
        markdown_table(fig8, ["period_s", "slo_ms", "violation_ratio", "over_plan_share", "accuracy",
                              "max_accuracy_drop"]),
    ]) + "\n"
