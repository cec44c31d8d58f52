"""A stand-in for Triton's ``triton_python_backend_utils``: run a python-backend model in a plain process.

Triton's python backend hands a model ``initialize(args)`` and ``execute(requests)`` and gives it this module's
names. Where no tritonserver runs (a GPU machine without one, unit tests), :func:`install` puts this stand-in under
that name and :func:`load` builds a model of the repository as Triton would, so the model's own code runs, its
runtime selection from the instance group included. It covers what the models of this project use, no more:
tensors, requests, responses and errors, the logger, custom metrics (counted, not exported).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
from pathlib import Path

import numpy as np

MODULE = "triton_python_backend_utils"
_TYPES = {"TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_FP64": np.float64, "TYPE_INT64": np.int64,
          "TYPE_INT32": np.int32, "TYPE_INT8": np.int8, "TYPE_UINT8": np.uint8, "TYPE_BOOL": np.bool_,
          "TYPE_STRING": np.object_}


class TritonModelException(Exception):
    pass


class TritonError:
    INTERNAL, INVALID_ARG, UNSUPPORTED = "INTERNAL", "INVALID_ARG", "UNSUPPORTED"

    def __init__(self, message: str, code: str = INTERNAL) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> str:
        return self._code


class Tensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self._name, self._value = name, np.asarray(value)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._value


class InferenceRequest:
    """A request as ``execute`` receives it (``inputs``: name -> array)."""

    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        self._inputs = [Tensor(k, v) for k, v in inputs.items()]

    def inputs(self) -> list[Tensor]:
        return self._inputs


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._outputs, self._error = output_tensors or [], error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def triton_string_to_numpy(name: str):
    return _TYPES[name if name.startswith("TYPE_") else f"TYPE_{name}"]


class Logger:
    lines: list[str] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(message)

    log_warn = log_error = log_verbose = log_info


class MetricFamily:
    COUNTER, GAUGE = "COUNTER", "GAUGE"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.kind = name, kind

    def Metric(self, labels: dict[str, str] | None = None) -> _Metric:  # noqa: N802 - Triton's spelling
        return _Metric()


class _Metric:
    def __init__(self) -> None:
        self.value = 0.0

    def increment(self, amount: float) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = value


def install() -> types.ModuleType:
    """This module as ``triton_python_backend_utils`` (left as it is if one is installed already)."""
    return sys.modules.setdefault(MODULE, sys.modules[__name__])


def model_config(model_dir: Path) -> dict:
    """The parts of ``config.pbtxt`` the models read, as the JSON Triton gives them: name, max_batch_size, inputs'
    names, data types and dims, and the string parameters (the configs this project writes; not a pbtxt parser)."""
    text = (model_dir / "config.pbtxt").read_text()
    batch = re.search(r"max_batch_size:\s*(\d+)", text)
    tensors = [{"name": n, "data_type": t, "dims": [d.strip() for d in dims.split(",")]}
               for n, t, dims in re.findall(r'name:\s*"(\w+)"\s*data_type:\s*(\w+)\s*dims:\s*\[([^\]]*)\]',
                                            _block(text, "input"))]
    params = {k: {"string_value": json.loads(f'"{v}"')}
              for k, v in re.findall(r'key:\s*"(\w+)"\s*value:?\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"', text)}
    kind = re.search(r"instance_group.*?kind:\s*KIND_(\w+)", text, re.S)
    return {"name": model_dir.name, "max_batch_size": int(batch.group(1)) if batch else 0, "input": tensors,
            "parameters": params, "instance_kind": kind.group(1) if kind else "CPU"}


def _block(text: str, field: str) -> str:
    """The text inside ``field [ ... ]``, brackets counted (a block may sit on one line, its tensors' dims too)."""
    start = re.search(rf"^{field}\s*\[", text, re.M)
    if start is None:
        return ""
    depth, i = 1, start.end()
    while depth and i < len(text):
        depth += {"[": 1, "]": -1}.get(text[i], 0)
        i += 1
    return text[start.end() : i - 1]


def load(model_dir: Path, kind: str | None = None, device_id: int = 0, version: str = "1",
         parameters: dict[str, str] | None = None):
    """The python-backend model of ``model_dir`` (a repository folder), initialised as Triton would for one
    instance of ``kind`` ("CPU" or "GPU"; default: its config's instance group); ``parameters`` override the
    config's."""
    install()
    config = model_config(model_dir)
    kind = kind or config.pop("instance_kind")
    config["parameters"] |= {k: {"string_value": v} for k, v in (parameters or {}).items()}
    shim = re.search(r"^from (\S+) import TritonPythonModel", (model_dir / version / "model.py").read_text(), re.M)
    if shim is None:
        raise ValueError(f"{model_dir}: model.py does not import a TritonPythonModel from a module")
    module = importlib.import_module(shim.group(1))
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(model_dir),
                      "model_version": version, "model_name": model_dir.name, "model_instance_kind": kind,
                      "model_instance_device_id": str(device_id)})
    return model
