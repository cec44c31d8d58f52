"""`accscale profile triton` and `accscale profile validate`: an operator's models, profiled where Triton serves
them; the parsing of their inputs without Triton, the measuring against a real one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export import data
from export.profiler import SUPERNET_MODEL
from export.repository import static_model_name
from export.subnetact import extract_subnet
from export.triton_profile import (
    _batch_sizes,
    gpu_memory_used,
    model_analyzer_config,
    parse_shapes,
    read_accuracies,
)
from scheduler_sidecar.cli import main
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ProfileError

ROWS = 64  # labelled held-out digits sent through Triton


def test_model_analyzer_keys_read_as_they_mean(tmp_path):
    config = tmp_path / "ma.yaml"
    config.write_text("profile_models: resnet18, resnet50\nbatch_sizes: {start: 1, stop: 8, step: 3}\n"
                      "triton_grpc_endpoint: 10.0.0.2:8001\nrun_config_search_disable: true\n")
    assert model_analyzer_config(config) == {"models": ["resnet18", "resnet50"], "batch_sizes": [1, 4, 7],
                                             "url": "10.0.0.2:8001"}
    config.write_text("profile_models:\n  bert_small: {}\n  bert_large: {}\nbatch_sizes: [4, 1, 4]\n")
    assert model_analyzer_config(config) == {"models": ["bert_small", "bert_large"], "batch_sizes": [1, 4]}
    assert _batch_sizes("1,2,16", "x") == [1, 2, 16] and _batch_sizes(8, "x") == [8]
    for bad in ("0", [], {"start": 1}, True):
        with pytest.raises(ProfileError, match="batch"):
            _batch_sizes(bad, "--batch-sizes")


def test_shapes_accuracies_and_memory_are_checked(tmp_path):
    assert parse_shapes(["INPUT:3,224,224", "ids:128"]) == {"INPUT": (3, 224, 224), "ids": (128,)}
    for bad in ("INPUT", "INPUT:3,x", ":3", "INPUT:0"):
        with pytest.raises(ProfileError, match="--shape"):
            parse_shapes([bad])
    csv = tmp_path / "acc.csv"
    csv.write_text("model,version,accuracy,metric,dataset\nresnet18,,0.697,top-1,ImageNet val\n"
                   "resnet50,2,0.761,top-1,ImageNet val\n")
    got = read_accuracies(csv)
    assert got["resnet18", ""].value == 0.697 and got["resnet50", "2"].dataset == "ImageNet val"
    csv.write_text("model,version,accuracy,metric,dataset\nresnet18,,69.7,top-1,ImageNet val\n")
    with pytest.raises(ProfileError, match=r"acc.csv:2: accuracy 69.7 is not a fraction"):
        read_accuracies(csv)
    csv.write_text("model,accuracy\nresnet18,0.7\n")
    with pytest.raises(ProfileError, match="needs the columns"):
        read_accuracies(csv)
    metrics = ('nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1.5e+09\n'
               'nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 5e+08\nnv_cpu_memory_used_bytes 9e+09\n')
    assert gpu_memory_used(metrics) == 2_000_000_000 and gpu_memory_used("nv_cpu_memory_used_bytes 9e+09\n") is None


def test_validate_names_the_bad_field_and_summarises_a_good_profile(tmp_path, capsys):
    good = {"schema": "accscale/profile/v1", "name": "mine", "source": "by hand", "variants": [
        {"id": "small", "accuracy": 0.7, "actuation": {"kind": "model", "model": "small"}, "load_ms": 900.0,
         "latency": {"gpu": {"batch_sizes": [1, 8], "p50_ms": [2.0, 5.0], "p99_ms": [3.0, 7.0]}}},
        {"id": "large", "accuracy": 0.8, "actuation": {"kind": "model", "model": "large"},
         "latency": {"gpu": {"batch_sizes": [1, 8], "p50_ms": [6.0, 20.0], "p99_ms": [8.0, 25.0]}}}]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(good))
    assert main(["profile", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 variants (model)" in out and "70.00% .. 80.00%" in out and "1 of 2 measured" in out
    good["variants"][1]["latency"]["gpu"]["p99_ms"] = [8.0]
    path.write_text(json.dumps(good))
    assert main(["profile", "validate", str(path)]) == 2
    assert "variants[1].latency.gpu.p99_ms: has 1 values, expected 2" in capsys.readouterr().err


@pytest.mark.triton
@pytest.mark.slow
def test_profile_triton_measures_the_served_models(fast_build, triton, tmp_path, capsys):
    """The fast build's static subnets, as an operator's family already in Triton: latency per batch size within
    each model's max batch size, cold-load time, and accuracy measured through Triton equal to torch's."""
    subnets = {static_model_name(SUPERNET_MODEL, s): s for s in fast_build.static_ids}
    models = list(subnets)
    heldout = data.load(fast_build.act.spec.image_size)["heldout"]
    x, labels = heldout.images[:ROWS], heldout.labels[:ROWS]
    np.savez(tmp_path / "digits.npz", INPUT=x, labels=labels)
    out = tmp_path / "family.json"
    assert main(["profile", "triton", "--url", triton.grpc_url, "--models", ",".join(models), "--batch-sizes",
                 "1,4,4096", "--repeats", "5", "--warmup", "1", "--load-repeats", "1", "--device-kind", "cpu-test",
                 "--data", str(tmp_path / "digits.npz"), "--out", str(out)]) == 0
    progress = capsys.readouterr().err
    assert all(f"{m}: batch 4: p50" in progress and f"{m}: cold load" in progress for m in models)
    profile = Profile.load(out)
    assert {v.id for v in profile.variants} == set(models) and profile.device_kinds == ("cpu-test",)
    assert [v.accuracy for v in profile.variants] == sorted(v.accuracy for v in profile.variants)
    for v in profile.variants:
        curve = v.latency["cpu-test"]
        assert v.actuation.kind == "model" and v.actuation.model == v.id
        assert curve.batch_sizes == (1, 4)  # 4096 is above every model's max batch size
        assert all(z >= a > 0 for a, z in zip(curve.p50_ms, curve.p99_ms))
        assert v.load_ms is not None and v.load_ms > 0 and v.memory_bytes is None  # a CPU Triton reports none
        (candidate,) = fast_build.calibration.select([subnets[v.id]])
        act = fast_build.act
        act.set_norm_tables([candidate.stats])
        act.set_subnet(candidate.row, 0)
        with torch.no_grad():
            expected = (extract_subnet(act)(torch.from_numpy(x)).numpy().argmax(axis=1) == labels).mean()
        assert abs(v.accuracy - expected) <= 1 / ROWS, v.id  # a near-tie may flip one argmax
    provenance = json.loads(out.read_text())["metadata"]["provenance"]
    assert provenance["triton_version"] and provenance["command"].startswith("accscale profile triton")


@pytest.mark.triton
def test_profile_triton_refuses_what_it_cannot_measure(fast_build, triton, tmp_path, capsys):
    model = static_model_name(SUPERNET_MODEL, fast_build.static_ids[0])
    out = tmp_path / "p.json"
    base = ["profile", "triton", "--url", triton.grpc_url, "--repeats", "1", "--warmup", "0", "--out", str(out)]
    assert main([*base, "--models", "resnet999"]) == 2
    err = capsys.readouterr().err
    assert "model 'resnet999' is not ready" in err and model in err
    assert main([*base, "--models", model]) == 2
    assert f"no accuracy for {model}" in capsys.readouterr().err
    assert not out.exists()
