"""KServe v2 facts both front ends share: status codes, datatypes, tensors and the sidecar's errors.

A query's tensors travel through the sidecar as raw little-endian bytes (what tritonclient
sends in ``raw_input_contents`` or the binary-tensor tail): a batch is the concatenation of
its rows, and a batch's output splits back into equal rows, so no tensor is decoded on the
hot path. Only JSON (HTTP) and typed gRPC ``contents`` go through numpy.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Mapping

import grpc
import numpy as np


class Code(enum.Enum):
    """An error class and how each protocol spells it (Triton's own mapping where it has one)."""

    INVALID_ARGUMENT = (grpc.StatusCode.INVALID_ARGUMENT, 400)
    NOT_FOUND = (grpc.StatusCode.NOT_FOUND, 404)
    UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, 503)  # queue full, no healthy worker, worker failed
    # The budget ran out in the sidecar. HTTP has no deadline of its own; 504 says "the answer
    # did not come in time" and is distinct from 503 (try again later).
    DEADLINE_EXCEEDED = (grpc.StatusCode.DEADLINE_EXCEEDED, 504)
    PERMISSION_DENIED = (grpc.StatusCode.PERMISSION_DENIED, 403)
    INTERNAL = (grpc.StatusCode.INTERNAL, 500)

    @property
    def grpc(self) -> grpc.StatusCode:
        return self.value[0]

    @property
    def http(self) -> int:
        return self.value[1]

    @classmethod
    def from_grpc(cls, status: grpc.StatusCode) -> "Code":
        """Relay an upstream (Triton) status: the same class where we have it, INTERNAL otherwise."""
        return next((c for c in cls if c.grpc == status), cls.INTERNAL)


class SidecarError(Exception):
    """A request the sidecar answers with an explicit error."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# KServe v2 datatype -> numpy dtype (little-endian); BYTES has no fixed row size and is not served
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t).newbyteorder("<") for name, t in {
        "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
        "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
        "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    }.items()
}
# gRPC InferTensorContents field that carries each datatype when raw_input_contents is not used
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a logical model; ``dims`` excludes the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    @functools.cached_property
    def row_bytes(self) -> int:  # cached: it is checked on every request
        return int(np.prod(self.dims, dtype=np.int64)) * DTYPES[self.datatype].itemsize

    def check(self, datatype: str, shape: tuple[int, ...], nbytes: int | None = None) -> None:
        """Raise INVALID_ARGUMENT unless (datatype, shape[, bytes]) is one sample of this tensor."""
        if datatype != self.datatype:
            raise SidecarError(Code.INVALID_ARGUMENT, f"input '{self.name}': datatype {datatype}, expected {self.datatype}")
        if tuple(shape) != (1, *self.dims):
            raise SidecarError(Code.INVALID_ARGUMENT, f"input '{self.name}': shape {list(shape)}, expected "
                               f"{[1, *self.dims]} (the sidecar takes single-sample requests)")
        if nbytes is not None and nbytes != self.row_bytes:
            raise SidecarError(Code.INVALID_ARGUMENT, f"input '{self.name}': {nbytes} bytes of data, "
                               f"expected {self.row_bytes} for shape {[1, *self.dims]} {datatype}")


def to_row_bytes(spec: TensorSpec, data: object) -> bytes:
    """Typed values (a JSON list, flat or nested, or gRPC contents) -> one row's raw bytes."""
    try:
        array = np.asarray(data, dtype=DTYPES[spec.datatype])
    except (TypeError, ValueError) as exc:
        raise SidecarError(Code.INVALID_ARGUMENT, f"input '{spec.name}': {exc}") from None
    if array.size * array.itemsize != spec.row_bytes:
        raise SidecarError(Code.INVALID_ARGUMENT, f"input '{spec.name}': {array.size} values, "
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
        raise SidecarError(Code.INVALID_ARGUMENT, f"parameter 'slo_us' must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Answer:
    """What served one query, and its output rows (raw bytes per output name)."""

    outputs: dict[str, bytes]
    variant_id: str
    accuracy: float
    queue_us: int  # arrival to dispatch
    service_us: int  # dispatch to the worker's answer
    batch_size: int
    worker: str

    def parameters(self) -> dict[str, object]:
        """Response parameters: what served the request and where its time went."""
        return {"variant": self.variant_id, "accuracy": self.accuracy, "queue_us": self.queue_us,
                "service_us": self.service_us, "batch_size": self.batch_size, "worker": self.worker}
