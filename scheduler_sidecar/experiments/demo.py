"""``accscale demo``: the whole system on the default supernet, one bursty trace, three policies
(``accscale demo proteus``, ``accscale demo loki`` and ``accscale demo hybridserve``: those systems' live demos,
:mod:`.proteus.demo`, :mod:`.loki.demo`, :mod:`.hybridserve.demo`; ``accscale demo all``: the five at once on one
deployment, :mod:`.demo_all`).

Builds (or reuses) the full-preset supernet (``--family transformer``: the movie-review encoder, token ids in)
and its profile, starts Triton and the sidecar
on free loopback ports, replays one bursty trace with Locust for SlackFit and for two
baselines (Clipper+ serving the most accurate subnet, and INFaaS serving the cheapest),
switching policy live through the sidecar's admin endpoint, then writes the report
(``accscale report``) and prints its table. Everything it started is stopped on exit,
Ctrl-C and failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import time
import urllib.request
from pathlib import Path

from export.commands import add_build_options, add_family_option
from loadtest import report
from loadtest.loadtest_cli import Replay, replay, save_payloads
from loadtest.traces import bursty, with_slo
from scheduler_sidecar.experiments import demo_all
from scheduler_sidecar.experiments.deployment import deploy
from scheduler_sidecar.experiments.hybridserve import demo as hybridserve_demo
from scheduler_sidecar.experiments.loki import demo as loki_demo
from scheduler_sidecar.experiments.proteus import demo as proteus_demo

log = logging.getLogger(__name__)

POLICIES = ("slackfit", "clipper", "infaas")
# The demo's client (Locust), Triton and the sidecar share 2 cores: a request's time at the client beyond the
# sidecar's own queue and service time was 1.96 ms at the median and 6.06 ms at the 90th percentile (issue 26's
# demo, after the loop lag was counted), against the sidecar's default allowance of 0.3 ms. With 3 ms, SlackFit met
# 0.9896 of its requests at the client instead of 0.9631; every policy gets the same allowance.
DEMO_OVERHEAD_US = 3000
SLO_MS = {"cnn": 36.0, "transformer": 10.0}  # per family, when --slo-ms is not given


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="build the default supernet, serve it through Triton and the sidecar, "
                              "replay a bursty trace for three policies and report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_options(p)
    add_family_option(p)
    p.add_argument("--duration-s", type=float, default=60.0, help="trace length per policy (default: 60)")
    p.add_argument("--base-qps", type=float, default=50.0, help="steady part of the bursty trace (default: 50)")
    p.add_argument("--variant-qps", type=float, default=100.0, help="bursty part's mean rate (default: 100)")
    p.add_argument("--cv2", type=float, default=8.0, help="burstiness (CV²) of the bursty part (default: 8)")
    p.add_argument("--slo-ms", type=float, help=f"every request's SLO (default: {SLO_MS['cnn']:g} for the CNN, "
                   f"SuperServe Fig. 9; {SLO_MS['transformer']:g} for the transformer)")
    p.add_argument("--overhead-us", type=int, default=DEMO_OVERHEAD_US,
                   help=f"time per request outside the sidecar's view, taken off every slack (default: "
                        f"{DEMO_OVERHEAD_US}; the report's 'unseen p90 ms' measures it)")
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
    slo_ms = args.slo_ms or SLO_MS[args.family]
    trace = with_slo(bursty(args.base_qps, args.variant_qps, args.cv2, args.duration_s, seed=0), slo_ms)
    trace_path = out / "trace.txt"
    trace.save(trace_path)
    payloads = save_payloads(out / "payloads.npz", built.samples, built.labels)
    token = secrets.token_hex(8)
    runs = []
    with deploy(args.repository, [built.model_name], profile=built.profile_path,
                sidecar_args=["--admin-token", token, "--overhead-us", str(args.overhead_us),
                              "--model-name", built.logical_name]) as d:
        (triton,), sidecar = d.tritons, d.sidecar
        print(f"triton at {triton.grpc_url}, sidecar at {sidecar.grpc_url} (gRPC) / {sidecar.http_url} (HTTP)")
        for policy in POLICIES:
            _switch_policy(sidecar.http_url, token, built.logical_name, policy)
            print(f"\n{policy}: replaying {len(trace)} queries over {args.duration_s:g} s "
                  f"({trace.mean_rate_qps:.0f} q/s mean, CV² {args.cv2:g})")
            replay([Replay(built.logical_name, trace_path, payloads)], sidecar.grpc_url, out / policy, name=policy,
                   slo_ms=slo_ms)
            runs.append(report.Run.load(out / policy))
    page = report.write(runs, out / "report")
    print("\n" + report.summary_table(runs))
    print(f"\nreport: {page}")
    return 0


def _switch_policy(http_url: str, token: str, model: str, policy: str) -> None:
    request = urllib.request.Request(f"http://{http_url}/v2/admin/policy", method="POST",
                                     data=json.dumps({"model": model, "policy": policy}).encode(),
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request) as response:
        log.debug("policy switch: %s", response.read().decode())
