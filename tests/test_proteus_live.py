"""Proteus live: two query types, each a family of static subnets, on two Triton servers of two emulated
device kinds; the sidecar places one variant per server through model control and routes by the plan."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.live.triton_launcher import TritonServer
from scheduler_sidecar.server.serve import SidecarServer

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SLOWDOWN = 3.0
SLO = {"slo_us": 400_000}
FAMILIES = {"digits": "digits_static", "digits-b": "second_static"}  # query type -> name stem of its Triton models


@pytest.fixture(scope="module")
def images(fast_build) -> np.ndarray:
    from export import data

    return data.load(fast_build.act.spec.image_size)["heldout"].images[:40]


def grpc_input(x: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


@pytest.fixture(scope="module")
def deployment(fast_build, tmp_path_factory):
    """A repository with the fast build's static subnets exported twice (one family per query type),
    their profiles for a "cpu" and an emulated "cpu-x3" kind, and one Triton server of each kind."""
    from export.profiler import export_static
    from export.repository import static_model_name

    tmp = tmp_path_factory.mktemp("proteus")
    repository = tmp / "repository"
    candidates = sorted(fast_build.calibration.select(list(fast_build.static_ids)), key=lambda c: (c.accuracy, c.macs))
    base = fast_build.profile.variants[0].latency[fast_build.profile.device_kinds[0]]
    profiles, models, model_of = {}, [], {}
    for query_type, supernet_name in FAMILIES.items():
        variants = []
        for i, c in enumerate(candidates):
            export_static(fast_build.act, c, repository, supernet_name=supernet_name)
            model = static_model_name(supernet_name, c.subnet_id)
            models.append(model)
            model_of[f"{query_type}-{c.subnet_id}"] = model
            curve = [x * (1 + i) for x in base.p50_ms]  # latency grows with accuracy, as on a Pareto front
            variants.append(Variant(f"{query_type}-{c.subnet_id}", c.accuracy, Actuation("model", model), {
                kind: LatencyCurve(base.batch_sizes, tuple(x * f for x in curve), tuple(x * f for x in curve))
                for kind, f in (("cpu", 1.0), ("cpu-x3", SLOWDOWN))}))
        profiles[query_type] = tmp / f"{query_type}.json"
        Profile(f"proteus-{query_type}", "tests/test_proteus_live.py", tuple(variants)).save(profiles[query_type])
    with TritonServer(repository=repository, models=models) as fast, \
            TritonServer(repository=repository, models=models, emulate_slowdown=SLOWDOWN) as slow:
        yield {"profiles": profiles, "fast": fast, "slow": slow, "models": models, "model_of": model_of, "tmp": tmp}


def ready_models(server: TritonServer, models) -> set[str]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        return {m for m in models if client.is_model_ready(m)}


def test_proteus_places_one_variant_per_device_and_serves_both_types(deployment, images):
    fast, slow = deployment["fast"], deployment["slow"]
    config = deployment["tmp"] / "sidecar.toml"
    models = "".join(f'[[models]]\nname = "{q}"\nprofile = "{p}"\npolicy = "proteus"\ndefault_slo_us = 400000\n'
                     f'latency_calibration = false\n' for q, p in deployment["profiles"].items())
    config.write_text(f'[worker_devices]\n"{fast.grpc_url}" = "cpu"\n"{slow.grpc_url}" = "cpu-x3"\n'
                      f'[planner]\nkind = "proteus"\nperiod_s = 2.0\n{models}')
    with SidecarServer(workers=[fast.grpc_url, slow.grpc_url], config=config) as server, \
            grpcclient.InferenceServerClient(server.grpc_url) as client:
        # the first plan put one variant on each device and unloaded the rest (each type got one device)
        placed = [ready_models(t, deployment["models"]) for t in (fast, slow)]
        assert [len(p) for p in placed] == [1, 1], placed
        assert {next(iter(p)).split("_static")[0] for p in placed} == {"digits", "second"}  # one per type
        served: dict[str, set[str]] = {q: set() for q in FAMILIES}
        started = time.monotonic()
        for i, x in enumerate(images):
            query_type = list(FAMILIES)[i % 2]
            result = client.infer(query_type, [grpc_input(x[None])], parameters=SLO)
            variant = result.get_response().parameters["variant"].string_param
            assert variant.startswith(query_type + "-")
            served[query_type].add(variant)
            model = deployment["model_of"][variant]
            host = fast if model in placed[0] else slow
            with grpcclient.InferenceServerClient(host.grpc_url) as direct:
                expected = direct.infer(model, [grpc_input(x[None])]).as_numpy("LOGITS")
            np.testing.assert_allclose(result.as_numpy("LOGITS"), expected, rtol=1e-4, atol=1e-4)
        assert time.monotonic() - started < 60
        assert all(served.values())
        log = server.log_path.read_text()
        assert "first plan placed" in log and "Traceback" not in log, log
