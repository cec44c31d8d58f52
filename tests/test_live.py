"""The live driver with in-process fake workers: batching, disconnects, failures, retries, shared slots,
loads, plans off the event loop, latency calibration and the config file. Time is a fake clock."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from scheduler_sidecar.core.engine import TypeLimits
from scheduler_sidecar.core.plan import Plan, Planner
from scheduler_sidecar.core.records import Decision
from scheduler_sidecar.errors import (
    DeadlineExceeded,
    InternalError,
    SloInfeasible,
    Unavailable,
    WorkerFailed,
    WorkerLost,
)
from scheduler_sidecar.live.driver import Answer, LiveDriver, LiveModel, ModelOptions, now_us
from scheduler_sidecar.live.tensors import TensorSpec
from scheduler_sidecar.live.workers import FakeWorker, Health, InferCall, SendingFakeWorker, split_outputs
from scheduler_sidecar.server import config as sidecar_config
from scheduler_sidecar.server.config import ModelSpec
from scheduler_sidecar.server.metrics import Metrics, ModelMetrics
from scheduler_sidecar.systems import make_policy, policies
from scheduler_sidecar.systems.superserve.baselines import ClipperPlus
from scheduler_sidecar.systems.superserve.slackfit import SlackFit
from tests import virtual_clock
from tests.builders import POLICY_OPTIONS, make_mover, make_profile
from tests.virtual_clock import VirtualLoop

INPUT = TensorSpec("INPUT", "FP32", (2,))
OUTPUT = TensorSpec("LOGITS", "FP32", (3,))


class Clock:
    def __init__(self) -> None:
        self.now_us = 0

    def __call__(self) -> int:
        return self.now_us


def compute(call: InferCall) -> list[dict[str, bytes]]:
    """Each answer row: (row sum, variant model index, batch size)."""
    x = np.frombuffer(b"".join(call.inputs[0][1]), np.float32).reshape(-1, 2)
    k = len(x)
    out = np.stack([x.sum(1), np.full(k, int(call.model[1:])), np.full(k, k)], 1).astype(np.float32)
    return [{"LOGITS": r.tobytes()} for r in out]


def make_model(name: str = "m", queue_limit: int | None = 1024, admission: bool = False, **options) -> LiveModel:
    """A logical model of make_profile(); no admission unless asked (these tests drive the queue themselves)."""
    return LiveModel(ModelOptions(name, limits=TypeLimits(queue_limit, admission=admission), **options), make_profile(),
                     (INPUT,), (OUTPUT,), ModelMetrics(Metrics(), name))


def make_driver(*workers: FakeWorker, policies=None, clock=None, **options):
    models = [make_model(**options)] if policies is None else [make_model(n, **options) for n in policies]
    chosen = [SlackFit(make_profile())] if policies is None else list(policies.values())
    driver = LiveDriver(zip(models, chosen), clock=clock or Clock())
    for w in workers:
        driver.add_worker(w, 1)
    return driver, models


def worker(url: str = "a", gated: bool = True, fake: type[FakeWorker] = FakeWorker, **kw) -> FakeWorker:
    return fake(url, compute=compute, gate=asyncio.Event() if gated else None, **kw)


# a worker the driver awaits (``infer``, in a task per batch) and one that calls it back (``send``, the native
# worker's way in): the tests marked with this run the driver's batch path both ways
BOTH_WAYS = pytest.mark.parametrize("fake", [FakeWorker, SendingFakeWorker], ids=["awaited", "called-back"])


def row(*values: float) -> dict[str, bytes]:
    return {"INPUT": np.asarray(values, np.float32).tobytes()}


def logits(answer) -> np.ndarray:
    return np.frombuffer(answer.outputs["LOGITS"], np.float32)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@BOTH_WAYS
def test_requests_are_batched_and_answered_with_their_own_rows(fake):
    async def main():
        w = worker(fake=fake)
        driver, (model,) = make_driver(w)
        first = asyncio.ensure_future(model.infer(row(1, 2), 1_000_000))
        await settle()  # the first request runs alone; the next three queue behind it
        rest = [asyncio.ensure_future(model.infer(row(i, i), 1_000_000)) for i in range(3)]
        await settle()
        w.gate.set()
        answers = await asyncio.gather(first, *rest)
        assert [logits(a)[0] for a in answers] == [3, 0, 2, 4]
        assert [a.batch_size for a in answers] == [1, 3, 3, 3]
        assert len(w.calls) == 2 and driver.num_pending == 0

    asyncio.run(main())


@BOTH_WAYS
def test_a_client_that_leaves_frees_its_queue_entry(fake):
    async def main():
        w = worker(fake=fake)
        driver, (model,) = make_driver(w)
        running = asyncio.ensure_future(model.infer(row(1, 1), 1_000_000))
        await settle()
        leaving = asyncio.ensure_future(model.infer(row(2, 2), 1_000_000))
        await settle()
        assert driver.engine.queued("m") == 1
        leaving.cancel()
        await settle()
        assert driver.engine.queued("m") == 0 and driver.num_pending == 1
        w.gate.set()
        await running
        assert len(w.calls) == 1

    asyncio.run(main())


def poisoned(call: InferCall) -> list[dict[str, bytes]]:
    """:func:`compute`, but a batch with a NaN in it fails, as a model that rejects NaN."""
    if np.isnan(np.frombuffer(b"".join(call.inputs[0][1]), np.float32)).any():
        raise WorkerFailed("worker a: the model rejects NaN")
    return compute(call)


@BOTH_WAYS
def test_a_row_that_breaks_the_model_fails_alone_and_its_batch_mates_are_answered(fake):
    async def main():
        w = fake("a", compute=poisoned, gate=asyncio.Event())
        driver, (model,) = make_driver(w)
        first = asyncio.ensure_future(model.infer(row(0, 0), 1_000_000))
        await settle()  # the next five queue behind the first and run as one batch, one of them poisoned
        rest = [asyncio.ensure_future(model.infer(row(float("nan") if i == 3 else i, 1), 1_000_000))
                for i in range(5)]
        await settle()
        w.gate.set()
        answers = await asyncio.gather(first, *rest, return_exceptions=True)
        assert isinstance(answers[4], WorkerFailed) and "NaN" in str(answers[4])
        assert [logits(a)[0] for i, a in enumerate(answers) if i != 4] == [0, 1, 2, 3, 5]
        assert [c.rows for c in w.calls] == [1, 5, 2, 3, 1, 2, 1, 1]  # the batch of 5, then halves down to the row
        assert driver.num_pending == 0

    asyncio.run(main())


@BOTH_WAYS
def test_a_lost_worker_s_batch_is_retried_on_the_other(fake):
    async def main():
        lost, good = worker("a", fail_with=WorkerLost("gone"), fake=fake), worker("b", gated=False, fake=fake)
        lost.gate.set()
        driver, (model,) = make_driver(lost, good)
        downs = []
        driver.on_worker_lost = lambda w, reason: (downs.append(w.url), driver.worker_health(w, False))
        answers = await asyncio.gather(*(model.infer(row(i, 0), 1_000_000) for i in range(4)))
        assert sorted(logits(a)[0] for a in answers) == [0, 1, 2, 3]
        assert {a.worker for a in answers} == {"b"} and downs == ["a"]

    asyncio.run(main())


def test_a_worker_added_after_one_left_takes_no_slot_of_a_worker_still_serving():
    """A rolling update: a leaves and drains, then c joins (what discovery does when a Deployment rolls). c gets a
    slot id of its own, so b stays in the pool and both serve."""
    async def main():
        a, b, c = worker("a", gated=False), worker("b", gated=False), worker("c", gated=False)
        driver, (model,) = make_driver(a, b)
        await driver.drained(driver.remove_worker(a))
        (new,) = driver.add_worker(c, 1)
        assert new == 2 and {sid: driver.membership.worker(sid).url for sid in driver.slots} == {1: "b", 2: "c"}
        assert sorted(w.id for w in driver.engine.workers) == [1, 2]
        answers = await asyncio.gather(*(model.infer(row(i, 0), 1_000_000) for i in range(6)))
        assert sorted(logits(x)[0] for x in answers) == [0, 1, 2, 3, 4, 5] and {x.worker for x in answers} <= {"b", "c"}

    asyncio.run(main())


def test_a_rolling_update_of_every_worker_loses_no_request_and_keeps_each_slot_on_its_triton():
    """Three workers, each replaced in turn while requests are in flight (the new one admitted, then the old one
    drained, as a Deployment rolls): every request is answered, each by the Triton that ran its batch; afterwards
    the engine serves exactly the new workers' slots, each on the Triton the registry names."""
    async def main():
        old = [worker(url, gated=False) for url in "abc"]
        driver, (model,) = make_driver(*old)
        new, pending = [], []
        for i, leaving in enumerate(old):
            pending += [asyncio.ensure_future(model.infer(row(10 * i + k, 0), 1_000_000)) for k in range(4)]
            new.append(worker(f"n{i}", gated=False))
            driver.add_worker(new[-1], 1)
            ids = driver.remove_worker(leaving)
            pending += [asyncio.ensure_future(model.infer(row(10 * i + k, 1), 1_000_000)) for k in range(4)]
            await driver.drained(ids)
        answers = await asyncio.gather(*pending)
        assert sorted(logits(a)[0] for a in answers) == sorted(10 * i + k + j for i in range(3) for k in range(4)
                                                               for j in (0, 1))
        ran = {w.url: sum(call.rows for call in w.calls) for w in old + new}
        assert sum(ran.values()) == len(answers)  # one row per answer, on the Triton that answered it
        assert all(ran[url] == sum(a.worker == url for a in answers) for url in ran)
        serving = {slot.id: driver.membership.worker(slot.id).url for slot, _ in driver.membership.serving()}
        assert sorted(serving.values()) == ["n0", "n1", "n2"]
        assert sorted(w.id for w in driver.engine.workers) == sorted(serving) == [3, 4, 5]

    asyncio.run(main())


def test_a_worker_removed_while_its_slots_are_added_is_not_joined_again():
    """The sidecar adds a Triton's slots group by group, awaiting between them; a removal in between must not let
    the next group join the same connection again as a new, never-removed member. And a connection keeps the
    device kind it joined with."""
    async def main():
        a, b = worker("a", gated=False), worker("b", gated=False)
        driver, _ = make_driver(a)
        driver.remove_worker(a)
        with pytest.raises(ValueError, match="has left the pool"):
            driver.add_worker(a, 1)
        assert [m.url for m in driver.membership.members.values() if not m.leaving] == []
        driver.add_worker(b, 1, device="cpu")
        with pytest.raises(ValueError, match="device kind 'cpu', not 'gpu'"):
            driver.add_worker(b, 1, device="gpu")

    asyncio.run(main())


def test_with_no_worker_left_every_request_gets_an_explicit_error():
    async def main():
        lost = worker("a", fail_with=WorkerLost("gone"))
        lost.gate.set()
        driver, (model,) = make_driver(lost)
        driver.on_worker_lost = lambda w, reason: driver.worker_health(w, False)
        results = await asyncio.gather(*(model.infer(row(i, 0), 1_000_000) for i in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(r, Unavailable) for r in results)
        with pytest.raises(Unavailable, match="no healthy worker"):
            await model.infer(row(0, 0), 1_000_000)

    asyncio.run(main())


def test_an_answer_without_one_of_the_model_s_outputs_is_the_worker_s_failure():
    """Seen live: a Loki BLS whose stub Triton had found unhealthy answered a batch without its STATUS output, and the
    front end then failed each request with a KeyError; now the batch fails as the worker's (retried in halves, then
    each request gets the worker's error)."""
    status = TensorSpec("STATUS", "INT32", (1,))
    call = InferCall("m1", "", ((INPUT, (bytes(8), bytes(8))),), (OUTPUT, status))
    with pytest.raises(WorkerFailed, match=r"answered without output\(s\) \['STATUS'\]"):
        split_outputs("a", call, [("LOGITS", bytes(24))])
    with pytest.raises(WorkerFailed, match="STATUS"):  # an output given twice hides none missing
        split_outputs("a", call, [("LOGITS", bytes(24)), ("LOGITS", bytes(24))])
    rows = split_outputs("a", call, [("LOGITS", bytes(24)), ("STATUS", bytes(8)), ("EXTRA", b"x")])
    assert [sorted(r) for r in rows] == [["LOGITS", "STATUS"]] * 2


@BOTH_WAYS
def test_worker_errors_are_relayed_not_retried(fake):
    async def main():
        failing = worker("a", fail_with=WorkerFailed("bad input shape"), fake=fake)
        failing.gate.set()
        driver, (model,) = make_driver(failing, worker("b", gated=False, fake=fake))
        with pytest.raises(WorkerFailed, match="bad input shape"):
            await model.infer(row(1, 1), 1_000_000)

    asyncio.run(main())


def test_admission_and_drop_errors():
    async def main():
        w = worker()
        clock = Clock()
        driver, (model,) = make_driver(w, clock=clock, queue_limit=1)
        with pytest.raises(SloInfeasible, match="below the fastest"):
            await model.infer(row(1, 1), 10)
        running = asyncio.ensure_future(model.infer(row(1, 1), 1_000_000))
        await settle()
        queued = asyncio.ensure_future(model.infer(row(1, 1), 5_000))
        await settle()
        with pytest.raises(Unavailable, match="queue full"):
            await model.infer(row(1, 1), 1_000_000)
        clock.now_us = 10_000  # the queued request's slack is gone while the worker is busy
        w.gate.set()
        await running
        with pytest.raises(DeadlineExceeded):
            await queued

    asyncio.run(main())


def test_two_logical_models_share_worker_slots_without_double_booking():
    """Two query types on one worker slot: the slot never runs two batches at once, and both are served."""
    async def main():
        w = worker()
        policies = {"x": SlackFit(make_profile()), "y": SlackFit(make_profile())}
        driver, (x, y) = make_driver(w, policies=policies)
        calls = [asyncio.ensure_future(m.infer(row(i, 1), 1_000_000)) for i in range(6) for m in (x, y)]
        await settle()
        assert w.running == 1 and driver.engine.queued() == len(calls) - 1
        w.gate.set()
        answers = await asyncio.gather(*calls)
        assert w.max_running == 1
        assert sorted(logits(a)[0] for a in answers) == sorted([i + 1.0 for i in range(6)] * 2)
        assert {a.slot for a in answers} == {0}

    asyncio.run(main())


class Broken(SlackFit):
    """SlackFit with a bug: decide() raises."""

    def decide(self, now_us, queue, workers):
        raise RuntimeError("a planted bug")


def test_a_policy_that_raises_fails_its_own_model_and_the_other_keeps_serving():
    """Two logical models on one worker; x's policy raises. x's requests get INTERNAL, y's are answered, and
    accscale_scheduling_faults counts the fault against x alone (before, _guard failed every queued request of every
    model)."""
    async def main():
        policies = {"x": Broken(make_profile()), "y": SlackFit(make_profile())}
        driver, (x, y) = make_driver(worker(gated=False), policies=policies)
        results = await asyncio.gather(*(m.infer(row(i, 1), 1_000_000) for i in range(4) for m in (x, y)),
                                       return_exceptions=True)
        bad, good = results[0::2], results[1::2]
        assert all(isinstance(r, InternalError) and "a planted bug" in str(r) for r in bad)
        assert sorted(logits(a)[0] for a in good) == [1, 2, 3, 4]
        rendered = x.stats.metrics.render().decode()
        assert 'accscale_scheduling_faults_total{culprit="slackfit",model="x"}' in rendered
        assert 'model="y"' not in "".join(line for line in rendered.splitlines() if "scheduling_faults" in line)

    asyncio.run(main())


def test_a_worker_serves_nothing_while_a_policy_loads_a_model():
    """The load goes to the worker; requests wait until it completes, then all are served; none is lost."""
    async def main():
        w = worker()
        driver, (model,) = make_driver(policies={"m": make_mover()})
        driver.add_worker(w, 1, resident=frozenset({"m3"}))
        calls = [asyncio.ensure_future(model.infer(row(i, 0), 1_000_000)) for i in range(3)]
        await settle()
        assert w.control == [("unload", "m3"), ("load", "m2")]
        assert not w.calls and driver.engine.workers[0].loading_model == "m2"  # serving nothing while loading
        w.gate.set()
        answers = await asyncio.gather(*calls)
        assert sorted(logits(a)[0] for a in answers) == [0, 1, 2]
        assert driver.engine.workers[0].resident == frozenset({"m2"}) and {a.variant_id for a in answers} == {"v2"}

    asyncio.run(main())


class SlowPlanner(Planner):
    """A planner whose solve blocks (in its thread) until the test lets it finish."""

    period_us = 30_000_000

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.plans = 0

    def plan(self, now_us, demand):
        self.started.set()
        assert self.release.wait(timeout=60)
        self.plans += 1
        return Plan(now_us)


def test_a_slow_planner_does_not_delay_requests():
    """While the planner's solve is blocked in its thread, requests are served on the event loop."""
    async def main():
        planner = SlowPlanner()
        driver, (model,) = make_driver(worker(gated=False))
        driver.use_planner(planner)
        await asyncio.get_running_loop().run_in_executor(None, planner.started.wait, 60)
        answers = await asyncio.gather(*(model.infer(row(i, 0), 1_000_000) for i in range(5)))
        assert len(answers) == 5 and planner.plans == 0 and driver.engine.plan_of("m") is None
        planner.release.set()
        await driver.settle()
        assert planner.plans == 1 and driver.engine.plan_of("m") is not None
        await driver.close()

    asyncio.run(main())


def test_a_follow_up_query_answers_its_parent_s_client():
    """A cascade: small (m0) escalates rows whose sum is below 2 to big (m3); those clients get big's answer."""
    async def main():
        clock = Clock()

        def slow(call):  # each batch takes 10 ms on the fake clock
            clock.now_us += 10_000
            return compute(call)

        w = FakeWorker("a", compute=slow, gate=None)
        driver, (small, big) = make_driver(w, clock=clock, policies={"small": make_policy("infaas", make_profile()),
                                                                     "big": make_policy("clipper", make_profile())})
        small.follow_up = lambda inputs, out, left_us: ("big", inputs) if np.frombuffer(out["LOGITS"], np.float32)[0] < 2 else None
        answers = await asyncio.gather(*(small.infer(row(i, 0), 1_000_000) for i in range(4)))
        assert [(logits(a)[0], logits(a)[1], a.variant_id) for a in answers] == [
            (0, 3, "v3"), (1, 3, "v3"), (2, 0, "v0"), (3, 0, "v0")]
        # an escalated request's queue time counts from its arrival, so the small model's batch is in it: its
        # time in the sidecar is both batches' at least
        assert all(a.service_us == 10_000 for a in answers)
        assert all(a.queue_us + a.service_us >= 20_000 for a in answers[:2])
        assert [c.model for c in w.calls].count("m3") >= 1 and driver.num_pending == 0
        # each request is counted once, where it ended; the model that passed one on counts it escalated
        counts = {(m.name, outcome): sum(m.stats.metrics.registry.get_sample_value(
            "accscale_requests_total", {"model": m.name, "variant": v, "outcome": outcome}) or 0 for v in ("v0", "v3"))
            for m in (small, big) for outcome in ("met", "escalated")}
        assert counts == {("small", "met"): 2, ("small", "escalated"): 2, ("big", "met"): 2, ("big", "escalated"): 0}

    asyncio.run(main())


def test_a_client_that_leaves_while_its_first_step_runs_is_not_escalated():
    async def main():
        w = worker()
        driver, (small, big) = make_driver(w, policies={"small": make_policy("infaas", make_profile()),
                                                         "big": make_policy("clipper", make_profile())})
        small.follow_up = lambda inputs, out, left_us: ("big", inputs)
        leaving = asyncio.ensure_future(small.infer(row(0, 0), 1_000_000))
        await settle()
        leaving.cancel()  # the client leaves while small runs its row
        await settle()
        w.gate.set()
        await settle()
        assert [c.model for c in w.calls] == ["m0"] and driver.num_pending == 0

    asyncio.run(main())


def test_a_follow_up_hook_that_fails_part_way_leaves_every_answer_of_its_batch_final():
    """Rows 0 and 1 would escalate; the hook fails on row 1: neither goes on, and every client gets small's answer
    (none is left waiting on a follow-up that was never queued)."""
    async def main():
        w = worker(gated=False)
        driver, (small, big) = make_driver(w, policies={"small": make_policy("infaas", make_profile()),
                                                         "big": make_policy("clipper", make_profile())})

        def hook(inputs, out, left_us):
            first = np.frombuffer(inputs["INPUT"], np.float32)[0]
            if first == 1:
                raise RuntimeError("a bug in the hook")
            return ("big", inputs) if first < 2 else None

        small.follow_up = hook
        # one batch of three; a row handed over to a follow-up never queued would leave its client waiting
        answers = await asyncio.wait_for(small.infer_rows([row(i, 0) for i in range(3)], 1_000_000), 10)
        assert len(w.calls) == 1 and [a.variant_id for a in answers] == ["v0"] * 3 and driver.num_pending == 0

    asyncio.run(main())


def test_every_policy_can_drive_the_live_model():
    async def main():
        w = worker(gated=False)
        driver, (model,) = make_driver(w)
        for name in policies():
            driver.set_policy("m", make_policy(name, make_profile(), **POLICY_OPTIONS.get(name, {})))
            answer = await model.infer(row(1, 2), 1_000_000)
            assert logits(answer)[0] == 3
        assert len(w.calls) == len(policies())

    asyncio.run(main())


@pytest.mark.parametrize("calibrate", [True, False])
def test_latency_calibration_scales_the_table_the_same_policy_reads(calibrate):
    """Batches that take no time on the fake clock: the policy's latency table is scaled in place."""
    from scheduler_sidecar.core.latency import CALIBRATION_BOUNDS, CALIBRATION_WINDOW

    async def main():
        driver, (model,) = make_driver(worker(gated=False), latency_calibration=calibrate)
        policy = model.policy
        profiled = policy.latency.us("v0", 1, "cpu")
        for _ in range(CALIBRATION_WINDOW):
            await model.infer(row(1, 1), 1_000_000)
        expected = CALIBRATION_BOUNDS[0] if calibrate else 1.0
        assert model.policy is policy and policy.latency.scale("cpu") == expected
        assert policy.latency.us("v0", 1, "cpu") == round(profiled * expected)

    asyncio.run(main())


class ServeFrom(ClipperPlus):
    """Holds every query until ``start_us``, then serves it: a policy that waits, as adaptive batching does."""

    def __init__(self, profile, start_us: int) -> None:
        super().__init__(profile)
        self.start_us = start_us

    def decide(self, now_us, queue, workers):
        if queue and now_us < self.start_us:
            return Decision(wakeup_us=self.start_us)
        return super().decide(now_us, queue, workers)


def test_a_wakeup_that_fires_before_the_clock_reads_its_time_is_not_lost():
    """The loop's timer fires when a slower clock still reads less than the wakeup time: the driver waits on
    rather than waking the engine early (which keeps that time pending and never asks for it again)."""
    loop = VirtualLoop()

    async def main():
        driver, (model,) = make_driver(worker(gated=False), policies={"m": ServeFrom(make_profile(), 10_000)},
                                       clock=lambda: loop.clock() * 9 // 10)  # 90% of the loop's speed
        answer = await model.infer(row(1, 1), 1_000_000)
        assert driver.clock() >= 10_000 and answer.queue_us == 10_000

    virtual_clock.run(main(), loop)


def test_config_file_and_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('http_port = 9\nworkers = ["h:1"]\n[[models]]\nname = "d"\nprofile = "p.json"\n'
                    'policy = "maxacc"\n[models.policy_options]\nnum_buckets = 8\n')
    config = sidecar_config.load(path, http_port=10)
    assert config.http_port == 10 and config.workers == ("h:1",)
    assert config.models == (ModelSpec("d", Path("p.json"), "maxacc", {"num_buckets": 8}),)
    with pytest.raises(ValueError, match="unknown policy"):
        sidecar_config.load(None, workers=["h:1"], models=[{"name": "d", "profile": "p", "policy": "fifo"}])
    with pytest.raises(ValueError, match="at least one Triton worker"):
        sidecar_config.load(None, models=[{"name": "d", "profile": "p"}])
    path.write_text("workers = [")
    with pytest.raises(ValueError, match="c.toml"):
        sidecar_config.load(path)


TINY_MODEL = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.index = float(args["model_name"][1:])
        self.log = os.path.join(args["model_repository"], "..", "intervals.txt")

    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.005)  # the model's work: long enough that two batches at once would overlap
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            k = len(x)
            y = np.stack([x.sum(1), np.full(k, self.index), np.full(k, k)], 1).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("LOGITS", y)]))
        with open(self.log, "a") as f:
            f.write(f"{start} {time.monotonic()}\\n")
        return out
'''


def tiny_repository(path: Path, names) -> Path:
    for name in names:
        (path / name / "1").mkdir(parents=True)
        (path / name / "1" / "model.py").write_text(TINY_MODEL)
        (path / name / "config.pbtxt").write_text(tiny_config(name))
    return path


def tiny_config(name: str) -> str:
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 16\n'
            'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            'output [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
            'instance_group [ { count: 1 kind: KIND_CPU } ]\n')


@pytest.mark.triton
@pytest.mark.slow
def test_a_policy_loads_a_model_on_a_real_triton_and_no_request_is_lost(tmp_path):
    """Explicit model control: m3 is unloaded and m2 loaded while requests wait; all are then served by m2."""
    from scheduler_sidecar.live.workers import TritonWorker
    from scheduler_sidecar.processes.triton_launcher import TritonServer

    tiny_repository(tmp_path, ("m2", "m3"))

    async def main(url: str):
        triton = TritonWorker(url)
        assert await triton.ready(["m3"], 5.0) is Health.READY
        assert await triton.ready(["m2"], 5.0) is Health.NOT_READY
        driver, (model,) = make_driver(policies={"m": make_mover()}, clock=now_us)
        driver.add_worker(triton, 1, resident=frozenset({"m3"}))
        calls = [asyncio.ensure_future(model.infer(row(i, 1), 60_000_000)) for i in range(4)]
        await settle()
        assert driver.engine.workers[0].loading_model == "m2" and driver.engine.queued("m") == 4
        answers = await asyncio.gather(*calls)
        assert sorted(logits(a)[0] for a in answers) == [1, 2, 3, 4]
        assert {logits(a)[1] for a in answers} == {2.0}  # served by m2, loaded meanwhile
        assert await triton.ready(["m2"], 5.0) is Health.READY
        assert await triton.ready(["m3"], 5.0) is Health.NOT_READY
        await driver.close()
        await triton.close()

    with TritonServer(repository=tmp_path, models=["m3"]) as server:
        asyncio.run(main(server.grpc_url))


@pytest.mark.triton
@pytest.mark.slow
def test_two_logical_models_on_one_real_triton_never_run_two_batches_at_once(tmp_path):
    """`accscale serve` with two logical models on different Triton models of one endpoint (one instance
    each, so one worker slot): Triton could run both at once, the sidecar never sends two batches."""
    import tritonclient.grpc.aio as grpcaio

    from scheduler_sidecar.processes.sidecar import SidecarServer
    from scheduler_sidecar.processes.triton_launcher import TritonServer

    repository = tiny_repository(tmp_path / "repo", ("m0", "m1", "m2", "m3"))
    make_profile().save(tmp_path / "p.json")
    config = tmp_path / "sidecar.toml"

    async def load(url: str) -> list:
        async with grpcaio.InferenceServerClient(url) as client:
            async def one(model: str, i: int):
                x = grpcaio.InferInput("INPUT", [1, 2], "FP32")
                x.set_data_from_numpy(np.array([[i, 1]], np.float32))
                result = await client.infer(model, [x], parameters={"slo_us": 30_000_000})
                return model, result.as_numpy("LOGITS")[0], result.get_response().parameters["slot"].int64_param
            return await asyncio.gather(*(one(m, i) for i in range(20) for m in ("x", "y")))

    with TritonServer(repository=repository) as triton:
        config.write_text(f'workers = ["{triton.grpc_url}"]\n'
                          f'[[models]]\nname = "x"\nprofile = "{tmp_path / "p.json"}"\npolicy = "clipper"\n'
                          f'[[models]]\nname = "y"\nprofile = "{tmp_path / "p.json"}"\npolicy = "infaas"\n')
        with SidecarServer(workers=[], config=config) as sidecar:
            answers = asyncio.run(load(sidecar.grpc_url))
    assert sorted(float(out[0]) for m, out, _ in answers if m == "x") == [i + 1.0 for i in range(20)]
    assert {float(out[1]) for m, out, _ in answers} == {0.0, 3.0}  # x ran on m3 (clipper), y on m0 (infaas)
    assert {slot for *_, slot in answers} == {0}
    intervals = sorted(tuple(map(float, line.split())) for line in (tmp_path / "repo" / "intervals.txt").read_text().split("\n") if line)
    assert len(intervals) >= 2
    assert all(end <= next_start for (_, end), (next_start, _) in zip(intervals, intervals[1:]))


@BOTH_WAYS
def test_a_request_s_rows_arrive_together_and_are_answered_together(fake):
    """Four rows of one request are queued at once: one batch of four, their answers joined in row order."""
    async def main():
        w = worker(gated=False, fake=fake)
        driver, (model,) = make_driver(w)
        answers = await model.infer_rows([row(i, 1) for i in range(4)], 1_000_000)
        assert [logits(a)[0] for a in answers] == [1, 2, 3, 4] and [c.rows for c in w.calls] == [4]
        joined = Answer.join(answers)
        assert np.frombuffer(joined.outputs["LOGITS"], np.float32).reshape(4, 3)[:, 0].tolist() == [1, 2, 3, 4]
        assert joined.batch_size == 4 and joined.variant_id == answers[0].variant_id and driver.num_pending == 0

    asyncio.run(main())


@BOTH_WAYS
def test_requests_submitted_together_are_decided_once(fake):
    """Four one-row requests the native edge hands over in one call: one decision, one batch of four (each alone,
    the first would have run as a batch of one while the others queued); a request whose client left within the
    same burst is off the queue before anything runs."""
    async def main():
        w = worker(gated=False, fake=fake)
        driver, (model,) = make_driver(w)
        got: dict[int, object] = {}
        with driver.together():
            requests = [driver.submit(model, [row(i, 1)], 1_000_000, None, 0,
                                      lambda answers, error, i=i: got.setdefault(i, answers or error))
                        for i in range(5)]
            driver.withdraw(requests[4])
            assert w.calls == [] and driver.engine.queued("m") == 4  # queued, not decided on, the fifth gone
        await settle()
        assert [c.rows for c in w.calls] == [4] and sorted(got) == [0, 1, 2, 3]
        assert [logits(got[i][0])[0] for i in range(4)] == [1, 2, 3, 4] and driver.num_pending == 0

    asyncio.run(main())


@BOTH_WAYS
def test_a_request_whose_row_fails_fails_and_its_other_rows_are_withdrawn(fake):
    """One row of a request breaks the model: the request gets that row's error, and its other rows are withdrawn
    (taken off the queue, or their answers discarded)."""
    async def main():
        w = fake("a", compute=poisoned, gate=asyncio.Event())
        driver, (model,) = make_driver(w)
        blocker = asyncio.ensure_future(model.infer(row(0, 0), 1_000_000))
        await settle()
        # 40 rows queue behind it; the first batch (16) holds the NaN row, the next 16 start when it ends, 8 wait
        request = asyncio.ensure_future(model.infer_rows([row(float("nan"), 0)] + [row(i, i) for i in range(1, 40)],
                                                         1_000_000))
        await settle()
        w.gate.set()
        with pytest.raises(WorkerFailed, match="NaN"):
            await request
        await blocker
        await settle()
        # the batch of 16 is retried in halves down to the NaN row; the second batch's answers are discarded and
        # the 8 rows still queued never run
        assert [c.rows for c in w.calls] == [1, 16, 8, 4, 2, 1, 1, 2, 4, 8, 16]
        assert driver.engine.queued("m") == 0 and driver.num_pending == 0

    asyncio.run(main())


def test_a_batch_whose_call_cannot_start_fails_alone_and_the_engine_serves_on():
    """A worker's ``send`` that raises (a call the native client cannot build) ends its batch as a failed one, after
    the engine's event has returned: its request gets an explicit error, the next is served, and settle returns."""
    class Refusing(SendingFakeWorker):
        refusals = 1

        def send(self, call, timeout_s, done):
            if self.refusals:
                self.refusals -= 1
                raise TypeError("a row that is not bytes")
            super().send(call, timeout_s, done)

    async def main():
        w = Refusing("a", compute=compute)
        driver, (model,) = make_driver(w)
        with pytest.raises(WorkerFailed, match="TypeError: a row that is not bytes"):
            await model.infer(row(1, 1), 1_000_000)
        assert logits(await model.infer(row(2, 2), 1_000_000))[0] == 4
        await driver.settle()
        assert driver.num_pending == 0 and driver._sent == 0 and len(w.calls) == 1

    asyncio.run(main())


def test_settle_waits_for_batches_sent_through_callbacks():
    async def main():
        w = worker(fake=SendingFakeWorker)
        driver, (model,) = make_driver(w)
        request = asyncio.ensure_future(model.infer(row(1, 1), 1_000_000))
        await settle()
        assert driver._sent == 1
        waiting = [asyncio.ensure_future(driver.settle()) for _ in range(2)]  # two callers wait on one future
        await settle()
        assert not any(t.done() for t in waiting)
        w.gate.set()
        await asyncio.gather(*waiting)
        assert driver._sent == 0 and request.done()

    asyncio.run(main())
