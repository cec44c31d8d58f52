"""HybridServe staged: a cascade whose models are logical models of their own, as the paper serves it (§V).

Each model of the cascade is a logical model of the sidecar with its own queue and policy, served on its own Triton
model's instances (``slots = "per_model"``); the model that clients call is the cascade's first. When a batch comes
back, each of its requests is routed by :func:`python_backend.cascade.route` on its own answer: a confident one is
answered there and then, and one that goes on becomes a query of the next model's logical model, with the request's
deadline, so the models' replicas run in parallel and an escalation waits in the next model's queue. The BLS model
(:mod:`python_backend.cascade_bls`), by contrast, holds a batch through every model and answers it after the last.
The simulator (:mod:`scheduler_sidecar.experiments.hybridserve.simulation`) runs the same system: per-model queues,
the same routing, the same SLO-aware forwarding (:func:`python_backend.cascade.answered_early`).

The plan is the BLS model's format (``models``, ``thresholds``, ``temperatures``, ``skip``, ``exec_ms``), read from
the file a logical model's ``cascade`` key names; ``output`` names the models' logits (default ``LOGITS``). A
client's answer is the answering model's own output, and its response says that model (the variant that served it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from python_backend.cascade import answered_early, check_plan, confidence, route
from scheduler_sidecar.errors import ConfigError

# (a query's input rows, its output rows, its time left in us) -> (next logical model, its input rows), or None
FollowUp = Callable[[dict[str, bytes], dict[str, bytes], int], "tuple[str, dict[str, bytes]] | None"]


@dataclass(frozen=True)
class StagedCascade:
    """A cascade plan served stage by stage: ``served[m]`` is the logical model that runs the Triton model ``m``."""

    models: tuple[str, ...]
    thresholds: tuple[float, ...]
    temperatures: tuple[float, ...]
    skip: bool
    exec_ms: tuple[float, ...]  # each model's batch-1 time: what going on costs at least
    served: Mapping[str, str]
    output: str = "LOGITS"

    @classmethod
    def load(cls, path: Path | str, served: Mapping[str, str]) -> StagedCascade:
        """The plan at ``path``, checked against the logical models that serve each Triton model (``served``)."""
        try:
            plan = json.loads(Path(path).read_text())
        except (OSError, ValueError, RecursionError) as exc:
            raise ConfigError(f"cascade: cannot read the plan {str(path)!r}: {exc}") from exc
        return cls.from_plan(plan, served)

    @classmethod
    def from_plan(cls, plan: object, served: Mapping[str, str]) -> StagedCascade:
        # first what the config lacks: a model no logical model serves has no profile to check the plan against
        named = plan.get("models") if isinstance(plan, dict) else None
        missing = [m for m in named if isinstance(m, str) and m not in served] if isinstance(named, list) else []
        if missing:
            raise ConfigError(f"cascade: no logical model serves {missing}: give each cascade model a [[models]] "
                              "entry whose profile runs it")
        try:
            plan = check_plan(plan)  # the BLS model's checks: the format is one
        except ValueError as exc:
            raise ConfigError(f"cascade: {exc}") from None
        models = plan["models"]
        if len({served[m] for m in models}) != len(models):
            raise ConfigError(f"cascade: each of {models} needs a logical model of its own, got "
                              f"{[served[m] for m in models]}")
        if not isinstance(plan.get("output", "LOGITS"), str):
            raise ConfigError(f"cascade: give the plan's output a name (a string), got {plan['output']!r}")
        return cls(tuple(models), tuple(float(t) for t in plan["thresholds"]),
                   tuple(float(plan["temperatures"][m]) for m in models), plan["skip"],
                   tuple(float(plan["exec_ms"].get(m, 0.0)) for m in models), {m: served[m] for m in models},
                   plan.get("output", "LOGITS"))

    def check_tensors(self, tensors: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]) -> None:
        """That every model's inputs are the first's (an escalation passes a request's inputs on as they are) and
        that each model but the last has the plan's ``output`` as FP32 logits; ``tensors`` maps each logical model
        to its (inputs, outputs), each name -> a tensor spec (``name``, ``datatype``, ``dims``)."""
        names = [self.served[m] for m in self.models]
        first = {t.name: (t.datatype, t.dims) for t in tensors[names[0]][0].values()}
        for name in names[1:]:
            if {t.name: (t.datatype, t.dims) for t in tensors[name][0].values()} != first:
                raise ConfigError(f"cascade: {name!r} takes other inputs than {names[0]!r} ({first}); an escalation "
                                  "passes a request's inputs on as they are")
        for name in names[:-1]:
            out = tensors[name][1].get(self.output)
            if out is None or out.datatype != "FP32":
                raise ConfigError(f"cascade: {name!r} has no FP32 output {self.output!r} to route on (it has "
                                  f"{ {t.name: t.datatype for t in tensors[name][1].values()} }); the plan's "
                                  "output names it")

    def follow_ups(self) -> dict[str, FollowUp]:
        """The follow-up hook of each logical model that runs a cascade model but the last."""
        return {self.served[m]: self._hook(i) for i, m in enumerate(self.models[:-1])}

    def _hook(self, i: int) -> FollowUp:
        last, cost_us = len(self.models) - 1, [ms * 1000 for ms in self.exec_ms]
        threshold, temperature = np.asarray(self.thresholds[i]), self.temperatures[i]

        def follow_up(inputs: dict[str, bytes], outputs: dict[str, bytes], left_us: int
                      ) -> tuple[str, dict[str, bytes]] | None:
            logits = np.frombuffer(outputs[self.output], np.float32).reshape(1, -1)
            _, conf = confidence(logits, temperature)
            onward = route(i, conf, threshold, last, self.skip)
            if answered_early(onward, left_us, cost_us)[0] or onward[0] < 0:
                return None
            return self.served[self.models[int(onward[0])]], inputs

        return follow_up
