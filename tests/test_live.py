"""The live driver's bookkeeping with fake Triton endpoints: disconnects, failures, retries, config."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from scheduler_sidecar.server import config as sidecar_config
from scheduler_sidecar.server.config import ModelSpec
from scheduler_sidecar.live.driver import LiveModel
from scheduler_sidecar.server.metrics import Metrics
from scheduler_sidecar.server.protocol import Code, SidecarError, TensorSpec
from tests.builders import make_profile

INPUT = TensorSpec("INPUT", "FP32", (2,))
OUTPUT = TensorSpec("LOGITS", "FP32", (3,))


class FakeEndpoint:
    """Answers each batch with rows of (row sum, variant model index, batch size) once ``release`` is set."""

    def __init__(self, url: str, fail_with: grpc.StatusCode | None = None) -> None:
        self.url = url
        self.healthy = True
        self.fail_with = fail_with
        self.release = asyncio.Event()
        self.batches: list[pb.ModelInferRequest] = []

    async def infer(self, request: pb.ModelInferRequest, timeout_s: float) -> pb.ModelInferResponse:
        self.batches.append(request)
        await self.release.wait()
        if self.fail_with is not None:
            raise grpc.aio.AioRpcError(self.fail_with, grpc.aio.Metadata(), grpc.aio.Metadata(), "boom")
        x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(-1, 2)
        k = len(x)
        out = np.stack([x.sum(1), np.full(k, int(request.model_name[1:])), np.full(k, k)], 1).astype(np.float32)
        response = pb.ModelInferResponse(model_name=request.model_name)
        response.outputs.add(name="LOGITS", datatype="FP32", shape=[k, 3])
        response.raw_output_contents.append(out.tobytes())
        return response


class FakePool:
    def mark_down(self, endpoint, reason: str) -> None:
        endpoint.healthy = False
        for model in self.models:
            model.endpoint_changed(endpoint)


def make_model(*endpoints: FakeEndpoint, **spec) -> LiveModel:
    model = LiveModel(ModelSpec("m", Path("p.json"), **{"overhead_us": 0, **spec}), make_profile(),
                      (INPUT,), (OUTPUT,), Metrics())
    pool = FakePool()
    pool.models = [model]
    model.pool = pool
    for endpoint in endpoints:
        model.add_endpoint(endpoint, 1)
    return model


def row(*values: float) -> dict[str, bytes]:
    return {"INPUT": np.asarray(values, np.float32).tobytes()}


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_requests_are_batched_and_answered_with_their_own_rows():
    async def main():
        endpoint = FakeEndpoint("a")
        model = make_model(endpoint)
        first = asyncio.ensure_future(model.infer(row(1, 2), 1_000_000))
        await settle()  # the first request runs alone; the next three queue behind it
        rest = [asyncio.ensure_future(model.infer(row(i, i), 1_000_000)) for i in range(3)]
        await settle()
        endpoint.release.set()
        answers = await asyncio.gather(first, *rest)
        sums = [np.frombuffer(a.outputs["LOGITS"], np.float32)[0] for a in answers]
        assert sums == [3, 0, 2, 4]
        assert [a.batch_size for a in answers] == [1, 3, 3, 3]
        assert len(endpoint.batches) == 2 and len(model.queue) == 0

    asyncio.run(main())


def test_a_client_that_leaves_frees_its_queue_entry():
    async def main():
        endpoint = FakeEndpoint("a")
        model = make_model(endpoint)
        running = asyncio.ensure_future(model.infer(row(1, 1), 1_000_000))
        await settle()
        queued = [asyncio.ensure_future(model.infer(row(2, 2), 1_000_000)) for _ in range(5)]
        await settle()
        assert len(model.queue) == 5
        for task in queued:
            task.cancel()
        await settle()
        assert len(model.queue) == 0 and len(model._pending) == 1
        endpoint.release.set()
        await running
        assert len(model._pending) == 0 and len(endpoint.batches) == 1

    asyncio.run(main())


def test_a_failed_worker_s_batch_is_retried_on_the_other():
    async def main():
        bad, good = FakeEndpoint("bad", fail_with=grpc.StatusCode.UNAVAILABLE), FakeEndpoint("good")
        model = make_model(bad, good)
        tasks = [asyncio.ensure_future(model.infer(row(i, 0), 1_000_000)) for i in range(2)]
        await settle()  # one batch on each worker
        bad.release.set()
        await settle()
        good.release.set()
        answers = await asyncio.gather(*tasks)
        assert {a.worker for a in answers} == {"good"}
        assert not bad.healthy and not model.workers[0].healthy

    asyncio.run(main())


def test_with_no_worker_left_every_request_gets_an_explicit_error():
    async def main():
        bad = FakeEndpoint("bad", fail_with=grpc.StatusCode.UNAVAILABLE)
        model = make_model(bad)
        tasks = [asyncio.ensure_future(model.infer(row(i, 0), 1_000_000)) for i in range(4)]
        await settle()
        bad.release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, SidecarError) and r.code is Code.UNAVAILABLE for r in results)
        with pytest.raises(SidecarError, match="no healthy Triton worker"):
            await model.infer(row(1, 1), 1_000_000)
        assert len(model.queue) == 0 and not model._pending

    asyncio.run(main())


def test_triton_errors_are_relayed_not_retried():
    async def main():
        endpoint = FakeEndpoint("a", fail_with=grpc.StatusCode.INVALID_ARGUMENT)
        model = make_model(endpoint)
        task = asyncio.ensure_future(model.infer(row(1, 1), 1_000_000))
        await settle()
        endpoint.release.set()
        with pytest.raises(SidecarError) as err:
            await task
        assert err.value.code is Code.INVALID_ARGUMENT and "boom" in err.value.message
        assert endpoint.healthy and len(endpoint.batches) == 1

    asyncio.run(main())


def test_admission_errors():
    async def main():
        endpoint = FakeEndpoint("a")
        model = make_model(endpoint, queue_limit=2)
        with pytest.raises(SidecarError, match="below the fastest variant") as err:
            await model.infer(row(1, 1), 10)
        assert err.value.code is Code.INVALID_ARGUMENT
        tasks = [asyncio.ensure_future(model.infer(row(1, 1), 1_000_000)) for _ in range(3)]
        await settle()  # one runs, two queue
        with pytest.raises(SidecarError, match="queue full") as err:
            await model.infer(row(1, 1), 1_000_000)
        assert err.value.code is Code.UNAVAILABLE
        endpoint.release.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_requests_whose_slack_is_gone_are_dropped_with_deadline_exceeded():
    async def main():
        endpoint = FakeEndpoint("a")
        model = make_model(endpoint)
        first = asyncio.ensure_future(model.infer(row(1, 1), 1_000_000))
        await settle()
        tight = asyncio.ensure_future(model.infer(row(1, 1), 2_000))  # fastest variant: 1.5 ms at batch 1
        await asyncio.sleep(0.01)  # its slack runs out while the worker is busy
        endpoint.release.set()
        await first
        with pytest.raises(SidecarError) as err:
            await tight
        assert err.value.code is Code.DEADLINE_EXCEEDED

    asyncio.run(main())


def test_config_file_and_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('workers = ["h:1"]\nhttp_port = 9\n[[models]]\nname = "d"\nprofile = "p.json"\npolicy = "maxacc"\n'
                    '[models.policy_options]\nnum_buckets = 8\n')
    config = sidecar_config.load(path, http_port=10, workers=None)
    assert config.http_port == 10 and config.workers == ("h:1",)
    assert config.models == (ModelSpec("d", Path("p.json"), "maxacc", {"num_buckets": 8}),)
    with pytest.raises(ValueError, match="unknown policy"):
        sidecar_config.load(None, workers=["h:1"], models=[{"name": "d", "profile": "p", "policy": "fifo"}])
    with pytest.raises(ValueError, match="at least one Triton worker"):
        sidecar_config.load(None, models=[{"name": "d", "profile": "p"}])
    path.write_text("workers = [")
    with pytest.raises(ValueError, match="c.toml"):
        sidecar_config.load(path)


def test_every_policy_can_drive_the_live_model():
    from scheduler_sidecar.policies import POLICIES
    from tests.builders import POLICY_OPTIONS

    async def main():
        endpoint = FakeEndpoint("a")
        endpoint.release.set()
        model = make_model(endpoint)
        for name in POLICIES:
            model.set_policy(name, POLICY_OPTIONS.get(name))
            answer = await model.infer(row(1, 2), 1_000_000)
            assert np.frombuffer(answer.outputs["LOGITS"], np.float32)[0] == 3
        assert len(endpoint.batches) == len(POLICIES)

    asyncio.run(main())


@pytest.mark.parametrize("calibrate", [True, False])
def test_latency_calibration_replans_with_measured_latencies(calibrate):
    """The fake worker answers at once, far under the profiled 1.5 ms+: the policy re-plans on a faster profile."""
    from scheduler_sidecar.live.driver import CALIBRATION_BOUNDS, CALIBRATION_WINDOW

    async def main():
        endpoint = FakeEndpoint("a")
        endpoint.release.set()
        model = make_model(endpoint, latency_calibration=calibrate)
        profiled = model.policy.profile.variants[0].latency["cpu"].p50_ms[0]
        for _ in range(CALIBRATION_WINDOW):
            await model.infer(row(1, 1), 1_000_000)
        expected = CALIBRATION_BOUNDS[0] if calibrate else 1.0
        assert model.latency_scale == expected
        assert model.policy.profile.variants[0].latency["cpu"].p50_ms[0] == pytest.approx(profiled * expected)
        assert model.policy.name == "slackfit"

    asyncio.run(main())
