"""Loki's pipeline as one Triton BLS model: a frame goes through the detector, its crops through the classifiers.

Input ``FRAME`` [1, 64, 64]. Outputs, fixed-size so that the sidecar relays them like any model's:
``OBJECTS`` INT32 [MAX_OBJECTS, 6], one row per detection (row, col, kind, label, model, outcome), unused rows -1:
kind 0 a digit, 1 a shape; label -1 when dropped; model an index into the config parameter ``models``
(a JSON list); outcome 0 routed by the table, 1 rerouted, 2 dropped. ``STATUS`` INT32 [3]: (0 served or 1
dropped, the detector's model index, the plan's version). The plan comes with each request as
the parameter ``loki_plan`` (a JSON object; the sidecar sends the load balancer's tables) or, without one, from
``plan.json`` beside this file (written by the deployment). A plan has::

    {"version": 3, "drop": "rerouting",                  # none | last-task | per-task | rerouting
     "tables": {"frontend": {"detect": [[model, p], ...]},
                "<detector model>": {"digits": [[model, p], ...], "shapes": [...]}},
     "budget_ms": {model: ...},  "exec_ms": {model: ...},  "accuracy": {model: ...},
     "backups": {"digits": [[model, spare q/s], ...], ...}}   # most accurate first

For each frame the detector is drawn from the frontend's table; the frames of one detector run as one batch.
Each detection's crop goes to the child task of its kind, to a classifier drawn from the detector's table
(MostAccurateFirst, §5.1). The detector hop's realised delay (from the start of this batch to its result) is
compared with the detector's budget: within it, crops go where the table says; over it by x ms, with
``rerouting`` each crop goes to the most accurate backup whose execution time fits the routed classifier's
minus x, and is dropped without one; with ``per-task`` it is dropped (§5.2). With ``last-task`` and a
request parameter ``slo_ms`` (the time left), a crop whose classifier cannot finish in it is dropped. The crops
of one classifier run as one batch.

Every frame's answer says what served it; a frame with any crop dropped is "dropped" (it missed its SLO), with
what was served. The reason for a drop goes to the log at verbose level.

Test hook: with the config parameter ``scripted_delays`` = "1", a request parameter ``detect_delay_ms`` adds that
delay to the detector hop, so a test can script an overrun on a real server.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backend.pipeline import MAX_OBJECTS, crops, decode

PLAN_FILE = "plan.json"
MAX_BATCH = 32  # a stage model's largest batch (the profiled sizes end there)
KIND_TASK = {0: "digits", 1: "shapes"}
DROP_MODES = ("none", "last-task", "per-task", "rerouting")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.scripted = params.get("scripted_delays") == "1"
        plan_file = Path(args["model_repository"]) / args["model_version"] / PLAN_FILE
        self.default_plan = json.loads(plan_file.read_text()) if plan_file.exists() else None
        self.rng = np.random.default_rng(int(params.get("seed", "0")))
        self.models = json.loads(params.get("models", "[]"))
        self.index = {m: i for i, m in enumerate(self.models)}

    def execute(self, requests: list) -> list:
        start = time.perf_counter()
        answers: list[list[dict] | str] = []
        jobs = []  # (request index, frame index, frame, plan, options)
        for i, request in enumerate(requests):
            try:
                options = json.loads(request.parameters() or "{}")
                plan = options.get("loki_plan", self.default_plan)
                if isinstance(plan, str):
                    plan = json.loads(plan)
                if plan is None:
                    raise ValueError("no plan: send the parameter loki_plan or deploy plan.json")
                self._check(plan)
                frames = pb_utils.get_input_tensor_by_name(request, "FRAME").as_numpy()
            except (ValueError, TypeError, KeyError, RecursionError) as exc:  # RecursionError: JSON nested too deep
                answers.append(f"{type(exc).__name__}: {exc}")
                continue
            answers.append([{} for _ in frames])
            jobs += [(i, k, frame, plan, options) for k, frame in enumerate(frames)]
        try:
            self._run(jobs, answers, start)
        except pb_utils.TritonModelException as exc:  # a stage model failed: every frame of the batch is told
            answers = [a if isinstance(a, str) else f"a pipeline stage failed: {exc}" for a in answers]
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(a, pb_utils.TritonError.INVALID_ARG))
                if isinstance(a, str) else self._response(a) for a in answers]

    def _check(self, plan: object) -> None:
        """A plan names only this pipeline's stage models, with a budget, an execution time and an accuracy each,
        and tables of non-negative weights: anything else is refused before a frame runs."""
        if not isinstance(plan, dict) or not isinstance(plan.get("tables"), dict):
            raise ValueError("the plan must be an object with 'tables'")
        if plan.get("drop", "rerouting") not in DROP_MODES:
            raise ValueError(f"the plan's drop must be one of {DROP_MODES}")
        tables = plan["tables"]
        frontend = tables.get("frontend", {}).get("detect")
        if not isinstance(frontend, list) or not frontend:
            raise ValueError("the plan has no table from the frontend to 'detect'")
        detectors, classifiers = set(), set()
        for source, children in tables.items():
            for task, table in children.items():
                if task not in ("detect", *KIND_TASK.values()) or not isinstance(table, list) or not table:
                    raise ValueError(f"the plan's table {source} -> {task!r} is empty or names no task")
                for model, weight in table:
                    if not isinstance(weight, (int, float)) or not weight >= 0:
                        raise ValueError(f"the plan's weight for {model!r} must be a number >= 0")
                    (detectors if task == "detect" else classifiers).add(model)
        classifiers.update(model for backups in plan.get("backups", {}).values() for model, _ in backups)
        unknown = (detectors | classifiers) - set(self.index)
        if self.index and unknown:
            raise ValueError(f"the plan names models that are not this pipeline's: {sorted(unknown)}")
        for key, models in (("budget_ms", detectors), ("exec_ms", classifiers)):
            missing = [m for m in models if not isinstance(plan.get(key, {}).get(m), (int, float))]
            if missing:
                raise ValueError(f"the plan's {key} has no number for {sorted(missing)}")

    def _response(self, frames: list[dict]):
        objects = np.full((len(frames), MAX_OBJECTS, 6), -1, np.int32)
        status = np.zeros((len(frames), 3), np.int32)
        for i, f in enumerate(frames):
            rows = [(o["row"], o["col"], o["kind"], o["label"], self.index.get(o["model"], -1), int(o["rerouted"]))
                    for o in f["objects"]]
            rows += [(d["row"], d["col"], d["kind"], -1, -1, 2) for d in f["dropped"]]
            if rows:
                objects[i, :min(len(rows), MAX_OBJECTS)] = rows[:MAX_OBJECTS]
            status[i] = (f["status"] == "dropped", self.index.get(f["detector"], -1), f.get("plan") or 0)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OBJECTS", objects),
                                                          pb_utils.Tensor("STATUS", status)])

    def _run(self, jobs: list, answers: list, start: float) -> None:
        by_detector: dict[str, list] = {}
        for job in jobs:
            by_detector.setdefault(self._draw(job[3]["tables"]["frontend"]["detect"]), []).append(job)
        crops_for: dict[str, list] = {}  # classifier -> (job, detection, rerouted)
        for detector, group in by_detector.items():
            heat = self._infer(detector, np.stack([job[2] for job in group]))
            for job, h in zip(group, heat):
                i, k, frame, plan, options = job
                delay = float(options.get("detect_delay_ms", 0.0)) if self.scripted else 0.0
                if delay:
                    time.sleep(delay / 1000)
                hop_ms = (time.perf_counter() - start) * 1000
                overrun = hop_ms - plan["budget_ms"][detector]
                answer = answers[i][k]
                answer.update(status="served", detector=detector, objects=[], dropped=[], plan=plan.get("version"))
                detections = decode(h)
                patches = crops(frame, detections[:, :2]) if len(detections) else []
                for det, patch in zip(detections, patches):
                    target, reason = self._route(plan, detector, KIND_TASK[int(det[2])], overrun, options, start)
                    if target is None:
                        answer["dropped"].append({"row": int(det[0]), "col": int(det[1]), "kind": int(det[2])})
                        answer["status"] = "dropped"
                        pb_utils.Logger.log_verbose(f"frame {k} of request {i}: crop dropped: {reason}")
                    else:
                        crops_for.setdefault(target, []).append((answer, det, patch, reason == "rerouted"))
        for model, items in crops_for.items():
            labels = self._infer(model, np.stack([p for _, _, p, _ in items])).argmax(axis=1)
            for (answer, det, _, rerouted), label in zip(items, labels):
                answer["objects"].append({"row": int(det[0]), "col": int(det[1]), "kind": int(det[2]),
                                          "label": int(label), "model": model, "rerouted": rerouted})

    def _route(self, plan: dict, detector: str, task: str, overrun_ms: float, options: dict,
               start: float) -> tuple[str | None, str]:
        """The classifier for one crop and why: ("model", "table" | "rerouted") or (None, why it was dropped)."""
        target = self._draw(plan["tables"][detector][task])
        mode = plan.get("drop", "rerouting")
        if mode == "last-task" and "slo_ms" in options:
            left = float(options["slo_ms"]) - (time.perf_counter() - start) * 1000
            if plan["exec_ms"][target] > left:
                return None, "last-task: the classifier cannot finish within the SLO"
        if overrun_ms <= 0 or mode in ("none", "last-task"):
            return target, "table"
        if mode == "rerouting":
            fits = plan["exec_ms"][target] - overrun_ms
            for backup, _ in plan.get("backups", {}).get(task, ()):
                if plan["exec_ms"][backup] <= fits:
                    return backup, "rerouted"
            return None, f"the detector overran its budget by {overrun_ms:.1f} ms and no backup fits"
        return None, f"per-task: the detector overran its budget by {overrun_ms:.1f} ms"

    def _draw(self, table: list) -> str:
        models = [m for m, _ in table]
        weights = np.array([p for _, p in table], dtype=float)
        return models[int(self.rng.choice(len(models), p=weights / weights.sum()))] if len(models) > 1 else models[0]

    @staticmethod
    def _infer(model: str, x: np.ndarray) -> np.ndarray:
        """``model``'s LOGITS for ``x``, in batches of at most MAX_BATCH (the largest profiled)."""
        out = []
        for chunk in np.array_split(x, -(-len(x) // MAX_BATCH)):
            request = pb_utils.InferenceRequest(model_name=model, requested_output_names=["LOGITS"],
                                                inputs=[pb_utils.Tensor("INPUT", chunk.astype(np.float32))])
            response = request.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
            out.append(pb_utils.get_output_tensor_by_name(response, "LOGITS").as_numpy())
        return np.concatenate(out)
