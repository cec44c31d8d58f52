"""``accscale profile import``: a profile from Model Analyzer's results, for an operator who profiled with it.

Model Analyzer writes its inference results as a CSV (``results/metrics-model-inference.csv`` by default),
one row per measured (model config, batch size, concurrency), with the column headers of its result tables:
``Model``, ``Batch``, ``Concurrency``, ``Model Config Path``, ``p99 Latency (ms)``, and ``Avg Latency (ms)``
where its ``inference_output_fields`` include ``perf_latency_avg``. The import keeps the rows at concurrency 1
(the latency of one batch at a time, as ``profile triton`` measures it) of one configuration per model: the one
named with ``--model-config``, else ``<model>_config_default``, else the model's only one.

Decision: Model Analyzer records no median. The profile's p50 is its average latency where the CSV has it, and
otherwise its p99 (a policy then plans with the tail throughout: safe, and pessimistic by the spread). The
profile says which in its provenance. Accuracy Model Analyzer does not know: it comes from ``--accuracy``.
"""

from __future__ import annotations

import csv
import shlex
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from export.triton_profile import read_accuracies
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.errors import ProfileError

MODEL, BATCH, CONCURRENCY, CONFIG = "Model", "Batch", "Concurrency", "Model Config Path"
P99, AVERAGE = "p99 Latency (ms)", "Avg Latency (ms)"
REQUIRED = (MODEL, BATCH, CONCURRENCY, P99)


def read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such file") from None
    missing = [c for c in REQUIRED if not rows or c not in rows[0]]
    if missing:
        raise ProfileError(f"{path}: not Model Analyzer's inference results: no column {', '.join(map(repr, missing))}"
                           f" (it has {', '.join(rows[0]) if rows else 'no rows'})")
    return rows


def _number(row: dict[str, str], column: str, path: Path, line: int) -> float:
    try:
        return float(row[column])
    except (TypeError, ValueError):
        raise ProfileError(f"{path}:{line}: {column} {row[column]!r} is not a number") from None


def curves(rows: Sequence[dict[str, str]], path: Path, chosen: Sequence[str] = ()) -> dict[str, LatencyCurve]:
    """Model -> its latency per batch size at concurrency 1, in the configuration chosen as the module says."""
    configs: dict[str, dict[str, list[tuple[int, dict[str, str]]]]] = defaultdict(lambda: defaultdict(list))
    for line, row in enumerate(rows, start=2):
        if _number(row, CONCURRENCY, path, line) == 1:
            configs[row[MODEL]][row.get(CONFIG) or row[MODEL]].append((line, row))
    if not configs:
        raise ProfileError(f"{path}: no row at concurrency 1; profile with `concurrency: [1]` (a batch at a time)")
    out = {}
    for model, by_config in configs.items():
        named = [c for c in by_config if c in chosen] or [c for c in by_config if c == f"{model}_config_default"]
        if len(named) != 1 and len(by_config) != 1:
            raise ProfileError(f"{path}: {model} has several configurations at concurrency 1 "
                               f"({', '.join(sorted(by_config))}): name the one you deploy with --model-config")
        config = named[0] if len(named) == 1 else next(iter(by_config))
        points = sorted((int(_number(r, BATCH, path, i)), i, r) for i, r in by_config[config])
        sizes = [b for b, _, _ in points]
        if len(set(sizes)) != len(sizes):
            raise ProfileError(f"{path}: {model} ({config}) has a batch size twice at concurrency 1")
        p99 = tuple(_number(r, P99, path, i) for _, i, r in points)
        p50 = tuple(_number(r, AVERAGE, path, i) for _, i, r in points) if AVERAGE in points[0][2] else p99
        out[model] = LatencyCurve(tuple(sizes), p50, tuple(max(a, z) for a, z in zip(p50, p99)))
    # a profile's variants share their batch sizes: those every model was measured at
    common = sorted(set.intersection(*(set(c.batch_sizes) for c in out.values())))
    if not common:
        raise ProfileError(f"{path}: the models share no batch size at concurrency 1: "
                           + "; ".join(f"{m}: {list(c.batch_sizes)}" for m, c in out.items()))
    return {m: _at(c, common) for m, c in out.items()}


def _at(curve: LatencyCurve, sizes: Sequence[int]) -> LatencyCurve:
    index = [curve.batch_sizes.index(b) for b in sizes]
    return LatencyCurve(tuple(sizes), tuple(curve.p50_ms[i] for i in index), tuple(curve.p99_ms[i] for i in index))


def run(args) -> int:
    rows = read_rows(args.file)
    latency = curves(rows, args.file, args.model_config)
    accuracies = {model: a for (model, _), a in read_accuracies(args.accuracy).items()}  # a model's one version
    missing = sorted(m for m in latency if m not in accuracies)
    if missing:
        raise ProfileError(f"{args.accuracy}: no accuracy for {', '.join(missing)} (Model Analyzer knows none: "
                           "give a row per model)")
    averaged = AVERAGE in rows[0]
    variants = sorted((Variant(m, accuracies[m].value, Actuation("model", m), {args.device_kind: curve},
                               extras={"accuracy_metric": accuracies[m].metric,
                                         "accuracy_dataset": accuracies[m].dataset})
                       for m, curve in latency.items()), key=lambda v: v.accuracy)
    provenance = {"imported_from": str(args.file), "device_kind": args.device_kind,
                  "command": shlex.join(["accscale", *args.argv]),
                  "imported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "latency": "Model Analyzer, concurrency 1; p50 is its " + (
                      "average latency" if averaged else "p99 latency (the CSV has no average)")}
    profile = Profile(args.name or args.out.stem, f"Model Analyzer results {args.file.name}, device {args.device_kind}",
                      tuple(variants), {"provenance": provenance})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(args.out)
    Profile.load(args.out)  # what the sidecar will read: validated as it will be
    print(f"profile: {args.out} ({len(variants)} models, device kind {args.device_kind!r}; p50 from "
          f"{'the average' if averaged else 'p99'})")
    return 0
