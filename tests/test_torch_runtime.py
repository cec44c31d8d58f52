"""The GPU runtime (python_backend/torch_runtime.py): torch, on CUDA where there is one, on the CPU in CI.

The CPU tests check the runtime's logic, which is the same on both devices: every calibrated subnet computes what
onnxruntime and the training modules compute, weights and statistics are views of the weights loaded once, rows
naming different subnets are grouped, and the python-backend model picks the runtime from its instance group.
The tests marked ``gpu`` run on CUDA (``make gpu-check``) over the bench sets of ``ACCSCALE_GPU_BUNDLE`` and are
skipped without a GPU. Self-contained (no conftest fixtures): the GPU check runs this file with ``--noconftest``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from export.bench_torch import BUNDLE_ENV, MANIFEST, SAMPLES, write_bench_set  # noqa: E402
from export.presets import FAMILIES  # noqa: E402
from python_backend import standin  # noqa: E402
from python_backend.runners import Runtime, StaticRunner, SupernetRunner  # noqa: E402
from python_backend.torch_runtime import WEIGHT_LAYOUTS  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
ON_A_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
TOLERANCE = 1e-4  # the bar: logits within 1e-4 of onnxruntime's and torch's


@pytest.fixture(scope="module")
def bench_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's bench set with its ONNX graphs: the GPU check's bundle's fast sets where given, else the fast
    presets' exported here (cached builds)."""
    if os.environ.get(BUNDLE_ENV):
        return {family: Path(os.environ[BUNDLE_ENV]) / "fast" / family for family in FAMILIES}
    root = tmp_path_factory.mktemp("bench-sets")
    # every searched subnet of the cached builds, unprofiled: a profile would start a Triton
    return {family: write_bench_set(family, "fast", REPO_ROOT / "build", 3, root / family, profiled=False)
            for family in FAMILIES}


@pytest.fixture(scope="module")
def full_sets(bench_sets) -> dict[str, Path]:
    """The benches' sets (the full supernets, without ONNX graphs) in the GPU check's bundle, else the fast ones."""
    if os.environ.get(BUNDLE_ENV):
        return {family: Path(os.environ[BUNDLE_ENV]) / family for family in FAMILIES}
    return bench_sets


def _models(bench_set: Path) -> tuple[Path, dict[str, list[int]], np.ndarray]:
    manifest = json.loads((bench_set / MANIFEST).read_text())
    repo = bench_set / "repo"
    return (repo / manifest["supernet"] / "1", {str(repo / k / "1"): v for k, v in manifest["statics"].items()},
            np.load(bench_set / SAMPLES)[:16])


CPU_RUNTIME = Runtime()  # onnxruntime


def _agreement(bench_set: Path, device: str, layout: str, reference: Runtime = CPU_RUNTIME) -> list[float]:
    """Largest |logits difference| against ``reference`` (onnxruntime), per calibrated subnet, then per static
    subnet."""
    supernet, statics, x = _models(bench_set)
    expected = SupernetRunner(supernet, runtime=reference)
    runtime = SupernetRunner(supernet, runtime=Runtime("torch", device, layout))
    gaps = [float(np.abs(expected.run(x, np.full(len(x), i)) - runtime.run(x, np.full(len(x), i))).max())
            for i in range(len(expected.table.rows))]
    mixed = np.arange(len(x)) % len(expected.table.rows)  # a batch whose rows name different subnets
    gaps.append(float(np.abs(expected.run(x, mixed) - runtime.run(x, mixed)).max()))
    for static in map(Path, statics):
        gaps.append(float(np.abs(StaticRunner(static, runtime=reference).run(x)
                                 - StaticRunner(static, runtime=Runtime("torch", device, layout)).run(x)).max()))
    return gaps


@pytest.mark.parametrize("layout", WEIGHT_LAYOUTS)
@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_the_torch_runtime_computes_what_onnxruntime_does_on_every_subnet(bench_sets, family, layout):
    gaps = _agreement(bench_sets[family], "cpu", layout)
    assert max(gaps) < TOLERANCE, gaps


def test_the_cnn_runtime_computes_what_the_training_modules_do(tmp_path):
    from export.artifacts import Artifacts
    from export.presets import get_preset
    from export.profiler import export_supernet

    artifacts = Artifacts(get_preset("fast"), REPO_ROOT / "build")
    act = artifacts.supernet().eval()
    candidates = artifacts.calibration(act).candidates[:6]
    version = export_supernet(act, candidates, tmp_path) / "1"
    runtime = SupernetRunner(version, runtime=Runtime("torch"))
    x = np.random.default_rng(0).normal(size=(8, 1, act.spec.image_size, act.spec.image_size)).astype(np.float32)
    for i, c in enumerate(candidates):
        act.set_subnet(c.row, i)
        with torch.no_grad():
            expected = act(torch.from_numpy(x)).numpy()
        assert np.abs(runtime.run(x, np.full(len(x), i)) - expected).max() < TOLERANCE, c.subnet_id


def test_the_transformer_runtime_computes_what_the_training_modules_do(tmp_path):
    from export import transformer
    from export.text_artifacts import TextArtifacts, export_supernet

    texts = TextArtifacts(transformer.get_preset("fast"), REPO_ROOT / "build")
    model, tokens = texts.encoder(), texts.split("heldout")[0][:8]
    candidates = texts.calibration(model).candidates
    version = export_supernet(model, texts.tokenizer, candidates, tmp_path) / "1"
    runtime = SupernetRunner(version, runtime=Runtime("torch"))
    for i, c in enumerate(candidates):
        model.set_subnet(c.row)
        with torch.no_grad():
            expected = model(torch.from_numpy(tokens)).numpy()
        assert np.abs(runtime.run(tokens, np.full(len(tokens), i)) - expected).max() < TOLERANCE, c.subnet_id


def _shares(view, weights) -> bool:
    base = view.untyped_storage().data_ptr()
    return any(base == w.untyped_storage().data_ptr() for w in weights)


@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_every_subnet_runs_on_views_of_the_weights_loaded_once(bench_sets, family):
    supernet, _, _ = _models(bench_sets[family])
    runner = SupernetRunner(supernet, runtime=Runtime("torch"))
    weights = list(runner.network.weights.values())
    for i, row in enumerate(runner.table.rows):
        plan = runner.network.plan(row, i)
        tensors = [t for t in _flatten(plan.views) if isinstance(t, torch.Tensor)]
        assert tensors and all(_shares(t, weights) for t in tensors), row


def _flatten(value):
    if isinstance(value, tuple | list):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


def test_a_narrower_subnet_reads_fewer_channels_of_the_same_weight(bench_sets):
    supernet, _, _ = _models(bench_sets["cnn"])
    network = SupernetRunner(supernet, runtime=Runtime("torch")).network
    layout_rows = json.loads((supernet / "subnets.json").read_text())["subnets"]
    small, large = min(layout_rows, key=lambda s: sum(s["control"])), max(layout_rows, key=lambda s: sum(s["control"]))
    (_, blocks_small, *_), (_, blocks_large, *_) = (network.plan(s["control"], 0).views for s in (small, large))
    assert len(blocks_small) <= len(blocks_large)
    assert blocks_small[0][1].shape[0] <= blocks_large[0][1].shape[0]  # conv1's output channels: WeightSlice
    assert blocks_small[0][1].data_ptr() == blocks_large[0][1].data_ptr()  # the same first channels, not a copy


def _model(bench_set: Path, kind: str = "CPU", **parameters: str):
    manifest = json.loads((bench_set / MANIFEST).read_text())
    return standin.load(bench_set / "repo" / manifest["supernet"], kind, parameters=parameters), manifest


def test_the_python_backend_model_picks_its_runtime_from_the_instance_group_or_a_parameter(bench_sets):
    standin.install()
    # after the stand-in: the model imports Triton's utilities
    from python_backend.triton_model import runtime_of

    assert runtime_of({"model_instance_kind": "GPU", "model_instance_device_id": "1"}, {}) == Runtime("torch",
                                                                                                      "cuda:1")
    assert runtime_of({"model_instance_kind": "CPU"}, {}) == Runtime()
    assert runtime_of({"model_instance_kind": "CPU"}, {"runtime": "torch"}) == Runtime("torch", "cpu")
    model, _ = _model(bench_sets["cnn"], runtime="torch")
    assert model.runner.network.device.type == "cpu"
    with pytest.raises(standin.TritonModelException, match="runtime must be one of"):
        _model(bench_sets["cnn"], runtime="tensorrt")
    with pytest.raises(standin.TritonModelException, match="weight_layout must be one of"):
        _model(bench_sets["cnn"], runtime="torch", weight_layout="folded")


def _execute_mixed(model, manifest: dict, x: np.ndarray) -> list:
    rows = manifest["subnets"]
    requests = [standin.InferenceRequest({"INPUT": x[i : i + 1],
                                          "CONTROL": np.asarray([rows[i % len(rows)]], dtype=np.int32)})
                for i in range(4)]
    bad = np.asarray([[99] * len(rows[0])], dtype=np.int32)
    requests.insert(2, standin.InferenceRequest({"INPUT": x[:1], "CONTROL": bad}))
    return model.execute(requests)


def test_requests_naming_different_subnets_and_a_bad_one_each_get_their_own_answer(bench_sets):
    model, manifest = _model(bench_sets["cnn"], runtime="torch")
    x = np.load(bench_sets["cnn"] / SAMPLES)
    responses = _execute_mixed(model, manifest, x)
    assert [r.has_error() for r in responses] == [False, False, True, False, False]
    assert responses[2].error().code() == standin.TritonError.INVALID_ARG
    reference = SupernetRunner(_models(bench_sets["cnn"])[0])
    rows = manifest["subnets"]
    for i, response in zip([0, 1, 2, 3], [r for r in responses if not r.has_error()]):
        expected = reference.infer(x[i : i + 1], np.asarray([rows[i % len(rows)]], dtype=np.int32))
        got = standin.get_output_tensor_by_name(response, "LOGITS").as_numpy()
        assert np.abs(got - expected).max() < TOLERANCE


@pytest.mark.slow
def test_the_gpu_check_runs_end_to_end_on_the_cpu(bench_sets, tmp_path):
    """The dry run the issue asks for: the same script, ``--device cpu``, writes every step's result."""
    bundle = tmp_path / "bundle"
    (bundle / "fast").mkdir(parents=True)
    for family, path in bench_sets.items():  # the fast sets stand for the full ones too
        (bundle / family).symlink_to(path)
        (bundle / "fast" / family).symlink_to(path)
    out = tmp_path / "result.json"
    run = subprocess.run([sys.executable, "scripts/gpu_check.py", "run", "--device", "cpu", "--bundle", str(bundle),
                          "--out", str(out), "--repeats", "2", "--loads", "1"], cwd=REPO_ROOT, capture_output=True,
                         text=True)
    result = json.loads(out.read_text())
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert result["ok"] and set(result["steps"]) == {"environment", "tests", "bench-cnn-prefix", "bench-cnn-strided",
                                                     "bench-transformer-prefix", "bench-transformer-strided"}
    assert "11 skipped" in result["steps"]["tests"]["result"]["summary"]  # the GPU tests, collected
    cnn = result["steps"]["bench-cnn-prefix"]["result"]
    assert cnn["device"] == "cpu" and cnn["switch_ms"] > 0 and cnn["load_ms"] > cnn["switch_ms"]
    assert set(cnn["exec_overhead"]) == {"1", "16", "64"}
    assert [g["goal"] for g in cnn["goals"]] == ["actuation_ratio", "memory_ratio_weights", "exec_overhead"]
    assert set(result["steps"]["bench-cnn-strided"]["result"]["exec_overhead_runner"]) == {"1", "16", "64"}


# ------------------------------------------------------------------------------------------- on a GPU only


@pytest.mark.gpu
@ON_A_GPU
@pytest.mark.parametrize("layout", WEIGHT_LAYOUTS)
@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_on_the_gpu_every_subnet_computes_what_onnxruntime_does(bench_sets, family, layout):
    gaps = _agreement(bench_sets[family], "cuda", layout)
    assert max(gaps) < TOLERANCE, gaps


@pytest.mark.gpu
@ON_A_GPU
@pytest.mark.parametrize("layout", WEIGHT_LAYOUTS)
@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_on_the_gpu_the_full_supernets_compute_what_the_cpu_runtime_of_torch_does(full_sets, family, layout):
    """The benches' supernets (no ONNX graphs travel with them): CUDA against torch on the CPU, which the CPU tests
    hold to onnxruntime."""
    gaps = _agreement(full_sets[family], "cuda", layout, reference=Runtime("torch"))
    assert max(gaps) < TOLERANCE, gaps


@pytest.mark.gpu
@ON_A_GPU
@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_on_the_gpu_switching_subnets_allocates_nothing_that_stays(full_sets, family):
    """The weights are loaded once: after every subnet has run at every batch size, the tensors the model holds are
    its weights and nothing more (activations are freed; no subnet kept a copy)."""
    # cuBLAS takes its workspace (32 MiB on an H100) from torch's allocator at its first product, and keeps it
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model, manifest = _model(full_sets[family], "GPU")  # initialize warms every subnet up at every batch size
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    weights = model.runner.network.bytes()
    assert model.runner.network.device.type == "cuda"
    # the allocator rounds each tensor up to 512 bytes: the many small norm vectors add a little
    assert weights <= held <= 1.25 * weights + 2**20
    x = np.load(full_sets[family] / SAMPLES)
    for i in range(len(manifest["subnets"])):
        model.runner.run(x, np.full(len(x), i))
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before == held


@pytest.mark.gpu
@ON_A_GPU
def test_on_the_gpu_a_batch_of_different_subnets_and_a_bad_row_is_served_per_request(bench_sets):
    model, manifest = _model(bench_sets["cnn"], "GPU")
    responses = _execute_mixed(model, manifest, np.load(bench_sets["cnn"] / SAMPLES))
    assert [r.has_error() for r in responses] == [False, False, True, False, False]


def test_an_export_for_gpus_asks_for_gpu_instances_and_the_compose_stack_gives_each_triton_one(bench_sets, tmp_path):
    import onnx
    import yaml

    from export.repository import write_static

    source = next(iter(_models(bench_sets["cnn"])[1]))
    config_text = (Path(source).parent / "config.pbtxt").read_text()
    assert "kind: KIND_CPU" in config_text  # the default: the CPU runtime
    graph = Path(source) / "model.onnx"
    model_dir = write_static(tmp_path, "m", onnx.load(str(graph)), 10, "x", kind="KIND_GPU")
    assert "kind: KIND_GPU" in (model_dir / "config.pbtxt").read_text()
    compose = yaml.safe_load((REPO_ROOT / "deploy/compose/compose.gpu.yaml").read_text())
    for name in ("triton-a", "triton-b"):
        service = compose["services"][name]
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and service["image"] == "${IMAGE}-triton-gpu"
        assert "--model-repository=/models" in service["command"]


def test_the_stand_in_reads_a_config_s_inputs_parameters_and_instance_kind(tmp_path):
    (tmp_path / "config.pbtxt").write_text(
        'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4, 2 ] } ]\n'
        'output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'instance_group [ { count: 2 kind: KIND_GPU } ]\n'
        'parameters { key: "layout" value { string_value: "{\\"a\\": [1, 2]}" } }\n')
    config = standin.model_config(tmp_path)
    assert config["input"] == [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": ["4", "2"]}]  # not the output
    assert config["max_batch_size"] == 8 and config["instance_kind"] == "GPU"
    assert json.loads(config["parameters"]["layout"]["string_value"]) == {"a": [1, 2]}


def test_onnxruntime_models_take_their_instance_s_gpu_where_onnxruntime_gpu_is_installed():
    from python_backend.runners import providers

    assert providers(["CPUExecutionProvider"], device_id=1) == ["CPUExecutionProvider"]
    assert providers(["CUDAExecutionProvider", "CPUExecutionProvider"], device_id=1) == [
        ("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert providers(["CUDAExecutionProvider", "CPUExecutionProvider"]) == ["CUDAExecutionProvider",
                                                                             "CPUExecutionProvider"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gives")
def test_the_gpu_bench_without_a_gpu_says_so_before_it_exports_anything(capsys):
    from scheduler_sidecar.cli import main

    assert main(["bench", "subnetact", "--device", "cuda", "--preset", "fast"]) == 2
    assert "finds no CUDA device here; --device cpu runs the same bench" in capsys.readouterr().err
