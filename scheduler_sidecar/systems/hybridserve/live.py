"""HybridServe live: the sidecar in front of the cascade's BLS model (:mod:`python_backend.cascade_bls`).

A cascade is a logical model with an SLO. The sidecar holds its queue and sends each free Triton the head
batch, earliest deadline first, with the time the first request has left (``budget_ms``): where that cannot pay
for the next model, the BLS answers with the model at hand and says so (an extension: the paper has no SLO).
The thresholds are the BLS's deployed plan, or the plan file named by the ``plan`` option (an operator's: the
mode, AP or EO, is a file the planner wrote), sent with every batch. Replicas are the models' Triton instance
counts, set at deployment (:func:`.planner.OperatingPoint.replicas`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import EMPTY, Decision, Dispatch, WorkerState
from scheduler_sidecar.errors import ConfigError


class CascadeModel(Policy):
    """The sidecar's policy for a cascade. Options: ``max_batch`` (requests per call to the BLS, default 32, at most
    the profile's largest batch) and
    ``plan`` (a JSON plan file sent with every batch; default: the BLS's deployed plan)."""

    name = "cascade"
    file_options = frozenset({"plan"})

    def __init__(self, profile: Profile, *, max_batch: int = 32, plan: str | None = None, **options) -> None:
        super().__init__(profile, **options)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"cascade: max_batch must be a whole number >= 1, got {max_batch!r}")
        self.variant = profile.variants[-1]
        self.max_batch = min(max_batch, self.variant.latency[self.device].batch_sizes[-1])  # what it is profiled for
        self.params: tuple[tuple[str, object], ...] = ()
        if plan is not None:
            try:
                self.params = (("cascade_plan", json.dumps(json.loads(Path(plan).read_text()))),)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cascade: cannot read the plan {plan!r}: {exc}") from exc

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        if not queue:
            return EMPTY
        worker = next((w for w in workers if w.is_free and w.holds(self.variant.actuation.model)), None)
        if worker is None:
            return EMPTY
        dropped = self.drop_or_serve(now_us, queue, self.latency_us(self.variant, 1, worker.device))
        if dropped:
            return dropped
        batch = queue.head(self.max_batch)
        left_ms = self.slack_us(now_us, batch[0]) / 1000
        return Decision((Dispatch(worker.id, self.variant.id, tuple(q.id for q in batch),
                                  (*self.params, ("budget_ms", left_ms))),))
