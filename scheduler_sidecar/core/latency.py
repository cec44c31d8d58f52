"""The latency a policy plans with: profiled p50 per (variant, batch size, device kind), calibrated.

A :class:`LatencyTable` reads a profile's curves and multiplies them by a scale per device kind.
The live driver sets that scale from measured service times (a worker slower under load than
when it was profiled); the policy keeps reading the same table object, so a stateful policy is
never rebuilt. Policies that derive tables of their own from it (SlackFit's buckets) rebuild them
when :attr:`LatencyTable.version` changes.
"""

from __future__ import annotations

from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError


class LatencyTable:
    def __init__(self, profile: Profile) -> None:
        self._curves = {v.id: v.latency for v in profile.variants}
        self.device_kinds = profile.device_kinds
        self._scale: dict[str, float] = {}  # device kind -> measured / profiled; absent: 1
        self.version = 0  # bumped by every scale change

    def us(self, variant_id: str, batch_size: int, device: str) -> int:
        """Expected p50 of a batch of ``batch_size`` on ``device`` in integer microseconds."""
        p50_ms = self._curve(variant_id, device).p50_at(batch_size)
        scale = self._scale.get(device)
        return round((p50_ms if scale is None else p50_ms * scale) * 1000)

    def tail_us(self, variant_id: str, batch_size: int, device: str) -> int:
        """How much longer than :meth:`us` the batch takes at its profiled p99, in integer microseconds."""
        return round(self._curve(variant_id, device).tail_at(batch_size) * self.scale(device) * 1000)

    def _curve(self, variant_id: str, device: str):
        try:
            return self._curves[variant_id][device]
        except KeyError:
            raise ConfigError(f"no latency for variant {variant_id!r} on device kind {device!r}; the profile has "
                              f"{list(self.device_kinds)}") from None

    def scale(self, device: str) -> float:
        return self._scale.get(device, 1.0)

    def set_scale(self, device: str, factor: float) -> None:
        if not factor > 0:
            raise ValueError(f"latency scale must be positive, got {factor}")
        self._scale[device] = factor
        self.version += 1
