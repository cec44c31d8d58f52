"""Triton endpoints the sidecar dispatches to, and the poller that keeps their health current.

An endpoint is one ``tritonserver`` reached over gRPC. Each logical model turns an endpoint
into as many worker slots as its Triton model has instances (DESIGN 4.4). Health is
``ServerReady`` plus ``ModelReady`` of every model the sidecar uses, polled every
``interval_s``; a failed RPC marks the endpoint down at once, and a later successful poll
brings it back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

log = logging.getLogger(__name__)

# tritonclient sends up to 2 GiB; the default 4 MiB limit would fail large batches
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class Endpoint:
    """One Triton server; ``healthy`` is what the last check or RPC saw."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.healthy = False
        self._channel = grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def check(self, models: Iterable[str], timeout_s: float) -> bool:
        try:
            if not (await self.stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout_s)).ready:
                return False
            for name in models:
                if not (await self.stub.ModelReady(pb.ModelReadyRequest(name=name), timeout=timeout_s)).ready:
                    return False
        except grpc.aio.AioRpcError:
            return False
        return True

    async def infer(self, request: pb.ModelInferRequest, timeout_s: float) -> pb.ModelInferResponse:
        return await self.stub.ModelInfer(request, timeout=timeout_s)

    async def close(self) -> None:
        await self._channel.close()


class WorkerPool:
    """The endpoints, their health, and who to tell when it changes."""

    def __init__(self, models: Iterable[str], *, interval_s: float = 0.5, timeout_s: float = 1.0) -> None:
        self.models = tuple(sorted(set(models)))  # Triton models every endpoint must have ready
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.endpoints: list[Endpoint] = []
        self._listeners: list[Callable[[Endpoint], None]] = []
        self._poller: asyncio.Task | None = None

    def on_change(self, listener: Callable[[Endpoint], None]) -> None:
        self._listeners.append(listener)

    async def add(self, url: str, *, wait_s: float = 0.0) -> Endpoint:
        """Add an endpoint; it must be ready (server and every model) within ``wait_s``."""
        if any(e.url == url for e in self.endpoints):
            raise ValueError(f"worker {url} is already in the pool")
        endpoint = Endpoint(url)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait_s
        while not await endpoint.check(self.models, self.timeout_s):
            if loop.time() >= give_up:
                await endpoint.close()
                raise ValueError(f"Triton at {url} is not ready (server and models {list(self.models)})")
            await asyncio.sleep(0.2)
        endpoint.healthy = True
        self.endpoints.append(endpoint)
        log.info("worker %s ready", url)
        self._notify(endpoint)
        return endpoint

    def mark_down(self, endpoint: Endpoint, reason: str) -> None:
        if endpoint.healthy:
            log.warning("worker %s down: %s", endpoint.url, reason)
            endpoint.healthy = False
            self._notify(endpoint)

    def start(self) -> None:
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await asyncio.gather(*(e.close() for e in self.endpoints), return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            endpoints = list(self.endpoints)
            states = await asyncio.gather(*(e.check(self.models, self.timeout_s) for e in endpoints))
            for endpoint, ready in zip(endpoints, states):
                if ready and not endpoint.healthy:
                    log.info("worker %s is back", endpoint.url)
                    endpoint.healthy = True
                    self._notify(endpoint)
                elif not ready:
                    self.mark_down(endpoint, "health check failed")

    def _notify(self, endpoint: Endpoint) -> None:
        for listener in self._listeners:
            listener(endpoint)
