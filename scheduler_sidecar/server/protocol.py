"""KServe v2 as both front ends speak it, and the one check every inference request passes.

A front end only takes its wire format apart: each input becomes a :class:`TensorIn`, each
requested output an :class:`OutputIn`, and :func:`parse_request` checks them, with the request's
parameters, against the model and the :class:`Limits`, and returns an :class:`InferRequest`
or raises INVALID_ARGUMENT. Nothing a client sends reaches the engine unchecked, so a bad
request fails alone, with a message that names the problem (and quotes at most
:data:`QUOTE_CHARS` of what the client sent).

A query's tensors travel through the sidecar as raw little-endian bytes (what tritonclient
sends in ``raw_input_contents`` or the binary-tensor tail): a batch is the concatenation of
its rows, and a batch's output splits back into equal rows, so no tensor is decoded on the
hot path. Only JSON (HTTP) and typed gRPC ``contents`` go through numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from scheduler_sidecar.errors import Code, InvalidRequest
from scheduler_sidecar.live.tensors import DTYPES, TensorSpec

__all__ = ["CONTENTS_FIELD", "InferRequest", "Limits", "ModelInfo", "OutputIn", "TensorIn", "from_row_bytes",
           "grpc_status", "parse_request", "quote"]

QUOTE_CHARS = 64  # of a client's string an error message repeats: a 100 KB model name is not echoed back


def grpc_status(code: Code) -> grpc.StatusCode:
    """How gRPC spells an error code (Triton's own mapping)."""
    return grpc.StatusCode[code.value[0]]


def quote(value: object) -> str:
    """A client-sent value for an error message, cut to :data:`QUOTE_CHARS`."""
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}... ({len(text)} chars)"


@dataclass(frozen=True)
class Limits:
    """What one request may carry; the sidecar's configuration sets them (see ``server.config``)."""

    # Larger bodies (HTTP) and messages (gRPC) are refused before they are read into memory. 64 MiB is
    # the input limit newer Triton releases put on HTTP by default; a single-sample request is far smaller.
    max_request_bytes: int = 64 << 20
    # An SLO beyond this is a client's mistake, not a deadline: 10^16 us would overflow the deadline of
    # the batch it joins, and fail its batch-mates (issue 14). One minute is far above any serving SLO.
    max_slo_us: int = 60_000_000
    # Rows one request may carry (its batch dimension); each is a query of its own. Bounded so that one
    # request cannot fill the queue that other clients share (the default queue limit is 1024).
    max_rows: int = 64


@dataclass(frozen=True)
class ModelInfo:
    """What a front end knows of a logical model: plain data, so that a front end needs no engine object
    (the request path crosses only ``Sidecar.infer``, and could cross a process boundary there)."""

    name: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    default_slo_us: int


@dataclass(frozen=True)
class TensorIn:
    """One input as a front end received it, unchecked: ``raw`` bytes, or typed ``values`` to encode."""

    name: object
    datatype: object
    shape: object
    raw: bytes | None = None
    values: object = None


@dataclass(frozen=True)
class OutputIn:
    """One requested output as a front end received it, unchecked; ``binary`` is HTTP's ``binary_data``."""

    name: object
    binary: object = None  # None: the request's default


@dataclass(frozen=True)
class InferRequest:
    """A checked request: each input's raw bytes (``count`` rows), its SLO and the outputs to return (name, as
    binary)."""

    inputs: dict[str, bytes]
    count: int
    slo_us: int
    outputs: tuple[tuple[str, bool], ...]

    def rows(self, model: ModelInfo) -> list[dict[str, bytes]]:
        """One query's inputs per row."""
        if self.count == 1:
            return [self.inputs]
        sizes = {name: model.inputs[name].row_bytes for name in self.inputs}
        return [{name: raw[i * sizes[name]:(i + 1) * sizes[name]] for name, raw in self.inputs.items()}
                for i in range(self.count)]


def parse_request(model: ModelInfo, parameters: Mapping[str, object], inputs: Iterable[TensorIn],
                  outputs: Sequence[OutputIn] | None, limits: Limits) -> InferRequest:
    """Check a request against ``model`` and ``limits``; raises :class:`InvalidRequest` naming the first problem."""
    slo_us = _slo_us(parameters, model.default_slo_us, limits.max_slo_us)
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidRequest(f"parameter 'binary_data_output' must be a boolean, got {quote(binary_default)}")
    data: dict[str, bytes] = {}
    count = None
    for tensor in inputs:
        spec = model.inputs.get(tensor.name) if isinstance(tensor.name, str) else None
        if spec is None:
            raise InvalidRequest(f"unexpected input {quote(tensor.name)} for model {quote(model.name)}; inputs are "
                                 f"{sorted(model.inputs)}")
        if spec.name in data:
            raise InvalidRequest(f"input '{spec.name}' given twice")
        data[spec.name], rows = _tensor(spec, tensor, limits.max_rows)
        if count is not None and rows != count:
            raise InvalidRequest(f"input '{spec.name}' has {rows} rows, the others {count}")
        count = rows
    missing = sorted(set(model.inputs) - set(data))
    if missing or count is None:
        raise InvalidRequest(f"model {quote(model.name)} expects inputs {missing or sorted(model.inputs)}")
    if not outputs:  # none named: every output, as Triton answers
        wanted = tuple((name, binary_default) for name in model.outputs)
    else:
        wanted = tuple(_output(model, o, binary_default) for o in outputs)
    return InferRequest(data, count, slo_us, wanted)


def _slo_us(parameters: Mapping[str, object], default_us: int, max_us: int) -> int:
    """The ``slo_us`` parameter: a whole number of microseconds in [1, max_us], or the model's default."""
    if "slo_us" not in parameters:
        return default_us
    value = parameters["slo_us"]
    # JSON reads 1e400 as inf and NaN as nan: both are floats that are not whole numbers
    whole = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if isinstance(value, bool) or not whole or not 0 < value <= max_us:
        raise InvalidRequest(f"parameter 'slo_us' must be a whole number of microseconds in [1, {max_us}], "
                             f"got {quote(value)}")
    return int(value)


def _tensor(spec: TensorSpec, tensor: TensorIn, max_rows: int) -> tuple[bytes, int]:
    """An input's raw bytes and its number of rows (its first dimension)."""
    if tensor.datatype != spec.datatype:
        raise InvalidRequest(f"input '{spec.name}': datatype {quote(tensor.datatype)}, expected {spec.datatype}")
    shape = tensor.shape
    # bool is an int to Python; a shape of [true, 1, 16, 16] is still a malformed one
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidRequest(f"input '{spec.name}': 'shape' must be a list of integers, got {quote(shape)}")
    if len(shape) != 1 + len(spec.dims) or tuple(shape[1:]) != spec.dims or not 1 <= shape[0] <= max_rows:
        raise InvalidRequest(f"input '{spec.name}': shape {quote(list(shape))}, expected [rows, "
                             f"{', '.join(map(str, spec.dims))}] with 1 to {max_rows} rows")
    rows = shape[0]
    raw = tensor.raw if tensor.raw is not None else _encode(spec, tensor.values, rows)
    if len(raw) != spec.row_bytes * rows:
        raise InvalidRequest(f"input '{spec.name}': {len(raw)} bytes of data, expected {spec.row_bytes * rows} for "
                             f"shape {list(shape)} {spec.datatype}")
    return raw, rows


def _encode(spec: TensorSpec, values: object, rows: int) -> bytes:
    """Typed values (a JSON list, flat or nested, or gRPC contents) -> the rows' raw bytes."""
    if values is None:
        raise InvalidRequest(f"input '{spec.name}' has no data")
    if isinstance(values, (str, bytes, dict)):
        raise InvalidRequest(f"input '{spec.name}': data must be a list of numbers, got {quote(values)}")
    try:
        array = np.asarray(values, dtype=DTYPES[spec.datatype])
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:  # ragged, non-numeric, out of range
        raise InvalidRequest(f"input '{spec.name}': data is not {spec.datatype} values ({quote(str(exc))})") from None
    count = spec.row_bytes // array.itemsize * rows
    if array.size != count:
        raise InvalidRequest(f"input '{spec.name}': {array.size} values, expected {count}")
    return array.tobytes()


def _output(model: ModelInfo, output: OutputIn, binary_default: bool) -> tuple[str, bool]:
    if not isinstance(output.name, str) or output.name not in model.outputs:
        raise InvalidRequest(f"unknown output {quote(output.name)}; outputs are {list(model.outputs)}")
    binary = binary_default if output.binary is None else output.binary
    if not isinstance(binary, bool):
        raise InvalidRequest(f"output '{output.name}': 'binary_data' must be a boolean, got {quote(binary)}")
    return output.name, binary


# gRPC InferTensorContents field that carries each datatype when raw_input_contents is not used
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}


def from_row_bytes(spec: TensorSpec, raw: bytes) -> list:
    """Rows' raw bytes -> a flat list for a JSON response."""
    return np.frombuffer(raw, dtype=DTYPES[spec.datatype]).tolist()
