"""The Triton workers the sidecar dispatches to, and the poller that keeps their health current.

Health is ``ServerReady`` plus ``ModelReady`` of every model the sidecar uses, polled every
``interval_s``; a lost batch marks its worker down at once, and a later successful poll brings
it back. Listeners (the live driver) hear of every change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from scheduler_sidecar.live.workers import TritonWorker, Worker

log = logging.getLogger(__name__)


class WorkerPool:
    """The workers, their health, and who to tell when it changes."""

    def __init__(self, models: Iterable[str], *, interval_s: float = 0.5, timeout_s: float = 1.0,
                 connect: Callable[[str], Worker] = TritonWorker) -> None:
        self.models = tuple(sorted(set(models)))  # Triton models every worker must have ready
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.connect = connect
        self.workers: list[Worker] = []
        self.healthy: dict[str, bool] = {}  # url -> what the last check or batch saw
        self._listeners: list[Callable[[Worker, bool], None]] = []
        self._poller: asyncio.Task | None = None

    def on_change(self, listener: Callable[[Worker, bool], None]) -> None:
        self._listeners.append(listener)

    async def add(self, url: str, *, wait_s: float = 0.0) -> Worker:
        """Add a worker; it must be ready (server and every model) within ``wait_s``."""
        if url in self.healthy:
            raise ValueError(f"worker {url} is already in the pool")
        worker = self.connect(url)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait_s
        while not await worker.ready(self.models, self.timeout_s):
            if loop.time() >= give_up:
                await worker.close()
                raise ValueError(f"Triton at {url} is not ready (server and models {list(self.models)})")
            await asyncio.sleep(0.2)
        self.workers.append(worker)
        self.healthy[url] = True
        log.info("worker %s ready", url)
        return worker

    def mark_down(self, worker: Worker, reason: str) -> None:
        if self.healthy.get(worker.url):
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
            workers = list(self.workers)
            states = await asyncio.gather(*(w.ready(self.models, self.timeout_s) for w in workers))
            for worker, ready in zip(workers, states):
                if ready and not self.healthy[worker.url]:
                    log.info("worker %s is back", worker.url)
                    self._set(worker, True)
                elif not ready:
                    self.mark_down(worker, "health check failed")

    def _set(self, worker: Worker, healthy: bool) -> None:
        self.healthy[worker.url] = healthy
        for listener in self._listeners:
            listener(worker, healthy)
