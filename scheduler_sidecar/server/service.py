"""The sidecar behind both front ends: its logical models, its workers and what it says about them.

The front ends (``grpc_frontend``, ``http_frontend``) only translate the protocol; what a
logical model is (its tensors are the Triton model's, less the control tensor), its
metadata and config, readiness, the admin actions and metrics all live here.
"""

from __future__ import annotations

import logging
from importlib import metadata as importlib_metadata

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from scheduler_sidecar.server.config import SidecarConfig
from scheduler_sidecar.live.driver import CONTROL_INPUT, LiveModel
from scheduler_sidecar.server.metrics import Metrics
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.server.protocol import DTYPES, Code, SidecarError, TensorSpec
from scheduler_sidecar.live.endpoints import Endpoint, WorkerPool

log = logging.getLogger(__name__)

SERVER_NAME = "accscale"
EXTENSIONS = ("binary_tensor_data", "parameters", "model_configuration")
PLATFORM = "accscale_sidecar"
MODEL_VERSION = "1"


class Sidecar:
    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.profiles = {m.name: Profile.load(m.profile) for m in config.models}
        triton_models = {v.actuation.model for p in self.profiles.values() for v in p.variants}
        self.pool = WorkerPool(triton_models, interval_s=config.health_interval_s)
        self.models: dict[str, LiveModel] = {}

    async def start(self) -> None:
        """Connect to every configured worker (they must be ready), then build the logical models."""
        self.pool.on_change(self._endpoint_changed)
        for url in self.config.workers:
            await self.pool.add(url, wait_s=self.config.startup_wait_s)
        first = self.pool.endpoints[0]
        for spec in self.config.models:
            profile = self.profiles[spec.name]
            inputs, outputs = await _tensors(first, profile.variants[0].actuation.model)
            model = LiveModel(spec, profile, inputs, outputs, self.metrics)
            model.pool = self.pool
            self.models[spec.name] = model
            for endpoint in self.pool.endpoints:
                model.add_endpoint(endpoint, await _slots(endpoint, model))
        self.pool.start()
        log.info("serving %s over %d worker(s)", sorted(self.models), len(self.pool.endpoints))

    async def close(self) -> None:
        for model in self.models.values():
            await model.close()
        await self.pool.close()

    def _endpoint_changed(self, endpoint: Endpoint) -> None:
        self.metrics.worker_healthy.labels(endpoint.url).set(1 if endpoint.healthy else 0)
        for model in self.models.values():
            model.endpoint_changed(endpoint)

    # ---------------------------------------------------------------- lookups
    def model(self, name: str, version: str = "") -> LiveModel:
        model = self.models.get(name)
        if model is None:
            raise SidecarError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if version not in ("", MODEL_VERSION):
            raise SidecarError(Code.NOT_FOUND, f"Request for unknown model: '{name}' version {version} is not found")
        return model

    def ready(self) -> bool:
        return all(self.model_ready(name) for name in self.models)

    def model_ready(self, name: str) -> bool:
        model = self.models.get(name)
        return model is not None and any(w.healthy for w in model.workers)

    def server_metadata(self) -> pb.ServerMetadataResponse:
        try:
            version = importlib_metadata.version("accscale")
        except importlib_metadata.PackageNotFoundError:
            version = "0"
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=version, extensions=EXTENSIONS)

    def model_metadata(self, name: str, version: str = "") -> pb.ModelMetadataResponse:
        model = self.model(name, version)

        def tensors(specs: dict[str, TensorSpec]) -> list:
            return [pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=[-1, *t.dims])
                    for t in specs.values()]

        return pb.ModelMetadataResponse(name=name, versions=[MODEL_VERSION], platform=PLATFORM,
                                        inputs=tensors(model.inputs), outputs=tensors(model.outputs))

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        """A config that tells clients (perf_analyzer) to send single samples with a batch dimension."""
        model = self.model(name, version)
        return mc.ModelConfig(
            name=name, platform=PLATFORM, max_batch_size=1,
            input=[mc.ModelInput(name=t.name, data_type=mc.DataType.Value(f"TYPE_{t.datatype}"), dims=list(t.dims))
                   for t in model.inputs.values()],
            output=[mc.ModelOutput(name=t.name, data_type=mc.DataType.Value(f"TYPE_{t.datatype}"), dims=list(t.dims))
                    for t in model.outputs.values()],
            parameters={"policy": mc.ModelParameter(string_value=model.policy.name),
                        "profile": mc.ModelParameter(string_value=model.profile.name)},
        )

    # ---------------------------------------------------------------- admin
    def check_admin(self, token: str | None) -> None:
        if not self.config.admin_token:
            raise SidecarError(Code.PERMISSION_DENIED, "admin endpoints are off (start with --admin-token)")
        if token != self.config.admin_token:
            raise SidecarError(Code.PERMISSION_DENIED, "wrong or missing admin token")

    def set_policy(self, name: str, policy: str, options: dict | None = None) -> dict[str, str]:
        model = self.model(name)
        try:
            old = model.set_policy(policy, options)
        except (TypeError, ValueError) as exc:
            raise SidecarError(Code.INVALID_ARGUMENT, str(exc)) from None
        return {"model": name, "old": old, "policy": policy}

    async def add_worker(self, url: str) -> dict[str, object]:
        try:
            endpoint = await self.pool.add(url, wait_s=self.config.health_interval_s)
        except ValueError as exc:
            raise SidecarError(Code.INVALID_ARGUMENT, str(exc)) from None
        slots = {}
        for model in self.models.values():
            slots[model.name] = await _slots(endpoint, model)
            model.add_endpoint(endpoint, slots[model.name])
        return {"worker": url, "slots": slots}

    def workers(self) -> list[dict[str, object]]:
        return [{"url": e.url, "healthy": e.healthy} for e in self.pool.endpoints]


async def _tensors(endpoint: Endpoint, triton_model: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """A logical model's tensors: those of its Triton model without the batch dimension and the control input."""
    config = (await endpoint.stub.ModelConfig(pb.ModelConfigRequest(name=triton_model), timeout=10)).config
    if config.max_batch_size < 1:
        raise ValueError(f"Triton model {triton_model!r} has max_batch_size {config.max_batch_size}; "
                         "the sidecar batches requests and needs a batching model")
    meta = await endpoint.stub.ModelMetadata(pb.ModelMetadataRequest(name=triton_model), timeout=10)

    def specs(tensors) -> tuple[TensorSpec, ...]:
        out = []
        for t in tensors:
            if t.datatype not in DTYPES or any(d < 0 for d in t.shape[1:]):
                raise ValueError(f"Triton model {triton_model!r}: tensor {t.name!r} ({t.datatype} {list(t.shape)}) "
                                 "is not a fixed-size tensor; the sidecar serves fixed-size tensors")
            out.append(TensorSpec(t.name, t.datatype, tuple(t.shape[1:])))
        return tuple(out)

    return specs(t for t in meta.inputs if t.name != CONTROL_INPUT), specs(meta.outputs)


async def _slots(endpoint: Endpoint, model: LiveModel) -> int:
    """Worker slots a logical model gets on an endpoint: the fewest instances of any Triton model it uses."""
    counts = []
    for name in sorted(model.triton_models):
        config = (await endpoint.stub.ModelConfig(pb.ModelConfigRequest(name=name), timeout=10)).config
        counts.append(sum(g.count for g in config.instance_group) or 1)
    return min(counts)
