"""Write models into a Triton model repository (config.pbtxt, the model.py shim, ONNX).

Every model, the project's and an operator's own (:func:`write_onnx`), is a python-backend model running onnxruntime (the CPU Triton bundled with
nvidia-pytriton has no onnxruntime backend); on a GPU server the same model picks the CUDA
execution provider when ``onnxruntime-gpu`` is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from export.onnx_writer import save
from python_backend.control import ControlLayout
from python_backend.pipeline import MAX_OBJECTS
from python_backend.runners import MODEL_FILE, SUBNETS_FILE, SubnetTable
from python_backend.torch_runtime import WEIGHTS_FILE, write_weights
from scheduler_sidecar.errors import ConfigError

SHIM = '''"""Thin shim: the model's logic lives in the accscale package (python_backend)."""
from python_backend.{module} import TritonPythonModel  # noqa: F401
'''


def static_model_name(supernet_name: str, subnet_id: str) -> str:
    """Triton model name of a statically exported subnet, e.g. ``digits_supernet__d142_w3_3210_21``."""
    return f"{supernet_name}__{re.sub(r'[^A-Za-z0-9]+', '_', subnet_id)}"


Tensor = tuple[str, str, list[int]]  # (name, Triton data type, dims without the batch dimension)
Weights = tuple[dict, dict[str, np.ndarray]]  # the GPU runtime's architecture and tensors (export.torch_weights)


def _config(name: str, inputs: list[Tensor], outputs: list[Tensor], params: dict[str, str], max_batch_size: int,
            instances: int, queue_delay_us: int = 0, kind: str = "KIND_CPU") -> str:
    def tensor(n: str, dtype: str, dims: list[int]) -> str:
        # a tensor that is only the batch (a label per row) is served as dims [1], reshaped to none
        reshape = "" if dims else " reshape: { shape: [ ] }"
        return f'  {{ name: "{n}" data_type: {dtype} dims: [ {", ".join(map(str, dims or [1]))} ]{reshape} }}'

    input_text = ",\n".join(tensor(*i) for i in inputs)
    output_text = ",\n".join(tensor(*o) for o in outputs)
    parameters = "\n".join(
        f'parameters {{ key: "{k}" value {{ string_value: {json.dumps(v)} }} }}' for k, v in params.items()
    )
    # by default merge whatever is queued, never wait: the sidecar forms the batches it wants (a model served to
    # clients direct, as plain Triton, waits up to queue_delay_us for a fuller batch)
    batcher = (f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}\n"
               if max_batch_size > 0 else "")
    return f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [
{input_text}
]
output [
{output_text}
]
{batcher}instance_group [ {{ count: {instances} kind: {kind} }} ]
{parameters}
"""


def _write_model(repository: Path, name: str, model: onnx.ModelProto | None, config: str,
                 extra: dict[str, str], module: str = "triton_model", weights: Weights | None = None) -> Path:
    model_dir = repository / name
    repository.mkdir(parents=True, exist_ok=True)
    # built beside the repository, so an interrupted export leaves nothing Triton would try to load
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=repository.resolve().parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from a Triton running as another user
    (tmp / "1").mkdir()
    if model is not None:  # a runner that computes without a network (the classical detector) has none
        save(model, tmp / "1" / MODEL_FILE)
    (tmp / "1" / "model.py").write_text(SHIM.format(module=module))
    for file_name, text in extra.items():
        (tmp / "1" / file_name).write_text(text)
    if weights is not None:  # the GPU runtime's copy of the network (python_backend.torch_runtime)
        write_weights(tmp / "1" / WEIGHTS_FILE, *weights)
    (tmp / "config.pbtxt").write_text(config)
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)
    return model_dir


def write_supernet(repository: Path, name: str, model: onnx.ModelProto, table: SubnetTable, num_classes: int, *,
                   files: dict[str, str] | None = None, weights: Weights | None = None, max_batch_size: int = 64,
                   instances: int = 1, threads: int = 1, kind: str = "KIND_CPU") -> Path:
    """A supernet model: the graph's ``INPUT`` and the CONTROL rows of ``table``'s layout, which its config
    declares; ``files`` go beside the graph (a tokenizer's vocabulary); ``kind`` "KIND_GPU" runs it on the GPU
    runtime (python_backend.triton_model.runtime_of)."""
    layout: ControlLayout = table.layout
    config = _config(
        name, [_graph_input(model), ("CONTROL", "TYPE_INT32", [layout.num_fields])],
        [("LOGITS", "TYPE_FP32", [num_classes])],
        {"runner": "supernet", "intra_op_threads": str(threads), "control_layout": layout.to_json()},
        max_batch_size, instances, kind=kind,
    )
    return _write_model(repository, name, model, config, {SUBNETS_FILE: table.to_json(), **(files or {})},
                        weights=weights)


def write_static(repository: Path, name: str, model: onnx.ModelProto, num_classes: int, subnet_id: str, *,
                 files: dict[str, str] | None = None, weights: Weights | None = None, max_batch_size: int = 64,
                 instances: int = 1, threads: int = 1, queue_delay_us: int = 0, kind: str = "KIND_CPU") -> Path:
    config = _config(name, [_graph_input(model)], [("LOGITS", "TYPE_FP32", [num_classes])],
                     {"runner": "static", "intra_op_threads": str(threads), "subnet": subnet_id},
                     max_batch_size, instances, queue_delay_us, kind)
    return _write_model(repository, name, model, config, files or {}, weights=weights)


def _graph_input(model: onnx.ModelProto, name: str = "INPUT") -> Tensor:
    """The batched graph input ``name`` as the config declares it (type, dims without the batch)."""
    (value,) = [v for v in model.graph.input if v.name == name]
    tensor = value.type.tensor_type
    return name, TRITON_TYPES[tensor.elem_type], [d.dim_value for d in tensor.shape.dim[1:]]


def write_model(repository: Path, name: str, model: onnx.ModelProto | None, input_dims: list[int],
                output: int | list[int], params: dict[str, str], *, max_batch_size: int = 64,
                instances: int = 1) -> Path:
    """A python-backend model with one FP32 ``INPUT`` of ``input_dims`` and ``LOGITS`` of ``output`` (the number of
    classes, or the dims), neither with the batch dimension."""
    dims = [output] if isinstance(output, int) else list(output)
    config = _config(name, [("INPUT", "TYPE_FP32", list(input_dims))], [("LOGITS", "TYPE_FP32", dims)], params,
                     max_batch_size, instances)
    return _write_model(repository, name, model, config, {})


def write_loki_pipeline(repository: Path, name: str, plan: dict, models: list[str], *, max_batch_size: int = 32,
                        instances: int = 1, scripted_delays: bool = False) -> Path:
    """The Loki pipeline's BLS model (:mod:`python_backend.loki_bls`): FRAME [1, 64, 64] -> OBJECTS, STATUS, STAGE_MS, with
    ``plan`` as its default plan and ``models`` the stage models its answers index.

    The stage models in ``repository`` lose Triton's dynamic batcher: the BLS forms each stage's batches at the
    plan's sizes, as the simulator's workers take them, and has several of them in flight at once; the batcher
    merged those in its queue into batches beyond the plan's (the large detector's mean batch went from 2.8 to
    3.6-4.6 rows and its batch time from 410 to 590-800 ms, in the fidelity bench at 1x)."""
    for model in models:
        stage = repository / model / "config.pbtxt"
        text = stage.read_text() if stage.exists() else ""
        unbatched = re.sub(r"^dynamic_batching \{[^}]*\}\n", "", text, flags=re.M)
        if unbatched != text:  # whole, and written beside the model, not in it: another deployment may be copying
            # the trained models meanwhile (copy_stage_models)
            fd, tmp = tempfile.mkstemp(dir=repository, prefix=f".{model}-", suffix=".pbtxt")
            with open(fd, "w") as f:
                f.write(unbatched)
            Path(tmp).replace(stage)
    config = f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "FRAME" data_type: TYPE_FP32 dims: [ 1, 64, 64 ] }} ]
output [
  {{ name: "OBJECTS" data_type: TYPE_INT32 dims: [ {MAX_OBJECTS}, 6 ] }},
  {{ name: "STATUS" data_type: TYPE_INT32 dims: [ 4 ] }},
  {{ name: "STAGE_MS" data_type: TYPE_FP32 dims: [ 3 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "scripted_delays" value {{ string_value: "{int(scripted_delays)}" }} }}
parameters {{ key: "models" value {{ string_value: {json.dumps(json.dumps(models))} }} }}
"""
    return _write_model(repository, name, None, config, {"plan.json": json.dumps(plan)}, module="loki_bls")


def write_cascade(repository: Path, name: str, plan: dict, models: list[str], *, side: int = 16,
                  max_batch_size: int = 64, instances: int = 1) -> Path:
    """HybridServe's cascade BLS model (:mod:`python_backend.cascade_bls`): INPUT [1, side, side] -> LABEL, MODEL,
    CONFIDENCE, REASON, with ``plan`` as its default plan and ``models`` the family its MODEL output indexes."""
    config = f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1, {side}, {side} ] }} ]
output [
  {{ name: "LABEL" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "MODEL" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "CONFIDENCE" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "REASON" data_type: TYPE_INT32 dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "models" value {{ string_value: {json.dumps(json.dumps(models))} }} }}
"""
    return _write_model(repository, name, None, config, {"plan.json": json.dumps(plan)}, module="cascade_bls")


# ONNX element types and the Triton data types they are served as
TRITON_TYPES = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.DOUBLE: "TYPE_FP64",
                onnx.TensorProto.FLOAT16: "TYPE_FP16", onnx.TensorProto.INT64: "TYPE_INT64",
                onnx.TensorProto.INT32: "TYPE_INT32", onnx.TensorProto.INT16: "TYPE_INT16",
                onnx.TensorProto.INT8: "TYPE_INT8", onnx.TensorProto.UINT8: "TYPE_UINT8",
                onnx.TensorProto.BOOL: "TYPE_BOOL"}


def write_onnx(repository: Path, name: str, model_path: Path, *, max_batch_size: int = 32, instances: int = 1,
               threads: int = 1) -> Path:
    """An operator's ONNX model as a Triton model served by :mod:`python_backend.onnx_model`: the config's inputs
    and outputs are the graph's. With ``max_batch_size`` > 0 every tensor's first dimension is the batch; a tensor
    that is only the batch (a label per row) is served as dims [1], reshaped to none."""
    try:
        model = onnx.load(str(model_path))
    except (OSError, ValueError, DecodeError) as exc:
        raise ConfigError(f"{model_path}: not an ONNX model ({exc})") from None
    initializers = {t.name for t in model.graph.initializer}
    batching = max_batch_size > 0

    def tensor(value: onnx.ValueInfoProto) -> Tensor:
        kind = value.type.tensor_type.elem_type
        if kind not in TRITON_TYPES:
            raise ConfigError(f"{model_path}: {value.name!r} is of ONNX type {onnx.TensorProto.DataType.Name(kind)}, "
                              f"which this runner does not serve (it serves {', '.join(TRITON_TYPES.values())})")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                for d in value.type.tensor_type.shape.dim]
        if batching:
            if not dims or dims[0] != -1:
                raise ConfigError(f"{model_path}: {value.name!r} has shape {dims}, whose first dimension is not a "
                                  "variable batch: export it with a dynamic batch axis, or give --max-batch-size 0")
            dims = dims[1:]
        return value.name, TRITON_TYPES[kind], dims

    config = _config(name, [tensor(v) for v in model.graph.input if v.name not in initializers],
                     [tensor(v) for v in model.graph.output], {"intra_op_threads": str(threads)}, max_batch_size,
                     instances)
    return _write_model(repository, name, model, config, {}, module="onnx_model")
