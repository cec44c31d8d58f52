"""The sidecar's policy for a logical model that one Triton BLS model serves (a Loki pipeline, a HybridServe
cascade): the BLS does the stages inside Triton, the sidecar holds the queue."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import EMPTY, Decision, Dispatch, Query, WorkerState
from scheduler_sidecar.errors import ConfigError


class BlsPolicy(Policy):
    """Each free Triton holding the BLS model gets the queue's head batch, earliest deadline first, of at most
    ``max_batch`` requests (and at most the profile's largest batch), with the request parameters
    :meth:`batch_params` gives (the plan, time budgets: the system's own)."""

    def __init__(self, profile: Profile, *, max_batch: int, **options) -> None:
        super().__init__(profile, **options)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"{self.name}: max_batch must be a whole number >= 1, got {max_batch!r}")
        self.variant = profile.variants[-1]
        self.max_batch = min(max_batch, self.variant.latency[self.device].batch_sizes[-1])

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        if not queue:
            return EMPTY
        worker = next((w for w in workers if w.is_free and self.serves(w)), None)
        if worker is None:
            return EMPTY
        dropped = self.drop_or_serve(now_us, queue, self.latency_us(self.variant, 1, worker.device))
        if dropped:
            return dropped
        batch = queue.head(self.max_batch)
        return Decision((Dispatch(worker.id, self.variant.id, tuple(q.id for q in batch),
                                  self.batch_params(now_us, batch, worker)),))

    def serves(self, worker: WorkerState) -> bool:
        """Whether ``worker`` may run a batch: it holds the BLS model."""
        return worker.holds(self.variant.actuation.model)

    @abc.abstractmethod
    def batch_params(self, now_us: int, batch: Sequence[Query], worker: WorkerState) -> tuple[tuple[str, object], ...]:
        """The request parameters ``batch`` goes to ``worker`` with."""
