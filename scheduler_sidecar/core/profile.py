"""Profiles: the variants a policy may choose from, validated on load.

A profile is a JSON file::

    {"schema": "accscale/profile/v1", "name": ..., "source": ...,   # who measured it, or whose data
     "metadata": {...},                                            # free-form provenance
     "variants": [{"id": ..., "accuracy": 0.973,                   # top-1 in [0, 1]
                   "actuation": {"kind": "supernet", "model": "digits", "control": [...]},
                   "latency": {"cpu": {"batch_sizes": [1, ...], "p50_ms": [...], "p99_ms": [...]}},
                   "memory_bytes": 123456,                         # optional, as are the next two
                   "load_ms": 850.0}, ...]}                          # its Triton model's measured load time

``actuation.kind`` is ``supernet`` (a control row for a SubNetAct model), ``model`` (a
separate Triton model, optional ``version``) or ``pipeline`` (a path through a BLS model).
Every error names the file and the field, e.g. ``p.json: variants[3].latency.cpu.p50_ms``.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scheduler_sidecar.errors import ProfileError

# the published and paper-scale profiles shipped with the project (a source checkout or an editable install)
PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
SCHEMA = "accscale/profile/v1"
ACTUATION_KINDS = ("supernet", "model", "pipeline")


@dataclass(frozen=True)
class LatencyCurve:
    """Latency of one variant on one device kind, per batch size (ascending)."""

    batch_sizes: tuple[int, ...]
    p50_ms: tuple[float, ...]
    p99_ms: tuple[float, ...]

    @property
    def mean_p50_ms(self) -> float:
        return sum(self.p50_ms) / len(self.p50_ms)

    def p50_at(self, batch_size: int) -> float:
        """p50 of a batch of ``batch_size``: a size between profiled ones runs padded to the next one up."""
        return self.p50_ms[self._at(batch_size)]

    def tail_at(self, batch_size: int) -> float:
        """How much longer than its p50 a batch of ``batch_size`` takes at the p99 (padded as :meth:`p50_at`)."""
        i = self._at(batch_size)
        return max(0.0, self.p99_ms[i] - self.p50_ms[i])

    def _at(self, batch_size: int) -> int:
        i = bisect.bisect_left(self.batch_sizes, batch_size)
        if i == len(self.batch_sizes):
            raise ValueError(f"batch size {batch_size} exceeds the largest profiled one ({self.batch_sizes[-1]})")
        return i

    def scaled(self, factor: float) -> LatencyCurve:
        """Every latency multiplied by ``factor``."""
        return LatencyCurve(self.batch_sizes, tuple(x * factor for x in self.p50_ms),
                            tuple(x * factor for x in self.p99_ms))

    def interpolated(self, batch_sizes: Sequence[int]) -> LatencyCurve:
        """The curve at ``batch_sizes``: linear between the two profiled sizes around each one."""
        lo, hi = self.batch_sizes[0], self.batch_sizes[-1]
        if any(not lo <= b <= hi for b in batch_sizes):
            raise ValueError(f"batch sizes {list(batch_sizes)} leave the profiled range {lo}..{hi}")

        def at(values: tuple[float, ...], b: int) -> float:
            i = bisect.bisect_left(self.batch_sizes, b)
            if self.batch_sizes[i] == b:
                return values[i]
            b0, b1 = self.batch_sizes[i - 1], self.batch_sizes[i]
            return values[i - 1] + (values[i] - values[i - 1]) * (b - b0) / (b1 - b0)

        return LatencyCurve(tuple(batch_sizes), tuple(at(self.p50_ms, b) for b in batch_sizes),
                            tuple(at(self.p99_ms, b) for b in batch_sizes))


@dataclass(frozen=True)
class Actuation:
    kind: str  # one of ACTUATION_KINDS
    model: str  # Triton model name (the supernet, the variant, or the pipeline's BLS model)
    control: tuple[int, ...] | None = None  # supernet control row (python_backend.control)
    version: str | None = None  # Triton model version; None = the latest
    path: tuple[str, ...] | None = None  # pipeline: the variant of each stage


@dataclass(frozen=True)
class Variant:
    id: str
    accuracy: float  # top-1 in [0, 1], measured on held-out data or imported with its source named
    actuation: Actuation
    latency: dict[str, LatencyCurve]  # device kind -> curve
    memory_bytes: int | None = None
    extras: dict[str, Any] = field(default_factory=dict, compare=False)  # e.g. {"macs": ...}
    load_ms: float | None = None  # measured time to load its Triton model (a plan's actuation delay); None: unknown


@dataclass(frozen=True)
class Profile:
    name: str
    source: str  # who measured it (command and machine) or whose published data it is
    variants: tuple[Variant, ...]  # ascending accuracy
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def device_kinds(self) -> tuple[str, ...]:
        return tuple(self.variants[0].latency) if self.variants else ()

    def variant(self, variant_id: str) -> Variant:
        for v in self.variants:
            if v.id == variant_id:
                return v
        raise ProfileError(f"profile {self.name!r} has no variant {variant_id!r}")

    def spread(self, n: int) -> list[Variant]:
        """``n`` distinct variants uniformly spaced in accuracy, from least to most accurate."""
        if n >= len(self.variants):
            return list(self.variants)
        lo, hi = self.variants[0].accuracy, self.variants[-1].accuracy
        picked: list[Variant] = []
        for k in range(n):
            target = lo + (hi - lo) * k / max(n - 1, 1)
            free = [v for v in self.variants if v not in picked]
            picked.append(min(free, key=lambda v: (abs(v.accuracy - target), v.id)))
        return sorted(picked, key=lambda v: v.accuracy)

    def load_ms(self) -> dict[str, float]:
        """Triton model -> its measured load time, for the variants whose profile states one."""
        return {v.actuation.model: v.load_ms for v in self.variants if v.load_ms is not None}

    def scaled(self, factor: float) -> Profile:
        """The same profile with every latency multiplied by ``factor`` (the sidecar's latency calibration)."""
        return replace(self, variants=tuple(replace(v, latency={d: c.scaled(factor) for d, c in v.latency.items()})
                                            for v in self.variants))

    def dominated(self, device: str) -> list[str]:
        """Ids of variants dominated by another (>= accuracy, <= mean p50 latency, one strict)."""
        out = []
        for v in self.variants:
            lv = v.latency[device].mean_p50_ms
            for w in self.variants:
                lw = w.latency[device].mean_p50_ms
                if w is not v and w.accuracy >= v.accuracy and lw <= lv and (w.accuracy > v.accuracy or lw < lv):
                    out.append(v.id)
                    break
        return out

    def to_json(self) -> str:
        def variant(v: Variant) -> dict[str, Any]:
            act: dict[str, Any] = {"kind": v.actuation.kind, "model": v.actuation.model}
            for key in ("control", "version", "path"):
                if getattr(v.actuation, key) is not None:
                    act[key] = list(getattr(v.actuation, key)) if key != "version" else v.actuation.version
            out: dict[str, Any] = {
                "id": v.id, "accuracy": round(v.accuracy, 6), "actuation": act,
                "latency": {d: {"batch_sizes": list(c.batch_sizes), "p50_ms": [round(x, 4) for x in c.p50_ms],
                                "p99_ms": [round(x, 4) for x in c.p99_ms]} for d, c in v.latency.items()},
            }
            if v.memory_bytes is not None:
                out["memory_bytes"] = v.memory_bytes
            if v.load_ms is not None:
                out["load_ms"] = round(v.load_ms, 3)
            return out | ({"extras": v.extras} if v.extras else {})

        return json.dumps({"schema": SCHEMA, "name": self.name, "source": self.source, "metadata": self.metadata,
                           "variants": [variant(v) for v in self.variants]}, indent=1)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path | str) -> Profile:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ProfileError(f"{path}: no such profile file") from None
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not JSON ({exc})") from None
        return _parse(raw, str(path))


class _Reader:
    """Typed access to a JSON object with errors that name the file and field."""

    def __init__(self, raw: Any, where: str) -> None:
        self.raw, self.where = raw, where

    def fail(self, msg: str) -> ProfileError:
        return ProfileError(f"{self.where}: {msg}")

    def get(self, key: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
        if not isinstance(self.raw, dict):
            raise self.fail("must be an object")
        if key not in self.raw:
            if required:
                raise ProfileError(f"{self.where}.{key}: missing")
            return None
        value = self.raw[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise ProfileError(f"{self.where}.{key}: expected {getattr(kind, '__name__', kind)}, got {value!r:.60}")
        return value

    def child(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), f"{self.where}.{key}")


def _numbers(r: _Reader, key: str, n: int | None, integer: bool = False) -> tuple:
    values = r.get(key, list)
    kind = int if integer else (int, float)
    if not values or any(not isinstance(x, kind) or isinstance(x, bool) for x in values):
        raise ProfileError(f"{r.where}.{key}: expected a non-empty list of {'integers' if integer else 'numbers'}")
    if any(not math.isfinite(x) or x < 0 for x in values):
        raise ProfileError(f"{r.where}.{key}: values must be finite and >= 0")
    if n is not None and len(values) != n:
        raise ProfileError(f"{r.where}.{key}: has {len(values)} values, expected {n} (one per batch size)")
    return tuple(values)


def _parse(raw: Any, where: str) -> Profile:
    top = _Reader(raw, where)
    schema = top.get("schema", str)
    if schema != SCHEMA:
        raise ProfileError(f"{where}.schema: {schema!r} is not {SCHEMA!r}")
    variants = []
    raw_variants = top.get("variants", list)
    if not raw_variants:
        raise ProfileError(f"{where}.variants: a profile needs at least one variant")
    for i, rv in enumerate(raw_variants):
        r = _Reader(rv, f"{where}: variants[{i}]")
        accuracy = r.get("accuracy", (int, float))
        if not 0.0 <= accuracy <= 1.0:
            raise ProfileError(f"{r.where}.accuracy: {accuracy} is not a fraction in [0, 1]")
        a = r.child("actuation")
        kind = a.get("kind", str)
        if kind not in ACTUATION_KINDS:
            raise ProfileError(f"{a.where}.kind: {kind!r} is not one of {ACTUATION_KINDS}")
        control = a.get("control", list, required=kind == "supernet")
        if control is not None and any(not isinstance(c, int) or isinstance(c, bool) for c in control):
            raise ProfileError(f"{a.where}.control: expected a list of integers")
        path = a.get("path", list, required=kind == "pipeline")
        actuation = Actuation(kind, a.get("model", str), tuple(control) if control is not None else None,
                              a.get("version", str, required=False), tuple(path) if path is not None else None)
        lat = r.child("latency")
        if not lat.raw:
            raise ProfileError(f"{lat.where}: needs at least one device kind")
        curves = {}
        for device in lat.raw:
            c = lat.child(device)
            sizes = _numbers(c, "batch_sizes", None, integer=True)
            if list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                raise ProfileError(f"{c.where}.batch_sizes: must be ascending, distinct and >= 1")
            curves[device] = LatencyCurve(sizes, _numbers(c, "p50_ms", len(sizes)), _numbers(c, "p99_ms", len(sizes)))
        load_ms = r.get("load_ms", (int, float), required=False)
        if load_ms is not None and not load_ms >= 0:
            raise ProfileError(f"{r.where}.load_ms: {load_ms} is not a time >= 0")
        variants.append(Variant(r.get("id", str), float(accuracy), actuation, curves,
                                r.get("memory_bytes", int, required=False), r.get("extras", dict, required=False) or {},
                                None if load_ms is None else float(load_ms)))
    ids = [v.id for v in variants]
    if len(set(ids)) != len(ids):
        raise ProfileError(f"{where}.variants: duplicate ids {sorted({i for i in ids if ids.count(i) > 1})}")
    devices = set(variants[0].latency)
    for i, v in enumerate(variants):
        if set(v.latency) != devices:
            raise ProfileError(f"{where}: variants[{i}].latency: device kinds {sorted(v.latency)} differ from "
                               f"variants[0]'s {sorted(devices)}")
        for device in devices:  # policies compare variants batch size by batch size
            if v.latency[device].batch_sizes != variants[0].latency[device].batch_sizes:
                raise ProfileError(f"{where}: variants[{i}].latency.{device}.batch_sizes differ from variants[0]'s")
    variants.sort(key=lambda v: (v.accuracy, v.id))
    return Profile(top.get("name", str), top.get("source", str), tuple(variants),
                   top.get("metadata", dict, required=False) or {})


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, accuracy) points no other point dominates, by ascending cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front
