"""A sum that gives the same float on every Python the project supports.

Python 3.12 made the built-in ``sum()`` of floats compensated (more precise), so a total can differ in its last
bits between 3.11 and 3.12, and a planner that compares totals (capacity against demand, one replica's share of a
rate) can flip a discrete decision. Decision: the planners add left to right, as ``sum()`` did before 3.12, so a
plan is the same on every supported Python and the pinned results (``tests/test_regression.py``) hold on each.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable


def ordered_sum(values: Iterable[float]) -> float:
    """``sum(values)`` added left to right, on every Python."""
    return functools.reduce(operator.add, values, 0)
