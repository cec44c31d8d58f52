"""The live driver's only way out: a :class:`Worker` (one Triton endpoint), its Triton implementation and a fake.

A worker runs a batch of rows on a named model, loads and unloads models (Triton's model-control
API; the launcher starts Triton in explicit mode), says whether it is ready and describes a
model's tensors. Errors come back as the project's own: :class:`WorkerLost` when the endpoint is
gone (the batch may be retried elsewhere), :class:`WorkerFailed` when it answered an error.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from scheduler_sidecar.errors import (
    Code,
    WorkerError,
    WorkerFailed,
    WorkerLost,
    WorkerRefused,
    WorkerTimeout,
    WorkerUnreachable,
)
from scheduler_sidecar.live.tensors import DTYPES, TensorSpec

CHANNEL_OPTIONS = [
    # tritonclient sends up to 2 GiB; the default 4 MiB limit would fail large batches
    ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
    # a worker that restarts is reached again within about a second: gRPC's default reconnect backoff
    # grows to 120 s, and a Triton back after a 90 s outage was seen only 26 s later
    ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# worker errors that mean the worker is gone (its batch is retried elsewhere); others are relayed
LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN)
# a batch's too: NOT_FOUND. The sidecar sends a batch only to a worker that has the model loaded, so the model went
# away under it: a Triton that is stopping unloads every model before it exits (seen with `docker stop` under
# load). Retried elsewhere; the worker is down until a health check finds the model ready again
BATCH_LOST = (*LOST, grpc.StatusCode.NOT_FOUND)
MODEL_CONTROL_TIMEOUT_S = 120.0  # a model load may compile or read large weights
# what set_instances did: reloaded the model with the count, found it already so, or recorded the count for the
# model's next load (it is not loaded)
Scaled = Literal["reloaded", "unchanged", "deferred"]
# the config parameter that set_instances sets to the count on a model without a batcher of Triton's, so that Triton
# loads it anew rather than in place (see there); backends ignore a parameter they do not know
INSTANCES_PARAMETER = "accscale_instances"


@dataclass(frozen=True)
class InferCall:
    """One batch for a worker: each input's rows (raw bytes, one per query) and the outputs to split back."""

    model: str
    version: str  # "" for the latest
    inputs: tuple[tuple[TensorSpec, tuple[bytes, ...]], ...]
    outputs: tuple[TensorSpec, ...]
    parameters: tuple[tuple[str, object], ...] = ()  # the dispatch's per-batch settings, as request parameters

    @property
    def rows(self) -> int:
        return len(self.inputs[0][1])


@dataclass(frozen=True)
class ModelDescription:
    """What the sidecar needs of a Triton model: its tensors (no batch dimension) and its instances."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    instances: int


class Health(enum.Enum):
    """What one health check of a worker found."""

    READY = "ready"
    NOT_READY = "not ready"  # the server answered: it, or a model the sidecar needs, is not ready
    UNREACHABLE = "unreachable"  # no connection: the server is gone
    # the check timed out: a dead server, or a busy one (or a busy sidecar) that answers late; inconclusive
    NO_ANSWER = "no answer"


class Worker(Protocol):
    url: str
    answered: int  # RPCs the worker has answered successfully: a batch served is a sign of life too

    async def infer(self, call: InferCall, timeout_s: float) -> list[dict[str, bytes]]:
        """The output rows of each query (output name -> raw bytes); raises WorkerLost or WorkerFailed."""

    async def load(self, model: str) -> None: ...

    async def unload(self, model: str) -> None: ...

    async def set_instances(self, model: str, instances: int) -> Scaled: ...

    async def ready(self, models: Iterable[str], timeout_s: float) -> Health:
        """Whether the server and every named model are ready (with none named: whether the server is live)."""

    async def describe(self, model: str) -> ModelDescription: ...

    async def close(self) -> None: ...


def code_from_grpc(status: grpc.StatusCode) -> Code:
    """Relay an upstream (Triton) status: the same code where we have it, INTERNAL otherwise."""
    return next((c for c in Code if c.value[0] == status.name), Code.INTERNAL)


def set_parameter(parameter: pb.InferParameter, value: object) -> None:
    """A request parameter of the type ``value`` has; anything but a bool, int, float or str is sent as JSON."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value if isinstance(value, str) else json.dumps(value)


def _worker_error(url: str, exc: grpc.aio.AioRpcError, lost: tuple[grpc.StatusCode, ...] = LOST,
                  channel: grpc.ChannelConnectivity | None = None) -> WorkerError:
    return status_error(url, exc.code(), exc.details(), lost, channel)


def status_error(url: str, code: grpc.StatusCode, details: str, lost: tuple[grpc.StatusCode, ...] = LOST,
                 channel: grpc.ChannelConnectivity | None = None) -> WorkerError:
    """The typed error of a failed call, told by its status and, for a lost worker, the channel's state (a channel
    that is not READY never had the call: the worker is unreachable), never by the message's words."""
    message = f"worker {url}: {details}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return WorkerTimeout(message, worker=url)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return WorkerRefused(message, worker=url)
    if code in lost:
        kind = WorkerUnreachable if channel not in (None, grpc.ChannelConnectivity.READY) else WorkerLost
        return kind(f"{message} ({code.name})", worker=url)
    return WorkerFailed(message, code_from_grpc(code), worker=url)


class TritonWorker:
    """A Triton server reached over gRPC."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answered = 0
        self._channel = grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._instances: dict[str, int] = {}  # model -> the instance count last set, kept while it is unloaded

    async def infer(self, call: InferCall, timeout_s: float) -> list[dict[str, bytes]]:
        k = call.rows
        request = pb.ModelInferRequest(model_name=call.model, model_version=call.version)
        for spec, rows in call.inputs:
            request.inputs.add(name=spec.name, datatype=spec.datatype, shape=[k, *spec.dims])
            request.raw_input_contents.append(b"".join(rows))
        for key, value in call.parameters:
            set_parameter(request.parameters[key], value)
        try:
            response = await self.stub.ModelInfer(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _worker_error(self.url, exc, BATCH_LOST, self._channel.get_state()) from exc
        self.answered += 1
        return split_rows(self.url, call, response)

    async def load(self, model: str) -> None:
        """Load ``model``, with the instance count last set for it if one was: a planner that unloads a model and
        loads it again later (Loki's hardware scaling) gets the count it set, not the repository's."""
        await self._control(self.stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=model))
        if model in self._instances:
            await self.set_instances(model, self._instances[model])

    async def unload(self, model: str) -> None:
        await self._control(self.stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=model))

    async def set_instances(self, model: str, instances: int) -> Scaled:
        """Reload ``model`` with its config's instance count set to ``instances`` (Triton serves the old
        instances until the new ones are ready); a model that is not loaded gets the count when it is."""
        from google.protobuf import json_format  # lazy: google

        self._instances[model] = instances
        try:
            config = (await self.stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=10)).config
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return "deferred"
            raise _worker_error(self.url, exc) from exc
        groups = config.instance_group or [config.instance_group.add()]
        count = max(1, instances // len(groups))
        if all(group.count == count for group in groups):
            return "unchanged"  # already so (a model just loaded with its repository's count): no reload
        for group in groups:
            group.count = count
        if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
            # Triton changes the instances of a model on its default scheduler in place only once its queue is
            # empty: under load that never empties (Loki's stage models in a burst) a scale-up waited 18 s, the
            # whole burst. A config that differs in more than its instances loads anew beside the old instances,
            # which serve meanwhile: 1.5 s under the same load
            config.parameters[INSTANCES_PARAMETER].string_value = str(count)
        request = pb.RepositoryModelLoadRequest(model_name=model)
        request.parameters["config"].string_param = json_format.MessageToJson(config)
        await self._control(self.stub.RepositoryModelLoad, request)
        return "reloaded"

    async def _control(self, rpc, request) -> None:
        try:
            await rpc(request, timeout=MODEL_CONTROL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise _worker_error(self.url, exc) from exc

    async def ready(self, models: Iterable[str], timeout_s: float) -> Health:
        models = tuple(models)
        try:
            # with no model named (a planner loads and unloads them) the server need only be live: under
            # --strict-readiness it reports not ready while a model loads
            if not models:
                if not (await self.stub.ServerLive(pb.ServerLiveRequest(), timeout=timeout_s)).live:
                    return Health.NOT_READY
            elif not (await self.stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout_s)).ready:
                return Health.NOT_READY
            for name in models:
                if not (await self.stub.ModelReady(pb.ModelReadyRequest(name=name), timeout=timeout_s)).ready:
                    return Health.NOT_READY
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return Health.NO_ANSWER
            return Health.UNREACHABLE if exc.code() in LOST else Health.NOT_READY
        self.answered += 1
        return Health.READY

    async def describe(self, model: str) -> ModelDescription:
        try:
            config = (await self.stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=10)).config
            meta = await self.stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise _worker_error(self.url, exc) from exc

        def specs(tensors) -> tuple[TensorSpec, ...]:
            out = []
            for t in tensors:
                if t.datatype not in DTYPES or any(d < 0 for d in t.shape[1:]):
                    raise ValueError(f"Triton model {model!r}: tensor {t.name!r} ({t.datatype} {list(t.shape)}) "
                                     "is not a fixed-size tensor; the sidecar serves fixed-size tensors")
                out.append(TensorSpec(t.name, t.datatype, tuple(t.shape[1:])))
            return tuple(out)

        return ModelDescription(specs(meta.inputs), specs(meta.outputs), config.max_batch_size,
                                sum(g.count for g in config.instance_group) or 1)

    async def close(self) -> None:
        await self._channel.close()


def split_rows(url: str, call: InferCall, response: pb.ModelInferResponse) -> list[dict[str, bytes]]:
    """A batch's raw outputs back into one row per query; a malformed answer is the worker's failure."""
    if len(response.raw_output_contents) != len(response.outputs):
        raise WorkerFailed(f"worker {url} answered without raw output contents")
    return split_outputs(url, call, [(t.name, raw) for t, raw in zip(response.outputs, response.raw_output_contents)])


def split_outputs(url: str, call: InferCall, outputs: Iterable[tuple[str, bytes]]) -> list[dict[str, bytes]]:
    """Each output's raw bytes (name, bytes), split into one row per query; an answer without one of the outputs is
    the worker's failure (a BLS model whose stub broke mid-batch answered so: its clients get the worker's error)."""
    k = call.rows
    wanted = {t.name: t for t in call.outputs}
    rows: list[dict[str, bytes]] = [{} for _ in range(k)]
    seen = set()
    for name, raw in outputs:
        spec = wanted.get(name)
        if spec is None:
            continue
        seen.add(name)
        size = spec.row_bytes
        if len(raw) != size * k:
            raise WorkerFailed(f"worker {url}: output '{name}' has {len(raw)} bytes, expected {size * k} "
                               f"for {k} rows")
        for i in range(k):
            rows[i][name] = raw[i * size:(i + 1) * size]
    missing = sorted(set(wanted) - seen)
    if missing:
        raise WorkerFailed(f"worker {url}: model {call.model!r} answered without output(s) {missing}")
    return rows


@dataclass
class FakeWorker:
    """An in-process worker for tests: it records every call and answers as ``compute`` says.

    ``gate``, when set, holds every batch and load until the test opens it; ``delay_s`` and
    ``load_delay_s``, when set, make a batch or a load take that long after the gate (awaited with
    ``asyncio.sleep``, so on a virtual-time loop exactly that long); ``fail_with`` makes batches raise;
    ``running`` and ``max_running`` show how many batches ran at once.
    """

    url: str
    compute: Callable[[InferCall], list[dict[str, bytes]]]  # a batch's output rows, one per query
    description: ModelDescription | None = None
    gate: asyncio.Event | None = None
    fail_with: WorkerError | None = None
    health: Health = Health.READY
    delay_s: Callable[[InferCall], float] | None = None  # a batch's service time in seconds
    load_delay_s: Callable[[str], float] | None = None  # a model load's time in seconds
    answered: int = 0
    calls: list[InferCall] = field(default_factory=list)
    control: list[tuple[str, str]] = field(default_factory=list)  # ("load" | "unload", model), in order
    running: int = 0
    max_running: int = 0

    async def infer(self, call: InferCall, timeout_s: float) -> list[dict[str, bytes]]:
        self.calls.append(call)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay_s is not None:
                await asyncio.sleep(self.delay_s(call))
            if self.fail_with is not None:
                raise self.fail_with
            rows = self.compute(call)
            self.answered += 1
            return rows
        finally:
            self.running -= 1

    async def load(self, model: str) -> None:
        self.control.append(("load", model))
        if self.gate is not None:
            await self.gate.wait()
        if self.load_delay_s is not None:
            await asyncio.sleep(self.load_delay_s(model))

    async def unload(self, model: str) -> None:
        self.control.append(("unload", model))

    async def set_instances(self, model: str, instances: int) -> Scaled:
        self.control.append(("instances", f"{model}={instances}"))
        return "reloaded"

    async def ready(self, models: Iterable[str], timeout_s: float) -> Health:
        return self.health

    async def describe(self, model: str) -> ModelDescription:
        if self.description is None:
            raise WorkerFailed(f"fake worker {self.url} describes no model")
        return self.description

    async def close(self) -> None:
        pass



class SendingFakeWorker(FakeWorker):
    """:class:`FakeWorker` with ``send``, the callback way in that the native worker offers: the driver then runs
    its batches with no coroutine of its own (the fake itself still runs each in a task, to keep its gate and
    delays)."""

    def send(self, call: InferCall, timeout_s: float,
             done: Callable[[list[dict[str, bytes]] | Exception], None]) -> None:
        async def run() -> None:
            try:
                result = await self.infer(call, timeout_s)
            except Exception as exc:  # a worker's error, or a bug in compute: either way the batch's answer
                result = exc
            done(result)

        sending = self.__dict__.setdefault("_sending", set())  # the tasks, held until done
        task = asyncio.get_running_loop().create_task(run())
        sending.add(task)
        task.add_done_callback(sending.discard)
