"""The SubNetAct supernet served in place by a real tritonserver (fast preset)."""

from __future__ import annotations

import json
import queue
import random
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from export import data
from export.profiler import SUPERNET_MODEL
from export.repository import static_model_name
from export.subnetact import extract_subnet

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def infer(url: str, model: str, x: np.ndarray, control: np.ndarray | None = None) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        return client.infer(model, make_inputs(x, control)).as_numpy("LOGITS")


def make_inputs(x: np.ndarray, control: np.ndarray | None = None) -> list:
    inputs = [grpcclient.InferInput("INPUT", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    if control is not None:
        inputs.append(grpcclient.InferInput("CONTROL", list(control.shape), "INT32"))
        inputs[1].set_data_from_numpy(control)
    return inputs


def static_torch_logits(fast_build, subnet_id: str, x: np.ndarray) -> np.ndarray:
    """The statically extracted subnet's torch output, the reference for every Triton answer."""
    (candidate,) = fast_build.calibration.select([subnet_id])
    act = fast_build.act
    act.set_norm_tables([candidate.stats])
    act.set_subnet(candidate.row, 0)
    with torch.no_grad():
        return extract_subnet(act)(torch.from_numpy(x)).numpy()


def assert_logits_close(got: np.ndarray, expected: np.ndarray) -> None:
    # relative tolerance 1e-4, scaled by the logits' magnitude so near-zero logits compare sanely
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def heldout(fast_build, n: int, offset: int = 0) -> np.ndarray:
    return data.load(fast_build.act.spec.image_size)["heldout"].images[offset : offset + n]


def test_random_subnets_match_static_torch_subnets(fast_build, triton):
    """For 24 random calibrated subnets, Triton's in-place supernet equals the extracted subnet in torch."""
    picks = random.Random(11).sample(list(fast_build.calibration.candidates), 24)
    x = heldout(fast_build, 4)
    for candidate in picks:
        control = np.tile(np.asarray(candidate.row, dtype=np.int32), (len(x), 1))
        got = infer(triton.grpc_url, SUPERNET_MODEL, x, control)
        assert_logits_close(got, static_torch_logits(fast_build, candidate.subnet_id, x))


def test_static_subnet_models_match_torch(fast_build, triton):
    """Subnets exported statically as their own Triton models give the same outputs."""
    x = heldout(fast_build, 3)
    for subnet_id in fast_build.static_ids:
        got = infer(triton.grpc_url, static_model_name(SUPERNET_MODEL, subnet_id), x)
        assert_logits_close(got, static_torch_logits(fast_build, subnet_id, x))


def test_one_request_mixing_subnets(fast_build, triton):
    """A single request whose rows name different subnets equals one request per row."""
    picks = random.Random(5).sample(list(fast_build.calibration.candidates), 6)
    x = heldout(fast_build, 6)
    control = np.array([c.row for c in picks], dtype=np.int32)
    mixed = infer(triton.grpc_url, SUPERNET_MODEL, x, control)
    for i in range(6):
        assert_logits_close(mixed[i : i + 1], infer(triton.grpc_url, SUPERNET_MODEL, x[i : i + 1], control[i : i + 1]))


def test_dynamic_batcher_mixes_subnets(fast_build, triton):
    """Concurrent requests for different subnets, merged by Triton's dynamic batcher, keep their outputs.

    The model is reloaded for the test with a batcher that waits (up to 5 s) for batches of 8, so that requests are
    merged whatever the machine's load; the repository's config, which never waits (the sidecar forms the batches),
    merged none of 48 requests on a loaded machine once (a fresh clone's `make test`)."""
    picks = random.Random(9).sample(list(fast_build.calibration.candidates), 8)
    x = heldout(fast_build, 48)
    rows = [picks[i % len(picks)].row for i in range(len(x))]
    expected = [infer(triton.grpc_url, SUPERNET_MODEL, x[i : i + 1], np.array([rows[i]], dtype=np.int32))
                for i in range(len(x))]
    control = httpclient.InferenceServerClient(triton.http_url)
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        config = control.get_model_config(SUPERNET_MODEL)
        original = json.dumps(config)
        config["dynamic_batching"] = {"max_queue_delay_microseconds": 5_000_000, "preferred_batch_size": [8]}
        control.load_model(SUPERNET_MODEL, config=json.dumps(config))
        before = _stats(triton)
        done: queue.Queue = queue.Queue()
        for i in range(len(x)):
            inputs = [grpcclient.InferInput("INPUT", [1, *x.shape[1:]], "FP32"),
                      grpcclient.InferInput("CONTROL", [1, len(rows[i])], "INT32")]
            inputs[0].set_data_from_numpy(x[i : i + 1])
            inputs[1].set_data_from_numpy(np.array([rows[i]], dtype=np.int32))
            client.async_infer(SUPERNET_MODEL, inputs,
                               partial(lambda i, result, error: done.put((i, result, error)), i))
        answers = dict((i, (result, error)) for i, result, error in (done.get(timeout=60) for _ in range(len(x))))
        results = [answers[i][0].as_numpy("LOGITS") for i in range(len(x)) if answers[i][1] is None]
        after = _stats(triton)
    finally:
        client.close()
        # the repository's config again, for the tests after this one, given in full: a load without a config kept
        # the override, whose 5 s batcher then held the next tests' one-row requests past the sidecar's deadline
        control.load_model(SUPERNET_MODEL, config=original)
        control.close()
    for got, want in zip(results, expected):
        assert_logits_close(got, want)
    assert len(results) == len(x)
    requests, executions = after[0] - before[0], after[1] - before[1]
    # Triton counts an execution once its responses are out, so the last batch may not be counted yet when every
    # answer is in (a fresh clone's suite read 45 of 48): the batches counted merged their requests all the same
    assert 0 < requests <= len(x)
    assert executions < requests, "the dynamic batcher never merged requests"


def _stats(triton) -> tuple[int, int]:
    stats = httpclient.InferenceServerClient(triton.http_url).get_inference_statistics(SUPERNET_MODEL)
    s = stats["model_stats"][0]
    return int(s["inference_count"]), int(s["execution_count"])


def _control_error(triton, control: np.ndarray, dtype: str = "INT32") -> InferenceServerException:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    x = np.zeros((len(control), 1, 16, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT", list(x.shape), "FP32"),
              grpcclient.InferInput("CONTROL", list(control.shape), dtype)]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(control)
    with pytest.raises(InferenceServerException) as info:
        client.infer(SUPERNET_MODEL, inputs)
    return info.value


def test_invalid_control_rows_are_rejected_and_the_server_keeps_serving(fast_build, triton):
    """Bad CONTROL rows get INVALID_ARGUMENT naming the problem; the next valid request succeeds."""
    layout = fast_build.act.layout
    good = np.asarray(fast_build.calibration.candidates[0].row, dtype=np.int32)
    calibrated = {c.row for c in fast_build.calibration.candidates}
    rng = random.Random(2)
    uncalibrated = next(r for r in iter(lambda: _random_row(layout, rng), None) if r not in calibrated)
    cases = {
        "out-of-range depth": (np.array([[9] + list(good[1:])], np.int32), "INT32", r"D\[0\]=9: depth of stage 0"),
        "width index": (np.array([list(good[:-1]) + [7]], np.int32), "INT32", r"W\[2.\d\]=7: width index"),
        "wrong length": (np.array([list(good) + [0]], np.int32), "INT32", r"CONTROL"),
        "wrong dtype": (good[None].astype(np.float32), "FP32", r"CONTROL.*(data-type|datatype|FP32)"),
        "uncalibrated": (np.array([uncalibrated], np.int32), "INT32", r"has no SubnetNorm statistics"),
    }
    for name, (control, dtype, message) in cases.items():
        error = _control_error(triton, control, dtype)
        assert error.status() == "StatusCode.INVALID_ARGUMENT", (name, error)
        assert __import__("re").search(message, error.message()), (name, error.message())
        out = infer(triton.grpc_url, SUPERNET_MODEL, heldout(fast_build, 1), good[None])
        assert out.shape == (1, 10)


def test_a_bad_request_does_not_fail_its_batch_neighbours(fast_build, triton):
    """In one dynamic batch, the request with a bad row fails alone."""
    good = np.asarray(fast_build.calibration.candidates[0].row, dtype=np.int32)
    bad = good.copy()
    bad[0] = 99
    x = heldout(fast_build, 1)

    def call(control: np.ndarray):
        try:
            return infer(triton.grpc_url, SUPERNET_MODEL, x, control[None])
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, [good if i % 2 else bad for i in range(16)]))
    assert all(isinstance(r, np.ndarray) for r in results[1::2])
    assert all(isinstance(r, InferenceServerException) for r in results[0::2])


def _random_row(layout, rng: random.Random) -> tuple[int, ...]:
    depths = [rng.randint(layout.min_depth, d) for d in layout.max_depths]
    return layout.validate(depths + [rng.randrange(len(layout.width_choices)) for _ in range(layout.num_blocks)])


def test_profile_validates_and_is_pareto(fast_build):
    """The profiler's file loads through the validator and no kept subnet is dominated."""
    from scheduler_sidecar.core.profile import Profile

    profile = Profile.load(fast_build.profile_path)
    (device,) = profile.device_kinds
    assert profile.dominated(device) == []
    assert len(profile.variants) >= 3
    assert all(v.actuation.kind == "supernet" and v.actuation.model == SUPERNET_MODEL for v in profile.variants)
    assert all(v.latency[device].batch_sizes == tuple(range(1, 17)) for v in profile.variants)


def test_every_variant_is_warmed_at_every_batch_size_before_ready(fast_build, triton):
    """Each model instance runs each subnet at batch sizes 1, 2, 4, ..., 64 (max_batch_size) in initialize."""
    log = triton.log_path.read_text()
    sizes = "batch sizes [1, 2, 4, 8, 16, 32, 64]"
    assert f"{SUPERNET_MODEL}: warmed up with {len(fast_build.calibration.candidates) * 7} runs ({sizes})" in log
    for subnet_id in fast_build.static_ids:
        assert f"{static_model_name(SUPERNET_MODEL, subnet_id)}: warmed up with 7 runs ({sizes})" in log
