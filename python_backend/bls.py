"""What the two BLS models (:mod:`.loki_bls`, :mod:`.cascade_bls`) share: their config, the plan a request
brings or the deployment wrote, how a malformed request is answered, and the call to a stage model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

PLAN_FILE = "plan.json"  # the deployed plan, beside model.py in the version folder
# what a malformed request raises while it is read; it fails that request only (RecursionError: JSON nested
# too deep)
REQUEST_ERRORS = (ValueError, TypeError, KeyError, RecursionError)


class BlsConfig:
    """A BLS model's config parameters (strings), its stage models (the parameter ``models``, a JSON list, whose
    indices the answers name) and its deployed plan, if any."""

    def __init__(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.config = config
        self.params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.models: list[str] = json.loads(self.params.get("models", "[]"))
        self.index = {m: i for i, m in enumerate(self.models)}
        plan_file = Path(args["model_repository"]) / args["model_version"] / PLAN_FILE
        self.deployed_plan = json.loads(plan_file.read_text()) if plan_file.exists() else None


def request_options(request) -> dict:
    """A request's parameters; each plan and per-row value in them may be a JSON string or the object itself."""
    return json.loads(request.parameters() or "{}")


def request_plan(options: dict, key: str, deployed: object) -> object:
    """The plan the request brings under ``key``, else the deployed one; neither is a malformed request."""
    plan = options.get(key, deployed)
    if plan is None:
        raise ValueError(f"no plan: send the parameter {key} or deploy {PLAN_FILE}")
    return json.loads(plan) if isinstance(plan, str) else plan


def error_response(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))


def infer(model: str, x: np.ndarray, max_batch: int | None = None) -> np.ndarray:
    """``model``'s LOGITS for ``x``, in batches of at most ``max_batch``. A failed call raises
    TritonModelException."""
    return np.concatenate([_logits(model, _request(model, chunk).exec())
                           for chunk in (np.array_split(x, -(-len(x) // max_batch)) if max_batch else (x,))])


async def infer_async(model: str, x: np.ndarray) -> np.ndarray:
    """``model``'s LOGITS for ``x`` in one call, awaited (``async_exec``), so that an ``async def execute`` has
    several stage calls in flight at once."""
    return _logits(model, await _request(model, x).async_exec())


def _request(model: str, x: np.ndarray):
    return pb_utils.InferenceRequest(model_name=model, requested_output_names=["LOGITS"],
                                     inputs=[pb_utils.Tensor("INPUT", x.astype(np.float32))])


def _logits(model: str, response) -> np.ndarray:
    """A response's LOGITS, copied: a tensor's array may be a view of the stub's shared memory, which it reuses on
    the next call (a test saw crops labelled from other pixels)."""
    if response.has_error():
        raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
    return pb_utils.get_output_tensor_by_name(response, "LOGITS").as_numpy().copy()


def number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
