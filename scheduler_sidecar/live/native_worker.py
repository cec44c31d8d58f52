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
import logging
from collections.abc import Callable

import grpc

from scheduler_sidecar.errors import WorkerError
from scheduler_sidecar.live.workers import (
    BATCH_LOST,
    InferCall,
    TritonWorker,
    split_outputs,
    status_error,
)

log = logging.getLogger(__name__)

TAKE_LIMIT = 512  # answers per call into Python, at most
CODES = {code.value[0]: code for code in grpc.StatusCode}


class NativeClient:
    """One C++ Triton client for the process; its answers reach their callbacks on the event loop that sent them."""

    def __init__(self, module) -> None:
        self.client = module.Client()
        self._callbacks: dict[int, Callable[[tuple], None]] = {}
        self._tokens = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    def send(self, url: str, call: InferCall, timeout_s: float, done: Callable[[tuple], None]) -> None:
        """Start the batch; ``done`` gets (status code, message, whether the channel was ready, [(output name, raw
        bytes), ...]) when Triton answers, on this event loop."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.client.fd, self._take)
        token = next(self._tokens)
        parameters = {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v) for k, v in call.parameters}
        self.client.infer(token, url, call.model, call.version,
                          [(spec.name, spec.datatype, [call.rows, *spec.dims], rows) for spec, rows in call.inputs],
                          parameters, max(1, round(timeout_s * 1e6)))
        self._callbacks[token] = done

    async def infer(self, url: str, call: InferCall, timeout_s: float) -> tuple[int, str, bool, list]:
        """:meth:`send`, awaited."""
        future = asyncio.get_running_loop().create_future()
        self.send(url, call, timeout_s, lambda answer: future.done() or future.set_result(answer))
        return await future

    def _take(self) -> None:
        for token, *answer in self.client.take(TAKE_LIMIT):
            done = self._callbacks.pop(token, None)
            if done is None:
                continue
            try:
                done(answer)
            except Exception:  # a bug in one batch's handling: the other answers are still delivered
                log.exception("handling a batch's answer failed")

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.client.fd)
            self._loop = None


class NativeTritonWorker(TritonWorker):
    """:class:`TritonWorker` with its batches sent by :class:`NativeClient`."""

    def __init__(self, url: str, client: NativeClient) -> None:
        super().__init__(url)
        self.client = client

    def send(self, call: InferCall, timeout_s: float,
             done: Callable[[list[dict[str, bytes]] | WorkerError], None]) -> None:
        """Start a batch; ``done`` gets each query's output rows, or the worker's error (as :meth:`infer` would
        raise it). The driver's way in: no coroutine per batch."""
        self.client.send(self.url, call, timeout_s, lambda answer: done(self._result(call, answer)))

    async def infer(self, call: InferCall, timeout_s: float) -> list[dict[str, bytes]]:
        result = self._result(call, await self.client.infer(self.url, call, timeout_s))
        if isinstance(result, WorkerError):
            raise result
        return result

    def _result(self, call: InferCall, answer: tuple) -> list[dict[str, bytes]] | WorkerError:
        code, message, ready, outputs = answer
        if code:
            state = grpc.ChannelConnectivity.READY if ready else grpc.ChannelConnectivity.IDLE
            return status_error(self.url, CODES.get(code, grpc.StatusCode.UNKNOWN), message, BATCH_LOST, state)
        self.answered += 1
        try:
            return split_outputs(self.url, call, outputs)
        except WorkerError as exc:
            return exc
