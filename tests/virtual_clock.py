"""An asyncio event loop on virtual time, for tests: no wall-clock waiting, and a deadlock is an error.

Time is a whole number of microseconds (``loop.clock()``; ``loop.time()`` gives it in seconds). The
loop keeps its own timer heap and, whenever it has nothing ready to run, starts the earliest timer
and moves the clock to that timer's time at once. It starts one timer per idle moment, so a timer's
callback and everything that follows from it (tasks it wakes, the callbacks they schedule) run to
completion before the next timer starts, even one due at the same microsecond: timers due together
run in ``rank`` order, then in the order they were scheduled. ``run_in_executor`` calls the function
inline, so a blocking call (a planner's solve) takes no virtual time. With nothing ready and no
timer left while the awaited coroutine is not done, the loop raises :class:`Deadlock`.

What it relies on beyond the public API (checked on CPython 3.11):

- ``BaseEventLoop.call_later`` goes through ``call_at``, so overriding ``call_at`` sees every timer
  and the base loop's own timer heap (``_scheduled``) stays empty;
- ``BaseEventLoop._run_once`` calls ``selector.select(timeout)`` once per iteration, with
  ``timeout=None`` exactly when no callback is ready, the loop is not stopping and its own timer
  heap is empty; a callback the selector schedules with ``call_soon`` runs in that same iteration;
- ``asyncio.TimerHandle(when, callback, args, loop, context)`` builds the handle callers cancel
  (its constructor is not documented).

No other thread may schedule work (``call_soon_threadsafe``): the loop never waits for one.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import math
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Nothing can run and no timer is pending, but the awaited coroutine is not done."""


class _IdleSelector(selectors.SelectSelector):
    """Polls without blocking; where the loop would wait for the next event it calls ``on_idle`` instead."""

    def __init__(self) -> None:
        super().__init__()
        self.on_idle: Callable[[], None] = lambda: None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # nothing ready and the base loop's timer heap empty (see the module docstring)
            self.on_idle()
        return super().select(0)


def _to_us(when_s: float) -> int:
    """The first whole microsecond not before ``when_s``; 1 ns of slack absorbs float rounding
    (``0.1 + 0.2`` s is 300000 us, not 300001)."""
    return math.ceil(when_s * 1e6 - 1e-3)


class VirtualLoop(asyncio.SelectorEventLoop):
    """See the module docstring."""

    def __init__(self) -> None:
        selector = _IdleSelector()
        super().__init__(selector)
        selector.on_idle = self._start_next_timer
        self._now_us = 0
        # (due us, rank, sequence number, handle, callback, args, context); the handle is what callers cancel
        self._timers: list[tuple[int, int, int, asyncio.TimerHandle, Callable[..., object], tuple[Any, ...],
                                 contextvars.Context]] = []
        self._seq = itertools.count()

    def clock(self) -> int:
        """Virtual time in whole microseconds: pass ``loop.clock`` as a driver's clock."""
        return self._now_us

    def time(self) -> float:
        return self._now_us / 1e6

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: contextvars.Context | None = None, rank: int = 0) -> asyncio.TimerHandle:
        """Like ``loop.call_at``; of the callbacks due at the same microsecond, lower ranks run first."""
        context = context if context is not None else contextvars.copy_context()
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, (_to_us(when), rank, next(self._seq), handle, callback, args, context))
        return handle

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Call ``func`` now, on the loop: no thread, no virtual time."""
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _start_next_timer(self) -> None:
        while self._timers:
            due_us, _, _, handle, callback, args, context = heapq.heappop(self._timers)
            if not handle.cancelled():
                self._now_us = max(self._now_us, due_us)
                self.call_soon(callback, *args, context=context)
                return
        raise Deadlock(f"virtual loop at {self._now_us} us: nothing is ready and no timer is pending, "
                       "but the awaited coroutine is not done")


def run(main: Coroutine[Any, Any, T], loop: VirtualLoop | None = None) -> T:
    """Run ``main`` on ``loop`` (a new one by default) and close it, cancelling what is left, as asyncio.run does."""
    loop = loop or VirtualLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:  # gather() of nothing would make its future on another loop
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
