"""Where a subnet's time goes (`accscale bench subnetact --breakdown`): the supernet graph against the static one
under onnxruntime's profiler, on the fast build."""

from __future__ import annotations

import numpy as np
import pytest

from export.overheads import breakdown
from export.profiler import SUPERNET_MODEL
from export.repository import static_model_name


@pytest.mark.slow
def test_the_breakdown_accounts_for_each_graphs_time_by_category(fast_build):
    subnet = fast_build.static_ids[0]
    images = np.zeros((4, 1, fast_build.act.spec.image_size, fast_build.act.spec.image_size), np.float32)
    row = breakdown(fast_build.repository / SUPERNET_MODEL / "1",
                    fast_build.repository / static_model_name(SUPERNET_MODEL, subnet) / "1", subnet, images, runs=5)
    assert row["subnet"] == subnet and row["batch"] == 4
    assert row["ratio"] == pytest.approx(row["supernet_us"] / row["static_us"], rel=0.01)
    for graph in ("static", "supernet"):  # the categories, the executor's share included, add up to the run
        parts = sum(v for k, v in row.items() if k.startswith(f"{graph}_") and k.endswith("_us") and k != f"{graph}_us")
        assert parts == pytest.approx(row[f"{graph}_us"], rel=0.02) and row[f"{graph}_conv_us"] > 0
    # SubnetNorm reads its statistics at run time, so its norms stay separate operators; the static graph folds
    # every norm into its convolution at load
    assert row["supernet_norm_us"] > 0 and row["static_norm_us"] == 0
    assert row["supernet_gather_us"] > 0 and row["supernet_control_us"] > 0


def test_bench_subnetact_refuses_no_repeats(capsys):
    from scheduler_sidecar.cli import main

    assert main(["bench", "subnetact", "--breakdown", "--repeats", "0"]) == 2
    assert "--repeats, --spread and --loads must be >= 1" in capsys.readouterr().err


def test_bench_subnetact_refuses_folding_the_transformers_norms(capsys):
    from scheduler_sidecar.cli import main

    assert main(["bench", "subnetact", "--family", "transformer", "--norms", "folded"]) == 2
    assert "the transformer has no norms to fold" in capsys.readouterr().err
