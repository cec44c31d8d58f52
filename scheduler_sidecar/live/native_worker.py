"""A Triton worker whose batches go out through the native edge's C++ client (native/edge.cc, ``Client``).

The sidecar on the native edge sends its batches from C++ too, so no Python gRPC runs on its data path: the
driver hands a batch's rows to :class:`NativeClient`, which builds the request, calls Triton on gRPC's threads
and queues the answer; the event loop, woken through an eventfd, takes the answers that are in, in one call.
Model control, health and metadata calls are rare and stay on :class:`TritonWorker`'s grpc.aio channel.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import grpc

from scheduler_sidecar.live.workers import (
    BATCH_LOST,
    InferCall,
    TritonWorker,
    split_outputs,
    status_error,
)

TAKE_LIMIT = 512  # answers per call into Python, at most
CODES = {code.value[0]: code for code in grpc.StatusCode}


class NativeClient:
    """One C++ Triton client for the process; its answers resolve futures on the event loop that sent them."""

    def __init__(self, module) -> None:
        self.client = module.Client()
        self._futures: dict[int, asyncio.Future] = {}
        self._tokens = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def infer(self, url: str, call: InferCall, timeout_s: float) -> tuple[int, str, bool, list]:
        """(status code, message, whether the channel was ready, [(output name, raw bytes), ...])."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            loop.add_reader(self.client.fd, self._take)
            self._loop = loop
        token = next(self._tokens)
        future = self._futures[token] = loop.create_future()
        parameters = {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v) for k, v in call.parameters}
        try:
            self.client.infer(token, url, call.model, call.version,
                              [(spec.name, spec.datatype, [call.rows, *spec.dims], rows) for spec, rows in call.inputs],
                              parameters, max(1, round(timeout_s * 1e6)))
            return await future
        finally:
            self._futures.pop(token, None)  # a batch abandoned by its caller: its answer is dropped when it comes

    def _take(self) -> None:
        for token, *answer in self.client.take(TAKE_LIMIT):
            future = self._futures.pop(token, None)
            if future is not None and not future.done():
                future.set_result(answer)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.client.fd)
            self._loop = None


class NativeTritonWorker(TritonWorker):
    """:class:`TritonWorker` with its batches sent by :class:`NativeClient`."""

    def __init__(self, url: str, client: NativeClient) -> None:
        super().__init__(url)
        self.client = client

    async def infer(self, call: InferCall, timeout_s: float) -> list[dict[str, bytes]]:
        code, message, ready, outputs = await self.client.infer(self.url, call, timeout_s)
        if code:
            state = grpc.ChannelConnectivity.READY if ready else grpc.ChannelConnectivity.IDLE
            raise status_error(self.url, CODES.get(code, grpc.StatusCode.UNKNOWN), message, BATCH_LOST, state)
        self.answered += 1
        return split_outputs(self.url, call, outputs)
