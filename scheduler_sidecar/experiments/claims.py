"""A reproduction's claims as data: each of the paper's statements, the paper's number, ours, and whether it holds,
all computed from the run. ``summary.md`` is written from them and the tests hold them, so an outcome that changes
changes a claim, and a test fails until the list is updated knowingly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Claim:
    """One statement of the paper, checked on this run."""

    id: str  # stable: what the tests hold (``fig4.fewest_violations.x1.6``)
    statement: str  # the paper's statement, in our words
    paper: str  # the paper's number or order, as it states it
    ours: str  # what this run measured
    holds: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "holds", bool(self.holds))  # a numpy comparison's bool_ is no JSON

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def ranked(values: Mapping[str, float], *, descending: bool = False) -> list[str]:
    """The names ordered by their values (ascending unless ``descending``); ties keep the mapping's order."""
    return sorted(values, key=lambda name: -values[name] if descending else values[name])


def order_text(values: Mapping[str, float], *, descending: bool = False, digits: int = 4) -> str:
    """``a (0.01) < b (0.2)``: the names in order with their values."""
    sign = " > " if descending else " < "
    return sign.join(f"{name} ({values[name]:.{digits}g})" for name in ranked(values, descending=descending))


def least(id: str, statement: str, paper: str, values: Mapping[str, float], expected: str, *,
          most: bool = False, strict: bool = False) -> Claim:
    """``expected`` has the smallest value (the largest with ``most``); a tie with it counts as holding, unless
    ``strict`` (for a claim that a tie, such as every system at 0 violations, does not show)."""
    best = max(values.values()) if most else min(values.values())
    others = [v for name, v in values.items() if name != expected]
    holds = values[expected] == best and not (strict and best in others)
    return Claim(id, statement, paper, order_text(values, descending=most), holds)


def in_order(id: str, statement: str, paper: str, values: Mapping[str, float], expected: Sequence[str], *,
             descending: bool = False) -> Claim:
    """The values of ``expected`` are ordered as listed (ascending unless ``descending``; ties hold)."""
    seq = [values[name] for name in expected]
    holds = all(a >= b if descending else a <= b for a, b in zip(seq, seq[1:]))
    return Claim(id, statement, paper, order_text({n: values[n] for n in expected}, descending=descending), holds)


def at_least(id: str, statement: str, paper: str, value: float, bound: float, unit: str = "") -> Claim:
    """``value >= bound``."""
    return Claim(id, statement, paper, f"{value:.4g}{unit}", value >= bound)


def table(claims: Iterable[Claim]) -> str:
    """The claims as a markdown table, the outcome first."""
    rows = ["| holds | claim | paper | ours |", "|---|---|---|---|"]
    rows += [f"| {'yes' if c.holds else '**no**'} | {c.statement} | {c.paper} | {c.ours} |" for c in claims]
    return "\n".join(rows)
