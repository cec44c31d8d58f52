"""Emulated device kinds: a Triton server whose models run a fixed factor slower than this machine.

Proteus plans over heterogeneous devices; on one CPU machine a slower kind is emulated by a
tritonserver started with ``ACCSCALE_EMULATED_SLOWDOWN=f``: every batch sleeps ``f - 1`` times its
compute time after computing. The sleep leaves the cores free, so several emulated devices share a
small machine, and a profile's curves for that kind are the measured ones times ``f``.
"""

from __future__ import annotations

import os
import time

SLOWDOWN_ENV = "ACCSCALE_EMULATED_SLOWDOWN"


def slowdown() -> float:
    """This process's factor (1: no emulation); a bad value raises ValueError."""
    factor = float(os.environ.get(SLOWDOWN_ENV, "1"))
    if not factor >= 1:
        raise ValueError(f"{SLOWDOWN_ENV} must be a number >= 1, got {factor}")
    return factor


def pad(factor: float, started: float) -> None:
    """Sleep so that the work begun at ``started`` (``time.perf_counter()``) takes ``factor`` times as long."""
    if factor > 1:
        time.sleep((factor - 1) * (time.perf_counter() - started))
