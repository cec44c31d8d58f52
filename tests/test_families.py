"""The demo's model families (export.families) and the emulated device kinds' padding (python_backend.emulation)."""

from __future__ import annotations

import numpy as np
import pytest

from export.families import mlp_onnx, tabular, train_mlp
from python_backend.emulation import Padding, write_latency


def test_an_mlp_written_as_onnx_computes_what_its_weights_do(tmp_path):
    import onnxruntime as ort

    x_train, y_train, x_test, y_test = tabular("wine")
    weights = train_mlp(x_train, y_train, (16,))
    session = ort.InferenceSession(mlp_onnx(weights, "m").SerializeToString())
    h = x_test
    for i, (w, b) in enumerate(weights):
        h = h @ w.T + b
        h = np.maximum(h, 0) if i < len(weights) - 1 else h
    np.testing.assert_allclose(session.run(["LOGITS"], {"INPUT": x_test})[0], h, rtol=1e-4, atol=1e-4)
    assert (h.argmax(axis=1) == y_test).mean() > 0.8  # it learned the task (3 classes, chance 0.4)


def test_padding_stretches_a_batch_to_the_factor_times_its_profiled_latency(tmp_path):
    write_latency(tmp_path, [1, 2, 4, 8], [1.0, 1.5, 2.0, 4.0])
    padding = Padding(10.0, tmp_path)
    assert padding.delay(1, 0.0004) == pytest.approx(0.0100 - 0.0004)
    assert padding.delay(3, 0.001) == pytest.approx(0.020 - 0.001)  # a batch of 3 runs as the profiled 4
    assert padding.delay(8, 0.050) == 0.0  # a batch the machine slowed down past its target is not slowed more


def test_padding_without_a_profile_keeps_the_speed_of_the_fastest_compute(tmp_path):
    padding = Padding(3.0, tmp_path)
    # a slow first batch (a cold start), then the machine at its speed, then loaded for a while: the device takes
    # 3 x 2 ms throughout, and a batch the load slowed past that is not slowed more
    took = (0.020, 0.002, 0.004, 0.004, 0.007)
    delays = [padding.delay(4, t) for t in took]
    assert delays == pytest.approx([0.040, 0.004, 0.002, 0.002, 0.0])
    assert padding.delay(1, 0.001) == pytest.approx(0.002)  # each batch size has its own speed


def test_padding_of_a_supernet_keeps_each_subnets_own_speed(tmp_path):
    """A supernet's batches run different subnets: the smallest's compute must not set the pace of the largest."""
    padding = Padding(4.0, tmp_path)
    assert padding.delay(8, 0.001, (0,)) == pytest.approx(0.003)  # the smallest subnet: 4 x 1 ms
    assert padding.delay(8, 0.010, (5,)) == pytest.approx(0.030)  # the largest: 4 x its own 10 ms, not 4 x 1 ms
    assert padding.delay(8, 0.012, (5,)) == pytest.approx(0.028)  # and the largest keeps its fastest, 10 ms
