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
from pathlib import Path

from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.systems.bls import BlsPolicy


class CascadeModel(BlsPolicy):
    """The sidecar's policy for a cascade. Options: ``max_batch`` (requests per call to the BLS, default 32) and
    ``plan`` (a JSON plan file sent with every batch; default: the BLS's deployed plan)."""

    name = "cascade"
    file_options = frozenset({"plan"})
    time_left_param = "budget_ms"

    def __init__(self, profile: Profile, *, max_batch: int = 32, plan: str | None = None, **options) -> None:
        super().__init__(profile, max_batch=max_batch, **options)
        if plan is not None:
            try:
                self.params = (("cascade_plan", json.dumps(json.loads(Path(plan).read_text()))),)
            except (OSError, ValueError, RecursionError) as exc:
                raise ConfigError(f"cascade: cannot read the plan {plan!r}: {exc}") from exc
