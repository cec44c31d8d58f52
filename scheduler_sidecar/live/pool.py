"""The Triton workers the sidecar dispatches to, and the poller that keeps their health current.

Health is ``ServerReady`` plus ``ModelReady`` of every model the sidecar uses, checked every
``interval_s``. A worker that says it is not ready, or cannot be reached, is down at once; so
is one whose batch found it gone (the driver calls :meth:`WorkerPool.mark_down`). A check that
gets no answer in time proves nothing: on a saturated machine the worker, or the sidecar's own
event loop, answers late while batches still flow. So a worker is down for silence only after
``timeouts_to_down`` checks in a row without an answer *and* without any batch answered in
between; overload is shed by the policy and the queue limit, never by declaring workers dead. A
later good check brings a worker back. Listeners (the live driver) hear of every change.

Which workers there are and their health are the membership registry's (:mod:`.membership`), shared with the live
driver; the pool adds and removes members there and keeps only what its checks count.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.live.membership import Membership
from scheduler_sidecar.live.workers import Health, TritonWorker, Worker

log = logging.getLogger(__name__)

TIMEOUTS_TO_DOWN = 3  # silent checks in a row, with no batch answered meanwhile, before a worker is down


class WorkerPool:
    """The workers, their health, and who to tell when it changes."""

    def __init__(self, models: Iterable[str], *, interval_s: float = 0.5, timeout_s: float = 1.0,
                 timeouts_to_down: int = TIMEOUTS_TO_DOWN, connect: Callable[[str], Worker] = TritonWorker,
                 membership: Membership | None = None) -> None:
        self.models = tuple(sorted(set(models)))  # Triton models every worker must have ready
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.timeouts_to_down = timeouts_to_down
        self.connect = connect
        self.membership = membership or Membership()
        self._silent: dict[str, int] = {}  # url -> checks in a row that got no answer while no batch was answered
        self._answered: dict[str, int] = {}  # url -> the worker's answered count at the last check
        self._listeners: list[Callable[[Worker, bool], None]] = []
        self._poller: asyncio.Task | None = None

    def on_change(self, listener: Callable[[Worker, bool], None]) -> None:
        self._listeners.append(listener)

    @property
    def workers(self) -> list[Worker]:
        return self.membership.workers

    @property
    def healthy(self) -> dict[str, bool]:
        """url -> what the last check or batch saw."""
        return {m.url: m.healthy for m in self.membership.members.values() if not m.leaving}

    async def add(self, url: str, *, wait_s: float = 0.0, device: str | None = None) -> Worker:
        """Add a worker; it must be ready (server and every model) within ``wait_s``."""
        if self.membership.find(url) is not None:
            raise ValueError(f"worker {url} is already in the pool")
        worker = self.connect(url)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait_s
        while (health := await worker.ready(self.models, self.timeout_s)) is not Health.READY:
            if loop.time() >= give_up:
                await worker.close()
                raise ConfigError(f"Triton at {url} is not ready (server and models {list(self.models)}): "
                                  f"{health.value}")
            await asyncio.sleep(0.2)
        if self.membership.find(url) is not None:  # added meanwhile, while this one waited for it to be ready
            await worker.close()
            raise ValueError(f"worker {url} is already in the pool")
        self.membership.join(worker, device=device)
        self._silent[url], self._answered[url] = 0, worker.answered
        log.info("worker %s ready", url)
        return worker

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def remove(self, url: str) -> Worker:
        """Stop checking the worker at ``url`` (it left the deployment) and return it; the caller closes it once
        the batches it runs have ended."""
        member = self.membership.find(url)
        if member is None:
            raise ValueError(f"worker {url} is not in the pool")
        worker = self.membership.leave(member.worker).worker
        del self._silent[url], self._answered[url]
        log.info("worker %s removed", url)
        return worker

    def mark_down(self, worker: Worker, reason: str) -> None:
        # a worker removed meanwhile (or an earlier one at the same url) is none of the pool's business
        member = self.membership.find(worker.url)
        if member is not None and member.worker is worker and member.healthy:
            log.warning("worker %s down: %s", worker.url, reason)
            self._set(worker, False)

    def start(self) -> None:
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await asyncio.gather(*(w.close() for w in self.workers), return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()

    async def check(self) -> None:
        """One health check of every worker (the poller runs one every ``interval_s``)."""
        workers = list(self.workers)
        states = await asyncio.gather(*(w.ready(self.models, self.timeout_s) for w in workers))
        for worker, health in zip(workers, states):
            if not any(w is worker for w in self.workers) or worker.url not in self._answered:
                continue  # removed while it was being checked
            url = worker.url
            progress, self._answered[url] = worker.answered != self._answered[url], worker.answered
            if health is Health.READY:
                self._silent[url] = 0
                if not self.healthy[url]:
                    log.info("worker %s is back", url)
                    self._set(worker, True)
            elif health is Health.NO_ANSWER:
                self._silent[url] = 0 if progress else self._silent[url] + 1
                if self._silent[url] >= self.timeouts_to_down:
                    self.mark_down(worker, f"{self._silent[url]} health checks in a row got no answer within "
                                           f"{self.timeout_s:g} s, and no batch was answered meanwhile")
            else:
                self.mark_down(worker, f"health check: {health.value}")

    def _set(self, worker: Worker, healthy: bool) -> None:
        self.membership.set_health(worker, healthy)
        for listener in self._listeners:
            listener(worker, healthy)
