"""``accscale demo``: the default supernet, built once, served in place by a real Triton.

Builds (or reuses) the full-preset supernet and its profile, starts Triton on free ports,
sends one held-out digit through three Pareto subnets of the one supernet model (fastest,
median, most accurate) and prints what served each answer.
"""

from __future__ import annotations

import argparse
import logging
import time
import numpy as np

from export.commands import add_build_options

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="build the default supernet, serve it with Triton, query three subnets",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tritonclient.grpc as grpcclient

    from export import data
    from export.artifacts import Artifacts
    from export.presets import get_preset
    from export.profiler import SUPERNET_MODEL, export_supernet
    from scheduler_sidecar.triton_launcher import TritonServer

    artifacts = Artifacts(get_preset(args.preset), args.build_dir)
    act = artifacts.supernet()
    calibration = artifacts.calibration(act)
    profile, kept = artifacts.profiled(act, calibration)
    export_supernet(act, kept, args.repository)  # cheap, and never serves a stale or other preset's model
    heldout = data.load(act.spec.image_size)["heldout"]
    x, label = heldout.images[:1], int(heldout.labels[0])
    variants = profile.variants
    picks = [variants[0], variants[len(variants) // 2], variants[-1]]
    device = profile.device_kinds[0]
    print(f"profile {artifacts.profile_path}: {len(variants)} Pareto subnets, top-1 "
          f"{100 * variants[0].accuracy:.2f}%..{100 * variants[-1].accuracy:.2f}%")
    with TritonServer(repository=args.repository, models=[SUPERNET_MODEL]) as server, \
            grpcclient.InferenceServerClient(server.grpc_url) as client:
        print(f"triton ready at {server.grpc_url} (gRPC); querying one held-out digit (label {label})\n")
        print(f"{'subnet (CONTROL row)':<44} {'top-1':>7} {'p50 b=1':>9} {'answer':>7} {'latency':>9}")
        warm_up = True
        for v in [picks[0], *picks]:  # the first call warms the model up and is not shown
            control = np.asarray([v.actuation.control], dtype=np.int32)
            inputs = [grpcclient.InferInput("INPUT", list(x.shape), "FP32"),
                      grpcclient.InferInput("CONTROL", list(control.shape), "INT32")]
            inputs[0].set_data_from_numpy(np.ascontiguousarray(x))
            inputs[1].set_data_from_numpy(control)
            start = time.perf_counter()
            logits = client.infer(SUPERNET_MODEL, inputs).as_numpy("LOGITS")
            elapsed_ms = (time.perf_counter() - start) * 1e3
            if warm_up:
                warm_up = False
                continue
            print(f"{v.id:<44} {100 * v.accuracy:6.2f}% {v.latency[device].p50_at(1):7.2f}ms "
                  f"{int(logits.argmax()):>7} {elapsed_ms:7.2f}ms")
    print(f"\nall three answers came from one Triton model, {SUPERNET_MODEL!r}: SubNetAct switched subnets in place")
    return 0
