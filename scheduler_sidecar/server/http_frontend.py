"""The HTTP front end: KServe v2 REST with the binary-tensor extension, ``/metrics`` and admin routes.

Requests follow Triton's HTTP protocol: a JSON header, optionally followed by raw tensor
bytes whose JSON length is in ``Inference-Header-Content-Length``; inputs carry either
``data`` or ``parameters.binary_data_size``; outputs come back binary when the request asks
(``binary_data`` per output or ``binary_data_output``), JSON otherwise. Errors are
``{"error": "..."}`` with Triton's status codes.

Admin routes (off unless the sidecar has an admin token; ``Authorization: Bearer <token>``):
``POST /v2/admin/policy`` ``{"model", "policy", "options"?}`` switches a model's policy in
place; ``GET /v2/admin/workers`` lists workers; ``POST /v2/admin/workers`` ``{"url"}`` adds one;
``DELETE /v2/admin/workers`` ``{"url"}`` drains one (no new batch goes there, its running ones finish) and forgets
it: call it before stopping a Triton on purpose.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from aiohttp import web
from google.protobuf import json_format

from scheduler_sidecar.errors import InvalidRequest, RequestError
from scheduler_sidecar.live.driver import Answer
from scheduler_sidecar.server.protocol import (
    InferRequest,
    Limits,
    ModelInfo,
    OutputIn,
    TensorIn,
    from_row_bytes,
    parse_request,
    quote,
)
from scheduler_sidecar.server.service import MODEL_VERSION, Sidecar

log = logging.getLogger(__name__)

HEADER_LENGTH = "Inference-Header-Content-Length"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return _error(exc.code.http, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _error(exc.status, exc.text if exc.status == 413 else exc.reason)
        if exc.status in (408, 413):  # what is left of a stalled or oversized body is not waited for
            response.force_close()
        return response
    except Exception as exc:  # a bug: logged, and still a JSON answer
        log.exception("%s %s failed", request.method, request.path)
        return _error(500, f"internal error: {type(exc).__name__}")


def _message(proto) -> dict:
    return json_format.MessageToDict(proto, preserving_proto_field_name=True)


class Routes:
    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=self.sidecar.limits.max_request_bytes)
        r = app.router
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics)
        r.add_post("/v2/admin/policy", self.set_policy)
        r.add_get("/v2/admin/workers", self.list_workers)
        r.add_post("/v2/admin/workers", self.add_worker)
        r.add_delete("/v2/admin/workers", self.remove_worker)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(prefix, self.model_metadata)
            r.add_get(prefix + "/ready", self.model_ready)
            r.add_get(prefix + "/config", self.model_config)
            r.add_post(prefix + "/infer", self.infer)
        return app

    # the health answers say it in the status, as Triton's do, and in a JSON body, which the KServe SDK parses
    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        ready = self.sidecar.ready()
        return web.json_response({"ready": ready}, status=200 if ready else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(_message(self.sidecar.server_metadata()))

    async def model_metadata(self, request: web.Request) -> web.Response:
        name, version = request.match_info["model"], request.match_info.get("version", "")
        return web.json_response(_message(self.sidecar.model_metadata(name, version)))

    async def model_ready(self, request: web.Request) -> web.Response:
        ok = self.sidecar.model_ready(request.match_info["model"]) and \
            request.match_info.get("version", "") in ("", MODEL_VERSION)
        return web.json_response({"ready": ok}, status=200 if ok else 400)

    async def model_config(self, request: web.Request) -> web.Response:
        name, version = request.match_info["model"], request.match_info.get("version", "")
        return web.json_response(_message(self.sidecar.model_config(name, version)))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.sidecar.metrics.render(), headers={"Content-Type": self.sidecar.metrics.content_type})

    # ---------------------------------------------------------------- inference
    async def infer(self, request: web.Request) -> web.Response:
        model = self.sidecar.model(request.match_info["model"], request.match_info.get("version", ""))
        body = await self._read(request)
        checked, request_id = read_body(model, body, request.headers.get(HEADER_LENGTH), self.sidecar.limits)
        answer = await self.sidecar.infer(checked, model)
        reply: dict[str, Any] = {"model_name": model.name, "model_version": MODEL_VERSION,
                                 "parameters": answer.parameters(), "outputs": []}
        if request_id is not None:
            reply["id"] = request_id
        binary = []
        for out in reply_outputs(model, checked, answer):
            entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.shape}
            if out.raw is not None:
                entry["parameters"] = {"binary_data_size": len(out.raw)}
                binary.append(out.raw)
            else:
                entry["data"] = out.data
            reply["outputs"].append(entry)
        text = json.dumps(reply).encode()
        if not binary:
            return web.Response(body=text, content_type="application/json")
        return web.Response(body=b"".join([text, *binary]), content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(len(text))})

    # ---------------------------------------------------------------- admin
    async def _read(self, request: web.Request) -> bytes:
        """The request's body, which must arrive within ``read_timeout_s`` (a client that stalls is cut off)."""
        limit = self.sidecar.limits.max_request_bytes
        if request.content_length is not None and request.content_length > limit:  # refused before it is read
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        timeout_s = self.sidecar.config.read_timeout_s
        try:
            async with asyncio.timeout(timeout_s):  # a timer on this task, not a task of its own as wait_for's
                return await request.read()
        except TimeoutError:
            raise web.HTTPRequestTimeout(reason=f"the request body did not arrive within {timeout_s:g} s") from None

    async def _admin_body(self, request: web.Request) -> dict:
        auth = request.headers.get("Authorization", "")
        self.sidecar.check_admin(auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None)
        body = _json(await self._read(request), "body")
        if not isinstance(body, dict):
            raise InvalidRequest("body must be a JSON object")
        return body

    async def set_policy(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        if not isinstance(body.get("model"), str) or not isinstance(body.get("policy"), str):
            raise InvalidRequest('body must be {"model": ..., "policy": ..., "options"?: {...}}')
        return web.json_response(await self.sidecar.set_policy(body["model"], body["policy"], body.get("options")))

    async def list_workers(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.sidecar.check_admin(auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None)
        return web.json_response({"workers": self.sidecar.workers()})

    async def add_worker(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        if not isinstance(body.get("url"), str):
            raise InvalidRequest('body must be {"url": "host:grpc_port"}')
        return web.json_response(await self.sidecar.add_worker(body["url"]))

    async def remove_worker(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        if not isinstance(body.get("url"), str):
            raise InvalidRequest('body must be {"url": "host:grpc_port"}')
        return web.json_response(await self.sidecar.remove_worker(body["url"]))


class OutputOut(NamedTuple):
    """One output of an answer as HTTP returns it: its bytes for the binary tail, or its values for JSON."""

    name: str
    datatype: str
    shape: list[int]
    raw: bytes | None
    data: list | None


def reply_outputs(model: ModelInfo, checked: InferRequest, answer: Answer) -> list[OutputOut]:
    """The outputs a request asked for, each binary or JSON as it asked (both edges answer with this)."""
    outputs = []
    for name, as_binary in checked.outputs:
        spec = model.outputs[name]
        raw = answer.outputs[name]
        outputs.append(OutputOut(name, spec.datatype, [checked.count, *spec.dims], raw if as_binary else None,
                                 None if as_binary else from_row_bytes(spec, raw)))
    return outputs


def read_body(model: ModelInfo, body: bytes, header_length: str | None, limits: Limits,
              ) -> tuple[InferRequest, str | None]:
    """An inference request's body (its JSON header and binary tail), checked: the request and its id."""
    header, tail = _split_body(body, header_length)
    params = header.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidRequest("'parameters' must be an object")
    checked = parse_request(model, params, _inputs(header.get("inputs"), tail), _outputs(header.get("outputs")), limits)
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"'id' must be a string, got {quote(request_id)}")
    return checked, request_id


def _json(text: bytes, what: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{what} is not JSON: {exc}") from None
    except RecursionError:  # the parser recurses once per nesting level
        raise InvalidRequest(f"{what} is nested too deeply") from None


def _split_body(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    if header_length is None:
        json_bytes, tail = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidRequest(f"{HEADER_LENGTH} is not an integer") from None
        if not 0 < n <= len(body):
            raise InvalidRequest(f"{HEADER_LENGTH} {n} is outside the body "
                                 f"({len(body)} bytes); raw-binary requests without a JSON header are not supported")
        json_bytes, tail = body[:n], body[n:]
    header = _json(json_bytes, "request header")
    if not isinstance(header, dict):
        raise InvalidRequest("request header must be a JSON object")
    return header, tail


def _inputs(inputs: object, tail: bytes) -> list[TensorIn]:
    """Each input with its slice of the binary tail (``binary_data_size``) or its JSON ``data``."""
    if not isinstance(inputs, list):
        raise InvalidRequest("'inputs' must be a list")
    out, offset = [], 0
    for tensor in inputs:
        if not isinstance(tensor, dict):
            raise InvalidRequest(f"each input must be an object, got {quote(tensor)}")
        params = _parameters(tensor, f"input {quote(tensor.get('name'))}")
        size = params.get("binary_data_size")
        if size is None:
            out.append(TensorIn(tensor.get("name"), tensor.get("datatype"), tensor.get("shape"),
                                values=tensor.get("data")))
            continue
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= len(tail) - offset:
            raise InvalidRequest(f"input {quote(tensor.get('name'))}: binary_data_size {quote(size)} does not fit "
                                 f"the {len(tail) - offset} bytes left in the body")
        out.append(TensorIn(tensor.get("name"), tensor.get("datatype"), tensor.get("shape"),
                            raw=tail[offset:offset + size]))
        offset += size
    if offset != len(tail):
        raise InvalidRequest(f"{len(tail) - offset} bytes of binary data belong to no input")
    return out


def _outputs(outputs: object) -> list[OutputIn] | None:
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise InvalidRequest("'outputs' must be a list of objects")
    return [OutputIn(o.get("name"), _parameters(o, f"output {quote(o.get('name'))}").get("binary_data"))
            for o in outputs]


def _parameters(tensor: dict, what: str) -> dict:
    params = tensor.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidRequest(f"{what}: 'parameters' must be an object, got {quote(params)}")
    return params


async def start(sidecar: Sidecar, host: str, port: int, path: str | None = None) -> tuple[web.AppRunner, int]:
    """Start the HTTP server; returns its runner and the port it bound (``port`` 0 picks a free one). With ``path``
    it listens on that Unix socket instead (behind the native edge), and the port returned is 0."""
    # handler_cancellation: a client that disconnects cancels its handler, which frees its queue entry
    # keepalive_timeout also closes a connection whose request headers never finish (aiohttp arms it on
    # connect); lingering_time bounds how long the rest of a refused or stalled body is drained
    runner = web.AppRunner(Routes(sidecar).app(), handler_cancellation=True, access_log=None,
                           keepalive_timeout=sidecar.config.idle_timeout_s,
                           lingering_time=sidecar.config.read_timeout_s)
    await runner.setup()
    if path is not None:
        await web.UnixSite(runner, path).start()
        return runner, 0
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]
