"""Routing: where the queries of a type whose policy routes (``Policy.routes``) wait.

Such a query is in its type's queue and in one worker's queue (or held unrouted), where ``policy.route`` sent it;
whatever ends it (a dispatch, a drop, a cancel, a failure) takes it out of both at once (``QueryType.remove``).
After any change of the workers or the plan, the queue of a worker the policy no longer ``keeps`` is routed again,
queries held unrouted get another try, and a retried batch's queries are routed again: the policy never holds a
copy of what is queued.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduler_sidecar.core.records import DROP, Query
from scheduler_sidecar.core.worker_table import WorkerTable
from scheduler_sidecar.errors import PolicyError

if TYPE_CHECKING:  # the engine's record of a type; the engine imports this module
    from scheduler_sidecar.core.engine import QueryType


class Routing:
    """See the module docstring; ``due`` says the workers or a plan changed since the routed queues were checked.
    ``dropped``: the engine's hook that ends a query the policy gave up on (it is out of its queues by then)."""

    def __init__(self, table: WorkerTable, dropped: Callable[[QueryType, Query, int], None]) -> None:
        self.table, self.dropped = table, dropped
        self.due = False

    def route(self, qt: QueryType, query: Query, now: int, *, again: bool) -> None:
        """Queue ``query`` (already in the type's queue) where the type's policy routes it, or end it if dropped."""
        assert qt.routes is not None
        ask = qt.policy.reroute if again else qt.policy.route
        target = ask(now, query, qt.view, self.table.serving(qt.name, qt.model_set))
        if target is DROP:
            qt.queue.remove([query.id])
            self.dropped(qt, query, now)
            return
        if target is not None and target not in self.table.index:
            raise PolicyError(f"{qt.policy.name}: routed query {query.id} to unknown worker {target}")
        qt.routes.push(query, target)

    def reroute(self, qt: QueryType, now: int) -> None:
        """Route again the type's queries of every worker its policy no longer keeps, and those held unrouted."""
        routes = qt.routes
        if routes is None or not routes.where:
            return
        table = self.table
        for wid in routes.workers():
            i = table.index.get(wid) if wid is not None else None
            if i is not None and qt.policy.keeps(table.workers[i]):
                continue
            for q in routes.take(wid):
                self.route(qt, q, now, again=True)


__all__ = ["Routing"]
