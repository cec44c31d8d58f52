import pytest

from python_backend.control import ControlError, ControlLayout, channels

LAYOUT = ControlLayout(max_depths=(2, 3), width_choices=(0.25, 0.5, 1.0))


def test_fields_are_depths_then_widths():
    """The control row is D per stage, then W per block, stage by stage."""
    assert LAYOUT.field_names() == ["D[0]", "D[1]", "W[0.0]", "W[0.1]", "W[1.0]", "W[1.1]", "W[1.2]"]


def test_canonical_form_zeroes_skipped_blocks():
    """Width entries of blocks LayerSelect skips do not change which subnet a row names."""
    assert LAYOUT.validate([1, 2, 2, 1, 0, 2, 1]) == (1, 2, 2, 0, 0, 2, 0)
    assert LAYOUT.subnet_id([1, 2, 2, 1, 0, 2, 1]) == LAYOUT.subnet_id([1, 2, 2, 0, 0, 2, 2]) == "d12-w2.02"


def test_subnet_id_round_trips():
    """Every id parses back to its canonical row."""
    for row in [LAYOUT.largest(), LAYOUT.smallest(), (2, 2, 1, 0, 2, 2, 0)]:
        assert LAYOUT.row_from_id(LAYOUT.subnet_id(row)) == LAYOUT.validate(row)


@pytest.mark.parametrize(
    "row, message",
    [
        ([0, 1, 0, 0, 0, 0, 0], r"D\[0\]=0: depth of stage 0 must be in 1..2"),
        ([1, 4, 0, 0, 0, 0, 0], r"D\[1\]=4"),
        ([1, 1, 3, 0, 0, 0, 0], r"W\[0.0\]=3: width index must be in 0..2"),
        ([1, 1, 0, 0, -1, 0, 0], r"W\[1.0\]=-1"),
        ([1, 1, 0], r"has 3 values, expected 7"),
    ],
)
def test_invalid_rows_name_the_field(row, message):
    """Each bad row is rejected with a message that names the offending field."""
    with pytest.raises(ControlError, match=message):
        LAYOUT.validate(row)


def test_bad_ids_are_rejected():
    with pytest.raises(ControlError, match="not a subnet id"):
        LAYOUT.row_from_id("d12-w2.0")


def test_weight_slice_channel_count_is_the_ceiling():
    """WeightSlice keeps ceil(W * C) channels (SuperServe 3.1), at least one."""
    assert [channels(w, 10) for w in (0.25, 0.5, 0.75, 1.0)] == [3, 5, 8, 10]
    assert channels(0.75, 32) == 24
    assert channels(0.01, 4) == 1
