"""Worker health: a worker that says it is not ready, or is gone, is down at once; one that is only slow to
answer its health check is not, while its batches are answered (overload never looks like a dead worker)."""

from __future__ import annotations

import asyncio

from scheduler_sidecar.live.pool import WorkerPool
from scheduler_sidecar.live.tensors import TensorSpec
from scheduler_sidecar.live.workers import FakeWorker, Health, InferCall

BATCH = InferCall("m", "", ((TensorSpec("X", "FP32", (1,)), (b"\0" * 4,)),), ())


def echo(call: InferCall) -> list[dict[str, bytes]]:
    return [{} for _ in range(call.rows)]


def pool_of(*workers: FakeWorker, timeouts_to_down: int = 3) -> tuple[WorkerPool, list[tuple[str, bool]]]:
    by_url = {w.url: w for w in workers}
    pool = WorkerPool(["m"], timeouts_to_down=timeouts_to_down, connect=by_url.__getitem__)
    changes: list[tuple[str, bool]] = []
    pool.on_change(lambda worker, healthy: changes.append((worker.url, healthy)))
    return pool, changes


def run(main) -> None:
    asyncio.run(main())


def test_silent_checks_while_batches_are_answered_never_mark_a_worker_down():
    async def main():
        busy = FakeWorker("busy", echo)
        pool, changes = pool_of(busy)
        await pool.add("busy")
        busy.health = Health.NO_ANSWER
        for _ in range(10):
            await busy.infer(BATCH, 1.0)  # a batch answered between two checks
            await pool.check()
        assert pool.healthy == {"busy": True} and changes == []

    run(main)


def test_silent_checks_in_a_row_without_progress_mark_it_down_and_a_good_check_brings_it_back():
    async def main():
        mute = FakeWorker("mute", echo)
        pool, changes = pool_of(mute, timeouts_to_down=3)
        await pool.add("mute")
        mute.health = Health.NO_ANSWER
        await pool.check()
        await pool.check()
        await mute.infer(BATCH, 1.0)  # progress resets the count
        await pool.check()
        await pool.check()
        await pool.check()
        assert pool.healthy == {"mute": True}
        await pool.check()  # the third silent check in a row with no batch answered
        assert pool.healthy == {"mute": False} and changes == [("mute", False)]
        await pool.check()
        assert changes == [("mute", False)]  # heard once
        mute.health = Health.READY
        await pool.check()
        assert pool.healthy == {"mute": True} and changes == [("mute", False), ("mute", True)]

    run(main)


def test_not_ready_or_unreachable_is_down_at_once():
    async def main():
        a, b, c = FakeWorker("a", echo), FakeWorker("b", echo), FakeWorker("c", echo)
        pool, changes = pool_of(a, b, c)
        for url in "abc":
            await pool.add(url)
        a.health, b.health = Health.NOT_READY, Health.UNREACHABLE
        await pool.check()
        assert pool.healthy == {"a": False, "b": False, "c": True}
        assert sorted(changes) == [("a", False), ("b", False)]

    run(main)


def test_a_worker_that_is_not_ready_cannot_join():
    async def main():
        late = FakeWorker("late", echo, health=Health.NOT_READY)
        pool, _ = pool_of(late)
        try:
            await pool.add("late")
        except ValueError as exc:
            assert "not ready" in str(exc)
        else:
            raise AssertionError("a worker that is not ready joined the pool")
        assert pool.workers == []

    run(main)


def test_a_worker_nothing_listens_for_is_unreachable_typed_with_its_url_and_queries():
    """A batch sent to a port nothing listens on: WorkerUnreachable (a WorkerLost, so it is retried elsewhere), told
    by the status and the channel's state rather than the message, carrying the worker's URL."""
    import socket  # this test's only

    from scheduler_sidecar.errors import WorkerLost, WorkerUnreachable  # this test's only
    from scheduler_sidecar.live.workers import TritonWorker  # this test's only

    async def main():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"127.0.0.1:{s.getsockname()[1]}"
        worker = TritonWorker(url)
        spec = TensorSpec("INPUT", "FP32", (2,))
        try:
            await worker.infer(InferCall("m", "", ((spec, (b"\0" * 8,)),), (spec,), ()), 5.0)
        except WorkerUnreachable as exc:
            assert isinstance(exc, WorkerLost) and exc.worker == url and exc.about((3, 4)).queries == (3, 4)
        else:
            raise AssertionError("no error from a worker nothing listens for")
        finally:
            await worker.close()

    asyncio.run(main())
