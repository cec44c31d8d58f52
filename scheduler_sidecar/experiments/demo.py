"""``accscale demo``: the whole system on the default supernet, one bursty trace, three policies
(``accscale demo proteus``, ``accscale demo loki`` and ``accscale demo hybridserve``: those systems' live demos,
``accscale demo all``: the five at once on one deployment).

Builds (or reuses) the full-preset supernet (``--family transformer``: the movie-review encoder, token ids in)
and its profile, starts Triton and the sidecar on free loopback ports, and sizes a trace from the profile: quiet
spells at 0.6x what the most accurate subnet serves within the SLO, and three bursts at 1.5, 2 and 2.5x that, within
what the smallest subnet serves (``--base-qps``/``--variant-qps``: SuperServe's bursty trace instead). A short
replay first measures the time each request spends outside the sidecar's view (the client, the front end), and
every policy plans with its 99th percentile taken off each request's slack. The trace is then replayed with Locust
for SlackFit and two baselines (Clipper+ serving the most accurate subnet, INFaaS the cheapest), switching policy
live through the sidecar's admin endpoint. The report (``accscale report``) shades the bursts and says, per
policy, the accuracy it gave up in them and the attainment it kept. Everything it started is stopped on exit,
Ctrl-C and failure.
"""

from __future__ import annotations

import argparse
import secrets
import time
from pathlib import Path

import numpy as np

from export.commands import add_build_options, add_family_option
from loadtest import report
from loadtest.loadtest_cli import Replay, replay, save_payloads
from loadtest.traces import Trace, bursty, with_slo
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments import allowance, bursts, demo_all, deployment
from scheduler_sidecar.experiments.deployment import Device, deploy
from scheduler_sidecar.experiments.hybridserve import demo as hybridserve_demo
from scheduler_sidecar.experiments.loki import demo as loki_demo
from scheduler_sidecar.experiments.proteus import demo as proteus_demo

POLICIES = ("slackfit", "clipper", "infaas")
SLO_MS = {"cnn": 36.0, "transformer": 10.0}  # per family, when --slo-ms is not given


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="build the default supernet, serve it through Triton and the sidecar, "
                              "replay a bursty trace for three policies and report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_options(p)
    add_family_option(p)
    p.add_argument("--duration-s", type=float, help=f"trace length per policy (default: {bursts.SHAPE_S}; 60 with "
                   "--base-qps or --variant-qps)")
    p.add_argument("--base-qps", type=float, help="replay SuperServe's bursty trace instead, with this steady "
                   "part (default: the trace sized from the profile)")
    p.add_argument("--variant-qps", type=float, help="the bursty trace's gamma part's mean rate (default: 100 "
                   "with --base-qps; with it alone, the steady part is 50)")
    p.add_argument("--cv2", type=float, default=8.0, help="burstiness (CV²) of the bursty trace's gamma part, "
                   "with --base-qps or --variant-qps (default: 8)")
    p.add_argument("--slo-ms", type=float, help=f"every request's SLO (default: {SLO_MS['cnn']:g} for the CNN, "
                   f"SuperServe Fig. 9; {SLO_MS['transformer']:g} for the transformer)")
    p.add_argument("--overhead-us", type=int,
                   help="time per request outside the sidecar's view, taken off every slack (default: measured "
                        f"before the runs, the {allowance.QUANTILE}th percentile of a short replay's)")
    p.add_argument("--emulate-slowdown", type=float, default=1.0, metavar="F",
                   help="serve on an emulated device F times slower than this machine, the extra time asleep, so "
                        "that the model's compute leaves the cores to the sidecar and the client, as on a GPU host "
                        "(default: 1, this machine's own compute; the default SLO is F times longer)")
    p.add_argument("--out", type=Path, help="where runs and the report go (default: runs/demo-<time>)")
    p.set_defaults(func=run)
    systems = p.add_subparsers(dest="system", metavar="SYSTEM", help="another system's live demo (default: "
                               "SuperServe's, above)")
    proteus_demo.register(systems)
    loki_demo.register(systems)
    hybridserve_demo.register(systems)
    demo_all.register(systems)


def run(args: argparse.Namespace) -> int:
    from export.supernets import build  # lazy: onnx, torch

    out = args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    built = build(args.family, args.preset, args.build_dir)
    built.export_supernet(built.pareto, args.repository)  # cheap, and never serves a stale or other preset's model
    variants = built.profile.variants
    print(f"profile {built.profile_path}: {len(variants)} Pareto subnets, top-1 "
          f"{100 * variants[0].accuracy:.2f}%..{100 * variants[-1].accuracy:.2f}%")
    if not args.emulate_slowdown >= 1:
        raise ConfigError("--emulate-slowdown must be >= 1")
    # on an emulated device F times slower, the default SLO is F times longer: the same ask of the device
    slo_ms = args.slo_ms or SLO_MS[args.family] * args.emulate_slowdown
    profile, profile_path = built.profile, built.profile_path
    if args.emulate_slowdown > 1:  # the emulated device's profile: every latency F times this machine's
        profile, profile_path = profile.scaled(args.emulate_slowdown), out / "profile.json"
        profile.save(profile_path)
    payloads = save_payloads(out / "payloads.npz", built.samples, built.labels)
    token = secrets.token_hex(8)
    runs = []
    with deploy(args.repository, [built.model_name], [Device(args.emulate_slowdown)], profile=profile_path,
                sidecar_args=["--admin-token", token, "--model-name", built.logical_name]) as d:
        (triton,), sidecar = d.tritons, d.sidecar
        print(f"triton at {triton.grpc_url}, sidecar at {sidecar.grpc_url} (gRPC) / {sidecar.http_url} (HTTP)")
        overhead_us = args.overhead_us
        if overhead_us is None:
            sizing, trace = demo_trace(profile, slo_ms, args, quiet=True)
            overhead_us = allowance.measure(sidecar, token, built.logical_name, sizing or _flat(trace), payloads,
                                             out / "calibration", trace.duration_s)
        sizing, trace = demo_trace(profile, slo_ms, args, allowance_ms=overhead_us / 1000)
        if sizing:
            print(bursts.needed_line(profile, sizing))
        trace_path = out / "trace.txt"
        trace.save(trace_path)
        for policy in POLICIES:
            deployment.switch_policy(sidecar.http_url, token, built.logical_name, policy, {"overhead_us": overhead_us})
            print(f"\n{policy}: replaying {len(trace)} queries over {trace.duration_s:g} s "
                  f"({trace.mean_rate_qps:.0f} q/s mean)")
            replay([Replay(built.logical_name, trace_path, payloads)], sidecar.grpc_url, out / policy, name=policy,
                   slo_ms=slo_ms)
            runs.append(report.Run.load(out / policy))
    source = (f"measured: the {allowance.QUANTILE}th percentile of a calibration replay" if args.overhead_us is None
              else "--overhead-us")
    device = (f"an emulated device {args.emulate_slowdown:g}x this machine's compute" if args.emulate_slowdown > 1
              else "this machine's own compute")
    note = (f"Served on {device}. " + (f"Trace sized from the profile: {sizing.describe()}; "
                                       f"{bursts.needed_line(profile, sizing)}. " if sizing else "")
            + f"Every policy took {overhead_us / 1000:g} ms off each request's slack for the time outside the "
            f"sidecar's view ({source}).")
    compared = simulated(profile_path, built.logical_name, trace_path, slo_ms, overhead_us, runs)
    page = report.write(runs, out / "report", bursts=sizing.bursts_s if sizing else (), note=note,
                        extra=compared)
    print("\n" + report.summary_table(runs))
    print("\n" + compared)
    if sizing:
        print("\n" + "\n".join(report.trade_lines(report.trade(runs, sizing.bursts_s))))
    print(f"\nreport: {page}")
    return 0


def simulated(profile_path: Path, model: str, trace_path: Path, slo_ms: float, overhead_us: int,
              runs: list[report.Run]) -> str:
    """The same trace in the simulator, each policy with the same allowance, beside the live runs (a Markdown
    table: simulated, the sidecar's view and the client's, and simulated minus live in points)."""
    from scheduler_sidecar.experiments.simulate import load_queries  # lazy: the simulator's solvers
    from scheduler_sidecar.server.config import ModelSpec  # lazy: the sidecar's gRPC stack
    from scheduler_sidecar.server.service import model_policy  # lazy: the sidecar's gRPC stack
    from scheduler_sidecar.sim.simulator import SimConfig, Simulator  # lazy: the simulator's solvers

    profile = Profile.load(profile_path)
    arrival_us, deadline_us = load_queries(trace_path, slo_ms)
    rows = []
    for r in runs:
        spec = ModelSpec(model, profile_path, r.name, {"overhead_us": overhead_us},
                         default_slo_us=round(slo_ms * 1000))
        sim = Simulator(model_policy(spec, profile), SimConfig(workers=1), admission=spec.admission).run(
            arrival_us, deadline_us).summary()
        live = r.log.summary()
        rows.append(f"| {r.name} | {sim['slo_attainment']:.4f} | {live['server_attainment'] or 0:.4f} | "
                    f"{live['slo_attainment']:.4f} | "
                    f"{100 * (sim['slo_attainment'] - (live['server_attainment'] or 0)):+.2f} / "
                    f"{100 * (sim['slo_attainment'] - live['slo_attainment']):+.2f} | "
                    f"{100 * sim['mean_serving_accuracy']:.2f}% | {100 * live['mean_serving_accuracy']:.2f}% | "
                    f"{100 * (sim['mean_serving_accuracy'] - live['mean_serving_accuracy']):+.2f} |")
    return "\n".join(["The same trace in `accscale simulate` (one worker, the same allowance):", "",
                      "| policy | simulated | in the sidecar | at the client | simulated - live (pts, sidecar / "
                      "client) | simulated acc. | live acc. | acc. simulated - live (pts) |",
                      "|---|---|---|---|---|---|---|---|",
                      *rows])


def demo_trace(profile: Profile, slo_ms: float, args: argparse.Namespace, *, allowance_ms: float = 0.0,
               quiet: bool = False) -> tuple[bursts.Sizing | None, Trace]:
    """The trace sized from ``profile`` (printed unless ``quiet``), or SuperServe's bursty one where its rates are
    given."""
    if args.base_qps is None and args.variant_qps is None:
        sizing = bursts.size(profile, slo_ms, duration_s=args.duration_s or bursts.SHAPE_S, allowance_ms=allowance_ms)
        if not quiet:
            print(sizing.describe())
        return sizing, bursts.trace(sizing)
    base, variant = args.base_qps or 50.0, args.variant_qps or 100.0
    return None, with_slo(bursty(base, variant, args.cv2, args.duration_s or 60.0, seed=0), slo_ms)


def _flat(trace: Trace) -> bursts.Sizing:
    """A stand-in sizing for a trace that was not sized: its mean rate, quiet and burst alike."""
    rate = trace.mean_rate_qps
    return bursts.Sizing(float(np.nanmax(trace.slo_ms)), 0.0, "-", 1, "-", "-", rate, rate, rate, (rate,), (), 0.0)
