"""The simulated world, described apart from any policy: its workers, their device kinds and speeds,
how long a batch and a model load take, and when workers fail.

A batch takes the profiled p50 of (variant, batch size) on the worker's device kind, divided by
the worker's speed, or, with ``latency_noise="tail"``, a lognormal sample whose median is that
p50 and whose 99th percentile is the p99, or, with ``latency_ratios``, that p50 times one of those
ratios drawn at random (a live run's batches' service times over their profiled p50s: its own spread,
tail and all); plus ``batch_overhead_ms``, what serving adds to the model's own time where the profile
leaves it out (a live deployment's RPC and server, measured).
A batch between profiled sizes is padded to the next profiled size, as a batching server runs it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import WorkerState

_Z99 = 2.3263478740408408  # standard normal 99th percentile


@dataclass(frozen=True, slots=True)
class SimWorker:
    device: str = "cpu"  # device kind: the profile curve its batches take
    speed: float = 1.0  # batches take the profiled latency divided by this
    resident: frozenset[str] | None = None  # Triton models loaded at the start; None: every model


@dataclass(frozen=True)
class World:
    workers: tuple[SimWorker, ...]
    seed: int = 0
    latency_noise: Literal["none", "tail"] = "none"
    fail_at_s: tuple[float, ...] = ()  # one worker (the lowest id still healthy) fails at each time
    # model load time, per Triton model or for all; None: the profiles' measured load times, 0 where none is known
    load_ms: Mapping[str, float] | float | None = None
    batch_overhead_ms: float = 0.0  # added to every batch's latency
    latency_ratios: tuple[float, ...] = ()  # measured: each batch's p50 times one of these, drawn at random

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("a simulation needs at least one worker")
        if any(not w.speed > 0 for w in self.workers):
            raise ValueError("worker speeds must be positive")
        if not self.batch_overhead_ms >= 0:
            raise ValueError(f"batch_overhead_ms must be >= 0, got {self.batch_overhead_ms}")
        if not all(r > 0 for r in self.latency_ratios) or (self.latency_ratios and self.latency_noise != "none"):
            raise ValueError("latency_ratios must be > 0, and take the place of latency_noise")

    @classmethod
    def uniform(cls, workers: int, device: str = "cpu", **options) -> World:
        """``workers`` identical workers of one device kind holding every model."""
        return cls(tuple(SimWorker(device) for _ in range(workers)), **options)

    def worker_states(self) -> list[WorkerState]:
        return [WorkerState(i, device=w.device, resident=w.resident) for i, w in enumerate(self.workers)]

    def load_us(self, model: str) -> int:
        load_ms = self.load_ms or 0.0
        ms = load_ms.get(model, 0.0) if isinstance(load_ms, Mapping) else load_ms
        return max(1, round(ms * 1000))

    def with_load_times(self, profiles: Sequence[Profile]) -> World:
        """This world, its load times the profiles' measured ones where it names none (the artifacts' 0 elsewhere)."""
        if self.load_ms is not None:
            return self
        return replace(self, load_ms={m: ms for p in profiles for m, ms in p.load_ms().items()})


class BatchLatency:
    """Samples how long a batch takes in the world (the simulator's only source of time)."""

    def __init__(self, world: World, profiles: Sequence[Profile]) -> None:
        self.world = world
        self.rng = np.random.default_rng(world.seed)
        # (variant, device, k) -> (p50 in us, lognormal sigma) of the smallest profiled batch size >= k
        self._table: dict[tuple[str, str, int], tuple[float, float]] = {}
        devices = {w.device for w in world.workers}
        for profile in profiles:
            for v in profile.variants:
                for device in devices & set(v.latency):
                    curve = v.latency[device]
                    k = 1
                    for b, p50, p99 in zip(curve.batch_sizes, curve.p50_ms, curve.p99_ms):
                        sigma = math.log(max(p99, p50) / p50) / _Z99 if p50 > 0 else 0.0
                        for size in range(k, b + 1):
                            self._table[(v.id, device, size)] = (p50 * 1000, sigma)
                        k = b + 1

    def sample_us(self, variant_id: str, batch_size: int, worker_id: int) -> int:
        worker = self.world.workers[worker_id]
        p50, sigma = self._table[(variant_id, worker.device, batch_size)]
        if worker.speed != 1.0:
            p50 /= worker.speed
        if self.world.latency_noise == "tail":
            p50 *= math.exp(sigma * self.rng.standard_normal())
        elif self.world.latency_ratios:
            p50 *= self.world.latency_ratios[int(self.rng.integers(len(self.world.latency_ratios)))]
        return max(1, round(p50 + self.world.batch_overhead_ms * 1000))
