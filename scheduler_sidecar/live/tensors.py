"""Tensors as the sidecar moves them: fixed-size rows of raw little-endian bytes, one per query.

A batch is the concatenation of its rows and a batch's output splits back into equal rows, so
no tensor is decoded on the hot path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

# KServe v2 datatype -> numpy dtype (little-endian); BYTES has no fixed row size and is not served
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t).newbyteorder("<") for name, t in {
        "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
        "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
        "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    }.items()
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
