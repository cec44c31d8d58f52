"""MaxAcc and MaxBatch (SuperServe A.5): greedy choices by binary search over the profile.

Both read the slack of the earliest-deadline query, like SlackFit, but order the two
decisions differently: MaxAcc first takes the most accurate subnet that fits at batch 1,
then the largest batch it can run; MaxBatch first takes the largest batch the least
accurate subnet can run, then the most accurate subnet at that batch. The binary searches
rely on the profile properties P1 (latency rises with batch size) and P2 (with accuracy);
a measured profile may break them slightly, so each choice is checked against the slack
and stepped down until it fits.
"""

from __future__ import annotations

import abc
import bisect

from scheduler_sidecar.core.policy import HeadSlackPolicy


class Table:
    """The latency of every (variant, profiled batch size) on one device kind, searched greedily."""

    def __init__(self, variant_ids: list[str], sizes: tuple[int, ...], rows: list[list[int]],
                 pick) -> None:
        self.variant_ids, self.sizes = variant_ids, sizes
        # [variant index in ascending accuracy][batch index] -> latency_us
        self.rows = rows
        self._pick = pick
        self._fastest = min(range(len(rows)), key=lambda s: (rows[s][0], s))
        self.fastest_us = rows[self._fastest][0]

    def largest_batch(self, s: int, slack_us: int) -> int:
        """Index of the largest batch of variant ``s`` within the slack (-1: none)."""
        row = self.rows[s]
        i = bisect.bisect_right(row, slack_us) - 1
        while i >= 0 and row[i] > slack_us:
            i -= 1
        return i

    def most_accurate(self, b: int, slack_us: int) -> int:
        """Index of the most accurate variant whose latency at batch index ``b`` fits (-1: none)."""
        s = bisect.bisect_right(self.rows, slack_us, key=lambda row: row[b]) - 1
        while s >= 0 and self.rows[s][b] > slack_us:
            s -= 1
        return s

    def choose(self, slack_us: int) -> tuple[str, int] | None:
        picked = self._pick(self, slack_us)
        return (self.variant_ids[picked[0]], self.sizes[picked[1]]) if picked else None

    def fastest(self) -> tuple[str, int]:
        return self.variant_ids[self._fastest], self.sizes[0]


class _Greedy(HeadSlackPolicy[Table]):
    def build_menu(self, device: str) -> Table:
        sizes = self.profile.variants[0].latency[device].batch_sizes
        rows = [[self.latency.us(v.id, b, device) for b in sizes] for v in self.profile.variants]
        return Table([v.id for v in self.profile.variants], sizes, rows, type(self).pick)

    @staticmethod
    @abc.abstractmethod
    def pick(table: Table, slack_us: int) -> tuple[int, int] | None:
        """(variant index, batch index) within the slack; None if nothing fits."""


class MaxAcc(_Greedy):
    """Accuracy first, then batch size."""

    name = "maxacc"

    @staticmethod
    def pick(table: Table, slack_us: int) -> tuple[int, int] | None:
        s = table.most_accurate(0, slack_us)
        return (s, table.largest_batch(s, slack_us)) if s >= 0 else None


class MaxBatch(_Greedy):
    """Batch size first (with the least accurate subnet), then accuracy."""

    name = "maxbatch"

    @staticmethod
    def pick(table: Table, slack_us: int) -> tuple[int, int] | None:
        b = table.largest_batch(0, slack_us)
        return (table.most_accurate(b, slack_us), b) if b >= 0 else None
