"""The least a Python gRPC front end like the sidecar's costs per request: ``bench sidecar --floor``'s server.

``python -m scheduler_sidecar.experiments.grpc_floor --port P --triton URL --mode echo|proxy`` serves
KServe v2 over ``grpc.aio``, as the sidecar does, with nothing else on the path:

- ``echo``: every ``ModelInfer`` is parsed and answered with the response Triton gave to the first
  one (the server's own cost: gRPC, protobuf, asyncio);
- ``proxy``: every ``ModelInfer`` is passed to Triton as it came, one call per request, and its
  answer passed back (the server's cost plus one Triton call per request, the sidecar's path
  without the engine, batching, checks or metrics).
- ``edge``: ``proxy`` on the sidecar's native edge (native/edge.cc): its C++ server takes the requests
  and its C++ client calls Triton, and Python only passes each request from one to the other and
  each answer back, woken by their eventfds, as the sidecar's event loop is. What a sidecar on the
  native edge costs before its engine, policy and checks do anything. For the bench's model only:
  raw FP32 inputs, and answers of 10 FP32 logits a row; anything else gets an error.

Metadata, config, statistics and health calls are passed to Triton. The bench measures this
process's CPU per request as it measures the sidecar's: what the sidecar cannot go below on this
runtime.
"""

from __future__ import annotations

import argparse
import asyncio

import grpc
from tritonclient.grpc import service_pb2_grpc

from scheduler_sidecar.live.workers import CHANNEL_OPTIONS


class Floor(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, triton: str, mode: str) -> None:
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.aio.insecure_channel(triton,
                                                                                         options=CHANNEL_OPTIONS))
        self.mode = mode
        self.canned = None
        self.answered = 0

    async def ServerLive(self, request, context):
        return await self.stub.ServerLive(request)

    async def ServerReady(self, request, context):
        return await self.stub.ServerReady(request)

    async def ServerMetadata(self, request, context):
        """Triton's, less the statistics extension, as the sidecar's, so that perf_analyzer asks for no
        statistics (in echo mode Triton's would not count the requests served)."""
        metadata = await self.stub.ServerMetadata(request)
        kept = [e for e in metadata.extensions if e != "statistics"]
        del metadata.extensions[:]
        metadata.extensions.extend(kept)
        return metadata

    async def ModelStatistics(self, request, context):
        """Triton's; in echo mode the inference count is the requests this server answered itself (the bench
        divides CPU by it)."""
        stats = await self.stub.ModelStatistics(request)
        if self.mode == "echo":
            for model in stats.model_stats:
                model.inference_count = self.answered
        return stats

    async def ModelReady(self, request, context):
        return await self.stub.ModelReady(request)

    async def ModelMetadata(self, request, context):
        return await self.stub.ModelMetadata(request)

    async def ModelConfig(self, request, context):
        return await self.stub.ModelConfig(request)

    async def ModelInfer(self, request, context):
        self.answered += 1
        if self.mode == "proxy" or self.canned is None:
            response = await self.stub.ModelInfer(request)
            self.canned = self.canned or response
            return response
        return self.canned


LOGITS, ROW_BYTES = 10, 40  # the bench's trivial model answers 10 FP32 logits a row


async def serve_edge(port: int, triton: str) -> None:
    """The ``edge`` mode: the edge's other calls (metadata, statistics) go straight to Triton."""
    from scheduler_sidecar.native import edge as native_edge  # lazy: the native edge is built on first use

    module = native_edge()
    edge = module.Edge(f"127.0.0.1:{port}", triton, 1 << 30, "1")
    client = module.Client()
    asking: dict[int, int] = {}  # the client's token -> the edge's request id
    tokens = iter(range(1 << 62))

    def take() -> None:
        for arrival in edge.take(512, 0):
            rid, kind = arrival[0], arrival[1]
            if kind == 1:  # a cancellation: its answer, when it comes, goes nowhere
                continue
            if kind != 0 or arrival[6] is None:  # HTTP, or typed contents: not this floor's
                edge.fail(rid, grpc.StatusCode.UNIMPLEMENTED.value[0], 501, "raw gRPC inputs only", "RequestError")
                continue
            _, _, model, version, _, _, inputs, _, _, _, _ = arrival
            token = next(tokens)
            asking[token] = rid
            client.infer(token, triton, model, version, [(n, d, s, [raw]) for n, d, s, raw in inputs], {}, 10**7)

    def answered() -> None:
        for token, code, message, _, outputs in client.take(512):
            rid = asking.pop(token)
            if not code and any(len(raw) % ROW_BYTES for _, raw in outputs):
                code, message = grpc.StatusCode.INTERNAL.value[0], f"not {LOGITS} FP32 logits a row"
            if code:
                edge.fail(rid, code, 500, message, "WorkerError")
            else:  # the trivial model's logits, the one output the bench's model has
                edge.answer(rid, [(name, "FP32", [len(raw) // ROW_BYTES, LOGITS], raw) for name, raw in outputs], {})

    loop = asyncio.get_running_loop()
    loop.add_reader(edge.fd, take)
    loop.add_reader(client.fd, answered)
    print("listening", flush=True)
    await asyncio.Event().wait()


async def serve(port: int, triton: str, mode: str) -> None:
    if mode == "edge":
        await serve_edge(port, triton)
        return
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Floor(triton, mode), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("listening", flush=True)  # what the bench waits for, from every process sharing the port
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--triton", required=True, help="Triton's gRPC host:port")
    parser.add_argument("--mode", choices=("echo", "proxy", "edge"), required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.triton, args.mode))


if __name__ == "__main__":
    main()
