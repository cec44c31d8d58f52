"""The SubNetAct control vector: its layout, validation and canonical subnet ids.

A control row is ``D_1..D_M`` (blocks run in each of the M stages) followed
by ``W_1..W_K`` (a width-choice index for each of the K blocks of the full supernet, stage
by stage). Width entries of blocks that LayerSelect skips have no effect; the canonical
form sets them to 0 so that one subnet has exactly one key.

Subnet ids are readable and reversible: ``d142-w3.3210.21`` means depths (1, 4, 2) and
the width indices of the *active* blocks, stage by stage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass


class ControlError(ValueError):
    """A control row that names no valid subnet; the message names the offending field."""


@dataclass(frozen=True)
class ControlLayout:
    """The shape of a supernet's control space."""

    max_depths: tuple[int, ...]  # per stage: blocks in the full supernet
    width_choices: tuple[float, ...]  # W value -> fraction of a block's middle channels
    min_depth: int = 1  # LayerSelect never skips a stage's first block (it changes resolution)

    def __post_init__(self) -> None:
        if not self.max_depths or min(self.max_depths) < self.min_depth:
            raise ValueError(f"max_depths {self.max_depths} must all be >= min_depth {self.min_depth}")
        if max(self.max_depths) > 9 or len(self.width_choices) > 10:
            raise ValueError("subnet ids use one digit per depth and width choice")

    @property
    def num_stages(self) -> int:
        return len(self.max_depths)

    @property
    def num_blocks(self) -> int:
        return sum(self.max_depths)

    @property
    def num_fields(self) -> int:
        return self.num_stages + self.num_blocks

    def block_index(self, stage: int, block: int) -> int:
        """Position of (stage, block) among the K width fields."""
        return sum(self.max_depths[:stage]) + block

    def field_name(self, index: int) -> str:
        """Human name of control field ``index``: ``D[s]`` or ``W[s.b]``."""
        if index < self.num_stages:
            return f"D[{index}]"
        k = index - self.num_stages
        for stage, depth in enumerate(self.max_depths):
            if k < depth:
                return f"W[{stage}.{k}]"
            k -= depth
        raise IndexError(index)

    def field_names(self) -> list[str]:
        return [self.field_name(i) for i in range(self.num_fields)]

    def validate(self, row: Sequence[int]) -> tuple[int, ...]:
        """Check ``row`` and return its canonical form; raise ControlError naming the bad field."""
        if len(row) != self.num_fields:
            raise ControlError(f"has {len(row)} values, expected {self.num_fields} ({self.describe()})")
        values = [int(v) for v in row]
        for stage, depth in enumerate(values[: self.num_stages]):
            if not self.min_depth <= depth <= self.max_depths[stage]:
                raise ControlError(
                    f"{self.field_name(stage)}={depth}: depth of stage {stage} must be in "
                    f"{self.min_depth}..{self.max_depths[stage]}"
                )
        for i in range(self.num_stages, self.num_fields):
            if not 0 <= values[i] < len(self.width_choices):
                raise ControlError(
                    f"{self.field_name(i)}={values[i]}: width index must be in 0..{len(self.width_choices) - 1}"
                )
        for stage, depth in enumerate(values[: self.num_stages]):
            for block in range(depth, self.max_depths[stage]):
                values[self.num_stages + self.block_index(stage, block)] = 0
        return tuple(values)

    def subnet_id(self, row: Sequence[int]) -> str:
        canon = self.validate(row)
        depths = canon[: self.num_stages]
        groups = []
        for stage, depth in enumerate(depths):
            start = self.num_stages + self.block_index(stage, 0)
            groups.append("".join(str(w) for w in canon[start : start + depth]))
        return f"d{''.join(map(str, depths))}-w{'.'.join(groups)}"

    def row_from_id(self, subnet_id: str) -> tuple[int, ...]:
        try:
            d_part, w_part = subnet_id.split("-w")
            depths = [int(c) for c in d_part.removeprefix("d")]
            groups = w_part.split(".")
            row = depths + [0] * self.num_blocks
            for stage, group in enumerate(groups):
                for block, c in enumerate(group):
                    row[self.num_stages + self.block_index(stage, block)] = int(c)
            if len(depths) != self.num_stages or len(groups) != self.num_stages:
                raise ValueError
            if any(len(g) != d for g, d in zip(groups, depths)):
                raise ValueError
        except (ValueError, IndexError):
            raise ControlError(f"{subnet_id!r} is not a subnet id of this supernet ({self.describe()})") from None
        return self.validate(row)

    def largest(self) -> tuple[int, ...]:
        top = len(self.width_choices) - 1
        return tuple(self.max_depths) + (top,) * self.num_blocks

    def smallest(self) -> tuple[int, ...]:
        return self.validate((self.min_depth,) * self.num_stages + (0,) * self.num_blocks)

    def describe(self) -> str:
        return (
            f"D[0..{self.num_stages - 1}] depths, then W[stage.block] width indices into "
            f"{list(self.width_choices)} for {list(self.max_depths)} blocks"
        )

    def to_json(self) -> str:
        return json.dumps(
            {"max_depths": list(self.max_depths), "width_choices": list(self.width_choices),
             "min_depth": self.min_depth, "fields": self.field_names()}
        )

    @classmethod
    def from_json(cls, text: str) -> ControlLayout:
        raw = json.loads(text)
        return cls(tuple(raw["max_depths"]), tuple(raw["width_choices"]), raw.get("min_depth", 1))


def channels(width_fraction: float, max_channels: int) -> int:
    """WeightSlice keeps the first ceil(W_k * C_k) channels (SuperServe section 3.1)."""
    # the epsilon keeps 0.75 * 32 at 24 despite binary rounding
    return max(1, math.ceil(width_fraction * max_channels - 1e-9))

