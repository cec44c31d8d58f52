"""Workers found by name: the Triton pods behind a Kubernetes headless Service, followed as they come and go.

A headless Service's name resolves to one address per ready pod: Kubernetes publishes a pod once its readiness
probe passes and withdraws it when the pod stops being ready or starts terminating. Every ``interval_s`` the
sidecar resolves the name again. A new address is admitted once its Triton answers ready (the admin API's path
for adding a worker: until then it is tried again at the next round); an address that is gone is drained: no new
batch goes there, the batches it runs finish, and then it is forgotten. A lookup that fails changes nothing: a
DNS hiccup must not drain the fleet, and a pod that really died is taken down by the health checks.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from scheduler_sidecar.errors import AccscaleError

log = logging.getLogger(__name__)

Resolver = Callable[[], Awaitable[frozenset[str]]]  # the worker urls ("host:port") the name has now


def dns_resolver(service: str, port: int) -> Resolver:
    """Every address ``service`` resolves to (A and AAAA records), each at ``port``."""

    async def resolve() -> frozenset[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(service, port, type=socket.SOCK_STREAM)
        return frozenset(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for *_, (ip, *_) in infos)

    return resolve


class Discovery:
    """Keeps the workers in step with what ``resolve`` finds: ``admit`` the new, ``drain`` the gone.

    ``known`` says which workers there are now (the configured ones and those found before); ``admit`` raises an
    AccscaleError or ValueError for a worker that is not ready yet.
    """

    def __init__(self, resolve: Resolver, known: Callable[[], frozenset[str]],
                 admit: Callable[[str], Awaitable[object]], drain: Callable[[str], Awaitable[object]], *,
                 interval_s: float) -> None:
        self.resolve, self.known, self.admit, self.drain = resolve, known, admit, drain
        self.interval_s = interval_s
        self.found: frozenset[str] | None = None  # what the last lookup that answered found

    async def lookup(self) -> frozenset[str] | None:
        """What the name has now; None if the lookup failed."""
        try:
            found = await self.resolve()
        except OSError as exc:
            log.warning("discovery: lookup failed (%s); the workers stay as they are", exc)
            return None
        if found != self.found:
            log.info("discovery: %d worker(s) found: %s", len(found), sorted(found))
        self.found = found
        return found

    async def sync(self) -> None:
        """One round: look the name up, admit what is new and ready, drain what is gone."""
        found = await self.lookup()
        if found is None:
            return
        known = self.known()
        for url in sorted(found - known):
            try:
                await self.admit(url)
            except (AccscaleError, ValueError) as exc:
                log.info("discovery: %s not admitted yet: %s", url, exc)
        for url in sorted(known - found):
            await self.drain(url)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sync()
