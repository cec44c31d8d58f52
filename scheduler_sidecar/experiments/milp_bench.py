"""``accscale bench milp --system loki|proteus``: a paper system's MILP solve times, against the paper's.

loki: the hardware- and accuracy-scaling steps over a demand sweep, and the load balancer's tables
(:mod:`.loki.bench`). proteus: every plan along the reproduction's trace, and one plan per cluster size as the
cluster grows (:mod:`.proteus.bench`, §6.8).
"""

from __future__ import annotations

import argparse
import json

from scheduler_sidecar.experiments.loki import bench as loki_bench
from scheduler_sidecar.experiments.proteus import bench as proteus_bench


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("milp", help="a paper system's MILP solve times (Loki's two steps; Proteus' along its "
                                      "trace and as the cluster grows)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=("loki", "proteus"), default="loki", help="the system (default: loki)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    loki_bench.add_arguments(p)
    proteus_bench.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.system == "loki":
        return loki_bench.run(args)
    out = proteus_bench.run(args)
    if args.json:
        print(json.dumps(out))
    else:
        proteus_bench.report(out)
    return 0
