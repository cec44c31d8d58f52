"""The time a request spends outside the sidecar's view, measured on a live deployment: the allowance every policy of
`accscale demo` and `bench payoff` takes off each request's slack.

The client (Locust), Triton and the sidecar share the machine's cores, so a request spends time that no policy sees:
the client's own sending and receiving, the gRPC stack and the front end before the sidecar counts it. A short replay
of a quiet spell and the largest burst under SlackFit with no allowance measures it (each request's latency at the
client less the sidecar's queue and service time); its ``QUANTILE``th percentile is the allowance.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from loadtest.loadtest_cli import Replay, replay
from loadtest.requestlog import RequestLog
from loadtest.traces import steps, with_slo
from scheduler_sidecar.experiments import bursts
from scheduler_sidecar.experiments.deployment import switch_policy

SHARE = 0.05  # the calibration replay's quiet spell, then its largest burst: each this share of the trace
QUANTILE = 99
# an allowance beyond this share of the SLO would leave the policies too little to plan with: the measurement is
# capped there, and says so (the machine cannot serve the trace as sized; a smaller burst or more cores can)
MAX_SHARE = 0.25


def measure(sidecar, token: str, model: str, sizing: bursts.Sizing, payloads: Path, out: Path,
                       duration_s: float, progress: Callable[[str], None] = print) -> int:
    """The time outside the sidecar's view, in microseconds: the ``QUANTILE``th percentile of a replay of
    a quiet spell and the largest burst under SlackFit with no allowance (a request's client latency less the
    sidecar's queue and service time), each ``SHARE`` of ``duration_s`` long (a second at least)."""
    seconds = max(1, round(SHARE * duration_s))
    # twice: the first pass warms the path up (the first requests at a burst's rate after a start ran several times
    # slower, which no later burst repeats) and is left out
    rates = ([sizing.quiet_qps] * seconds + [max(sizing.burst_qps)] * seconds) * 2
    path = out / "trace.txt"
    out.mkdir(parents=True, exist_ok=True)
    with_slo(steps(rates, 1.0, seed=1), sizing.slo_ms).save(path)
    switch_policy(sidecar.http_url, token, model, "slackfit", {"overhead_us": 0})
    replay([Replay(model, path, payloads)], sidecar.grpc_url, out, name="calibration", slo_ms=sizing.slo_ms,
           progress_s=0)
    log = RequestLog([e for e in RequestLog.load(out / "requests.csv").entries if e.scheduled_s >= 2 * seconds])
    unseen, lag = log.unseen_ms(), log.column("lag_ms")
    measured_us = round(1000 * float(np.percentile(unseen, QUANTILE))) if unseen.size else 0
    overhead_us = min(measured_us, round(MAX_SHARE * sizing.slo_ms * 1000))
    if overhead_us < measured_us:
        progress(f"the measured {measured_us / 1000:.2f} ms is more than {MAX_SHARE:g} of the SLO: the "
              f"allowance is capped at {overhead_us / 1000:.2f} ms (this machine's cores cannot serve the largest "
              "burst's rate and the client together)")
    if unseen.size:
        progress(f"time outside the sidecar's view over {unseen.size} requests, p50 / p90 / p{QUANTILE}: "
              + " / ".join(f"{np.percentile(unseen, q):.2f}" for q in (50, 90, QUANTILE)) + " ms, of which "
              "the client's lateness in sending: " + " / ".join(f"{np.percentile(lag, q):.2f}"
                                                               for q in (50, 90, QUANTILE))
              + f" ms; every policy takes {overhead_us / 1000:.2f} ms off each request's slack")
    return overhead_us
