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
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from python_backend.cascade import answered_early, confidence, route
from scheduler_sidecar.errors import ConfigError

# (a query's input rows, its output rows, its time left in us) -> (next logical model, its input rows), or None
FollowUp = Callable[[dict[str, bytes], dict[str, bytes], int], "tuple[str, dict[str, bytes]] | None"]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
        if not isinstance(plan, dict):
            raise ConfigError("cascade: the plan must be a JSON object")
        models, thresholds = plan.get("models"), plan.get("thresholds")
        if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models) \
                or len(set(models)) != len(models):
            raise ConfigError("cascade: the plan's models must be a non-empty list of distinct model names")
        missing = [m for m in models if m not in served]
        if missing:
            raise ConfigError(f"cascade: no logical model serves {missing}: give each cascade model a [[models]] "
                              "entry whose profile runs it")
        if len({served[m] for m in models}) != len(models):
            raise ConfigError(f"cascade: each of {models} needs a logical model of its own, got "
                              f"{[served[m] for m in models]}")
        if not isinstance(thresholds, list) or len(thresholds) != len(models) - 1 or not all(
                _number(t) and 0 <= t <= 1 for t in thresholds):
            raise ConfigError(f"cascade: the plan needs {len(models) - 1} thresholds in [0, 1]")
        temperatures, exec_ms = plan.get("temperatures", {}), plan.get("exec_ms", {})
        if not isinstance(temperatures, dict) or not all(_number(temperatures.get(m)) and temperatures[m] > 0
                                                         for m in models):
            raise ConfigError("cascade: the plan needs a positive temperature for each of its models")
        if not isinstance(exec_ms, dict) or not all(_number(v) and v >= 0 for v in exec_ms.values()):
            raise ConfigError("cascade: the plan's exec_ms must map models to times >= 0")
        if not isinstance(plan.get("skip", False), bool) or not isinstance(plan.get("output", "LOGITS"), str):
            raise ConfigError("cascade: the plan's skip must be true or false, and its output a name")
        return cls(tuple(models), tuple(float(t) for t in thresholds), tuple(float(temperatures[m]) for m in models),
                   plan.get("skip", False), tuple(float(exec_ms.get(m, 0.0)) for m in models),
                   {m: served[m] for m in models}, plan.get("output", "LOGITS"))

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
