"""A pipeline as Loki's resource manager and load balancer see it (§2.1, §4.1): a rooted tree of tasks, each
with model variants that differ in accuracy, batch latency and fan-out.

A variant's ``fanout`` is the number of queries one of its queries creates for each child task: for a
detector, objects per frame times the share of them that go to that child (the artifact's
``multFactor x branchRatio``; the paper's r(i,k) per variant, split per child, digest A6). The augmented
graph has a vertex per (task, variant); its root-to-leaf paths are the ways a query can be served.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.errors import ProfileError

DEVICE = "gpu"  # Loki's cluster is homogeneous (digest A23): one device kind


@dataclass(frozen=True)
class StageVariant:
    id: str  # also its Triton model's name
    accuracy: float  # normalised single-model accuracy in (0, 1] (§6.1: over the family's best)
    latency: LatencyCurve  # p50 per batch size on the cluster's device
    fanout: Mapping[str, float] = field(default_factory=dict)  # child task -> queries created per query

    def batch_ms(self, batch: int) -> float:
        return self.latency.p50_ms[self.latency.batch_sizes.index(batch)]

    def throughput_qps(self, batch: int) -> float:
        """q(i,k,b): queries per second one replica serves in back-to-back batches of ``batch``."""
        return batch * 1000.0 / self.batch_ms(batch)


@dataclass(frozen=True)
class Task:
    name: str
    variants: tuple[StageVariant, ...]  # most accurate first
    children: tuple[str, ...] = ()

    @property
    def top(self) -> StageVariant:
        """v_i^max (Eq. 8)."""
        return self.variants[0]


Path = tuple[str, ...]  # variant ids from the root to a leaf (or any vertex) of the augmented graph


@dataclass(frozen=True)
class Pipeline:
    name: str
    tasks: tuple[Task, ...]  # topological order: the root first
    slo_ms: float
    source: str  # whose data it is, or how it was measured
    # measured end-to-end accuracy per root-to-leaf path (Â(p), §2.1); absent paths take the product of the
    # single-model accuracies (the artifact's assumption, digest A7)
    path_accuracy: Mapping[Path, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ProfileError(f"{self.name}: task names repeat: {names}")
        ids = [v.id for t in self.tasks for v in t.variants]
        if len(set(ids)) != len(ids):
            raise ProfileError(f"{self.name}: a variant id names one model of one task; repeated: {ids}")
        seen = {self.tasks[0].name}
        for t in self.tasks:
            if not t.variants:
                raise ProfileError(f"{self.name}: task {t.name!r} has no variants")
            if [v.accuracy for v in t.variants] != sorted((v.accuracy for v in t.variants), reverse=True):
                raise ProfileError(f"{self.name}: task {t.name!r} must list its variants most accurate first")
            for c in t.children:
                if c in seen or c not in names:
                    raise ProfileError(f"{self.name}: child {c!r} of {t.name!r} is unknown or not after its parent "
                                     "(a pipeline is a tree in topological order)")
                seen.add(c)
            for v in t.variants:
                if set(v.fanout) != set(t.children):
                    raise ProfileError(f"{self.name}: variant {v.id!r} must give a fan-out for exactly the children "
                                     f"{list(t.children)}")
        if len(seen) != len(self.tasks):
            raise ProfileError(f"{self.name}: tasks {sorted(set(names) - seen)} are not reachable from the root")
        object.__setattr__(self, "_index", {v.id: (t, v) for t in self.tasks for v in t.variants})

    # ------------------------------------------------------------------ structure
    @property
    def root(self) -> Task:
        return self.tasks[0]

    def task(self, name: str) -> Task:
        return next(t for t in self.tasks if t.name == name)

    def parent(self, name: str) -> Task | None:
        return next((t for t in self.tasks if name in t.children), None)

    @property
    def leaves(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if not t.children)

    def chain(self, name: str) -> tuple[Task, ...]:
        """The tasks from the root to ``name``."""
        out = [self.task(name)]
        while (p := self.parent(out[-1].name)) is not None:
            out.append(p)
        return tuple(reversed(out))

    def paths(self, name: str) -> list[Path]:
        """Every augmented-graph path from the root to a variant of task ``name``."""
        return [tuple(v.id for v in vs) for vs in itertools.product(*(t.variants for t in self.chain(name)))]

    def variant(self, variant_id: str) -> StageVariant:
        return self._index[variant_id][1]  # type: ignore[attr-defined]

    def task_of(self, variant_id: str) -> Task:
        return self._index[variant_id][0]  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ accuracy and load
    def accuracy(self, path: Path) -> float:
        """Â(p): measured where the pipeline has it, else the product of the single-model accuracies."""
        if path in self.path_accuracy:
            return self.path_accuracy[path]
        return math.prod(self.variant(v).accuracy for v in path)

    def multiplier(self, path: Path) -> float:
        """m(p, i, k) for the vertex ``path`` ends at: queries reaching it per query entering the pipeline,
        the product of the fan-outs of its predecessors only (digest A5, as the artifact)."""
        m = 1.0
        for a, b in itertools.pairwise(path):
            m *= self.variant(a).fanout[self.task_of(b).name]
        return m

    def scaled(self, factor: float) -> Pipeline:
        """The same pipeline with every latency multiplied by ``factor`` (an emulated slower device)."""
        tasks = tuple(replace(t, variants=tuple(replace(v, latency=v.latency.scaled(factor)) for v in t.variants))
                      for t in self.tasks)
        return replace(self, tasks=tasks)

    def profile(self, task: str) -> Profile:
        """The engine's profile of one task: each variant its own Triton model."""
        t = self.task(task)
        return Profile(f"{self.name}/{task}", self.source,
                       tuple(Variant(v.id, v.accuracy, Actuation("model", v.id), {DEVICE: v.latency})
                             for v in reversed(t.variants)))
