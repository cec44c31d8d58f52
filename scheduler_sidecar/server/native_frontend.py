"""The front ends on the native edge (native/edge.cc, native/http_server.cc): the protocols in C++, the decisions here.

The edge owns the public gRPC and HTTP ports. It parses ``ModelInfer`` and ``ModelStreamInfer`` requests on gRPC's
threads, and HTTP inference requests on its HTTP thread, and queues them; the event loop watches the edge's eventfd
and, woken, takes what is queued in one call (a burst of requests costs one wake-up and one call into Python). Each
request is checked as the Python front ends check it (:func:`grpc_frontend.check`, and for HTTP
:func:`protocol.parse_request`, or :func:`http_frontend.read_body` for a body the edge passed whole) and queued for
the engine with no coroutine or future of its own (``LiveDriver.submit``): its answer comes back in a callback, and
its outputs go to the edge, which builds, serializes and writes the answer.
Every other gRPC method and HTTP route (health, metadata, config, ``/metrics``, admin) the edge passes to the Python
front ends, which listen on Unix sockets behind it: what those answer has one implementation. The batches go to
Triton from C++ as well (:mod:`scheduler_sidecar.live.native_worker`).

A request's time in the edge counts against its slack: the edge stamps its arrival on the sidecar's clock, and the
deadline it was given is kept from then.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Callable

from tritonclient.grpc import service_pb2 as pb

from scheduler_sidecar.errors import InternalError, RequestError
from scheduler_sidecar.live.driver import Answer, Request, now_us
from scheduler_sidecar.live.native_worker import NativeClient, NativeTritonWorker
from scheduler_sidecar.native import edge as native_edge
from scheduler_sidecar.server import grpc_frontend, http_frontend
from scheduler_sidecar.server.protocol import (
    InferRequest,
    ModelInfo,
    OutputIn,
    TensorIn,
    grpc_status,
    parse_request,
)
from scheduler_sidecar.server.service import MODEL_VERSION, Sidecar

log = logging.getLogger(__name__)

TAKE_LIMIT = 512  # requests per call into Python, at most (the rest are taken on the loop's next turn)
CANCELLED = 1  # an arrival's kind: its call ended before it was answered
HTTP = 2  # an arrival's kind: an HTTP inference request (else a gRPC one)


class NativeFrontend:
    """The native edge on ``host:port`` in front of the Python gRPC front end (see the module docstring)."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar
        self.edge = None
        self._python = None  # the Python gRPC front end behind the edge
        self._python_http = None  # and the Python HTTP front end
        self._serving: dict[int, Request] = {}  # the edge's request id -> the request in flight

    async def start(self, host: str, grpc_port: int, http_port: int) -> tuple[int, int]:
        """Start both ports; returns the ports bound (0 picks a free one)."""
        module = native_edge()
        # the Python front ends behind the edge listen on Unix sockets: a loopback port taken with port 0 could be
        # one another process was just handed as free (a Triton starting beside the sidecar saw this one answer it)
        self._socket_dir = tempfile.TemporaryDirectory(prefix="accscale-edge-")
        behind = f"unix:{self._socket_dir.name}/python.sock"
        behind_http = f"{self._socket_dir.name}/python-http.sock"
        self._python, _ = await grpc_frontend.start(self.sidecar, "127.0.0.1", 0, address=behind)
        self._python_http, _ = await http_frontend.start(self.sidecar, host, 0, path=behind_http)
        config = self.sidecar.config
        self.edge = module.Edge(f"{host}:{grpc_port}", behind, self.sidecar.limits.max_request_bytes, MODEL_VERSION,
                                http_host=host, http_port=http_port, http_forward_to=behind_http,
                                read_timeout_ms=round(config.read_timeout_s * 1e3),
                                idle_timeout_ms=round(config.idle_timeout_s * 1e3))
        asyncio.get_running_loop().add_reader(self.edge.fd, self._take)
        log.info("gRPC and HTTP on the native edge at %s:%d and %s:%d (other methods and routes through the Python "
                 "front ends at %s and %s)", host, self.edge.port, host, self.edge.http_port, behind, behind_http)
        return self.edge.port, self.edge.http_port

    async def stop(self, grace: float = 1.0) -> None:
        asyncio.get_running_loop().remove_reader(self.edge.fd)
        await asyncio.to_thread(self.edge.stop)
        for request in list(self._serving.values()):
            self.sidecar.withdraw(request)
        self._serving.clear()
        await self._python.stop(grace=grace)
        await self._python_http.cleanup()
        self._socket_dir.cleanup()

    def _take(self) -> None:
        """What the edge has queued, in one call: requests to serve and requests whose client left. Each request is
        checked and queued here, with no coroutine of its own; its answer goes to the edge from :meth:`_answer`."""
        with self.sidecar.driver.together():  # one decision for the burst
            for arrival in self.edge.take(TAKE_LIMIT, 0):
                self._take_one(arrival)

    def _take_one(self, arrival: tuple) -> None:
        rid = arrival[0]
        if arrival[1] == CANCELLED:  # the client left: what it asked is no longer served
            request = self._serving.pop(rid, None)
            if request is not None:
                self.sidecar.withdraw(request)
            return
        try:
            if arrival[1] == HTTP:
                self._serve_http(*arrival)
            else:
                self._serve(*arrival)
        except RequestError as exc:
            self._fail(rid, exc)
        except Exception as exc:  # a bug: still this request's answer
            log.exception("a request failed")
            self._fail(rid, InternalError(f"{type(exc).__name__}: {exc}"))

    def _serve(self, rid: int, _kind: int, model_name: str, version: str, _request_id: str, params: dict,
               inputs: list | None, outputs: list[str], remaining_us: int, arrival_us: int,
               whole: bytes | None) -> None:
        waited_us = max(0, now_us() - arrival_us)
        budget_us = None if remaining_us < 0 else remaining_us - waited_us
        if whole is not None:  # typed contents (or a malformed raw request): Python's parser reads it
            request = pb.ModelInferRequest.FromString(whole)
            read = lambda: grpc_frontend.inputs_of(request)  # noqa: E731
        else:
            read = lambda: [TensorIn(name, datatype, shape, raw=raw)  # noqa: E731
                            for name, datatype, shape, raw in inputs]
        model, checked = grpc_frontend.check(self.sidecar, model_name, version, params, read, outputs)
        submitted = self.sidecar.submit(checked, model, budget_us, waited_us,
                                        lambda answer, error: self._answer(rid, model, checked, answer, error))
        if not submitted.ended:  # refused on arrival, it has had its answer (within a burst, refusal comes later)
            self._serving[rid] = submitted

    def _serve_http(self, rid: int, _kind: int, model_name: str, version: str, request_id: str | None,
                    params: dict | None, inputs: list | None, outputs: list | None, arrival_us: int,
                    body: bytes | None, header_length: str | None) -> None:
        waited_us = max(0, now_us() - arrival_us)
        model = self.sidecar.model(model_name, version)
        if body is not None:  # not the binary fast path (JSON data, or a body the edge did not recognize)
            checked, request_id = http_frontend.read_body(model, body, header_length, self.sidecar.limits)
        else:
            checked = parse_request(model, params, [TensorIn(*tensor) for tensor in inputs],
                                    None if outputs is None else [OutputIn(*output) for output in outputs],
                                    self.sidecar.limits)
        submitted = self.sidecar.submit(
            checked, model, None, waited_us,
            lambda answer, error: self._answer_http(rid, model, checked, request_id, answer, error))
        if not submitted.ended:
            self._serving[rid] = submitted

    def _answer_http(self, rid: int, model: ModelInfo, checked: InferRequest, request_id: str | None,
                     answer: Answer | None, error: RequestError | None) -> None:
        """As :meth:`_answer`, for HTTP: values of JSON outputs cross as JSON text, bytes of binary ones as bytes."""
        self._serving.pop(rid, None)
        try:
            if error is not None:
                self._fail(rid, error)
                return
            outputs = [(o.name, o.datatype, o.shape, o.raw, None if o.data is None else json.dumps(o.data))
                       for o in http_frontend.reply_outputs(model, checked, answer)]
            self.edge.answer_http(rid, outputs, answer.parameters(), request_id)
        except Exception as exc:  # a bug: still this request's answer
            log.exception("a request failed")
            self._fail(rid, InternalError(f"{type(exc).__name__}: {exc}"))

    def _answer(self, rid: int, model: ModelInfo, checked: InferRequest, answer: Answer | None,
                error: RequestError | None) -> None:
        """A request's answer or error, to the edge. Called from the engine's events: it never raises."""
        self._serving.pop(rid, None)
        try:
            if error is not None:
                self._fail(rid, error)
                return
            outputs = grpc_frontend.outputs_of(model, checked, answer)
            self.edge.answer(rid, outputs.tensors, outputs.parameters)
        except Exception as exc:  # a bug (or an answer the edge could not take): still this request's answer
            log.exception("a request failed")
            self._fail(rid, InternalError(f"{type(exc).__name__}: {exc}"))

    def _fail(self, rid: int, exc: RequestError) -> None:
        try:
            self.edge.fail(rid, grpc_status(exc.code).value[0], exc.code.http, exc.message, type(exc).__name__)
        except Exception:  # the edge could not take the message: the call ends when its client's deadline does
            log.exception("failing request %d failed", rid)


def connect() -> Callable[[str], NativeTritonWorker]:
    """How the sidecar on the native edge reaches a worker: its batches through one C++ client for the process."""
    client = NativeClient(native_edge())
    return lambda url: NativeTritonWorker(url, client)


async def start(sidecar: Sidecar, host: str, grpc_port: int, http_port: int) -> tuple[NativeFrontend, int, int]:
    """Start the native edge; returns it and the gRPC and HTTP ports it bound (0 picks a free one)."""
    frontend = NativeFrontend(sidecar)
    return frontend, *await frontend.start(host, grpc_port, http_port)
