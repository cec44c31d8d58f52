"""``accscale bench fidelity``: each system live (the sidecar in front of real Tritons) against the simulator on the
same trace, profile, policy, planner and workers (DESIGN 3).

The trace is replayed open loop through the sidecar and simulated with the profile's p50 latencies. The live
side is scored in the sidecar (its /metrics, from arrival at the sidecar, which is what the simulator models)
and, where the client can tell, at the client too (from each request's scheduled arrival, the client's own
delays included). SLO attainments and mean serving accuracies are printed side by side with their gaps in
points (live minus simulated).

- ``superserve``: the supernet built here (``accscale profile``), SlackFit (``--policy`` picks another of its
  policies).
- ``ramsis``: the same supernet, its Pareto subnets as RAMSIS' models, MDP policies generated for this SLO,
  the worker count and two loads around the trace's.
- ``loki``: the Loki demo's pipeline (``--recipe small``, cached under ``--build-dir``) as a BLS model on an
  emulated device behind the sidecar with Loki's controller over ``--instances`` replicas; simulated as Loki's
  per-task policies and controller over as many workers, its load times the ones measured live. Scored per
  frame: met when every crop was served and the sidecar answered within the SLO (the client's own delays
  left out: the sidecar's queue and service time), with the frame's accuracy the mean of its detections'
  measured path accuracy (the detector's where it found nothing), over met frames; the simulator's frames
  alike (its fan-out is the measured mean objects per frame, drawn per frame).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from export.presets import DEFAULT_BUILD_DIR

SYSTEMS = ("superserve", "ramsis", "loki")
MODEL = "digits"  # the logical model clients call
SLO_MS = {"superserve": 30.0, "ramsis": 30.0, "loki": 200.0}  # the default SLO: the demo's


def register_bench(kinds: argparse._SubParsersAction) -> None:
    f = kinds.add_parser("fidelity", help="each system live (sidecar + Triton) against the simulator, one trace",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--system", choices=SYSTEMS, default="superserve", help="which system (default: superserve)")
    f.add_argument("--profile", type=Path, default=Path("build/full/profile.json"),
                   help="superserve, ramsis: profile measured through Triton (default: build/full/profile.json, "
                        "`accscale profile`)")
    f.add_argument("--repository", type=Path, default=Path("model_repository"),
                   help="superserve, ramsis: Triton repository exported with that profile (default: model_repository)")
    f.add_argument("--trace", type=Path, help="trace to replay (default: a bursty 30 s trace, 150 + 250 q/s, CV² 4)")
    f.add_argument("--policy", default="slackfit", help="superserve: the policy of both drivers (default: slackfit)")
    f.add_argument("--workers", type=int, default=1, help="Triton servers, one worker each (default: 1)")
    f.add_argument("--slo-ms", type=float, help="SLO of trace lines without one (default: the system's demo's: "
                                                + ", ".join(f"{k} {v:g}" for k, v in SLO_MS.items()) + ")")
    f.add_argument("--instances", type=int, default=6, help="loki: the replica budget (default: 6)")
    f.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR,
                   help="loki: where its pipeline's build is cached (default: build)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    args.slo_ms = args.slo_ms or SLO_MS[args.system]
    with tempfile.TemporaryDirectory() as tmp:
        result = _SYSTEMS[args.system](args, Path(tmp), progress)
    if args.json:
        print(json.dumps(result))
        return 0
    views = [(f"live, {side}", result[f"live_{side}"]) for side in ("client", "sidecar") if f"live_{side}" in result]
    print(f"{args.system}: {result['queries']} queries")
    print(f"{'':<26} {'attainment':>10} {'accuracy':>9}")
    for name, r in (*views, ("simulated", result["simulated"])):
        print(f"{name:<26} {r['slo_attainment']:>10.4f} {100 * r['mean_serving_accuracy']:>8.2f}%")
    for side, gap in result["attainment_gap_pts"].items():
        print(f"gap (points), {side:<12} {gap:>10.2f} {result['accuracy_gap_pts'][side]:>9.2f}")
    return 0


def gaps(result: dict) -> dict:
    """``result`` with the attainment and accuracy gaps, in points, of each live view against the simulated one."""
    sim = result["simulated"]
    sides = [side for side in ("client", "sidecar") if f"live_{side}" in result]
    for what, key in (("attainment", "slo_attainment"), ("accuracy", "mean_serving_accuracy")):
        result[f"{what}_gap_pts"] = {side: round(100 * (result[f"live_{side}"][key] - sim[key]), 2) for side in sides}
    return result


def sidecar_view(http_url: str) -> dict[str, float]:
    """SLO attainment and mean serving accuracy as the sidecar counted them (its /metrics): from the
    request's arrival at the sidecar, so the client's own delays are left out, as in the simulator."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{http_url}/metrics") as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    outcomes: dict[str, float] = {}
    for sample in families["accscale_requests"].samples:
        if sample.name.endswith("_total"):
            outcome = sample.labels["outcome"]
            outcomes[outcome] = outcomes.get(outcome, 0.0) + sample.value
    accuracy = {s.name: s.value for s in families["accscale_served_accuracy"].samples}
    count = accuracy.get("accscale_served_accuracy_count", 0.0)
    total = sum(outcomes.values())
    return {"queries": int(total), "outcomes": outcomes,
            "slo_attainment": outcomes.get("met", 0.0) / total if total else 0.0,
            "mean_serving_accuracy": accuracy.get("accscale_served_accuracy_sum", 0.0) / count if count else 0.0}


def _trace(args: argparse.Namespace, tmp: Path, base_qps: float = 150.0, variant_qps: float = 250.0) -> Path:
    from loadtest.traces import bursty

    if args.trace is not None:
        return args.trace
    path = tmp / "trace.txt"
    bursty(base_qps, variant_qps, cv2=4.0, duration_s=30.0, seed=0).save(path)
    return path


def load_times_ms(log: str) -> list[float]:
    """The model load times the sidecar measured (its log's 'loaded MODEL on WORKER in N ms')."""
    return [float(ms) for ms in re.findall(r"loaded \S+ on \S+ in (\d+) ms", log)]


def _single_model(args: argparse.Namespace, tmp: Path, progress, policy: str, options: dict) -> dict:
    """One logical model on the supernet: live with ``policy`` and ``options`` in the sidecar's config, and
    simulated with the same policy object's options."""
    from loadtest.loadtest_cli import loadtest
    from loadtest.traces import Trace
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.experiments.simulate import load_queries
    from scheduler_sidecar.live.triton_launcher import TritonServer
    from scheduler_sidecar.server.config import ModelSpec
    from scheduler_sidecar.server.serve import SidecarServer
    from scheduler_sidecar.sim.simulator import SimConfig, Simulator
    from scheduler_sidecar.systems import make_policy

    profile = Profile.load(args.profile)
    trace_path = _trace(args, tmp)
    trace = Trace.load(trace_path)
    spec = ModelSpec(MODEL, args.profile, policy, options, default_slo_us=round(args.slo_ms * 1000))
    config = tmp / "sidecar.toml"
    config.write_text(f'[[models]]\nname = "{MODEL}"\nprofile = "{args.profile}"\npolicy = "{policy}"\n'
                      f"default_slo_us = {spec.default_slo_us}\n[models.policy_options]\n"
                      + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items()))
    models = sorted({v.actuation.model for v in profile.variants})
    with contextlib.ExitStack() as stack:
        tritons = [stack.enter_context(TritonServer(repository=args.repository, models=models))
                   for _ in range(args.workers)]
        sidecar = stack.enter_context(SidecarServer(workers=[t.grpc_url for t in tritons], config=config))
        progress(f"replaying {len(trace)} queries ({trace.mean_rate_qps:.0f} q/s) through the sidecar ({policy})")
        client = loadtest(trace_path, sidecar.grpc_url, tmp / "run", model=MODEL, slo_ms=args.slo_ms,
                          progress_s=0 if args.json else 5.0)["summary"]
        server = sidecar_view(sidecar.http_url)
    arrival_us, deadline_us = load_queries(trace_path, args.slo_ms)
    sim_policy = make_policy(policy, profile, overhead_us=spec.overhead_us, **options)  # as the live one subtracts
    sim = Simulator(sim_policy, SimConfig(workers=args.workers)).run(arrival_us, deadline_us).summary()
    keys = ("slo_attainment", "mean_serving_accuracy")
    return gaps({"system": args.system, "policy": policy, "queries": len(trace), "workers": args.workers,
                 "live_client": client, "live_sidecar": server,
                 "simulated": {k: sim[k] for k in (*keys, "met", "late", "dropped")}})


def superserve(args: argparse.Namespace, tmp: Path, progress) -> dict:
    return _single_model(args, tmp, progress, args.policy, {})


def ramsis(args: argparse.Namespace, tmp: Path, progress) -> dict:
    """RAMSIS' offline phase for this deployment: MDP policies for K = the worker slots and the trace's SLO, at
    loads around the trace's mean rate; then the same policy set live and simulated."""
    from loadtest.traces import Trace
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.systems.ramsis.generate import generate_set
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec
    from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, from_profile
    from scheduler_sidecar.systems.ramsis.policy import SLACK_STEPS

    profile = Profile.load(args.profile)
    rate = Trace.load(_trace(args, tmp)).mean_rate_qps
    policy_dir = tmp / "ramsis"
    progress(f"generating RAMSIS' policies for {args.workers} worker(s), SLO {args.slo_ms:g} ms")
    largest = profile.variants[0].latency[profile.device_kinds[0]].batch_sizes[-1]
    table = from_profile(profile, profile.device_kinds[0], "p99_ms", max(MAX_QUEUE, largest)).pareto()
    spec = MdpSpec(args.slo_ms, args.workers, 1.0, SLACK_STEPS, min(MAX_QUEUE, largest))  # as Ramsis builds it
    generate_set(table, spec, [round(rate / 2, 1), round(rate, 1), round(2 * rate, 1)], policy_dir, refine=False)
    return _single_model(args, tmp, progress, "ramsis", {"policy_dir": str(policy_dir)})




def loki(args: argparse.Namespace, tmp: Path, progress) -> dict:
    import asyncio

    from loadtest.traces import Trace
    from scheduler_sidecar.experiments import loki_demo
    from scheduler_sidecar.live.triton_launcher import TritonServer
    from scheduler_sidecar.server.serve import SidecarServer
    from scheduler_sidecar.systems.loki import systems
    from scheduler_sidecar.systems.loki.data import trained
    from scheduler_sidecar.systems.loki.planner import LokiConfig

    folder = args.build_dir / "loki-demo-small"
    progress(f"building (or reusing) the Loki pipeline in {folder}")
    stamp, profile, models, slowdown = loki_demo.deploy(folder, args.slo_ms, None, args.instances, "small")
    pipeline = trained(stamp).scaled(slowdown)
    trace = Trace.load(_trace(args, tmp, base_qps=5.0, variant_qps=10.0))
    demo = argparse.Namespace(instances=args.instances, slowdown=slowdown, period_s=5.0, headroom=1.0,
                              slo_ms=args.slo_ms)
    config = tmp / "sidecar.toml"
    config.write_text(loki_demo.sidecar_config(stamp, profile, demo))
    with TritonServer(repository=folder / "repository", models=[loki_demo.BLS], emulate_slowdown=slowdown) as triton, \
            SidecarServer(workers=[triton.grpc_url], config=config) as sidecar:
        progress(f"sending {len(trace)} frames ({trace.mean_rate_qps:.0f}/s) through the sidecar, SLO {args.slo_ms:g} ms")
        frames = asyncio.run(loki_demo.send(sidecar.grpc_url, trace.arrival_s, models, args.slo_ms))
        load_ms = load_times_ms(sidecar.log_path.read_text())
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
    live_sidecar = view([ok and f.sidecar_us <= slo_us for ok, f in zip(served, frames)])
    live_client = view([ok and f.client_s <= args.slo_ms / 1000 for ok, f in zip(served, frames)])
    arrival_us = np.round(trace.arrival_s * 1e6).astype(np.int64)
    setup = systems.Setup(pipeline, workers=args.instances, config=LokiConfig(period_s=5.0, min_demand_qps=1.0),
                          load_ms=float(np.mean(load_ms)) if load_ms else None)
    run_ = systems.simulate(systems.SYSTEMS["loki"], setup, arrival_us, initial_demand_qps=0.0)
    met = run_.frames.met
    simulated = {"slo_attainment": float(met.mean()),
                 "mean_serving_accuracy": float(np.nanmean(run_.frames.accuracy[met])) if met.any() else 0.0,
                 "met": int(met.sum()), "dropped": int(run_.frames.dropped.sum())}
    return gaps({"system": "loki", "queries": len(frames), "instances": args.instances, "slowdown": slowdown,
                 "load_ms": load_ms, "live_client": live_client, "live_sidecar": live_sidecar,
                 "live_outcomes": {"refused": sum(f.answer is None for f in frames),
                                   "dropped": sum(f.answer is not None and not ok for f, ok in zip(frames, served))},
                 "simulated": simulated, "simulated_plans": [p.step for p in run_.plans]})


_SYSTEMS: dict[str, Callable[[argparse.Namespace, Path, Callable[[str], None]], dict]] = {
    "superserve": superserve, "ramsis": ramsis, "loki": loki}
