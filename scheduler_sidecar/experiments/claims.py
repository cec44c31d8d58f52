"""A reproduction's claims as data: each of the paper's statements, the paper's number, ours, and whether it holds,
all computed from the run. ``summary.md`` is written from them and the tests hold them, so an outcome that changes
changes a claim, and a test fails until the list is updated knowingly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

# why a claim fails: the implementation or its settings differ from the paper's (fixed where found); the profile,
# trace or hardware differ; the paper's own artifact or text disagrees; or not yet found (the cause says what was
# tried)
CAUSES = ("ours", "inputs", "the paper", "unclassified")


@dataclass(frozen=True)
class Claim:
    """One statement of the paper, checked on this run."""

    id: str  # stable: what the tests hold (``fig4.fewest_violations.x1.6``)
    statement: str  # the paper's statement, in our words
    paper: str  # the paper's number or order, as it states it
    ours: str  # what this run measured
    holds: bool
    cause: str = ""  # a failing claim's class (CAUSES) and what shows it: "inputs: ..."; "" while unexamined

    def __post_init__(self) -> None:
        object.__setattr__(self, "holds", bool(self.holds))  # a numpy comparison's bool_ is no JSON
        if self.cause and self.cause.split(":")[0] not in CAUSES:
            raise ValueError(f"a claim's cause starts with one of {CAUSES}: {self.cause!r}")

    def because(self, cause: str) -> Claim:
        """This claim with ``cause`` if it fails; a claim that holds needs none."""
        return self if self.holds else replace(self, cause=cause)

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
    """The claims as a markdown table, the outcome first; with a cause column once any failing claim has one, and
    then a line counting the failing ones by cause."""
    claims = list(claims)
    if not any(c.cause for c in claims):
        rows = ["| holds | claim | paper | ours |", "|---|---|---|---|"]
        rows += [f"| {'yes' if c.holds else '**no**'} | {c.statement} | {c.paper} | {c.ours} |" for c in claims]
        return "\n".join(rows)
    failing = Counter((c.cause.split(":")[0] if c.cause else "unexamined") for c in claims if not c.holds)
    rows = [f"{sum(c.holds for c in claims)} of {len(claims)} hold; failing, by cause: "
            + (", ".join(f"{k} {failing[k]}" for k in (*CAUSES, "unexamined") if failing[k]) or "none") + ".", "",
            "| holds | claim | paper | ours | cause |", "|---|---|---|---|---|"]
    rows += [f"| {'yes' if c.holds else '**no**'} | {c.statement} | {c.paper} | {c.ours} | {c.cause} |"
             for c in sorted(claims, key=lambda c: (c.holds, (*CAUSES, "").index(c.cause.split(":")[0])))]
    return "\n".join(rows)
