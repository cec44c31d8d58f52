"""The claim checks the reproductions build their claims with."""

from __future__ import annotations

import pytest

from scheduler_sidecar.experiments.claims import at_least, in_order, least, table


def test_least_holds_for_the_smallest_and_a_tie_unless_strict():
    assert least("a", "s", "p", {"x": 1.0, "y": 2.0}, "x").holds
    assert not least("a", "s", "p", {"x": 3.0, "y": 2.0}, "x").holds
    assert least("a", "s", "p", {"x": 0.0, "y": 0.0}, "x").holds
    assert not least("a", "s", "p", {"x": 0.0, "y": 0.0}, "x", strict=True).holds
    assert least("a", "s", "p", {"x": 0.0, "y": 1.0}, "x", strict=True).holds
    most = least("a", "s", "p", {"x": 5.0, "y": 2.0}, "x", most=True)
    assert most.holds and most.ours == "x (5) > y (2)"


def test_in_order_and_at_least():
    assert in_order("a", "s", "p", {"x": 1.0, "y": 1.0, "z": 2.0}, ["x", "y", "z"]).holds
    assert not in_order("a", "s", "p", {"x": 1.0, "y": 3.0, "z": 2.0}, ["x", "y", "z"]).holds
    assert in_order("a", "s", "p", {"x": 3.0, "y": 2.0}, ["x", "y"], descending=True).holds
    assert at_least("a", "s", "p", 2.0, 2.0).holds and not at_least("a", "s", "p", 1.9, 2.0).holds


def test_the_table_names_every_claim_and_marks_the_ones_that_fail():
    text = table([at_least("a", "first", "1", 2.0, 1.0), at_least("b", "second", "3", 2.0, 3.0, "x")])
    assert "| yes | first | 1 | 2 |" in text and "| **no** | second | 3 | 2x |" in text


def test_causes_are_classed_and_counted():
    held = at_least("a", "first", "1", 2.0, 1.0).because("inputs: never shown")
    failed = at_least("b", "second", "3", 2.0, 3.0, "x").because("inputs: the profile is slower")
    assert held.cause == "" and failed.cause == "inputs: the profile is slower"
    text = table([held, failed, at_least("c", "third", "3", 1.0, 3.0)])
    assert text.startswith("1 of 3 hold; failing, by cause: inputs 1, unexamined 1.")
    assert "| **no** | second | 3 | 2x | inputs: the profile is slower |" in text
    with pytest.raises(ValueError, match="cause"):
        failed.because("a hunch")
