"""Loki's early dropping and opportunistic rerouting (§5.2) for one query of a child task, shared by the simulator's
task policies and the pipeline's BLS model, so that the two cannot disagree.

A query of a child task (a crop) was routed by its parent's table to a worker (simulator) or a model (BLS)
whose execution time at its planned batch size is ``routed_ms``. Its parent overran its task's latency budget
by ``overrun_ms``: the parent's hop, from the frame's arrival at the sidecar to the parent's result, minus the
budget. Within the budget the query goes where the table says. Over it:

- ``none``, ``last-task``: it still goes where the table says (last-task drops at the leaf, :func:`too_late`).
- ``per-task``: it is dropped (the paper's check point).
- ``rerouting`` (Loki's default): it goes to the first backup, most accurate first, whose time fits the routed
  one's minus the overrun (exec <= y - x) and whose spare capacity, a per-second :class:`Allowance` of its
  leftover queries per second, is not used up; with none, it is dropped. A backup's time is its execution time
  plus the work already queued ahead of a query sent there (the paper's profiled time alone would send a late
  query to a backup whose queue makes it later still).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping

DROP_MODES = ("none", "last-task", "per-task", "rerouting")
# what per-task dropping and rerouting also check before a batch runs (the decision and its measurements:
# scheduler_sidecar.systems.loki.policy); the BLS model makes the first two (the artifact's needs each task's queue,
# which a BLS execution does not have)
DEQUEUES = ("none", "hopeless", "artifact")
BLS_DEQUEUES = DEQUEUES[:2]


class Choice(enum.Enum):
    TABLE = "table"  # where the parent's table sent it
    REROUTED = "rerouted"  # to a backup
    DROPPED = "dropped"


class Allowance:
    """The backups' spare capacity (leftover queries per second, per backup) as an allowance that refills every
    whole second; a reroute takes one query of it."""

    def __init__(self, spare: Mapping[Hashable, float]) -> None:
        self.spare = dict(spare)
        self._second: int | None = None
        self._left: dict[Hashable, float] = {}

    def take(self, key: Hashable, second: int) -> bool:
        """Take one query of ``key``'s allowance in ``second``; False when none is left."""
        if second != self._second:
            self._second, self._left = second, dict(self.spare)
        if self._left.get(key, 0.0) < 1.0:
            return False
        self._left[key] -= 1.0
        return True


def next_hop(mode: str, overrun_ms: float, routed_ms: float | None, backups: Iterable[tuple[Hashable, float]],
             take: Callable[[Hashable], bool]) -> tuple[Choice, Hashable | None]:
    """Where a child query goes: (TABLE, None), (REROUTED, the backup's key) or (DROPPED, None).

    ``routed_ms`` is the routed worker's or model's execution time (None: the table routed it nowhere);
    ``backups`` are (key, time a query sent there takes), most accurate first; ``take(key)`` spends one query of
    that backup's allowance, or says there is none left.
    """
    if mode not in DROP_MODES:
        raise ValueError(f"unknown dropping mode {mode!r}; choose one of {DROP_MODES}")
    if overrun_ms <= 0 or mode in ("none", "last-task"):
        return Choice.TABLE, None
    if mode == "rerouting" and routed_ms is not None:
        fits_ms = routed_ms - overrun_ms
        for key, ms in backups:
            if ms <= fits_ms and take(key):
                return Choice.REROUTED, key
    return Choice.DROPPED, None


def expiring(waited: float, execution: float, budget: float) -> bool:
    """The artifact's check before a batch runs (per-task and rerouting): a query that has waited ``waited`` at its
    task and would then run ``execution`` overruns the task's latency ``budget`` (any one unit). The simulator's
    task policies apply it where asked (``dequeue="artifact"``); the BLS model runs its stages back to back, with
    no queue between them to check."""
    return waited + execution > budget


def too_late(time_left: float, execution: float) -> bool:
    """Last-task dropping: a leaf query whose execution cannot finish in the time its frame has left (any unit)."""
    return execution > time_left


def drops_at_dequeue(mode: str, dequeue: str) -> bool:
    """Whether the check ``dequeue`` runs before each batch: with per-task dropping and rerouting only."""
    return dequeue != "none" and mode in ("per-task", "rerouting")


def hopeless(time_left: float, execution: float, rest: float) -> bool:
    """The ``hopeless`` check before a batch runs: a query that would end past its frame's deadline if it ran now, in
    a batch that takes ``execution``, and every task after it ran as fast as any variant can (``rest``: the
    slowest branch of fastest variants at batch 1, no wait); any one unit. A leaf's rest is 0: last-task's check."""
    return execution + rest > time_left
