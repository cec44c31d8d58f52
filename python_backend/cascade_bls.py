"""HybridServe's cascade as one Triton BLS model: a batch runs on the first model, and only the samples below its
confidence threshold go on to the next (re-batched with whatever else reached that model), and so on.

Input ``INPUT`` [1, 16, 16]. Outputs per sample: ``LABEL`` INT32 [1]; ``MODEL`` INT32 [1], the answering model's
index in the config parameter ``models`` (a JSON list); ``CONFIDENCE`` FP32 [1], its calibrated confidence;
``REASON`` INT32 [1]: 0 confident (at or above the threshold), 1 the last model, 2 answered early because the
time left (request parameter ``budget_ms``) could not pay for the next model (an extension: the paper has no SLO).

The plan comes with each request as the parameter ``cascade_plan`` (a JSON object) or, without one, from
``plan.json`` beside this file (written by the deployment)::

    {"models": ["cascade_xs", "cascade_m", "cascade_l"],    # small to large, this cascade's models
     "thresholds": [0.89, 0.78],                            # one per model but the last
     "temperatures": {"cascade_xs": 0.99, ...},
     "skip": false,                                         # skip connections (python_backend.cascade)
     "exec_ms": {"cascade_m": 0.5, ...}}                    # batch-1 time of each model, for budget_ms

Routing is :func:`python_backend.cascade.route`, the function the offline evaluation uses, so the two agree.
A request whose plan is malformed gets its own error; the other requests of the batch are served.

An instance holds its batch through every hop, so the cascade's concurrency is its instance count. Decision: not a
decoupled model with an ``async def execute``, which would keep many batches in flight on one instance. Tried at the
demo's settings (64 clients, models 271x slower), it served no more (AP 1,494-1,564 requests/s against 1,573 for
64 synchronous instances, both near the 1,595 the model replicas allow), and Triton 2.51's python stub crashed under
its concurrent BLS calls in about one run in four (heap corruption in ``InferRequest::LoadFromSharedMemory``;
Triton's python backend also runs at most 32 BLS calls per instance unless ``thread-pool-size`` is raised).
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backend import bls
from python_backend.cascade import (
    ANSWER,
    CONFIDENT,
    EARLY,
    LAST,
    answered_early,
    check_plan,
    confidence,
    route,
)

MAX_BATCH = 32  # a model's largest profiled batch


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = bls.BlsConfig(args)
        self.models, self.index = config.models, config.index
        self.default_plan = None if config.deployed_plan is None else self._check(config.deployed_plan)

    def execute(self, requests: list) -> list:
        start = time.perf_counter()
        errors: dict[int, str] = {}
        groups: dict[str, list] = {}  # plan (as JSON) -> [(request, row offset, inputs, budget)]
        for i, request in enumerate(requests):
            try:
                options = bls.request_options(request)
                plan = self._check(bls.request_plan(options, "cascade_plan", self.default_plan))
                budget = float(options.get("budget_ms", math.inf))
                if math.isnan(budget):
                    raise ValueError("budget_ms must be a number")
                x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            except bls.REQUEST_ERRORS as exc:
                errors[i] = f"{type(exc).__name__}: {exc}"
                continue
            groups.setdefault(json.dumps(plan, sort_keys=True), []).append((i, x, budget))
        answers: dict[int, tuple] = {}
        for key, members in groups.items():
            try:
                self._run(json.loads(key), members, answers, start)
            except pb_utils.TritonModelException as exc:  # a model failed: its group's requests are told
                errors.update((i, f"a cascade model failed: {exc}") for i, _, _ in members)
        return [bls.error_response(errors[i]) if i in errors else pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor(name, array) for name, array in zip(("LABEL", "MODEL", "CONFIDENCE", "REASON"),
                                                                         answers[i])])
                for i in range(len(requests))]

    def _check(self, plan: object) -> dict:
        """A plan of this cascade's models (:func:`python_backend.cascade.check_plan`): anything else is refused."""
        return check_plan(plan, self.models)

    def _run(self, plan: dict, members: list, answers: dict, start: float) -> None:
        models, last = plan["models"], len(plan["models"]) - 1
        x = np.concatenate([m[1] for m in members]).astype(np.float32)
        budget = np.concatenate([np.full(len(m[1]), m[2]) for m in members])
        at = np.zeros(len(x), dtype=int)
        label, model, conf = np.zeros(len(x), np.int32), np.zeros(len(x), np.int32), np.zeros(len(x), np.float32)
        reason = np.zeros(len(x), np.int32)
        for i, name in enumerate(models):
            rows = np.flatnonzero(at == i)
            if not len(rows):
                continue
            labels, c = confidence(bls.infer(name, x[rows], MAX_BATCH), plan["temperatures"][name])
            onward = route(i, c, np.asarray(plan["thresholds"][i] if i < last else 0.0), last, plan["skip"])
            elapsed_ms = (time.perf_counter() - start) * 1000
            early = answered_early(onward, budget[rows] - elapsed_ms, [plan["exec_ms"].get(m, 0.0) for m in models])
            done = (onward == ANSWER) | early
            label[rows[done]], model[rows[done]], conf[rows[done]] = labels[done], self.index[name], c[done]
            reason[rows[done]] = np.where(early[done], EARLY, CONFIDENT if i < last else LAST)
            at[rows] = np.where(done, -1, onward)
        offset = 0
        for i, inputs, _ in members:
            part = slice(offset, offset + len(inputs))
            answers[i] = tuple(a[part, None] for a in (label, model, conf, reason))
            offset += len(inputs)
