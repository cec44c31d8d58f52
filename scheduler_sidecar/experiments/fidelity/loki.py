"""``accscale bench fidelity --system loki``: Loki live against Loki simulated.

The Loki demo's pipeline (``--recipe small``, cached under ``--build-dir``) as a BLS model on an emulated device
behind the sidecar with Loki's controller over ``--instances`` replicas; simulated as Loki's per-task policies and
controller over as many workers, its load times the ones measured live, from the sidecar's start (its clock's zero,
from its log), the frames arriving when the replay sent them (``replay_after_start_s`` later: the first plan's models
load meanwhile), so that the controller's periods and demand counts fall as they did live. Scored per frame: met when every crop was
served and the sidecar answered within the SLO (the client's own delays left out: the sidecar's queue and service
time), with the frame's accuracy the mean of its detections' measured path accuracy (the detector's where it found
nothing), over met frames; the simulator's frames alike, each with its own fan-out (the objects its detector finds in
that frame). Beside it (``with_drawn_fanout``), the same simulation with each frame's fan-out drawn from its
detector's mean objects per frame, as the simulator draws it for frames it does not know.

Beside the scores, each stage's times (``stages``): live, each stage model's and the BLS model's mean batch, a
request's mean wait in Triton's queue and a batch's mean time, from Triton's statistics (the models loaded at the
end, since their last load; a BLS model's batch time is its whole pipeline's); simulated, each task's queries' latency
p50 and p99 from their arrival at the task (a crop's arrival is its frame's detector batch's end) to their answer,
and their mean wait (each variant's mean batch, both sides, is ``mean_batch``). And the frames' latency p50 and p99,
live in the sidecar's and the client's view and simulated, and how it divides among the stages of a served frame
(``frame_stages``, :mod:`scheduler_sidecar.experiments.loki.stages`). Per detector, each side's met frames with
their mean accuracy (``met_by_detector``), and every frame by outcome (``outcomes_by_detector``: met, late, dropped,
refused; "none" for a frame no detector ran): where an accuracy gap comes from, the detector mix or each detector's
frames.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from loadtest.traces import Trace
from scheduler_sidecar.experiments.deployment import LOADED, Device, deploy, since_start_s
from scheduler_sidecar.experiments.fidelity.common import BEYOND_REACH, Progress, default_trace, gaps, p50_p99
from scheduler_sidecar.experiments.loki import demo as loki_demo
from scheduler_sidecar.experiments.loki import stages
from scheduler_sidecar.systems.loki import milp
from scheduler_sidecar.systems.loki.data import trained
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.planner import DEFAULT_HEADROOM

# the sidecar's log line of each plan (live/driver.py), with what a Loki plan says of itself (LokiPlan.describe)
PLAN = re.compile(r"plan asked for at ([\d.]+) s, ready at [\d.]+ s \(since the start\): demand ([\d.]+) q/s, "
                  r"(\w+) step")
INSTANCES = 6  # --instances' default: twice the tasks, so that hardware scaling has room


def loki(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    trained_in, folder = args.build_dir / "loki-demo-small", tmp / "loki"
    progress(f"building (or reusing) the Loki pipeline in {trained_in}")
    instances, bls_instances = args.instances or INSTANCES, args.bls_instances or loki_demo.BLS_INSTANCES
    stamp, profile, models, slowdown = loki_demo.build_pipeline(folder, args.slo_ms, None, instances, "small",
                                                                trained_in=trained_in, bls_instances=bls_instances)
    pipeline = replace(trained(stamp).scaled(slowdown), slo_ms=args.slo_ms)
    capacity = planned_capacity(pipeline, instances)
    trace = Trace.load(default_trace(args, tmp, base_qps=5.0, variant_qps=10.0, capacity_qps=capacity))
    demo = argparse.Namespace(instances=instances, slowdown=slowdown, period_s=5.0, headroom=DEFAULT_HEADROOM,
                              slo_ms=args.slo_ms)
    with deploy(folder / "repository", [loki_demo.BLS], [Device(slowdown)],
                config=loki_demo.sidecar_config(stamp, profile, demo)) as d:
        sidecar = d.sidecar
        progress(f"sending {len(trace)} frames ({trace.mean_rate_qps:.0f}/s) through the sidecar, "
                 f"SLO {args.slo_ms:g} ms")
        started: list[float] = []  # the replay's zero, on the monotonic clock
        frames = asyncio.run(loki_demo.send(sidecar.grpc_url, trace.arrival_s, models, args.slo_ms, started.append))
        live_stages = stage_stats(d.tritons[0].grpc_url, [*models, loki_demo.BLS])
        log = sidecar.log_path.read_text()
        load_ms = [float(ms) for _, _, ms in LOADED.findall(log)]
    (tmp / "sidecar.log").write_text(log)
    (tmp / "frames.json").write_text(json.dumps([{"answer": f.answer, "sidecar_us": f.sidecar_us,
                                                  "client_s": f.client_s} for f in frames]))
    slo_us = round(args.slo_ms * 1000)

    def accuracy(answer: dict) -> float:
        paths = [(answer["detector"], o["model"]) for o in answer["objects"]]
        return float(np.mean([pipeline.accuracy(p) for p in paths])) if paths else \
            pipeline.variant(answer["detector"]).accuracy

    def view(met: list[bool]) -> dict:
        served = [accuracy(f.answer) for f, m in zip(frames, met) if m]
        return {"queries": len(frames), "slo_attainment": float(np.mean(met)) if met else 0.0,
                "mean_serving_accuracy": float(np.mean(served)) if served else 0.0}

    served = [f.answer is not None and f.answer["status"] == "served" for f in frames]
    answered = [f for f, ok in zip(frames, served) if ok]  # served frames
    met_live = [ok and f.sidecar_us <= slo_us for ok, f in zip(served, frames)]  # the sidecar's view
    live_sidecar = view(met_live)
    live_client = view([ok and f.client_s <= args.slo_ms / 1000 for ok, f in zip(served, frames)])
    # the simulation starts when the sidecar did, the frames arriving when the replay sent them, seconds later (the
    # first plan's models load meanwhile): its controller's periods and demand counts fall as the sidecar's did
    offset_s = since_start_s(log, started[0])
    arrival_s = trace.arrival_s + offset_s
    run_ = loki_demo.simulate_beside(stamp, demo, arrival_s, load_ms)
    met = run_.frames.met
    # beside the live frames (frames.json), the simulated ones: each frame's detector and outcome, in trace order
    (tmp / "simulated_frames.json").write_text(json.dumps([
        {"arrival_s": float(a), "detector": v or "", "met": bool(m), "dropped": bool(d)}
        for a, v, m, d in zip(arrival_s, run_.result.variant, met, run_.frames.dropped)]))
    # beside it, the same simulation with each frame's fan-out drawn from its detector's mean, as before each frame
    # had its own: how much of the gap the fan-out explains
    drawn = loki_demo.simulate_beside(stamp, demo, arrival_s, load_ms, own_fanout=False).frames
    with_drawn = {"slo_attainment": float(drawn.met.mean()),
                  "mean_serving_accuracy": float(np.nanmean(drawn.accuracy[drawn.met])) if drawn.met.any() else 0.0}
    simulated_batches: dict[str, list[int]] = {}
    for b in run_.result.batches:
        simulated_batches.setdefault(b.variant_id, []).append(b.batch_size)
    simulated = {"slo_attainment": float(met.mean()),
                 "mean_serving_accuracy": float(np.nanmean(run_.frames.accuracy[met])) if met.any() else 0.0,
                 "met": int(met.sum()), "dropped": int(run_.frames.dropped.sum())}
    return gaps({"system": "loki", "queries": len(frames), "instances": instances, "bls_instances": bls_instances,
                 "slowdown": slowdown, "capacity_qps": round(capacity, 1), "rate_qps": round(trace.mean_rate_qps, 1),
                 "load_ms": load_ms, "replay_after_start_s": round(offset_s, 3),
                 "live_client": live_client, "live_sidecar": live_sidecar,
                 "live_outcomes": {"refused": sum(f.answer is None for f in frames),
                                   "dropped": sum(f.answer is not None and not ok for f, ok in zip(frames, served))},
                 "simulated": simulated, "simulated_plans": [p.step for p in run_.plans],
                 # each side's plans, [s since the sidecar's start, demand q/s, step]: the controllers see the same
                 # arrivals, so a plan that differs is where the two runs part
                 "plans": {"live": [[float(t), float(q), step] for t, q, step in PLAN.findall(log)],
                           "simulated": [[round(p.at_us / 1e6, 3), round(p.demand_qps, 2), p.step]
                                         for p in run_.plans]},
                 "with_drawn_fanout": {k: v for k, v in gaps({"live_client": live_client, "live_sidecar": live_sidecar,
                                                              "simulated": with_drawn}).items()
                                       if not k.startswith("live_")},
                 # each stage model's mean batch: live, Triton's count of rows over executions (of the models
                 # loaded at the end, since their last load); simulated, over the batches each variant ran
                 # (retried ones too)
                 "mean_batch": {"live": {m: s["mean_batch"] for m, s in live_stages.items() if m in models},
                                "simulated": {v: round(float(np.mean(b)), 2) for v, b in simulated_batches.items()}},
                 "stages": {"live": live_stages, "simulated": simulated_stages(pipeline, run_.result)},
                 "frame_latency_ms": {
                     "live_sidecar": p50_p99([f.sidecar_us / 1000 for f in answered]),
                     "live_client": p50_p99([f.client_s * 1000 for f in answered]),
                     "simulated": p50_p99(stages.frame_ms(run_.result, ~np.isnan(run_.frames.accuracy)))},
                 "frame_stages": {
                     "live": stages.live(answered),
                     "simulated": stages.simulated(run_.result, ~np.isnan(run_.frames.accuracy))},
                 # the met frames by the detector that served them: how many, and their mean accuracy (where the
                 # accuracy gap comes from: a detector mix, or the frames each detector's side met)
                 "met_by_detector": {
                     "live": _by_detector([(f.answer["detector"], accuracy(f.answer))
                                           for f, m in zip(frames, met_live) if m]),
                     "simulated": _by_detector([(run_.result.variant[i], run_.frames.accuracy[i])
                                                for i in np.flatnonzero(met)])},
                 # every frame by the detector that ran it ("none": dropped or refused before one ran) and its
                 # outcome: whether a detector's frames are fewer on one side, or more of them fail there
                 "outcomes_by_detector": {
                     "live": _outcomes([(f.answer["detector"] if f.answer else "", _live_outcome(f, ok, m))
                                        for f, ok, m in zip(frames, served, met_live)]),
                     "simulated": _outcomes([(run_.result.variant[i] or "",
                                              "met" if met[i] else "dropped" if run_.frames.dropped[i] else "late")
                                             for i in range(len(met))])}})


def _live_outcome(frame, served: bool, met: bool) -> str:
    if frame.answer is None:
        return "refused"  # by the sidecar, before the pipeline ran
    if not served:
        return "dropped"  # by the pipeline: the frame, or a crop of it
    return "met" if met else "late"


def _outcomes(frames: list[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """(detector or "", outcome) per frame -> per detector ("none" for ""): its frames by outcome."""
    out: dict[str, dict[str, int]] = {}
    for detector, outcome in frames:
        counts = out.setdefault(detector or "none", {"met": 0, "late": 0, "dropped": 0, "refused": 0})
        counts[outcome] += 1
    return dict(sorted(out.items()))


def _by_detector(frames: list[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """(detector, accuracy) per met frame -> per detector: its frames and their mean accuracy."""
    out: dict[str, list[float]] = {}
    for detector, accuracy in frames:
        out.setdefault(detector, []).append(float(accuracy))
    return {d: {"frames": len(a), "mean_accuracy": round(float(np.mean(a)), 4)} for d, a in sorted(out.items())}


def simulated_stages(pipeline: Pipeline, result) -> dict[str, dict]:
    """Per task, over its queries served: their count, their latency p50 and p99 (arrival at the task to answer) and
    their mean wait (the latency less their variant's profiled p50 at their batch's size: the batch's time where the
    simulation draws none other)."""
    from scheduler_sidecar.core.records import Outcome  # lazy: only here
    from scheduler_sidecar.sim.results import OUTCOME_CODES

    served = {OUTCOME_CODES[Outcome.MET], OUTCOME_CODES[Outcome.LATE]}
    rows: dict[str, list[tuple[float, float]]] = {}

    def add(task: str, variant: str, arrival: int, finish: int, batch: int) -> None:
        ms = (finish - arrival) / 1000
        rows.setdefault(task, []).append((ms, ms - pipeline.variant(variant).latency.p50_at(batch)))

    for i, v in enumerate(result.variant):
        if v is not None and int(result.outcome[i]) in served:
            add(pipeline.root.name, v, int(result.arrival_us[i]), int(result.finish_us[i]), int(result.batch_size[i]))
    for r in result.follow_ups:
        if r.variant_id is not None and r.outcome in (Outcome.MET, Outcome.LATE):
            add(pipeline.task_of(r.variant_id).name, r.variant_id, r.arrival_us, r.finish_us, r.batch_size)
    return {task: {"queries": len(v), "latency_ms": p50_p99([ms for ms, _ in v]),
                   "mean_wait_ms": round(float(np.mean([w for _, w in v])), 1)} for task, v in rows.items()}


def stage_stats(url: str, models: list[str]) -> dict[str, dict[str, float]]:
    """Each of ``models`` loaded on the Triton at ``url`` that ran: the rows it ran per execution, a request's mean
    wait in its queue and an execution's mean time (ms), from Triton's statistics (since its last load)."""
    import tritonclient.grpc as grpcclient  # lazy: gRPC

    client = grpcclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics().model_stats
    finally:
        client.close()
    rows: dict[str, np.ndarray] = {}
    for s in stats:
        if s.name in models and s.execution_count:
            compute_ns = sum(b.compute_infer.ns for b in s.batch_stats)
            # rows per execution from the inference count (one per row), the wait per request from the queue's own
            # count (one per request: a BLS request carries several frames)
            rows[s.name] = rows.get(s.name, 0) + np.array(
                [s.inference_count, s.execution_count, s.inference_stats.queue.ns, s.inference_stats.queue.count,
                 compute_ns], dtype=np.int64)
    return {m: {"mean_batch": round(n / k, 2), "mean_wait_ms": round(queue / max(1, requests) / 1e6, 1),
                "mean_service_ms": round(compute / k / 1e6, 1)}
            for m, (n, k, queue, requests, compute) in rows.items()}


def planned_capacity(pipeline: Pipeline, instances: int) -> float:
    """The most frames per second Loki's resource manager serves on ``instances`` replicas with every task on its
    most accurate variant (hardware scaling alone, InferLine's plan): beyond it, accuracy scaling must serve. The
    share of a demand beyond reach that such a plan serves, times that demand."""
    beyond = BEYOND_REACH * instances * max(v.throughput_qps(v.latency.batch_sizes[-1])
                                               for t in pipeline.tasks for v in t.variants)
    return milp.plan(pipeline, beyond, instances, top_only=True).served * beyond
