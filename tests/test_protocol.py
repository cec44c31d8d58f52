"""The one check every inference request passes, whichever front end it came through (issue 14's cases)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_sidecar.errors import InvalidRequest
from scheduler_sidecar.live.tensors import TensorSpec
from scheduler_sidecar.server.protocol import (
    QUOTE_CHARS,
    Limits,
    ModelInfo,
    OutputIn,
    TensorIn,
    parse_request,
    quote,
)

MODEL = ModelInfo("m", {"INPUT": TensorSpec("INPUT", "FP32", (2, 2))}, {"LOGITS": TensorSpec("LOGITS", "FP32", (3,))},
                  default_slo_us=50_000)
LIMITS = Limits(max_request_bytes=1 << 20, max_slo_us=60_000_000)
RAW = np.arange(4, dtype=np.float32).tobytes()


def good(**changes) -> TensorIn:
    fields = {"name": "INPUT", "datatype": "FP32", "shape": [1, 2, 2], "raw": RAW, **changes}
    return TensorIn(**fields)


def parse(parameters=None, inputs=None, outputs=None):
    return parse_request(MODEL, parameters or {}, [good()] if inputs is None else inputs, outputs, LIMITS)


def test_a_well_formed_request_comes_back_as_rows_slo_and_outputs():
    checked = parse({"slo_us": 20_000.0, "binary_data_output": True})
    assert checked.inputs == {"INPUT": RAW} and checked.count == 1 and checked.rows(MODEL) == [{"INPUT": RAW}]
    assert checked.slo_us == 20_000 and checked.outputs == (("LOGITS", True),)
    typed = parse(inputs=[good(raw=None, values=[[0, 1], [2, 3]])], outputs=[OutputIn("LOGITS", False)])
    assert typed.inputs == {"INPUT": RAW} and typed.slo_us == 50_000 and typed.outputs == (("LOGITS", False),)


def test_a_request_of_several_rows_is_split_into_one_query_input_per_row():
    rows = [np.full(4, i, np.float32).tobytes() for i in range(3)]
    checked = parse(inputs=[good(shape=[3, 2, 2], raw=b"".join(rows))])
    assert checked.count == 3 and checked.rows(MODEL) == [{"INPUT": r} for r in rows]
    typed = parse(inputs=[good(shape=[3, 2, 2], raw=None, values=[[[i, i], [i, i]] for i in range(3)])])
    assert typed.rows(MODEL) == checked.rows(MODEL)


def test_inputs_with_different_row_counts_are_invalid():
    two = ModelInfo("m", {"A": TensorSpec("A", "FP32", (2,)), "B": TensorSpec("B", "FP32", (2,))}, {}, 50_000)
    inputs = [TensorIn("A", "FP32", [1, 2], raw=bytes(8)), TensorIn("B", "FP32", [2, 2], raw=bytes(16))]
    with pytest.raises(InvalidRequest, match="input 'B' has 2 rows, the others 1"):
        parse_request(two, {}, inputs, None, LIMITS)


@pytest.mark.parametrize("slo", [10**16, 2**63 - 1, math.inf, -math.inf, math.nan, float("1e400"), 0, -5, 1.5,
                                 True, "100", None, [1], 60_000_001])
def test_slo_outside_its_range_or_not_a_whole_number_is_invalid(slo):
    with pytest.raises(InvalidRequest, match="slo_us"):
        parse({"slo_us": slo})


@pytest.mark.parametrize(("tensor", "message"), [
    (good(shape=[True, 2, 2]), "list of integers"),
    (good(shape="1,2,2"), "list of integers"),
    (good(shape=[0, 2, 2]), r"1 to 64 rows"),
    (good(shape=[65, 2, 2], raw=RAW * 65), r"1 to 64 rows"),
    (good(shape=[1, 2, 3]), r"expected \[rows, 2, 2\]"),
    (good(shape=[1, 4]), r"expected \[rows, 2, 2\]"),
    (good(shape=[2, 2, 2]), "16 bytes of data, expected 32"),
    (good(datatype="FP16"), "datatype"),
    (good(datatype=["FP32"]), "datatype"),
    (good(raw=RAW[:-1]), "bytes of data"),
    (good(raw=None, values=None), "no data"),
    (good(raw=None, values="abcd"), "list of numbers"),
    (good(raw=None, values={"a": 1}), "list of numbers"),
    (good(raw=None, values=[10**400, 1, 2, 3]), "FP32"),
    (good(raw=None, values=[[0, 1], [2]]), "FP32"),
    (good(raw=None, values=[0, 1, 2]), "3 values"),
    (good(raw=None, values=["x", 1, 2, 3]), "FP32"),
    (good(name="x" * 100_000), "unexpected input"),
    (good(name=7), "unexpected input"),
])
def test_malformed_inputs_are_invalid_and_name_the_problem(tensor, message):
    with pytest.raises(InvalidRequest, match=message) as caught:
        parse(inputs=[tensor])
    assert len(str(caught.value)) < 400  # a client's 100 KB name is quoted, not echoed


def test_a_deeply_nested_data_list_is_invalid():
    nested: list = [0.0]
    for _ in range(10_000):
        nested = [nested]
    with pytest.raises(InvalidRequest, match="FP32"):
        parse(inputs=[good(raw=None, values=nested)])


def test_inputs_must_be_given_once_each_and_outputs_must_exist():
    with pytest.raises(InvalidRequest, match="expects inputs"):
        parse(inputs=[])
    with pytest.raises(InvalidRequest, match="given twice"):
        parse(inputs=[good(), good()])
    with pytest.raises(InvalidRequest, match="unknown output"):
        parse(outputs=[OutputIn("PROBS")])
    with pytest.raises(InvalidRequest, match="binary_data"):
        parse(outputs=[OutputIn("LOGITS", "yes")])
    with pytest.raises(InvalidRequest, match="binary_data_output"):
        parse({"binary_data_output": 1})


def test_quote_cuts_long_values():
    assert quote("abc") == "'abc'"
    long = quote("x" * 10_000)
    assert len(long) < QUOTE_CHARS + 30 and long.endswith("(10002 chars)")
