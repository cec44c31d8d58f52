"""``accscale reproduce PAPER``: each paper system registers its reproduction here."""

from __future__ import annotations

import argparse

from scheduler_sidecar.experiments.hybridserve import reproduce as hybridserve
from scheduler_sidecar.experiments.loki import reproduce as loki
from scheduler_sidecar.experiments.proteus import reproduce as proteus
from scheduler_sidecar.experiments.ramsis import reproduce as ramsis
from scheduler_sidecar.experiments.superserve import reproduce as superserve


def register(subparsers: argparse._SubParsersAction) -> None:
    top = subparsers.add_parser("reproduce", help="reproduce a paper's experiments in simulation",
                                description="Reproduces a paper's experiments in simulation: tables, plots and "
                                            "summary.md. `accscale reproduce PAPER --help` lists its options.")
    papers = top.add_subparsers(dest="paper", metavar="PAPER", required=True)
    superserve.register(papers)
    ramsis.register(papers)
    proteus.register(papers)
    loki.register(papers)
    hybridserve.register(papers)
