"""HybridServe's run-time routing rule (§IV), shared by the cascade BLS model and the offline evaluator, so that the
two cannot disagree.

A cascade is an ordered list of models, small to large. At model ``i`` a sample's confidence is
``max(softmax(z / T_i)) ** CONFIDENCE_POWER``; at or above the threshold ``t_i`` the model answers (ties answer:
§IV-B forwards "scores below a threshold"), the last model always answers, and below it the sample goes on.

Where it goes on (§IV-C, skip connections). Decision: the paper's text, not Alg. 2's line 5 (LogUniform skip
thresholds, which is undefined at 0 and random): the interval [0, t_i) is split uniformly into as many bins as
model ``i`` has successors; the top bin (just below t_i) goes to the next model and the bottom one to the
largest, as Fig. 3's c = 0.7 -> successor, c = 0.2 -> largest. Without skips every sample goes to ``i + 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# §IV-A prints f(P) = max(P^2); on probabilities squaring is monotone, so it only reparametrises the thresholds
CONFIDENCE_POWER = 2.0
ANSWER = -1  # what route() returns for a sample the model answers
# why a model answered (the cascade BLS model's REASON output)
CONFIDENT, LAST, EARLY = 0, 1, 2  # at or above its threshold; the last model; no time left for the next


def confidence(logits: np.ndarray, temperature: float, power: float = CONFIDENCE_POWER) -> tuple[np.ndarray, np.ndarray]:
    """(labels, confidences) of ``logits`` [N, classes] at ``temperature`` (temperature scaling keeps the argmax)."""
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return logits.argmax(axis=1), p.max(axis=1) ** power


def route(i: int, conf: np.ndarray, thresholds: np.ndarray, last: int, skip: bool) -> np.ndarray:
    """Where the samples at model ``i`` with confidences ``conf`` go: ANSWER, or the index of the next model.

    ``thresholds`` is model ``i``'s threshold, one per sample or one for all (a scalar array), or anything that
    broadcasts against ``conf`` (the offline evaluator's [K, 1] against [K, N] or [N]); ``last`` is the last
    model's index.
    """
    t = np.asarray(thresholds, dtype=np.float64)
    # int8, as a cascade has far fewer than 127 models: the planner's search routes some hundred thousand threshold
    # vectors over every sample, and the walk is memory-bound
    if i == last:
        return np.full(np.broadcast_shapes(conf.shape, t.shape), ANSWER, dtype=np.int8)
    successors = last - i
    onward: np.ndarray | np.int8 = np.int8(i + 1)
    if skip and successors > 1:
        width = np.where(t > 0, t / successors, 1.0)
        bin_ = np.clip(np.floor(conf / width), 0, successors - 1).astype(np.int8)  # 0: just above 0, top: below t_i
        onward = last - bin_
    return np.where(conf >= t, np.int8(ANSWER), onward)


def answered_early(onward: np.ndarray, left: np.ndarray | float, cost: Sequence[float]) -> np.ndarray:
    """SLO-aware forwarding (an extension; the paper has no SLO): which of the samples ``route`` sent on have less
    time ``left`` than their next model's batch-1 time (``cost``, indexed by model, in the same unit), and so are
    answered by the model at hand. The BLS model, the simulator and the sidecar's staged cascade all apply this."""
    going = onward != ANSWER
    need = np.where(going, np.asarray(cost, dtype=np.float64)[np.where(going, onward, 0)], 0.0)
    return going & (need > left)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_plan(plan: object, known: Sequence[str] | None = None) -> dict:
    """A cascade's plan, as the BLS model and the sidecar's staged cascade read it: distinct models (of ``known``,
    where given), a threshold in [0, 1] between each pair, a positive temperature each, where given a non-negative
    batch-1 time each (``exec_ms``) and ``skip`` true or false; anything else raises ValueError. The plan, with its
    defaults filled in (no skips, no times)."""
    if not isinstance(plan, dict):
        raise ValueError("the plan must be a JSON object")
    models, thresholds = plan.get("models"), plan.get("thresholds")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ValueError("the plan's models must be a non-empty list of model names")
    if len(set(models)) != len(models) or (known is not None and set(models) - set(known)):
        raise ValueError("the plan's models must be distinct" + ("" if known is None else
                         f" models of this cascade {list(known)}") + f", got {models}")
    if not isinstance(thresholds, list) or len(thresholds) != len(models) - 1 or not all(
            _number(t) and 0 <= t <= 1 for t in thresholds):
        raise ValueError(f"the plan needs {len(models) - 1} thresholds in [0, 1]")
    temperatures = plan.get("temperatures", {})
    if not isinstance(temperatures, dict) or not all(_number(temperatures.get(m)) and temperatures[m] > 0
                                                     for m in models):
        raise ValueError("the plan needs a positive temperature for each of its models")
    exec_ms = plan.get("exec_ms", {})
    if not isinstance(exec_ms, dict) or not all(_number(v) and v >= 0 for v in exec_ms.values()):
        raise ValueError("the plan's exec_ms must map models to times >= 0")
    if not isinstance(plan.get("skip", False), bool):
        raise ValueError("the plan's skip must be true or false")
    return {**plan, "skip": plan.get("skip", False), "exec_ms": exec_ms}
