"""``accscale bench fidelity`` on the supernet built here (SuperServe's policies and RAMSIS'):

- ``superserve``: the supernet built here (``accscale profile``), SlackFit (``--policy`` picks another of its
  policies); accuracy: the mean profiled accuracy of the variants that served the requests met.
- ``ramsis``: the same supernet, its Pareto subnets as RAMSIS' models, MDP policies generated for this SLO, the
  worker count and two loads around the trace's.

With ``--slowdown F`` both serve on emulated devices F times slower than this machine (the profile's latencies F
times longer, and the default SLO): on the fast supernet built here the most accurate subnet's capacity is some
thousands of q/s, beyond what this machine's cores send through a sidecar, so that at ``--load`` the model, not the
host, is what runs out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from loadtest.loadtest_cli import loadtest
from loadtest.requestlog import RequestLog
from loadtest.traces import Trace
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.experiments.bursts import capacity_qps
from scheduler_sidecar.experiments.deployment import Device, deploy
from scheduler_sidecar.experiments.fidelity.common import (
    Progress,
    batch_ratios,
    default_trace,
    gaps,
    sidecar_view,
    sim_view,
)
from scheduler_sidecar.experiments.simulate import load_queries
from scheduler_sidecar.server.config import ModelSpec
from scheduler_sidecar.server.service import model_policy
from scheduler_sidecar.sim.simulator import Simulator
from scheduler_sidecar.sim.world import World
from scheduler_sidecar.systems.ramsis.generate import generate_set
from scheduler_sidecar.systems.ramsis.mdp import MdpSpec
from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, from_profile
from scheduler_sidecar.systems.ramsis.policy import SLACK_STEPS

MODEL = "digits"  # the logical model clients call (superserve, ramsis)


def _single_model(args: argparse.Namespace, tmp: Path, progress: Progress, policy: str, options: dict) -> dict:
    """One logical model on the supernet: live with ``policy`` and ``options`` in the sidecar's config, and
    simulated with the same policy object's options."""
    profile, profile_path = _profile(args, tmp)
    capacity = planned_capacity(profile, args)
    trace_path = default_trace(args, tmp, capacity_qps=capacity)
    trace = Trace.load(trace_path)
    spec = ModelSpec(MODEL, profile_path, policy, options, default_slo_us=round(args.slo_ms * 1000))
    config = (f'[[models]]\nname = "{MODEL}"\nprofile = "{profile_path}"\npolicy = "{policy}"\n'
              f"default_slo_us = {spec.default_slo_us}\n[models.policy_options]\n"
              + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items()))
    models = sorted({v.actuation.model for v in profile.variants})
    with deploy(args.repository, models, [Device(args.slowdown)] * args.workers, config=config) as d:
        sidecar = d.sidecar
        progress(f"replaying {len(trace)} queries ({trace.mean_rate_qps:.0f} q/s) through the sidecar ({policy})")
        client = loadtest(trace_path, sidecar.grpc_url, tmp / "run", model=MODEL, slo_ms=args.slo_ms,
                          progress_s=0 if args.json else 5.0)["summary"]
        server = sidecar_view(sidecar.http_url)
        (tmp / "sidecar.log").write_text(sidecar.log_path.read_text())
    live = {"live_client": client, "live_sidecar": server}
    ratios = batch_ratios(RequestLog.load(tmp / "run" / "requests.csv"), profile)
    # beside the simulation as planned, one whose batches take what the live run's took (their spread over their
    # p50s, drawn at random): how much of a gap the live batches' own times explain
    over_p50 = [round(float(np.percentile(ratios, q)), 3) for q in (50, 90, 99)] if ratios else []
    measured = gaps({**live, "simulated": simulate(spec, profile, trace_path, args, ratios),
                     "batch_time_over_p50": over_p50})
    return gaps({"system": args.system, "policy": policy, "queries": len(trace), "workers": args.workers,
                 "slowdown": args.slowdown, "slo_ms": args.slo_ms,
                 "capacity_qps": round(capacity, 1), "rate_qps": round(trace.mean_rate_qps, 1),
                 **live, "simulated": simulate(spec, profile, trace_path, args), "with_live_batch_times": measured})


def simulate(spec: ModelSpec, profile: Profile, trace: Path, args: argparse.Namespace,
             ratios: tuple[float, ...] = ()) -> dict:
    """The deployment simulated on ``trace``: each batch its profiled p50, or that times one of a live run's
    ``ratios`` (what its batches took over their p50s), drawn at random; the policy's latency table calibrated by
    the batches' times as the sidecar's is."""
    arrival_us, deadline_us = load_queries(trace, args.slo_ms)
    world = World.uniform(args.workers, profile.device_kinds[0], latency_ratios=tuple(ratios))
    result = Simulator(model_policy(spec, profile), world, admission=spec.admission,
                       calibrate=spec.latency_calibration).run(arrival_us, deadline_us)
    return sim_view(result.summary())


def _profile(args: argparse.Namespace, tmp: Path) -> tuple[Profile, Path]:
    """The profile the sidecar plans with, and its file: ``--profile``'s, every latency ``--slowdown`` times
    longer on an emulated device."""
    profile = Profile.load(args.profile)
    if args.slowdown == 1:
        return profile, args.profile
    path = tmp / "profile.json"
    profile.scaled(args.slowdown).save(path)
    return Profile.load(path), path


def planned_capacity(profile: Profile, args: argparse.Namespace) -> float:
    """The most q/s the workers serve within the SLO on the most accurate subnet, at the batch that pays best
    within SLO/2 (the rule the paper-scale profile is calibrated by): beyond it, accuracy scaling must serve."""
    best = max(profile.variants, key=lambda v: v.accuracy)
    return capacity_qps(best.latency[profile.device_kinds[0]], args.slo_ms, args.workers)


def superserve(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    return _single_model(args, tmp, progress, args.policy, {})


def ramsis(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    """RAMSIS' offline phase for this deployment: MDP policies for K = the worker slots and the trace's SLO, at
    loads around the trace's mean rate; then the same policy set live and simulated."""
    profile, _ = _profile(args, tmp)
    rate = Trace.load(default_trace(args, tmp, capacity_qps=planned_capacity(profile, args))).mean_rate_qps
    policy_dir = tmp / "ramsis"
    progress(f"generating RAMSIS' policies for {args.workers} worker(s), SLO {args.slo_ms:g} ms")
    largest = profile.variants[0].latency[profile.device_kinds[0]].batch_sizes[-1]
    table = from_profile(profile, profile.device_kinds[0], "p99_ms", max(MAX_QUEUE, largest)).pareto()
    spec = MdpSpec(args.slo_ms, args.workers, 1.0, SLACK_STEPS, min(MAX_QUEUE, largest))  # as Ramsis builds it
    generate_set(table, spec, [round(rate / 2, 1), round(rate, 1), round(2 * rate, 1)], policy_dir, refine=False)
    return _single_model(args, tmp, progress, "ramsis", {"policy_dir": str(policy_dir)})
