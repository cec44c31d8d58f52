"""``accscale bench fidelity --system hybridserve``: HybridServe live against HybridServe simulated.

The HybridServe demo's family (:mod:`scheduler_sidecar.experiments.hybridserve.demo`) on one Triton whose models run
its emulated slowdown (``--slowdown`` times it: a device that much slower), the cascade the planner searches
(``--mode``, ``--instances``, ``--rounding``, ``--no-prune``), and a gamma trace (CV² 4) at ``--rate-qps`` (or
``--load`` times the cost model's capacity on the replicas) whose payload indices are samples of the family's test
split. Served two ways (``--serving``):

- ``staged`` (the default): as the paper serves it, and as the simulator runs it. Each cascade model is a logical
  model of the sidecar (:mod:`~scheduler_sidecar.systems.hybridserve.stages`) on its replicas' Triton instances, set
  before the sidecar starts, without Triton's dynamic batcher (it merged two of the sidecar's batches that arrived
  together into one instance while another idled: a batch of 16 then ran as 32, 180 ms late, and at a 400 ms SLO
  the attainment gap was -10.33 points against -0.21 without it), each batched by Clipper+; an escalation is a query
  on the next model's queue.
- ``bls``: the cascade's BLS model behind HybridServe's planner (``--bls-instances``). A BLS instance holds its batch
  through every model and answers all of it after the last, where the simulator answers each request when its
  model does, and its instances cap the throughput where the simulator's per-model queues do not.

Simulated by :mod:`~scheduler_sidecar.experiments.hybridserve.simulation` with the same cascade, replicas, slowdown
and SLO, on the same samples, and once more with each batch taking what the live run's batches took over their
profiled p50 (``with_live_batch_times``). Attainment: the sidecar's /metrics, the client's request log, the
simulated requests met. Accuracy is what the answers were worth: the share of met requests answered right, live
from the request log (the answer against the sample's label) over the requests the sidecar met (its queue and
service time within the SLO) or the client did, and simulated from the answering model's cached prediction over the
requests met. Reported beside: each model's mean batch, wait and batch time on both sides (live from Triton's
statistics over the replay), the latency p50 and p99 of both, and, as this 2-core machine's client shares its cores
with the rest, ``client_delay_ms``.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from functools import partial
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from export.cascade_models import build
from loadtest.loadtest_cli import Replay, replay, save_payloads
from loadtest.requestlog import RequestLog
from loadtest.traces import Trace, gamma, with_payloads, with_slo
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.experiments.deployment import RELOADED, Device, deploy
from scheduler_sidecar.experiments.fidelity.common import (
    Progress,
    at_load,
    batch_ratios,
    client_delay_ms,
    gaps,
    p50_p99,
    sidecar_view,
)
from scheduler_sidecar.experiments.hybridserve import demo
from scheduler_sidecar.experiments.hybridserve.simulation import simulate
from scheduler_sidecar.processes.sidecar import SidecarServer
from scheduler_sidecar.systems.hybridserve.family import Family
from scheduler_sidecar.systems.hybridserve.live import HybridServeConfig, HybridServePlanner

INSTANCES = 16  # --instances' default: the model instances the replicas share

PLAN_WAIT_S = 300.0  # how long the cascade's instance counts may take to be in place


def hybridserve(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    """See the module notes."""
    stamp = build(args.build_dir / "hybridserve")
    family = Family.load(stamp)
    slowdown = demo.default_slowdown(family) * args.slowdown
    config = HybridServeConfig(args.instances or INSTANCES, args.rounding, slowdown)
    progress(f"searching {args.mode}'s cascade (Algorithm 1{', 2' if args.prune else ''})")
    # the sidecar's planner makes the same search from the same options
    planner = HybridServePlanner.from_family(stamp, args.mode, demo.BLS, config, prune=args.prune)
    cascade = planner.point.cascade
    images, labels = family.images("test")
    # the cost model's: what the cascade's replicas keep up with (the busiest model's R_i / (ρ_i l_i), §V-C)
    replicas = tuple(planner.replicas[m] for m in cascade.models)
    capacity = planner.point.capacity_rps(family, replicas) / config.slowdown
    # what the first model's replicas serve at most, at its largest profiled batch: every request reaches it, and no
    # SLO-aware early answer relieves it as one relieves the models after it. Near it, batches a few percent over
    # their profiled time tip Clipper+ into ever smaller batches as its queue ages, and the throughput falls away
    first = family.models[family.names.index(cascade.models[0])].latency
    ceiling = replicas[0] * first.batch_sizes[-1] / (first.p50_at(first.batch_sizes[-1]) / 1000) / config.slowdown
    trace, sample = _cascade_trace(args, tmp / "trace.txt", len(labels), capacity)
    staged = args.serving == "staged"
    if staged:  # each model its own logical model, on its replicas' instances, set before the sidecar starts
        served = cascade.models
        repository, models = family.folder / "repository", served
        sidecar_config = staged_config(tmp, family, planner, args.slo_ms)
        before = partial(_set_instances, instances={m: planner.replicas[m] for m in served})
    else:
        profile = demo.cascade_profile(tmp / "profile.json", family, planner.point, config.slowdown)
        # the Triton model the sidecar calls (the BLS, or the largest model alone), then the cascade's
        served = tuple(dict.fromkeys((Profile.load(profile).variants[0].actuation.model, *cascade.models)))
        repository = demo.write_bls(family, planner.bls_plan, args.bls_instances or demo.BLS_INSTANCES)
        models, before = [*family.names, demo.BLS], None
        sidecar_config = demo.sidecar_config(stamp, profile, args.mode, args.prune, config, args.slo_ms)
    with deploy(repository, models, [Device(config.slowdown)], config=sidecar_config, before_sidecar=before,
                config_path=tmp / "sidecar.toml") as d:
        (triton,), sidecar = d.tritons, d.sidecar
        # the plan's instance counts are in place (staged: set before the sidecar started)
        reloads = [] if staged else _logged(sidecar, RELOADED, len(planner.instances))
        progress(f"replaying {len(sample)} requests through the sidecar and the {' -> '.join(cascade.models)} cascade")
        before = _triton_stats(triton.grpc_url, served)
        client = replay([Replay(demo.MODEL, tmp / "trace.txt", save_payloads(tmp / "payloads.npz", images, labels))],
                        sidecar.grpc_url, tmp / "run", slo_ms=args.slo_ms, progress_s=0 if args.json else 5.0)
        after = _triton_stats(triton.grpc_url, served)
        server = sidecar_view(sidecar.http_url)
        (tmp / "sidecar.log").write_text(sidecar.log_path.read_text())
    log = RequestLog.load(tmp / "run" / "requests.csv")
    answers = _sidecar_answers(log)
    server["measured_accuracy"] = answers["measured_accuracy"]
    index = [family.names.index(m) for m in cascade.models]
    arrival_us = np.round(trace.arrival_s * 1e6).astype(np.int64)
    preds = family.predictions("test").subset(index)
    sim = simulate(family, cascade, replicas, preds, arrival_us, args.slo_ms, slowdown=config.slowdown, sample=sample)
    # served staged, beside the simulation as planned, one whose batches take what the live run's took (their spread
    # over their profiled p50s, drawn at random): how much of a gap the live batches' own times explain (a BLS
    # batch's time is its whole cascade's, which no model's batch in the simulation is)
    measured = {}
    if staged:
        ratios = batch_ratios(log, Profile("cascade", "its models' profiles", tuple(
            family.profile(m, config.slowdown).variants[0] for m in cascade.models)))
        again = simulate(family, cascade, replicas, preds, arrival_us, args.slo_ms, slowdown=config.slowdown,
                         sample=sample, latency_ratios=ratios)
        measured = {"with_live_batch_times": gaps({
            "live_sidecar": server, "batch_time_over_p50": [round(float(np.percentile(ratios, q)), 3)
                                                            for q in (50, 90, 99)] if ratios else [],
            "simulated": {"slo_attainment": 1 - again.violation_ratio, "measured_accuracy": again.met_accuracy}},
            accuracy="measured_accuracy")}
    return gaps({
        "system": "hybridserve", "queries": len(sample), "live_client": client["summary"], "live_sidecar": server,
        "simulated": {"slo_attainment": 1 - sim.violation_ratio, "measured_accuracy": sim.met_accuracy,
                      "answered": dict(zip(cascade.models, sim.answered)), "answered_early": sim.answered_early},
        "deployment": {"mode": args.mode, "prune": args.prune, "models": list(cascade.models),
                       "thresholds": list(cascade.thresholds), "skip": cascade.skip, "replicas": planner.instances,
                       "serving": args.serving,
                       "bls_instances": None if staged else args.bls_instances or demo.BLS_INSTANCES,
                       "slowdown": round(config.slowdown, 1),
                       "slo_ms": args.slo_ms, "rate_qps": round(trace.mean_rate_qps, 1),
                       "capacity_qps": round(capacity, 1), "first_model_ceiling_qps": round(ceiling, 1),
                       "reload_ms_live": {m: int(ms) for m, _, done, ms in reloads if done == "reloaded"}},
        "differences": {
            "client_delay_ms": client_delay_ms([log]),
            "latency_ms_live": answers["latency_ms"], "latency_ms_simulated": [round(x, 1) for x in sim.latency_ms],
            "latency_ms_by_model_live": answers["by_model"],
            "latency_ms_by_model_simulated": {m: [round(x, 1) for x in ms]
                                              for m, ms in zip(cascade.models, sim.latency_by_model_ms)},
            "sidecar_batch_live": server["mean_batch"],
            "per_model_live": {m: _per_model(before[m], after[m]) for m in served},
            "per_model_simulated": {m: {"mean_batch": round(b, 2), "mean_wait_ms": round(w, 1),
                                        "mean_service_ms": round(t, 1)}
                                    for m, b, w, t in zip(cascade.models, sim.mean_batch, sim.mean_wait_ms,
                                                          sim.mean_service_ms)}},
        **measured,
    }, accuracy="measured_accuracy")


def staged_config(tmp: Path, family: Family, planner: HybridServePlanner, slo_ms: float) -> str:
    """The sidecar's config for the planner's cascade served staged (:mod:`~scheduler_sidecar.systems.hybridserve.
    stages`): each model a logical model with its profile at the planner's slowdown, on its own instances, batched by
    Clipper+ as the simulation batches it, the first one clients' (``demo.MODEL``) with the cascade's plan. As the
    simulation: no admission, no calibration, no overhead subtracted from the slack."""
    plan = tmp / "cascade_plan.json"
    plan.write_text(json.dumps(planner.bls_plan))
    entries = []
    for i, m in enumerate(planner.point.cascade.models):
        profile = tmp / f"profile_{m}.json"
        family.profile(m, planner.config.slowdown).save(profile)
        entries.append(f'[[models]]\nname = "{demo.MODEL if i == 0 else m}"\nprofile = "{profile.absolute()}"\n'
                       f'policy = "clipper"\ndefault_slo_us = {round(slo_ms * 1000)}\noverhead_us = 0\n'
                       'latency_calibration = false\nadmission = false\n'
                       + (f'cascade = "{plan.absolute()}"\n' if i == 0 else ""))
    return 'slots = "per_model"\n' + "".join(entries)


def _set_instances(tritons: list, instances: dict[str, int]) -> None:
    for triton in tritons:
        demo.set_instances(triton.grpc_url, instances, batcher=False)


def _cascade_trace(args: argparse.Namespace, path: Path, samples: int, capacity_qps: float
                   ) -> tuple[Trace, np.ndarray]:
    """The trace replayed (``--trace``, or gamma at ``--rate-qps`` or ``--load`` times ``capacity_qps``, CV² 4), every
    request with ``--slo-ms`` and a test sample (its payload index, drawn where it has none), saved to ``path``; and
    each request's sample, as the replay resolves it."""
    rate = args.rate_qps if args.load is None else at_load(args, capacity_qps)
    trace = Trace.load(args.trace) if args.trace else gamma(rate, 4.0, args.duration_s, seed=0)
    if (trace.payload_index < 0).all():
        trace = with_payloads(trace, samples, seed=1)
    trace = with_slo(trace, args.slo_ms)  # the simulation gives every request one SLO
    trace.save(path)
    return trace, np.where(trace.payload_index >= 0, trace.payload_index, np.arange(len(trace))) % samples


def _logged(sidecar: SidecarServer, pattern: re.Pattern, count: int) -> list[tuple[str, ...]]:
    """Wait until the sidecar has logged ``count`` lines matching ``pattern``; their groups."""
    deadline = time.monotonic() + PLAN_WAIT_S
    while len(found := pattern.findall(sidecar.log_path.read_text())) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sidecar logged {len(found)} of {count} lines like {pattern.pattern!r} in "
                               f"{PLAN_WAIT_S:g} s; last lines:\n{sidecar.log_tail()}")
        time.sleep(0.2)
    return found


def _triton_stats(url: str, models: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each model's Triton statistics so far: requests, batches, the requests' time queued and the batches' time
    running, in ns."""
    with grpcclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(as_json=True)["model_stats"]
    return {s["name"]: np.array([int(s.get("inference_count", 0)), int(s.get("execution_count", 0)),
                                 int(s["inference_stats"].get("queue", {}).get("ns", 0)),
                                 sum(int(b.get("compute_infer", {}).get("ns", 0)) for b in s.get("batch_stats", []))])
            for s in stats if s["name"] in models}


def _per_model(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """A model's mean batch, a request's mean wait in its queue and a batch's mean time, between two statistics."""
    requests, batches, queue_ns, compute_ns = after - before
    return {"mean_batch": round(requests / max(1, batches), 2),
            "mean_wait_ms": round(queue_ns / max(1, requests) / 1e6, 1),
            "mean_service_ms": round(compute_ns / max(1, batches) / 1e6, 1)}


def _sidecar_answers(log: RequestLog) -> dict:
    """In the sidecar's view (each answer's queue and service time): the share of the requests it met answered
    right, and the p50 and p99 latency of those answered, in all and by the model that answered (served staged; the
    BLS's, served by the BLS)."""
    latency = log.column("queue_ms") + log.column("service_ms")  # NaN for errors
    met = latency <= log.column("slo_ms")
    answered = np.isfinite(latency)
    by = np.array([e.variant for e in log.entries])

    return {"measured_accuracy": float(log.column("correct")[met].mean()) if met.any() else 0.0,
            "latency_ms": p50_p99(latency[answered]),
            "by_model": {v: p50_p99(latency[answered & (by == v)]) for v in sorted(set(by[answered]))}}
