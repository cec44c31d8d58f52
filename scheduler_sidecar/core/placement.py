"""Placement: which Triton models each worker holds, moved to what a plan or a policy asks.

A plan's placement is carried out make before break: a worker loads what it lacks while it keeps serving what it
holds, one model at a time, and unloads what the plan no longer wants only once it holds everything the plan does,
between two batches; so a plan change never leaves a worker without a model to serve. A plan's instance counts
(a BLS model's stage models, which are no worker's placement), the same on every server or each server its own, go
to the executor once per change of a worker's count (a worker that joins gets them with the next plan). A policy's own
loads and unloads (a ``Decision``'s) are checked and carried out here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from scheduler_sidecar.core.plan import Plan, Scope
from scheduler_sidecar.core.records import Batch, Load, Unload, WorkerState
from scheduler_sidecar.core.worker_table import WorkerTable
from scheduler_sidecar.errors import PolicyError

if TYPE_CHECKING:  # the engine's executor; the engine imports this module
    from scheduler_sidecar.core.engine import Executor


class Placement:
    """See the module docstring. ``all_models``: every Triton model of the pool's types (what a worker that holds
    "every model" holds); ``changed``: the engine's hook for a change of which worker serves what."""

    def __init__(self, table: WorkerTable, executor: Executor, running: Mapping[int, Batch],
                 all_models: Callable[[], set[str]], changed: Callable[[], None]) -> None:
        self.table, self.executor, self.running = table, executor, running
        self.all_models, self.changed = all_models, changed
        self.target: dict[int, frozenset[str]] = {}  # worker id -> placement still to carry out
        self.instances: dict[tuple[str, int], int] = {}  # (Triton model, worker id) -> the count a plan last set

    def place(self, plan: Plan, scope: Scope) -> None:
        """Move the plan's workers to its placement as they become free, and set its instance counts."""
        for wid, models in plan.placement.items():
            if wid in self.table.index and wid not in self.table.leaving:  # else it left while the plan was made
                self.target[wid] = frozenset(models)
        wanted: dict[str, dict[int, int]] = {}  # model -> worker id -> the instances its server should run
        for w in self.table.workers:
            if scope.has_worker(w.id) and w.id not in self.table.leaving:
                own = plan.server_instances.get(w.id, {})
                for model, count in {**plan.instances, **own}.items():
                    wanted.setdefault(model, {})[w.id] = count
        for model, counts in wanted.items():
            changed: dict[int, list[WorkerState]] = {}  # count -> the workers to move to it
            for wid, count in counts.items():
                if self.instances.get((model, wid)) != count:
                    self.instances[model, wid] = count
                    changed.setdefault(count, []).append(self.table.workers[self.table.index[wid]])
            for count, workers in sorted(changed.items()):
                self.executor.scale(model, count, workers)

    def abandon(self, worker_id: int) -> None:
        """Stop moving a worker (it left, or a load of its placement failed: not retried in a loop)."""
        self.target.pop(worker_id, None)

    def move(self) -> None:
        """One move of each worker with a placement still to carry out: its next missing model loads beside what
        it serves, or, with none missing and the worker free, what the plan no longer wants leaves."""
        table = self.table
        for wid, target in list(self.target.items()):
            i = table.index[wid]
            worker = table.workers[i]
            if not worker.healthy or worker.staging_model is not None or worker.loading_model is not None:
                continue
            resident = worker.resident if worker.resident is not None else frozenset(self.all_models())
            missing = sorted(target - resident)
            if missing:
                self.executor.load(worker, missing[0])
                table.set(i, worker, staging_model=missing[0])
                self.changed()
            elif worker.is_free:
                for model in sorted(resident - target):
                    self.unload(Unload(wid, model))
                del self.target[wid]

    def load(self, load: Load, now: int) -> None:
        """A policy's load: the worker serves nothing until it completes."""
        i = self.table.index.get(load.worker_id)
        if i is None or not self.table.workers[i].is_free:
            raise PolicyError(f"cannot load {load.model!r}: worker {load.worker_id} is missing or not free")
        worker = self.table.workers[i]
        expected = self.executor.load(worker, load.model)
        self.table.set(i, worker, loading_model=load.model, loading_until_us=now + expected)
        self.changed()

    def unload(self, unload: Unload) -> None:
        i = self.table.index.get(unload.worker_id)
        if i is None or unload.worker_id in self.running:
            raise PolicyError(f"cannot unload {unload.model!r}: worker {unload.worker_id} is missing or busy")
        worker = self.table.workers[i]
        resident = worker.resident if worker.resident is not None else frozenset(self.all_models())
        self.table.set(i, worker, resident=resident - {unload.model})
        self.changed()
        self.executor.unload(worker, unload.model)

    def loaded(self, worker_id: int, model: str, ok: bool) -> bool:
        """A load finished (or failed: the model stays absent); False for a worker that has left meanwhile."""
        i = self.table.index.get(worker_id)
        if i is None:
            return False
        w = self.table.workers[i]
        resident = w.resident | {model} if ok and w.resident is not None else w.resident
        if w.staging_model == model:
            self.table.set(i, w, resident=resident, staging_model=None)
        else:
            self.table.set(i, w, resident=resident, loading_model=None, loading_until_us=None)
        self.changed()
        if not ok:
            self.abandon(worker_id)
        return True


__all__ = ["Placement"]
