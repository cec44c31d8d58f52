"""The gRPC front end: ``inference.GRPCInferenceService`` as tritonclient and perf_analyzer call it.

Health, server/model metadata, model config, ``ModelInfer`` and ``ModelStreamInfer`` are served;
the methods the sidecar does not offer (repository control, shared memory, statistics) answer
UNIMPLEMENTED, as the server metadata's extension list says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from scheduler_sidecar.errors import InternalError, InvalidRequest, RequestError
from scheduler_sidecar.live.driver import Answer
from scheduler_sidecar.server.protocol import (
    CONTENTS_FIELD,
    InferRequest,
    Limits,
    ModelInfo,
    OutputIn,
    TensorIn,
    grpc_status,
    parse_request,
    quote,
)
from scheduler_sidecar.server.service import MODEL_VERSION, Sidecar

log = logging.getLogger(__name__)


# every error the sidecar answers carries this trailing metadata key (its value: the error's class), so that a client
# tells the sidecar's answers from failures of the connection by a field rather than by the message's words
ERROR_METADATA = "accscale-error"


async def _abort(context, exc: RequestError) -> None:
    await context.abort(grpc_status(exc.code), exc.message, trailing_metadata=((ERROR_METADATA, type(exc).__name__),))


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.sidecar.ready())

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=self.sidecar.model_ready(request.name)
                                     and request.version in ("", MODEL_VERSION))

    async def ServerMetadata(self, request, context):
        return self.sidecar.server_metadata()

    async def ModelMetadata(self, request, context):
        try:
            return self.sidecar.model_metadata(request.name, request.version)
        except RequestError as exc:
            await _abort(context, exc)

    async def ModelConfig(self, request, context):
        try:
            return pb.ModelConfigResponse(config=self.sidecar.model_config(request.name, request.version))
        except RequestError as exc:
            await _abort(context, exc)

    async def ModelInfer(self, request, context):
        try:
            return await self._infer(_decoded(request), context.time_remaining())
        except RequestError as exc:
            await _abort(context, exc)
        except Exception as exc:  # a bug: still this request's answer, and marked as the sidecar's
            log.exception("a request failed")
            await _abort(context, InternalError(f"{type(exc).__name__}: {exc}"))

    async def ModelStreamInfer(self, request_iterator, context):
        """Triton's bidirectional stream: each request is served as it arrives and answered when it ends, so
        answers may come in another order than the requests (each carries its request's id). A request that
        fails gets its error on the stream (``error_message``, with the request's id), which stays open."""
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        serving: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()

        async def serve(request: pb.ModelInferRequest) -> None:
            try:
                answer = pb.ModelStreamInferResponse(infer_response=await self._infer(_decoded(request), None))
            except Exception as exc:  # a RequestError, or a bug: either way this request's answer, on the stream
                if not isinstance(exc, RequestError):
                    log.exception("a streamed request failed")
                message = exc.message if isinstance(exc, RequestError) else f"internal error: {type(exc).__name__}"
                named = request if isinstance(request, pb.ModelInferRequest) else pb.ModelInferRequest()
                answer = pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(
                    model_name=named.model_name, model_version=named.model_version, id=named.id))
            answers.put_nowait(answer)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    task = loop.create_task(serve(request))
                    serving.add(task)
                    task.add_done_callback(serving.discard)
                while serving:  # the client has sent its last request: answer what is still being served
                    await asyncio.gather(*serving)
            finally:
                answers.put_nowait(None)

        reader = loop.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
        finally:  # the stream ended or the client left: nothing it sent is served on
            for task in (reader, *serving):
                task.cancel()

    async def _infer(self, request: pb.ModelInferRequest, remaining_s: float | None) -> pb.ModelInferResponse:
        params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in request.parameters.items()
                  if v.WhichOneof("parameter_choice")}
        outputs = await serve(self.sidecar, request.model_name, request.model_version, params, lambda: inputs_of(request),
                              [o.name for o in request.outputs],
                              None if remaining_s is None else int(remaining_s * 1e6))
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=MODEL_VERSION, id=request.id)
        for key, value in outputs.parameters.items():
            field = {str: "string_param", int: "int64_param", float: "double_param"}[type(value)]
            setattr(response.parameters[key], field, value)
        for name, datatype, shape, raw in outputs.tensors:
            response.outputs.add(name=name, datatype=datatype, shape=shape)
            response.raw_output_contents.append(raw)
        return response


class Outputs(NamedTuple):
    """One request's answer, as both edges write it: its parameters and, per output, name, datatype, shape and
    raw bytes."""

    parameters: dict[str, object]
    tensors: list[tuple[str, str, list[int], bytes]]


def check(sidecar: Sidecar, model_name: str, version: str, params: dict, inputs: Callable[[], list[TensorIn]],
          outputs: list[str]) -> tuple[ModelInfo, InferRequest]:
    """A ModelInfer request's model and the request checked against it: what both edges do first. ``inputs`` is
    called once the model is known (an unknown model's error comes first)."""
    model = sidecar.model(model_name, version)
    return model, parse_request(model, params, inputs(), [OutputIn(name) for name in outputs], sidecar.limits)


def outputs_of(model: ModelInfo, checked: InferRequest, answer: Answer) -> Outputs:
    """A served request's answer as both edges write it."""
    return Outputs(answer.parameters(), [(name, model.outputs[name].datatype,
                                          [checked.count, *model.outputs[name].dims], answer.outputs[name])
                                         for name, _ in checked.outputs])


async def serve(sidecar: Sidecar, model_name: str, version: str, params: dict, inputs: Callable[[], list[TensorIn]],
                outputs: list[str], budget_us: int | None, waited_us: int | None = None) -> Outputs:
    """A ModelInfer request, checked and served (see :func:`check`); ``waited_us`` is how long the request waited
    before it got here, where the edge measured it."""
    model, checked = check(sidecar, model_name, version, params, inputs, outputs)
    return outputs_of(model, checked, await sidecar.infer(checked, model, budget_us, waited_us))


class Undecodable(NamedTuple):
    """A request body that is not a ModelInferRequest: what the lenient parser hands the handler, which refuses it
    as the client's error (gRPC's own parser would answer UNKNOWN, as if the server had failed)."""

    error: str


def _lenient(data: bytes) -> pb.ModelInferRequest | Undecodable:
    try:
        return pb.ModelInferRequest.FromString(data)
    except DecodeError as exc:
        return Undecodable(str(exc))


def _decoded(request: pb.ModelInferRequest | Undecodable) -> pb.ModelInferRequest:
    if isinstance(request, Undecodable):
        raise InvalidRequest(f"the request is not a ModelInferRequest: {request.error}")
    return request


def inputs_of(request: pb.ModelInferRequest) -> list[TensorIn]:
    """Each input with its raw bytes, or its typed contents when the client sent no raw_input_contents."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    inputs = []
    for i, tensor in enumerate(request.inputs):
        if raw:
            inputs.append(TensorIn(tensor.name, tensor.datatype, list(tensor.shape), raw=raw[i]))
            continue
        field = CONTENTS_FIELD.get(tensor.datatype)
        if field is None:
            raise InvalidRequest(f"input {quote(tensor.name)}: {quote(tensor.datatype)} data must be sent in "
                                 "raw_input_contents")
        inputs.append(TensorIn(tensor.name, tensor.datatype, list(tensor.shape), values=getattr(tensor.contents, field)))
    return inputs


def server_options(limits: Limits) -> list[tuple[str, int]]:
    """The sidecar's gRPC server: messages above the request limit are refused (RESOURCE_EXHAUSTED) unread."""
    return [("grpc.max_receive_message_length", limits.max_request_bytes), ("grpc.max_send_message_length", -1)]


async def start(sidecar: Sidecar, host: str, port: int, address: str | None = None) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server; returns it and the port it bound (``port`` 0 picks a free one). ``address``, where
    given, is bound instead of ``host:port`` (``unix:PATH``: a socket no other process's port can collide with)."""
    server = grpc.aio.server(options=server_options(sidecar.limits))
    servicer = Servicer(sidecar)
    # the two inference methods first, with a parser that marks a body it cannot read instead of failing the call
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            servicer.ModelInfer, request_deserializer=_lenient,
            response_serializer=pb.ModelInferResponse.SerializeToString),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            servicer.ModelStreamInfer, request_deserializer=_lenient,
            response_serializer=pb.ModelStreamInferResponse.SerializeToString)}),))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    bound = server.add_insecure_port(address or f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC port {host}:{port}")
    await server.start()
    return server, bound
