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
from scheduler_sidecar.core.profile import Profile


class _Greedy(HeadSlackPolicy):
    def __init__(self, profile: Profile, **options) -> None:
        super().__init__(profile, **options)
        self.sizes = profile.variants[0].latency[self.device].batch_sizes
        # [variant index in ascending accuracy][batch index] -> latency_us
        self.table = [[self.latency_us(v, b) for b in self.sizes] for v in profile.variants]
        self._fastest = min(range(len(self.table)), key=lambda s: (self.table[s][0], s))
        self.fastest_us = self.table[self._fastest][0]

    def largest_batch(self, s: int, slack_us: int) -> int:
        """Index of the largest batch of variant ``s`` within the slack (-1: none)."""
        row = self.table[s]
        i = bisect.bisect_right(row, slack_us) - 1
        while i >= 0 and row[i] > slack_us:
            i -= 1
        return i

    def most_accurate(self, b: int, slack_us: int) -> int:
        """Index of the most accurate variant whose latency at batch index ``b`` fits (-1: none)."""
        s = bisect.bisect_right(self.table, slack_us, key=lambda row: row[b]) - 1
        while s >= 0 and self.table[s][b] > slack_us:
            s -= 1
        return s

    @abc.abstractmethod
    def pick(self, slack_us: int) -> tuple[int, int] | None:
        """(variant index, batch index) within the slack; None if nothing fits."""

    def choose(self, slack_us: int) -> tuple[str, int] | None:
        picked = self.pick(slack_us)
        return (self.profile.variants[picked[0]].id, self.sizes[picked[1]]) if picked else None

    def fastest(self) -> tuple[str, int]:
        return self.profile.variants[self._fastest].id, self.sizes[0]


class MaxAcc(_Greedy):
    """Accuracy first, then batch size."""

    name = "maxacc"

    def pick(self, slack_us: int) -> tuple[int, int] | None:
        s = self.most_accurate(0, slack_us)
        return (s, self.largest_batch(s, slack_us)) if s >= 0 else None


class MaxBatch(_Greedy):
    """Batch size first (with the least accurate subnet), then accuracy."""

    name = "maxbatch"

    def pick(self, slack_us: int) -> tuple[int, int] | None:
        b = self.largest_batch(0, slack_us)
        return (self.most_accurate(b, slack_us), b) if b >= 0 else None
