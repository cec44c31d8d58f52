"""The gRPC front end: ``inference.GRPCInferenceService`` as tritonclient and perf_analyzer call it.

Health, server/model metadata, model config and ``ModelInfer`` are served; the methods the
sidecar does not offer (repository control, shared memory, statistics, streaming) answer
UNIMPLEMENTED, as the server metadata's extension list says.
"""

from __future__ import annotations

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from scheduler_sidecar.errors import InvalidRequest, RequestError
from scheduler_sidecar.live.workers import CHANNEL_OPTIONS
from scheduler_sidecar.server.protocol import CONTENTS_FIELD, grpc_status, parse_slo_us, to_row_bytes
from scheduler_sidecar.server.service import MODEL_VERSION, ModelInfo, Sidecar


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
            await context.abort(grpc_status(exc.code), exc.message)

    async def ModelConfig(self, request, context):
        try:
            return pb.ModelConfigResponse(config=self.sidecar.model_config(request.name, request.version))
        except RequestError as exc:
            await context.abort(grpc_status(exc.code), exc.message)

    async def ModelInfer(self, request, context):
        try:
            model = self.sidecar.model(request.model_name, request.model_version)
            params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in request.parameters.items()
                      if v.WhichOneof("parameter_choice")}
            slo_us = parse_slo_us(params, model.default_slo_us)
            rows = model.row_inputs(_rows(model, request))
            wanted = [o.name for o in request.outputs] or list(model.outputs)
            unknown = sorted(set(wanted) - set(model.outputs))
            if unknown:
                raise InvalidRequest(f"unknown outputs {unknown}; outputs are {list(model.outputs)}")
            remaining = context.time_remaining()
            answer = await self.sidecar.infer(model.name, rows, slo_us,
                                              None if remaining is None else int(remaining * 1e6))
        except RequestError as exc:
            await context.abort(grpc_status(exc.code), exc.message)
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=MODEL_VERSION, id=request.id)
        for key, value in answer.parameters().items():
            field = {str: "string_param", int: "int64_param", float: "double_param"}[type(value)]
            setattr(response.parameters[key], field, value)
        for name in wanted:
            spec = model.outputs[name]
            response.outputs.add(name=name, datatype=spec.datatype, shape=[1, *spec.dims])
            response.raw_output_contents.append(answer.outputs[name])
        return response


def _rows(model: ModelInfo, request: pb.ModelInferRequest):
    """(input name, one row's raw bytes) for each input, checked against the model's tensors."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    for i, tensor in enumerate(request.inputs):
        spec = model.inputs.get(tensor.name)
        if spec is None:
            yield tensor.name, b""  # row_inputs names the unexpected input
            continue
        spec.check(tensor.datatype, tuple(tensor.shape))
        if raw:
            data = raw[i]
        else:
            field = CONTENTS_FIELD.get(spec.datatype)
            if field is None:
                raise InvalidRequest(f"input '{spec.name}': {spec.datatype} data must be "
                                   "sent in raw_input_contents")
            data = to_row_bytes(spec, getattr(tensor.contents, field))
        spec.check(tensor.datatype, tuple(tensor.shape), len(data))
        yield tensor.name, data


async def start(sidecar: Sidecar, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server; returns it and the port it bound (``port`` 0 picks a free one)."""
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(sidecar), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC port {host}:{port}")
    await server.start()
    return server, bound
