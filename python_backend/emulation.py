"""Emulated device kinds: a Triton server whose models run a fixed factor slower than this machine.

Proteus plans over heterogeneous devices; on one CPU machine a slower kind is emulated by a
tritonserver started with ``ACCSCALE_EMULATED_SLOWDOWN=f``. After computing a batch, a model
sleeps until the batch has taken ``f`` times its profiled latency at that size, when its version
folder has the profile (``latency.json``: ``{"batch_sizes": [...], "p50_ms": [...]}``, a size between
profiled ones taking the next one's), or else ``f`` times the fastest compute it has seen at that size (of
that subnet, in a supernet: a batch of its smallest subnet must not set the pace of its largest).
Either way the emulated device keeps one speed: a batch the machine slowed down is not slowed ``f`` times
more, nor does a host loaded for a while (other processes on a small machine) slow the device ``f`` times
as much, which would break what a profile taken earlier on the same server predicts. A profile's curves for
that kind are the measured ones times ``f``. The sleep leaves the cores free, so several emulated devices
share a small machine.

Triton's statistics count a batch's sleep as compute. What the models really computed is the counter
``accscale_model_compute_seconds`` (label ``model``) on Triton's metrics endpoint: each batch adds its time before
the sleep, with or without emulation.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from pathlib import Path

SLOWDOWN_ENV = "ACCSCALE_EMULATED_SLOWDOWN"
LATENCY_FILE = "latency.json"
COMPUTE_METRIC = "accscale_model_compute_seconds"


def slowdown() -> float:
    """This process's factor (1: no emulation); a bad value raises ValueError."""
    factor = float(os.environ.get(SLOWDOWN_ENV, "1"))
    if not factor >= 1:
        raise ValueError(f"{SLOWDOWN_ENV} must be a number >= 1, got {factor}")
    return factor


def write_latency(version_dir: Path, batch_sizes: list[int], p50_ms: list[float]) -> None:
    (version_dir / LATENCY_FILE).write_text(json.dumps({"batch_sizes": batch_sizes, "p50_ms": p50_ms}))


def compute_counter(pb_utils, model: str):
    """The model's ``COMPUTE_METRIC`` counter (``pb_utils``: the python backend's utilities, which hold custom
    metrics), with its family, which must outlive it."""
    family = pb_utils.MetricFamily(name=COMPUTE_METRIC, description="seconds the model computed, emulated sleep "
                                   "left out", kind=pb_utils.MetricFamily.COUNTER)
    return family, family.Metric(labels={"model": model})


class Padding:
    """Sleeps after each batch to emulate a device ``factor`` times slower (see the module docstring), and counts
    each batch's compute on ``counter`` (anything with ``increment(seconds)``; None: not counted)."""

    def __init__(self, factor: float, version_dir: Path, counter=None) -> None:
        self.factor = factor
        self.counter = counter
        path = version_dir / LATENCY_FILE
        profile = json.loads(path.read_text()) if path.exists() else None
        self.sizes = profile["batch_sizes"] if profile else None
        self.ms = profile["p50_ms"] if profile else None
        # (what ran, batch size) -> fastest compute seen (a model with no profile)
        self._fastest: dict[tuple[tuple[int, ...], int], float] = {}

    @property
    def by_subnet(self) -> bool:
        """Whether :meth:`pad` needs to know which subnets a batch ran (it times each apart when no profile says)."""
        return self.factor > 1 and self.sizes is None

    def pad(self, batch_size: int, started: float, ran: tuple[int, ...] = ()) -> None:
        """The batch of ``batch_size`` rows began computing at ``started`` (``time.perf_counter()``); ``ran``: the
        subnets it ran, in a supernet."""
        took = time.perf_counter() - started
        if self.counter is not None:
            self.counter.increment(took)
        if self.factor > 1:
            time.sleep(self.delay(batch_size, took, ran))

    def delay(self, batch_size: int, took: float, ran: tuple[int, ...] = ()) -> float:
        """Seconds to sleep after a batch of ``batch_size`` rows of subnets ``ran`` that computed for ``took``
        seconds."""
        if self.sizes is not None:
            i = min(bisect.bisect_left(self.sizes, batch_size), len(self.sizes) - 1)
            machine = self.ms[i] / 1000
        else:
            # the fastest compute is this machine's speed unloaded: load only ever adds time
            key = (ran, batch_size)
            machine = self._fastest[key] = min(took, self._fastest.get(key, took))
        return max(0.0, self.factor * machine - took)
