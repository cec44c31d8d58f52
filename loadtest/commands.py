"""``accscale trace gen KIND`` and ``accscale trace info FILE``: write and inspect arrival traces."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from loadtest import traces
from loadtest.traces import Trace
from scheduler_sidecar.errors import ConfigError


def _compress(args: argparse.Namespace) -> Trace:
    if args.series is not None:
        counts, bin_s, source = traces.load_series(args.series), traces.SERIES_BIN_S[args.series], args.series
    elif args.bin_s is None:
        raise ConfigError("--series-file needs --bin-s, the width of one bin in seconds")
    else:
        counts, bin_s, source = traces.read_series(args.series_file), args.bin_s, str(args.series_file)
    if (args.mean_qps is None) == (args.min_qps is None and args.max_qps is None):
        raise ConfigError("give either --mean-qps, or --min-qps and --max-qps")
    trace = traces.compress(counts, bin_s, args.duration_s, args.mean_qps, args.seed, args.within_bin,
                            "mean" if args.mean_qps is not None else "minmax", args.min_qps, args.max_qps)
    return dataclasses.replace(trace, comment=f"series: {source}\n{trace.comment}")


# kind -> (help, builder from parsed arguments)
KINDS: dict[str, tuple[str, Callable[[argparse.Namespace], Trace]]] = {
    "constant": ("evenly spaced arrivals at a fixed rate",
                 lambda a: traces.constant(a.rate_qps, a.duration_s)),
    "poisson": ("Poisson arrivals at a fixed rate",
                lambda a: traces.poisson(a.rate_qps, a.duration_s, a.seed)),
    "gamma": ("gamma inter-arrivals of a given CV² at a fixed rate",
              lambda a: traces.gamma(a.rate_qps, a.cv2, a.duration_s, a.seed)),
    "bursty": ("SuperServe's bursty trace: a CV²=0 base stream plus a gamma variant stream",
               lambda a: traces.bursty(a.base_qps, a.variant_qps, a.cv2, a.duration_s, a.seed)),
    "time-varying": ("SuperServe's time-varying trace: rate1, a linear ramp at tau q/s², then rate2",
                     lambda a: traces.time_varying(a.rate1_qps, a.rate2_qps, a.tau_qps2, a.cv2, a.duration_s,
                                                   a.ramp_start_s, a.seed)),
    "compress": ("a count series (shipped or from a file) squeezed into a duration, shape preserved",
                 _compress),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser(
        "trace", help="generate and inspect open-loop arrival traces",
        description="Arrival traces for the simulator and the Locust replay: plain text, "
                    "one 'arrival_s[,slo_ms[,payload_index]]' line per query.")
    actions = trace.add_subparsers(dest="trace_action", metavar="ACTION", required=True)
    gen = actions.add_parser("gen", help="write a generated trace",
                             description="Write a seeded, generated trace.")
    for p in _add_kinds(gen):
        p.add_argument("--out", default="-", help="output file, or '-' for stdout (default: -)")
        p.set_defaults(func=run_gen)
    info = actions.add_parser("info", help="print a trace's size, duration and rates",
                              description="Print a trace's query count, duration, mean and peak rate "
                                          "(1-s bins).")
    info.add_argument("file", help="trace file, or '-' for stdin")
    info.set_defaults(func=run_info)


def _add_kinds(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """A subcommand per kind of trace, with its options and those every kind has; returns their parsers."""
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    added = []
    for kind, (help_text, _) in KINDS.items():
        p = kinds.add_parser(kind, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        _add_kind_options(kind, p)
        p.add_argument("--seed", type=int, default=0,
                       help="random seed of the arrivals and --payloads, kept in the header (default: 0)")
        p.add_argument("--slo-ms", type=float, help="give every query this SLO in ms (default: no SLOs)")
        p.add_argument("--payloads", type=int, metavar="N",
                       help="give every query a payload index drawn uniformly from 0..N-1 (default: none)")
        added.append(p)
    return added


def generated(spec: str) -> Trace:
    """The trace ``accscale trace gen SPEC`` writes, SPEC being its kind and options (e.g. ``bursty --base-qps 30
    --variant-qps 70 --cv2 8 --duration-s 30``); a bad one is a ConfigError (argparse says why on stderr)."""
    parser = argparse.ArgumentParser(prog="trace gen", add_help=False)
    _add_kinds(parser)
    try:
        return _trace(parser.parse_args(shlex.split(spec)))
    except SystemExit:
        raise ConfigError(f"not a trace generator's settings: {spec!r} (`accscale trace gen --help`)") from None


def _add_kind_options(kind: str, p: argparse.ArgumentParser) -> None:
    duration_required = kind != "compress"
    if kind in ("constant", "poisson", "gamma"):
        p.add_argument("--rate-qps", type=float, required=True, help="mean arrival rate in queries/s")
    if kind == "bursty":
        p.add_argument("--base-qps", type=float, required=True, help="rate of the CV²=0 base stream")
        p.add_argument("--variant-qps", type=float, required=True, help="rate of the gamma variant stream")
    if kind == "time-varying":
        p.add_argument("--rate1-qps", type=float, required=True, help="rate before the ramp")
        p.add_argument("--rate2-qps", type=float, required=True, help="rate after the ramp")
        p.add_argument("--tau-qps2", type=float, required=True, help="ramp slope in queries per second²")
        p.add_argument("--ramp-start-s", type=float, required=True, help="when the ramp starts, in seconds")
    if kind in ("gamma", "bursty", "time-varying"):
        p.add_argument("--cv2", type=float, required=True,
                       help="squared coefficient of variation of gamma inter-arrival times (0 = constant)")
    if kind == "compress":
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument("--series", choices=sorted(traces.SERIES_BIN_S), help="a shipped count series")
        source.add_argument("--series-file", type=Path,
                            help="a count series file: one number per line, '#' comments (needs --bin-s)")
        p.add_argument("--bin-s", type=float,
                       help="bin width of --series-file in seconds, e.g. 60 for per-minute counts "
                            "(shipped series know their own)")
        p.add_argument("--mean-qps", type=float, help="scale the series to this mean rate")
        p.add_argument("--min-qps", type=float, help="min-max scaling: the smallest bin gets this rate")
        p.add_argument("--max-qps", type=float, help="min-max scaling: the largest bin gets this rate")
        p.add_argument("--within-bin", choices=("poisson", "uniform"), default="poisson",
                       help="arrivals inside each bin: Poisson, or evenly spaced (default: poisson)")
    p.add_argument("--duration-s", type=float, required=duration_required,
                   help="trace length in seconds" if duration_required else
                   "trace length in seconds (default: the series' own length, bins x bin width)")


def _trace(args: argparse.Namespace) -> Trace:
    trace = KINDS[args.kind][1](args)
    if args.slo_ms is not None:
        trace = traces.with_slo(trace, args.slo_ms)
    if args.payloads is not None:
        trace = traces.with_payloads(trace, args.payloads, args.seed)
    return trace


def run_gen(args: argparse.Namespace) -> int:
    trace = _trace(args)
    if args.out == "-":
        sys.stdout.write(trace.to_text())
    else:
        trace.save(args.out)
    print(f"wrote {_summary(trace)} to {'stdout' if args.out == '-' else args.out}", file=sys.stderr)
    return 0


def run_info(args: argparse.Namespace) -> int:
    trace = Trace.from_text(sys.stdin.read(), source="<stdin>") if args.file == "-" else Trace.load(args.file)
    rate_qps = _rates_per_second(trace)
    print(f"name: {trace.name}")
    print(f"queries: {len(trace)}")
    print(f"duration_s: {trace.duration_s:.6g}")
    print(f"mean_rate_qps: {trace.mean_rate_qps:.1f}")
    print(f"peak_rate_qps: {rate_qps.max():.1f} (1-s bins)")
    print(f"min_rate_qps: {rate_qps.min():.1f} (1-s bins)")
    print(f"with_slo: {int((~np.isnan(trace.slo_ms)).sum())}")
    print(f"with_payload: {int((trace.payload_index >= 0).sum())}")
    return 0


def _rates_per_second(trace: Trace) -> np.ndarray:
    """Rates in 1-s bins, leaving out a partial last bin (one query in 20 ms is not a 50 q/s peak)."""
    rate_qps = trace.rate_per_bin(1.0)
    full = rate_qps[: int(trace.duration_s)]
    return full if full.size else (rate_qps if rate_qps.size else np.zeros(1))


def _summary(trace: Trace) -> str:
    return (f"{trace.name} trace: {len(trace)} queries over {trace.duration_s:.6g} s, "
            f"mean {trace.mean_rate_qps:.1f} q/s, peak {_rates_per_second(trace).max():.1f} q/s (1-s bins)")
