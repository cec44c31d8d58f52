"""How long a request waits on the event loop before its handler runs, which no policy would otherwise see.

gRPC's and aiohttp's I/O hand a request to the event loop as a ready callback; when the loop is busy
(a burst, a CPU shared with Triton and the load generator), the handler runs only after the callbacks
ahead of it, and the request's SLO clock has been running all along. :class:`LoopLag` measures that
wait with a timer that should fire every ``interval_s`` and records how late it fires; the largest
of its last ``window`` readings is what a request arriving now is taken to have waited. The sidecar
counts it against the request's deadline, so a policy plans with the slack the client really has left.
"""

from __future__ import annotations

import asyncio
import collections

INTERVAL_S = 0.005  # a probe every 5 ms: 200 wake-ups a second, a few ms of CPU
WINDOW = 8  # the last 40 ms of probes


class LoopLag:
    def __init__(self, interval_s: float = INTERVAL_S, window: int = WINDOW) -> None:
        self.interval_s = interval_s
        self._recent: collections.deque[float] = collections.deque([0.0], maxlen=window)
        self.us = 0  # the largest lateness of the recent probes, in microseconds

    async def run(self) -> None:
        """Probe until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            self._recent.append(max(0.0, loop.time() - start - self.interval_s))
            self.us = round(max(self._recent) * 1e6)
