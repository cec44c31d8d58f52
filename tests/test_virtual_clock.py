"""The virtual-time event loop the sim-vs-live tests run on."""

from __future__ import annotations

import asyncio

import pytest

from tests.virtual_clock import Deadlock, VirtualLoop, run


def test_time_jumps_to_each_timer_in_whole_microseconds():
    async def main(loop: VirtualLoop) -> list[int]:
        await asyncio.sleep(3600)  # an hour, at once
        seen = [loop.clock()]
        await asyncio.sleep(0.1 + 0.2)  # 0.30000000000000004 s: the microsecond 300000, not the next
        seen.append(loop.clock())
        await asyncio.sleep(1.5e-6)  # between two microseconds: the later one
        return [*seen, loop.clock()]

    loop = VirtualLoop()
    assert run(main(loop), loop) == [3_600_000_000, 3_600_300_000, 3_600_300_002]


def test_timers_due_together_run_by_rank_then_schedule_order_each_with_what_follows_from_it():
    async def main(loop: VirtualLoop) -> list[str]:
        order: list[str] = []

        async def wakes(name: str) -> None:
            await asyncio.sleep(0.001)
            order.append(name)
            loop.call_soon(order.append, f"after {name}")

        loop.call_at(0.001, order.append, "last", rank=1)
        tasks = [asyncio.create_task(wakes(name)) for name in ("a", "b")]
        handle = loop.call_at(0.001, order.append, "cancelled")
        handle.cancel()
        await asyncio.gather(*tasks)
        await asyncio.sleep(0.001)
        return order

    loop = VirtualLoop()
    assert run(main(loop), loop) == ["a", "after a", "b", "after b", "last"]


def test_run_in_executor_runs_inline_and_takes_no_time():
    async def main(loop: VirtualLoop) -> tuple[int, int]:
        answer = await loop.run_in_executor(None, sum, [20, 22])
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(None, divmod, 1, 0)
        return answer, loop.clock()

    loop = VirtualLoop()
    assert run(main(loop), loop) == (42, 0)


def test_waiting_for_what_can_never_happen_is_a_deadlock():
    async def main() -> None:
        await asyncio.sleep(0.002)
        await asyncio.get_running_loop().create_future()

    with pytest.raises(Deadlock, match="at 2000 us"):
        run(main())
