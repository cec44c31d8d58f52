"""Loki's pipeline as one Triton BLS model: a frame goes through the detector, its crops through the classifiers.

Input ``FRAME`` [1, 64, 64]. Outputs, fixed-size so that the sidecar relays them like any model's:
``OBJECTS`` INT32 [MAX_OBJECTS, 6], one row per detection (row, col, kind, label, model, outcome), unused rows -1:
kind 0 a digit, 1 a shape; label -1 when dropped; model an index into the config parameter ``models``
(a JSON list); outcome 0 routed by the table, 1 rerouted, 2 dropped. ``STATUS`` INT32 [4]: (0 served or 1
dropped, the detector's model index, the plan's version, the stage-model instances the plan runs). ``STAGE_MS``
FP32 [3]: when the sidecar sent the frame (its ``waited_ms``), when its detector batch came back and when its last
crop was labelled (the detector's time where it had none), each in ms since the frame's arrival at the sidecar (its
``waited_ms`` plus this execution's time; 0 for a frame dropped before its detector ran, whose STATUS names no
detector): where a frame's time goes, stage by stage, beside the simulator's.

The plan comes with each request as the parameter ``loki_plan`` (a JSON object; the sidecar sends the load
balancer's tables) or, without one, from ``plan.json`` beside this file (written by the deployment). A plan has::

    {"version": 3, "drop": "rerouting",                  # none | last-task | per-task | rerouting
     "dequeue": "hopeless", "rest_ms": {model: ...},     # the check before a batch (none | hopeless), the rest
     "tables": {"frontend": {"detect": [[model, p], ...]},
                "<detector model>": {"digits": [[model, p], ...], "shapes": [...]}},
     "budget_ms": {detector: ...},                       # the task's latency budget at that detector
     "exec_ms": {model: ...},  "batch": {model: ...},    # a batch's execution time at the planned batch size
     "accuracy": {model: ...}, "instances": {model: ...},
     "backups": {"digits": [[model, spare q/s], ...], ...}}   # most accurate first

Per-frame request parameters (JSON lists, one number per row of the request, in its order): ``waited_ms``, how
long the frame had waited since its arrival at the sidecar when the sidecar sent it (absent: 0), and
``left_ms``, the time it had left until its deadline then (absent: no deadline, no check before a batch drops
anything).

For each frame the detector is drawn from the frontend's table; the frames of one detector run in batches of its
planned size. Each detection's crop goes to the child task of its kind, to a classifier drawn from the detector's
table (MostAccurateFirst, §5.1), unless the shared rule of :mod:`python_backend.loki_routing` (early dropping and
opportunistic rerouting, §5.2) says otherwise; exactly as in the simulator:

- the detector hop's delay is the frame's ``waited_ms`` plus the time from the start of this execution to its
  detector batch's result; over the detector's budget by x ms, a crop is rerouted to the most accurate backup
  whose time fits the routed classifier's ``exec_ms`` minus x, or dropped;
- a backup's time is its ``exec_ms`` plus one batch per planned batch of crops already sent to it in this
  execution (the work queued ahead, as the simulator counts a worker's queue);
- a reroute spends one query of the backup's spare capacity, a per-second :class:`Allowance`;
- with ``last-task``, a crop whose classifier batch cannot finish in its frame's time left is dropped before
  that batch runs (its frame's ``left_ms`` minus the time this execution has taken);
- with ``per-task`` or ``rerouting`` and the plan's ``dequeue`` "hopeless" (the simulator's default check before a
  batch), when an instance is free for a stage batch, a frame or crop that would end past its deadline in that
  batch (the model's ``exec_ms``) even if every stage after it ran as fast as any variant can (its ``rest_ms``) is
  dropped before the batch runs: a frame before its detector (answered dropped, with no objects), a crop before
  its classifier. Decision: the batch's time is the plan's at the planned batch size, which the simulator takes
  at the size the batch has; a smaller batch than planned is checked a little early. A detector batch is formed
  before its check, so a frame dropped there is not replaced by the next frame, as a simulated worker would take
  it (with the sidecar's requests of up to 4 frames, rarely more than a frame a batch).

The stages run as the pipeline allows (``async def execute``, ``async_exec``), as the simulator's workers do: an
execution's detector batches are all in flight at once, as many of one detector as the plan runs instances of it,
and each batch's crops are routed when its own result comes back. When every detector batch of the execution has
come back, each classifier's crops run in batches of its planned size, earliest deadline first, again as many at
once as it has planned instances. (Before, an execution called its stage models one after another: a frame of its
second detector batch waited for the first.) Still unlike the simulator: a crop waits for the execution's slowest
detector batch, a frame is answered with its request's other frames after their last classifier batch, the
instances a plan runs are each execution's to share out (several BLS instances may queue more batches at a stage
model than it has instances), and the time between the sidecar sending a batch and this execution starting
(network, Triton's queue) is in neither measure.

Decision (the backups' spare capacity with several instances of this model): each instance is its own process,
and Triton may run them all at once, so each takes an equal share, spare / instances per second. Together they
never reroute more than the spare capacity (the simulator's invariant); a share below one query a second
reroutes nothing.

Every frame's answer says what served it; a frame with any crop dropped, or dropped before its detector, is
"dropped" (it missed its SLO), with what was served. The reason for a drop goes to the log at verbose level. Malformed plans and parameters fail
their own request only.

Test hook: with the config parameter ``scripted_delays`` = "1", a request parameter ``detect_delay_ms`` makes each
of its detector batches take that much longer, so a test can script an overrun on a real server.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backend import bls
from python_backend.loki_routing import (
    BLS_DEQUEUES,
    DROP_MODES,
    Allowance,
    Choice,
    drops_at_dequeue,
    hopeless,
    next_hop,
    too_late,
)
from python_backend.pipeline import MAX_OBJECTS, crops, decode

KIND_TASK = {0: "digits", 1: "shapes"}
MAX_ALLOWANCES = 4  # the plans a sidecar may still send while its Tritons load the newest (its MAX_PLANS)


@dataclass
class Frame:
    """One row of a request: its pixels, the plan it came with, its times when the sidecar sent it, its answer."""

    pixels: np.ndarray
    plan: dict
    waited_ms: float
    left_ms: float  # math.inf: no deadline given
    delay_ms: float  # scripted (the test hook)
    detector: str = ""
    detected_ms: float = 0.0  # since its arrival at the sidecar, when its detector batch came back
    done_ms: float = 0.0  # ... when its last crop was labelled
    objects: list[dict] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    hopeless: bool = False  # dropped before its detector batch ran (the plan's ``dequeue``)


@dataclass
class Crop:
    frame: Frame
    detection: np.ndarray  # (row, col, kind)
    patch: np.ndarray
    rerouted: bool


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = bls.BlsConfig(args)
        self.scripted = config.params.get("scripted_delays") == "1"
        self.default_plan = config.deployed_plan
        self.rng = np.random.default_rng(int(config.params.get("seed", "0")))
        self.models, self.index = config.models, config.index
        self.instances = sum(int(g.get("count", 1)) for g in config.config.get("instance_group", ())) or 1
        self._allowances: dict[str, Allowance] = {}  # the plan's backups (JSON) -> this instance's share

    async def execute(self, requests: list) -> list:
        start = time.perf_counter()
        answers: list[list[Frame] | str] = []
        for request in requests:
            try:
                answers.append(self._frames(request))
            except bls.REQUEST_ERRORS as exc:
                answers.append(f"{type(exc).__name__}: {exc}")
        try:
            await self._run([f for a in answers if not isinstance(a, str) for f in a], start)
        except pb_utils.TritonModelException as exc:  # a stage model failed: every frame of the batch is told
            answers = [a if isinstance(a, str) else f"a pipeline stage failed: {exc}" for a in answers]
        return [bls.error_response(a) if isinstance(a, str) else self._response(a) for a in answers]

    def _frames(self, request) -> list[Frame]:
        options = bls.request_options(request)
        plan = bls.request_plan(options, "loki_plan", self.default_plan)
        self._check(plan)
        # copies, here and of the stage models' outputs: a tensor's array may be a view of the stub's shared memory,
        # which it reuses while this execution calls the stage models (a test saw crops labelled from other pixels)
        pixels = pb_utils.get_input_tensor_by_name(request, "FRAME").as_numpy().copy()
        waited = per_row(options, "waited_ms", len(pixels), 0.0, max)
        left = per_row(options, "left_ms", len(pixels), math.inf, min)
        delay = float(options.get("detect_delay_ms", 0.0)) if self.scripted else 0.0
        return [Frame(p, plan, w, t, delay) for p, w, t in zip(pixels, waited, left)]

    def _check(self, plan: object) -> None:
        """A plan names only this pipeline's stage models, with a budget (detectors), an execution time
        (classifiers; with the check before a batch, every stage model, and its rest too) and a batch size each,
        tables of non-negative weights and backups of non-negative spare capacity: anything else is refused before
        a frame runs."""
        if not isinstance(plan, dict) or not isinstance(plan.get("tables"), dict):
            raise ValueError("the plan must be an object with 'tables'")
        if plan.get("drop", "rerouting") not in DROP_MODES:
            raise ValueError(f"the plan's drop must be one of {DROP_MODES}")
        if plan.get("dequeue", "none") not in BLS_DEQUEUES:
            raise ValueError(f"the plan's dequeue must be one of {BLS_DEQUEUES}")
        if not _whole(plan.get("version", 0), 0) or not all(_whole(n) for n in plan.get("instances", {}).values()):
            raise ValueError("the plan's version must be a whole number >= 0, its instance counts >= 1")
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
                    if not bls.number(weight) or not weight >= 0:
                        raise ValueError(f"the plan's weight for {model!r} must be a number >= 0")
                    (detectors if task == "detect" else classifiers).add(model)
        for backups in plan.get("backups", {}).values():
            for model, spare in backups:
                if not bls.number(spare) or not spare >= 0:
                    raise ValueError(f"the plan's spare capacity of backup {model!r} must be a number >= 0")
                classifiers.add(model)
        unknown = (detectors | classifiers) - set(self.index)
        if self.index and unknown:
            raise ValueError(f"the plan names models that are not this pipeline's: {sorted(unknown)}")
        for detector in {m for m, _ in frontend}:
            if any(not tables.get(detector, {}).get(task) for task in KIND_TASK.values()):
                raise ValueError(f"the plan has no table from {detector!r} to each of {list(KIND_TASK.values())}")
        checked = _checks_before_running(plan)  # a stage's execution and the rest after it, for every stage model
        for key, models, valid in (("budget_ms", detectors, bls.number),
                                   ("exec_ms", detectors | classifiers if checked else classifiers, bls.number),
                                   ("rest_ms", detectors | classifiers if checked else (), bls.number),
                                   ("batch", detectors | classifiers, _whole)):
            missing = [m for m in models if not valid(plan.get(key, {}).get(m))]
            if missing:
                raise ValueError(f"the plan's {key} has no valid number for {sorted(missing)}")

    def _response(self, frames: list[Frame]):
        objects = np.full((len(frames), MAX_OBJECTS, 6), -1, np.int32)
        status = np.zeros((len(frames), 4), np.int32)
        for i, f in enumerate(frames):
            rows = [(o["row"], o["col"], o["kind"], o["label"], self.index.get(o["model"], -1), int(o["rerouted"]))
                    for o in f.objects]
            rows += [(d["row"], d["col"], d["kind"], -1, -1, 2) for d in f.dropped]
            if rows:
                objects[i, :min(len(rows), MAX_OBJECTS)] = rows[:MAX_OBJECTS]
            detector = -1 if f.hopeless else self.index.get(f.detector, -1)  # its detector never ran
            status[i] = (bool(f.dropped) or f.hopeless, detector, f.plan.get("version") or 0,
                         sum(f.plan.get("instances", {}).values()))
        stage_ms = np.array([(f.waited_ms, f.detected_ms, f.done_ms) for f in frames], np.float32).reshape(-1, 3)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OBJECTS", objects),
                                                          pb_utils.Tensor("STATUS", status),
                                                          pb_utils.Tensor("STAGE_MS", stage_ms)])

    async def _run(self, frames: list[Frame], start: float) -> None:
        by_detector: dict[tuple[str, int], list[Frame]] = {}  # (detector, its planned batch) -> frames
        for f in frames:
            f.detector = self._draw(f.plan["tables"]["frontend"]["detect"])
            by_detector.setdefault((f.detector, f.plan["batch"][f.detector]), []).append(f)
        queues: dict[tuple[str, int], list[Crop]] = {}  # (classifier, its planned batch) -> the crops sent there
        slots: dict[str, asyncio.Semaphore] = {}  # a stage model -> its planned instances, as this execution's workers

        async def detect(detector: str, chunk: list[Frame]) -> None:
            async with _slots(slots, detector, chunk[0].plan):
                # with an instance free for it, as the simulator's worker dequeues a batch: a frame that cannot
                # make its deadline even on the fastest rest of its path is dropped before its detector runs
                elapsed_ms = (time.perf_counter() - start) * 1000
                for f in chunk:
                    f.hopeless = _checks_before_running(f.plan) and hopeless(
                        f.left_ms - elapsed_ms, f.plan["exec_ms"][detector], f.plan["rest_ms"][detector])
                    if f.hopeless:
                        pb_utils.Logger.log_verbose(f"a frame dropped: {f.left_ms - elapsed_ms:.1f} ms left")
                chunk = [f for f in chunk if not f.hopeless]
                if not chunk:
                    return
                heat = await bls.infer_async(detector, np.stack([f.pixels for f in chunk]))
                if self.scripted:
                    await asyncio.sleep(max(f.delay_ms for f in chunk) / 1000)
            inside_ms = (time.perf_counter() - start) * 1000
            for f, h in zip(chunk, heat):
                f.detected_ms = f.done_ms = f.waited_ms + inside_ms
                self._route(f, h, f.detected_ms, queues)

        await _all(detect(detector, chunk) for (detector, batch), group in by_detector.items()
                   for chunk in chunks(group, batch))
        await _all(self._classify(model, batch, queue, start, slots) for (model, batch), queue in queues.items())

    def _route(self, frame: Frame, heatmap: np.ndarray, hop_ms: float, queues: dict) -> None:
        """Send each crop of ``frame`` to its classifier's queue, or drop it (the shared rule)."""
        plan = frame.plan
        overrun_ms = hop_ms - plan["budget_ms"][frame.detector]
        allowance = self._allowance(plan)
        second = int(time.monotonic())

        def queued_ms(model: str) -> float:
            """A crop sent to ``model`` now: its batch, after one batch per planned batch already queued there."""
            batch = plan["batch"][model]
            return plan["exec_ms"][model] * (1 + len(queues.get((model, batch), ())) // batch)

        detections = decode(heatmap)
        for det, patch in zip(detections, crops(frame.pixels, detections[:, :2])):
            task = KIND_TASK[int(det[2])]
            target = self._draw(plan["tables"][frame.detector][task])
            backups = ((m, queued_ms(m)) for m, _ in plan.get("backups", {}).get(task, ()))
            choice, backup = next_hop(plan.get("drop", "rerouting"), overrun_ms, plan["exec_ms"][target], backups,
                                      lambda m: allowance.take(m, second))
            if choice is Choice.DROPPED:
                self._drop(frame, det, f"the detector overran its budget by {overrun_ms:.1f} ms")
                continue
            model = backup if choice is Choice.REROUTED else target
            queues.setdefault((model, plan["batch"][model]), []).append(
                Crop(frame, det, patch, choice is Choice.REROUTED))

    async def _classify(self, model: str, batch: int, queue: list[Crop], start: float,
                        slots: dict[str, asyncio.Semaphore]) -> None:
        """Run ``model`` on its crops, earliest deadline first, in batches of ``batch``, as many at once as it has
        planned instances; with last-task dropping, or the ``hopeless`` check before a batch (a leaf's rest is 0: the
        same test), the crops at the head that its next batch cannot finish in time are dropped when an instance is
        free for it."""
        queue = sorted(queue, key=lambda c: c.frame.left_ms)
        slot = _slots(slots, model, queue[0].frame.plan)
        running = []

        async def classify(chunk: list[Crop]) -> None:
            try:
                labels = (await bls.infer_async(model, np.stack([c.patch for c in chunk]))).argmax(axis=1)
            finally:
                slot.release()
            inside_ms = (time.perf_counter() - start) * 1000
            for c, label in zip(chunk, labels):
                c.frame.done_ms = max(c.frame.done_ms, c.frame.waited_ms + inside_ms)
                row, col, kind = (int(v) for v in c.detection)
                c.frame.objects.append({"row": row, "col": col, "kind": kind, "label": int(label), "model": model,
                                        "rerouted": c.rerouted})

        try:
            while queue and not any(t.done() and t.exception() for t in running):  # a failed batch fails them all
                await slot.acquire()
                elapsed_ms = (time.perf_counter() - start) * 1000
                while queue and _too_late(queue[0].frame.plan, model, queue[0].frame.left_ms - elapsed_ms):
                    crop = queue.pop(0)
                    self._drop(crop.frame, crop.detection, "the classifier cannot finish within the SLO")
                chunk, queue = queue[:batch], queue[batch:]
                if not chunk:
                    slot.release()
                    break
                running.append(asyncio.ensure_future(classify(chunk)))
        finally:  # none left running when the execution answers, whatever raised here
            await _all(running)

    @staticmethod
    def _drop(frame: Frame, detection: np.ndarray, reason: str) -> None:
        row, col, kind = (int(v) for v in detection)
        frame.dropped.append({"row": row, "col": col, "kind": kind})
        pb_utils.Logger.log_verbose(f"crop at ({row}, {col}) dropped: {reason}")

    def _allowance(self, plan: dict) -> Allowance:
        """This instance's share of the plan's backups' spare capacity (see the module notes)."""
        key = json.dumps(plan.get("backups", {}), sort_keys=True)
        allowance = self._allowances.get(key)
        if allowance is None:
            if len(self._allowances) >= MAX_ALLOWANCES:
                del self._allowances[next(iter(self._allowances))]
            allowance = self._allowances[key] = Allowance(
                {m: spare / self.instances for backups in plan.get("backups", {}).values() for m, spare in backups})
        return allowance

    def _draw(self, table: list) -> str:
        models = [m for m, _ in table]
        weights = np.array([p for _, p in table], dtype=float)
        return models[int(self.rng.choice(len(models), p=weights / weights.sum()))] if len(models) > 1 else models[0]


def per_row(options: dict, key: str, rows: int, default: float, worst: Callable[[Sequence[float]], float]
            ) -> list[float]:
    """The request parameter ``key``, a JSON list of one number per row (``default`` for each when absent).

    Decision: a list longer than the request's rows is the sidecar's batch less some rows (it retries a failed
    batch in halves, and leaves out a client that went away before its batch was sent): the order is kept but
    not which rows remain, so each row gets the ``worst`` of the list (the longest wait, the least time left),
    never counting a frame as earlier than it was. A shorter list is malformed.
    """
    if key not in options:
        return [default] * rows
    values = json.loads(options[key]) if isinstance(options[key], str) else options[key]
    if not isinstance(values, list) or not all(bls.number(v) for v in values):
        raise ValueError(f"{key} must be a JSON list of numbers, one per frame")
    if len(values) < rows:
        raise ValueError(f"{key} has {len(values)} numbers for {rows} frames")
    return [float(v) for v in values] if len(values) == rows else [float(worst(values))] * rows


def _checks_before_running(plan: dict) -> bool:
    """Whether the plan's ``dequeue`` check runs before each stage batch (the simulator's rule, shared)."""
    return drops_at_dequeue(plan.get("drop", "rerouting"), plan.get("dequeue", "none"))


def _too_late(plan: dict, model: str, left_ms: float) -> bool:
    """A crop of ``model`` with ``left_ms`` to its deadline is dropped before its batch: last-task's check, or the
    ``hopeless`` one."""
    if plan.get("drop") == "last-task":
        return too_late(left_ms, plan["exec_ms"][model])
    return _checks_before_running(plan) and hopeless(left_ms, plan["exec_ms"][model], plan["rest_ms"][model])


def _slots(slots: dict[str, asyncio.Semaphore], model: str, plan: dict) -> asyncio.Semaphore:
    """``model``'s calls in flight from this execution: at most the instances the plan runs of it (1 where it says
    none), so that a batch is sent, and the check before it made, when an instance of it is free, as the simulator
    starts a batch when a worker is."""
    if model not in slots:
        slots[model] = asyncio.Semaphore(plan.get("instances", {}).get(model, 1))
    return slots[model]


async def _all(calls) -> None:
    """Await every call, then raise the first failure: none is left running when the execution answers."""
    failures = [r for r in await asyncio.gather(*calls, return_exceptions=True) if isinstance(r, BaseException)]
    if failures:
        raise failures[0]


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _whole(value: object, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
