"""KServe v2 facts both front ends share: status codes, typed tensor contents, parameters and answers.

A query's tensors travel through the sidecar as raw little-endian bytes (what tritonclient
sends in ``raw_input_contents`` or the binary-tensor tail): a batch is the concatenation of
its rows, and a batch's output splits back into equal rows, so no tensor is decoded on the
hot path. Only JSON (HTTP) and typed gRPC ``contents`` go through numpy.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import numpy as np

from scheduler_sidecar.errors import Code, InvalidRequest
from scheduler_sidecar.live.tensors import DTYPES, TensorSpec

__all__ = ["CONTENTS_FIELD", "DTYPES", "TensorSpec", "from_row_bytes", "grpc_status", "parse_slo_us", "to_row_bytes"]


def grpc_status(code: Code) -> grpc.StatusCode:
    """How gRPC spells an error code (Triton's own mapping)."""
    return grpc.StatusCode[code.value[0]]


# gRPC InferTensorContents field that carries each datatype when raw_input_contents is not used
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}


def to_row_bytes(spec: TensorSpec, data: object) -> bytes:
    """Typed values (a JSON list, flat or nested, or gRPC contents) -> one row's raw bytes."""
    try:
        array = np.asarray(data, dtype=DTYPES[spec.datatype])
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"input '{spec.name}': {exc}") from None
    if array.size * array.itemsize != spec.row_bytes:
        raise InvalidRequest(f"input '{spec.name}': {array.size} values, "
                           f"expected {spec.row_bytes // array.itemsize}")
    return array.tobytes()


def from_row_bytes(spec: TensorSpec, raw: bytes) -> list:
    """One row's raw bytes -> a flat list for a JSON response."""
    return np.frombuffer(raw, dtype=DTYPES[spec.datatype]).tolist()


def parse_slo_us(parameters: Mapping[str, object], default_us: int) -> int:
    """The request's ``slo_us`` parameter (a positive integer), or the model's default."""
    if "slo_us" not in parameters:
        return default_us
    value = parameters["slo_us"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value <= 0:
        raise InvalidRequest(f"parameter 'slo_us' must be a positive integer, got {value!r}")
    return int(value)
