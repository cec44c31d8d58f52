"""The `accscale` command: one entry point, one subcommand per job.

Each subcommand lives next to the code it drives and registers itself through a
``register(subparsers)`` function; heavy imports (torch, onnxruntime) happen inside
the handlers so that ``accscale --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import signal
import sys

from tritonclient.utils import InferenceServerException

from python_backend.control import ControlError  # a control row naming no calibrated subnet (export, profile)
from scheduler_sidecar.errors import AccscaleError

# errors that mean "bad input or environment": one line for the user, no traceback (-v shows it); any other
# exception is a bug and keeps its traceback
USER_ERRORS = (AccscaleError, ControlError, OSError, InferenceServerException)

# modules that contribute subcommands, in the order `--help` lists them
COMMAND_MODULES = (
    "scheduler_sidecar.processes.triton_launcher",
    "export.commands",
    "scheduler_sidecar.experiments.demo",
    "loadtest.commands",
    "scheduler_sidecar.experiments.simulate",
    "scheduler_sidecar.experiments.advise",
    "scheduler_sidecar.experiments.reproduce",
    "scheduler_sidecar.experiments.superserve.paper_profile",
    "scheduler_sidecar.server.serve",
    "loadtest.loadtest_cli",
    "loadtest.report",
    "scheduler_sidecar.experiments.ramsis.cli",
)
# modules that contribute `accscale bench <kind>` benchmarks (``register_bench(kinds)``)
BENCH_MODULES = ("export.bench", "scheduler_sidecar.experiments.bench", "scheduler_sidecar.experiments.sidecar_bench",
                 "scheduler_sidecar.experiments.fidelity",
                 "scheduler_sidecar.experiments.overload_bench", "scheduler_sidecar.experiments.ramsis.bench",
                 "scheduler_sidecar.experiments.milp_bench", "scheduler_sidecar.experiments.sharding",
                 "scheduler_sidecar.experiments.hybridserve.energy_bench", "scheduler_sidecar.experiments.payoff")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accscale",
        description="Accuracy-scaling inference serving in front of NVIDIA Triton.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    bench = subparsers.add_parser("bench", help="benchmarks that report ratios measured side by side in one run",
                                  description="Benchmarks: each measures what it compares side by side in one run "
                                              "and reports the ratios. `accscale bench BENCH --help` says what "
                                              "BENCH measures.")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register_bench(kinds)
    _plain(parser)
    return parser


# the help texts are the modules' docstrings, written for Sphinx: ``x``, :mod:`x` and :class:`~a.b.C` read as x,
# x and C in a terminal, and a block's "::" as ":"
_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|obj|exc):`(~?)([^`]+)`")


def plain(text: str | None) -> str | None:
    """Help text as a terminal shows it: no reStructuredText (roles, literal quotes, ``::`` before a block)."""
    if text is None:
        return None
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    text = re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)
    return text.replace("`", "")


def _plain(parser: argparse.ArgumentParser) -> None:
    parser.description, parser.epilog = plain(parser.description), plain(parser.epilog)
    for action in parser._actions:
        action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help)
            for sub in dict.fromkeys(action.choices.values()):
                _plain(sub)


def exit_on_sigterm() -> None:
    """SIGTERM (``kill``, ``timeout``, a container's stop) exits as Ctrl-C does, through every ``with`` and ``finally``
    on the way out, so the servers a command started are stopped: Python's default ends the process at once, and a
    ``demo`` ended so left Locust sending and a python-backend stub of its Triton running. Exit status 143, the
    shell's for SIGTERM. (``accscale serve``, once it serves, stops on its own handler instead, draining.)"""
    def stop(signum, frame) -> None:
        # a second SIGTERM does not cut the clean-up short; a handler, not SIG_IGN, which a child started meanwhile
        # would inherit and then ignore its own terminate()
        signal.signal(signal.SIGTERM, lambda *_: print("stopping already", file=sys.stderr))
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the console script; a test calling main() keeps its process's own handlers
        exit_on_sigterm()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # the command line, for what a command records of how it was run
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        if args.verbose:
            raise
        command = " ".join(x for x in (args.command, getattr(args, "kind", None)) if x)
        print(f"accscale {command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
