"""The engine's workers: each one's state, which are free, and which serve each query type.

The one owner of worker state inside the engine, as vLLM's KV-cache manager is of its blocks: the engine changes a
worker only through :meth:`WorkerTable.set`, which keeps the count of free workers (what ``step`` asks first), and
admission, placement and routing read it. A worker removed from the pool is *leaving* until the batch it runs has
ended, then *retired*: its id is never taken again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from scheduler_sidecar.core.records import WorkerState


class WorkerTable:
    """See the module docstring."""

    def __init__(self, workers: Iterable[WorkerState]) -> None:
        self.workers: list[WorkerState] = list(workers)
        self.index = {w.id: i for i, w in enumerate(self.workers)}  # worker id -> its place in ``workers``
        self.free = sum(w.is_free for w in self.workers)  # workers that could start a batch now
        self.leaving: set[int] = set()  # removed while running a batch: they go when it ends
        self.retired: set[int] = set()  # gone: their ids are never taken again
        # query type -> (indices of its workers, None when all of them; how many of them are healthy)
        self._views: dict[str, tuple[list[int] | None, int]] = {}

    def set(self, i: int, worker: WorkerState, **changes) -> None:
        """Replace worker ``i``'s state by ``worker`` with ``changes``, keeping count of the free workers."""
        new = replace(worker, **changes)
        self.free += new.is_free - self.workers[i].is_free
        self.workers[i] = new

    def changed(self) -> None:
        """Which workers serve which type may have changed (health, placement, membership)."""
        self._views.clear()

    def add(self, workers: list[WorkerState]) -> None:
        """New workers; ValueError (and none added) if one's id is in the pool or ever was."""
        for w in workers:
            if w.id in self.index or w.id in self.retired:
                raise ValueError(f"worker {w.id} is already in the pool, or was: a worker id is never reused")
        for w in workers:
            self.index[w.id] = len(self.workers)
            self.workers.append(w)
            self.free += w.is_free
        if workers:
            self.changed()

    def retire(self, gone: set[int]) -> None:
        """Leaving workers whose last batch has ended go for good."""
        self.leaving -= gone
        self.retired |= gone
        self.workers = [w for w in self.workers if w.id not in gone]
        self.index = {w.id: i for i, w in enumerate(self.workers)}
        self.free = sum(w.is_free for w in self.workers)
        self.changed()

    def forget_type(self, name: str) -> None:
        """A type's models changed (a policy switch to another profile)."""
        self._views.pop(name, None)

    def view(self, name: str, models: set[str]) -> tuple[list[int] | None, int]:
        """The workers that hold one of ``models`` or are loading one (None: all of them), and how many are
        healthy; cached per type until the workers change."""
        view = self._views.get(name)
        if view is None:
            workers = self.workers
            mine = [i for i, w in enumerate(workers) if w.resident is None or models & w.resident
                    or w.loading_model in models or w.staging_model in models]
            view = self._views[name] = (None if len(mine) == len(workers) else mine,
                                        sum(workers[i].healthy for i in mine))
        return view

    def serving(self, name: str, models: set[str]) -> list[WorkerState]:
        """The workers a type's policy sees (every one when none is placed)."""
        mine = self.view(name, models)[0]
        return self.workers if mine is None else [self.workers[i] for i in mine]

    def devices(self, name: str, models: set[str]) -> dict[str, int]:
        """A type's healthy workers per device kind."""
        devices: dict[str, int] = {}
        for w in self.serving(name, models):
            if w.healthy:
                devices[w.device] = devices.get(w.device, 0) + 1
        return devices


__all__ = ["WorkerTable"]
