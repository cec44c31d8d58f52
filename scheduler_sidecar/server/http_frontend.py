"""The HTTP front end: KServe v2 REST with the binary-tensor extension, ``/metrics`` and admin routes.

Requests follow Triton's HTTP protocol: a JSON header, optionally followed by raw tensor
bytes whose JSON length is in ``Inference-Header-Content-Length``; inputs carry either
``data`` or ``parameters.binary_data_size``; outputs come back binary when the request asks
(``binary_data`` per output or ``binary_data_output``), JSON otherwise. Errors are
``{"error": "..."}`` with Triton's status codes.

Admin routes (off unless the sidecar has an admin token; ``Authorization: Bearer <token>``):
``POST /v2/admin/policy`` ``{"model", "policy", "options"?}`` switches a model's policy in
place; ``GET /v2/admin/workers`` lists workers; ``POST /v2/admin/workers`` ``{"url"}`` adds one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from google.protobuf import json_format

from scheduler_sidecar.errors import InvalidRequest, RequestError
from scheduler_sidecar.server.protocol import from_row_bytes, parse_slo_us, to_row_bytes
from scheduler_sidecar.server.service import MODEL_VERSION, ModelInfo, Sidecar

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
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise


def _message(proto) -> dict:
    return json_format.MessageToDict(proto, preserving_proto_field_name=True)


class Routes:
    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=1 << 30)
        r = app.router
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics)
        r.add_post("/v2/admin/policy", self.set_policy)
        r.add_get("/v2/admin/workers", self.list_workers)
        r.add_post("/v2/admin/workers", self.add_worker)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(prefix, self.model_metadata)
            r.add_get(prefix + "/ready", self.model_ready)
            r.add_get(prefix + "/config", self.model_config)
            r.add_post(prefix + "/infer", self.infer)
        return app

    async def live(self, request: web.Request) -> web.Response:
        return web.Response()

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.sidecar.ready() else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(_message(self.sidecar.server_metadata()))

    async def model_metadata(self, request: web.Request) -> web.Response:
        name, version = request.match_info["model"], request.match_info.get("version", "")
        return web.json_response(_message(self.sidecar.model_metadata(name, version)))

    async def model_ready(self, request: web.Request) -> web.Response:
        ok = self.sidecar.model_ready(request.match_info["model"]) and \
            request.match_info.get("version", "") in ("", MODEL_VERSION)
        return web.Response(status=200 if ok else 400)

    async def model_config(self, request: web.Request) -> web.Response:
        name, version = request.match_info["model"], request.match_info.get("version", "")
        return web.json_response(_message(self.sidecar.model_config(name, version)))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.sidecar.metrics.render(), headers={"Content-Type": self.sidecar.metrics.content_type})

    # ---------------------------------------------------------------- inference
    async def infer(self, request: web.Request) -> web.Response:
        model = self.sidecar.model(request.match_info["model"], request.match_info.get("version", ""))
        body = await request.read()
        header, tail = _split_body(body, request.headers.get(HEADER_LENGTH))
        params = header.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidRequest("'parameters' must be an object")
        slo_us = parse_slo_us(params, model.default_slo_us)
        rows = model.row_inputs(_rows(model, header.get("inputs"), tail))
        outputs = _requested_outputs(model, header.get("outputs"), bool(params.get("binary_data_output", False)))
        answer = await self.sidecar.infer(model.name, rows, slo_us)
        reply: dict[str, Any] = {"model_name": model.name, "model_version": MODEL_VERSION,
                                 "parameters": answer.parameters(), "outputs": []}
        if "id" in header:
            reply["id"] = header["id"]
        binary = []
        for name, as_binary in outputs:
            spec = model.outputs[name]
            out: dict[str, Any] = {"name": name, "datatype": spec.datatype, "shape": [1, *spec.dims]}
            if as_binary:
                out["parameters"] = {"binary_data_size": len(answer.outputs[name])}
                binary.append(answer.outputs[name])
            else:
                out["data"] = from_row_bytes(spec, answer.outputs[name])
            reply["outputs"].append(out)
        text = json.dumps(reply).encode()
        if not binary:
            return web.Response(body=text, content_type="application/json")
        return web.Response(body=b"".join([text, *binary]), content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(len(text))})

    # ---------------------------------------------------------------- admin
    async def _admin_body(self, request: web.Request) -> dict:
        auth = request.headers.get("Authorization", "")
        self.sidecar.check_admin(auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None)
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("body must be a JSON object")
        return body

    async def set_policy(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        if not isinstance(body.get("model"), str) or not isinstance(body.get("policy"), str):
            raise InvalidRequest('body must be {"model": ..., "policy": ..., "options"?: {...}}')
        return web.json_response(self.sidecar.set_policy(body["model"], body["policy"], body.get("options")))

    async def list_workers(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.sidecar.check_admin(auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None)
        return web.json_response({"workers": self.sidecar.workers()})

    async def add_worker(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        if not isinstance(body.get("url"), str):
            raise InvalidRequest('body must be {"url": "host:grpc_port"}')
        return web.json_response(await self.sidecar.add_worker(body["url"]))


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
    try:
        header = json.loads(json_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"request header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise InvalidRequest("request header must be a JSON object")
    return header, tail


def _rows(model: ModelInfo, inputs: object, tail: bytes):
    if not isinstance(inputs, list):
        raise InvalidRequest("'inputs' must be a list")
    offset = 0
    for tensor in inputs:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise InvalidRequest("each input needs a 'name'")
        spec = model.inputs.get(tensor["name"])
        if spec is None:
            yield tensor["name"], b""  # row_inputs names the unexpected input
            continue
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise InvalidRequest(f"input '{spec.name}': 'shape' must be a list of integers")
        spec.check(tensor.get("datatype"), tuple(shape))
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(tail):
                raise InvalidRequest(f"input '{spec.name}': binary_data_size {size!r} does not "
                                   f"fit the {len(tail) - offset} bytes left in the body")
            data, offset = tail[offset:offset + size], offset + size
        elif "data" in tensor:
            data = to_row_bytes(spec, tensor["data"])
        else:
            raise InvalidRequest(f"input '{spec.name}' has neither 'data' nor binary_data_size")
        spec.check(tensor["datatype"], tuple(shape), len(data))
        yield spec.name, data
    if offset != len(tail):
        raise InvalidRequest(f"{len(tail) - offset} bytes of binary data belong to no input")


def _requested_outputs(model: ModelInfo, outputs: object, binary_default: bool) -> list[tuple[str, bool]]:
    if outputs is None:
        return [(name, binary_default) for name in model.outputs]
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs):
        raise InvalidRequest("'outputs' must be a list of objects with a 'name'")
    wanted = []
    for o in outputs:
        if o["name"] not in model.outputs:
            raise InvalidRequest(f"unknown output '{o['name']}'; outputs are {list(model.outputs)}")
        wanted.append((o["name"], bool((o.get("parameters") or {}).get("binary_data", binary_default))))
    return wanted


async def start(sidecar: Sidecar, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start the HTTP server; returns its runner and the port it bound (``port`` 0 picks a free one)."""
    # handler_cancellation: a client that disconnects cancels its handler, which frees its queue entry
    runner = web.AppRunner(Routes(sidecar).app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]
