"""``accscale profile triton``: a profile of models a running Triton already serves, whatever their backend.

For each model, through Triton's gRPC endpoint:

- its metadata and config: inputs and outputs (names, types, shapes) and its max batch size;
- p50 and p99 latency per batch size at concurrency 1: ``warmup`` untimed calls, then ``repeats`` timed ones,
  each one blocking infer of the model's own input types and shapes (rows of ``--data`` where given, random
  values otherwise); sizes above the model's max batch size are left out, and a model without batching
  (max batch size 0) is measured at 1 only;
- with ``load_repeats``, the cold-load time: an unload, then a load request that returns once the model is
  ready (Triton's explicit model control; the median of the repeats);
- memory where Triton's metrics report it: the GPU memory a load adds (a CPU-only Triton reports none);
- accuracy from the operator: a CSV (``model, version, accuracy, metric, dataset``), or measured through Triton
  on the labelled rows of ``--data`` (the argmax of the first output against ``labels``).

Written as ``accscale/profile/v1``: one variant per model, ``actuation.kind = "model"``, its ``load_ms`` and
``memory_bytes`` where measured, and the provenance (Triton's version, the device kind named, the command).
Model Analyzer's config keys are read where they mean the same (``profile_models``, ``batch_sizes``,
``triton_grpc_endpoint``).
"""

from __future__ import annotations

import csv
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.errors import ProfileError

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
REPEATS, WARMUP = 50, 5
ACCURACY_COLUMNS = ("model", "version", "accuracy", "metric", "dataset")
LABELS = "labels"  # the array of --data holding each row's class
ACCURACY_ROWS_UNBATCHED = 1000  # a model without batching is called once per row: the first this many


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str  # Triton's, e.g. FP32
    dims: tuple[int, ...]  # without the batch dimension; -1 where variable


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str  # the ready version measured
    max_batch_size: int  # 0: the model takes no batch dimension
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    backend: str


@dataclass(frozen=True)
class Accuracy:
    value: float  # in [0, 1]
    metric: str
    dataset: str


@dataclass(frozen=True)
class Measured:
    """One model's figures, before they become a profile variant."""

    info: ModelInfo
    latency: LatencyCurve
    accuracy: Accuracy
    load_ms: float | None
    memory_bytes: int | None


def model_info(client: grpcclient.InferenceServerClient, name: str, version: str = "") -> ModelInfo:
    """The model's inputs, outputs and max batch size, or a ProfileError that names what is served instead."""
    if not client.is_model_ready(name, version):
        ready = sorted(m.name for m in client.get_model_repository_index().models if m.state == "READY")
        raise ProfileError(f"model {name!r} is not ready on this Triton (ready: {', '.join(ready) or 'none'}); "
                           "load it first, or check its name")
    meta = client.get_model_metadata(name, version, as_json=True)
    config = client.get_model_config(name, version, as_json=True)["config"]
    batch = int(config.get("max_batch_size", 0))

    def tensors(entries: list[dict]) -> tuple[Tensor, ...]:
        # metadata shapes carry the batch dimension (-1) when the model batches
        return tuple(Tensor(t["name"], t["datatype"], tuple(int(d) for d in t["shape"])[1 if batch else 0:])
                     for t in entries)

    versions = meta.get("versions") or [version or "1"]
    return ModelInfo(name, version or max(versions, key=lambda v: int(v) if v.isdigit() else 0), batch,
                     tensors(meta["inputs"]), tensors(meta["outputs"]), config.get("backend") or meta.get("platform", ""))


def parse_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``NAME:d1,d2`` (a tensor's dims without the batch dimension) -> {NAME: (d1, d2)}."""
    shapes = {}
    for spec in specs:
        name, _, dims = spec.rpartition(":")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise ProfileError(f"--shape {spec!r}: expected NAME:d1,d2,... with whole numbers") from None
        if not name or any(d < 1 for d in shapes[name]):
            raise ProfileError(f"--shape {spec!r}: expected NAME:d1,d2,... with dims >= 1")
    return shapes


class Inputs:
    """A model's inputs for a batch of ``b`` rows: rows of the operator's data where it has the input, else random
    values of the tensor's type and shape (``--shape`` fixing the variable dims)."""

    def __init__(self, info: ModelInfo, data: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]],
                 seed: int = 0) -> None:
        self.info, self.data, self.rng = info, data, np.random.default_rng(seed)
        self.dims = {}
        for t in info.inputs:
            if t.name in data:
                self.dims[t.name] = tuple(data[t.name].shape[1:])
            elif t.name in shapes:
                self.dims[t.name] = shapes[t.name]
            elif any(d < 0 for d in t.dims):
                raise ProfileError(f"{info.name}: input {t.name!r} has variable dims {list(t.dims)}: give --shape "
                                   f"{t.name}:d1,d2,... or --data FILE.npz with an array named {t.name!r}")
            else:
                self.dims[t.name] = t.dims
            if t.datatype == "BYTES" and t.name not in data:
                raise ProfileError(f"{info.name}: input {t.name!r} is BYTES: give --data FILE.npz with an array named "
                                   f"{t.name!r}")

    def batch(self, b: int, start: int = 0) -> list[grpcclient.InferInput]:
        out = []
        for t in self.info.inputs:
            if t.name in self.data:
                rows = self.data[t.name]
                value = rows[np.arange(start, start + b) % len(rows)].astype(triton_to_np_dtype(t.datatype))
            else:
                value = self._random(t, (b, *self.dims[t.name]))
            if not self.info.max_batch_size:
                value = value[0]
            tensor = grpcclient.InferInput(t.name, list(value.shape), t.datatype)  # value has its type
            tensor.set_data_from_numpy(value)
            out.append(tensor)
        return out

    def _random(self, t: Tensor, shape: tuple[int, ...]) -> np.ndarray:
        dtype = np.dtype(triton_to_np_dtype(t.datatype))
        if dtype == np.bool_:
            return self.rng.integers(0, 2, shape).astype(bool)
        if np.issubdtype(dtype, np.integer):
            return self.rng.integers(0, 2, shape).astype(dtype)
        return self.rng.standard_normal(shape).astype(dtype)


def measure_latency(client: grpcclient.InferenceServerClient, info: ModelInfo, inputs: Inputs, batch: int,
                    warmup: int, repeats: int, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(p50, p99) in ms of ``repeats`` blocking calls of ``batch`` rows, one at a time, after ``warmup`` calls."""
    request = inputs.batch(batch)
    outputs = [grpcclient.InferRequestedOutput(t.name) for t in info.outputs]
    for _ in range(warmup):
        client.infer(info.name, request, model_version=info.version, outputs=outputs)
    times = []
    for _ in range(repeats):
        start = clock()
        client.infer(info.name, request, model_version=info.version, outputs=outputs)
        times.append(1000 * (clock() - start))
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def measure_load(client: grpcclient.InferenceServerClient, metrics: Callable[[], int | None], name: str,
                 repeats: int, clock: Callable[[], float] = time.perf_counter) -> tuple[float, int | None]:
    """(median cold-load ms, the memory a load adds or None): unload, then load until ready, ``repeats`` times."""
    times, added = [], []
    for _ in range(repeats):
        client.unload_model(name, unload_dependents=False)
        before = metrics()
        start = clock()
        try:
            client.load_model(name)
        except InferenceServerException as exc:
            raise ProfileError(f"{name}: loading it again failed ({exc.message()}); Triton must run with "
                               "--model-control-mode=explicit to measure load times") from None
        times.append(1000 * (clock() - start))
        after = metrics()
        if before is not None and after is not None:
            added.append(max(0, after - before))
    return statistics.median(times), (int(statistics.median(added)) if added else None)


def gpu_memory_used(metrics_text: str) -> int | None:
    """The GPU memory Triton's metrics report in use, summed over GPUs; None where it reports none (CPU)."""
    values = [sample.value for family in text_string_to_metric_families(metrics_text)
              if family.name == "nv_gpu_memory_used_bytes" for sample in family.samples]
    return int(sum(values)) if values else None


def read_accuracies(path: Path) -> dict[tuple[str, str], Accuracy]:
    """(model, version or "") -> its accuracy, from the operator's CSV (columns ``model, version, accuracy, metric,
    dataset``; version may be empty, accuracy a fraction in [0, 1])."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such accuracy file") from None
    if not rows or set(ACCURACY_COLUMNS) - set(rows[0]):
        raise ProfileError(f"{path}: needs the columns {', '.join(ACCURACY_COLUMNS)}")
    out = {}
    for i, row in enumerate(rows, start=2):
        try:
            value = float(row["accuracy"])
        except ValueError:
            raise ProfileError(f"{path}:{i}: accuracy {row['accuracy']!r} is not a number") from None
        if not 0 <= value <= 1:
            raise ProfileError(f"{path}:{i}: accuracy {value} is not a fraction in [0, 1]")
        out[row["model"].strip(), row["version"].strip()] = Accuracy(value, row["metric"].strip(),
                                                                     row["dataset"].strip())
    return out


def measure_accuracy(client: grpcclient.InferenceServerClient, info: ModelInfo, inputs: Inputs,
                     labels: np.ndarray, dataset: str, output: str | None = None) -> Accuracy:
    """Top-1 through Triton on every labelled row of the data: the class is ``output`` (default: the first
    output) itself where it is one integer per row (a classifier's label), else its argmax (scores)."""
    output = output or info.outputs[0].name
    if output not in {t.name for t in info.outputs}:
        raise ProfileError(f"{info.name}: no output {output!r} (it has {', '.join(t.name for t in info.outputs)})")
    step = max(1, info.max_batch_size)
    rows = len(labels) if info.max_batch_size else min(len(labels), ACCURACY_ROWS_UNBATCHED)
    right = 0
    for start in range(0, rows, step):
        b = min(step, rows - start)
        result = client.infer(info.name, inputs.batch(b, start), model_version=info.version,
                              outputs=[grpcclient.InferRequestedOutput(output)]).as_numpy(output).reshape(b, -1)
        classes = result[:, 0] if result.shape[1] == 1 and np.issubdtype(result.dtype, np.integer) \
            else result.argmax(axis=1)
        right += int((classes == labels[start:start + b]).sum())
    return Accuracy(right / rows, "top-1 measured through Triton", dataset)


def profile_models(client: grpcclient.InferenceServerClient, models: Sequence[str], *,
                   batch_sizes: Sequence[int] = BATCH_SIZES, repeats: int = REPEATS, warmup: int = WARMUP,
                   load_repeats: int = 0, accuracies: Mapping[tuple[str, str], Accuracy] | None = None,
                   data: Mapping[str, np.ndarray] | None = None, data_name: str = "",
                   shapes: Mapping[str, tuple[int, ...]] | None = None, output: str | None = None,
                   metrics: Callable[[], int | None] = lambda: None,
                   progress: Callable[[str], None] = lambda line: None) -> list[Measured]:
    """Each of ``models`` measured as the module notes say (a name may be ``model:version``)."""
    if not models:
        raise ProfileError("no models to profile: name them (--models, or profile_models in --config)")
    if repeats < 1 or warmup < 0:
        raise ProfileError("--repeats must be >= 1 and --warmup >= 0")
    data = dict(data or {})
    labels = data.pop(LABELS, None)
    accuracies = accuracies or {}
    named = [(m.partition(":")[0], m.partition(":")[2]) for m in models]
    infos = [model_info(client, name, version) for name, version in named]
    missing = [i.name for i, (_, v) in zip(infos, named)
               if (i.name, v) not in accuracies and (i.name, "") not in accuracies and labels is None]
    if missing:
        raise ProfileError(f"no accuracy for {', '.join(missing)}: give --accuracy FILE.csv with a row for each, "
                           f"or --data FILE.npz with {LABELS!r} to measure it through Triton")
    measured = []
    for info, (_, version) in zip(infos, named):
        inputs = Inputs(info, data, shapes or {})
        sizes = sorted({b for b in batch_sizes if b <= info.max_batch_size} or {1}) if info.max_batch_size else [1]
        p50, p99 = [], []
        for b in sizes:
            a, z = measure_latency(client, info, inputs, b, warmup, repeats)
            p50.append(a)
            p99.append(z)
            progress(f"{info.name}: batch {b}: p50 {a:.3f} ms, p99 {z:.3f} ms ({repeats} calls after {warmup})")
        load_ms, memory = measure_load(client, metrics, info.name, load_repeats) if load_repeats else (None, None)
        if load_ms is not None:
            progress(f"{info.name}: cold load {load_ms:.0f} ms (median of {load_repeats})"
                     + (f", {memory / 2**20:.1f} MiB" if memory is not None else ""))
        given = accuracies.get((info.name, version)) or accuracies.get((info.name, ""))
        accuracy = given or measure_accuracy(client, info, inputs, np.asarray(labels), data_name, output)
        progress(f"{info.name}: accuracy {100 * accuracy.value:.2f}% ({accuracy.metric}, {accuracy.dataset})")
        measured.append(Measured(info, LatencyCurve(tuple(sizes), tuple(p50), tuple(p99)), accuracy, load_ms, memory))
    return measured


def to_profile(measured: Sequence[Measured], *, name: str, device_kind: str, triton_version: str, url: str,
               command: str, repeats: int, warmup: int) -> Profile:
    """The accscale profile of ``measured``, least accurate first."""
    variants = [Variant(m.info.name, m.accuracy.value, Actuation("model", m.info.name, version=m.info.version),
                        {device_kind: m.latency}, m.memory_bytes,
                        {"accuracy_metric": m.accuracy.metric, "accuracy_dataset": m.accuracy.dataset,
                         "backend": m.info.backend, "max_batch_size": m.info.max_batch_size,
                         "inputs": {t.name: [t.datatype, list(t.dims)] for t in m.info.inputs}},
                        m.load_ms)
                for m in sorted(measured, key=lambda m: m.accuracy.value)]
    provenance = {"triton_version": triton_version, "triton_url": url, "device_kind": device_kind,
                  "command": command, "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "latency": f"concurrency 1, {warmup} warm-up calls, then {repeats} timed calls per batch size"}
    return Profile(name, f"accscale profile triton ({url}, Triton {triton_version}, device {device_kind})",
                   tuple(variants), {"provenance": provenance})


def model_analyzer_config(path: Path) -> dict:
    """The keys of a Model Analyzer config that mean the same here: models, batch sizes, the gRPC endpoint."""
    import yaml  # lazy: only for --config

    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such config file") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping of Model Analyzer keys")
    out = {}
    models = raw.get("profile_models")
    if isinstance(models, str):
        out["models"] = [m.strip() for m in models.split(",") if m.strip()]
    elif isinstance(models, (list, dict)):
        out["models"] = [str(m) for m in models]
    elif models is not None:
        raise ProfileError(f"{path}: profile_models must be a name, a list or a mapping of names")
    if "batch_sizes" in raw:
        out["batch_sizes"] = _batch_sizes(raw["batch_sizes"], f"{path}: batch_sizes")
    if "triton_grpc_endpoint" in raw:
        out["url"] = str(raw["triton_grpc_endpoint"])
    return out


def _batch_sizes(value: object, where: str) -> list[int]:
    """Model Analyzer's forms: a number, a list, a comma-separated string, or {start, stop, step}."""
    if isinstance(value, dict):
        try:
            start, stop, step = int(value["start"]), int(value["stop"]), int(value.get("step", 1))
        except (KeyError, TypeError, ValueError):
            raise ProfileError(f"{where}: a range needs whole numbers start and stop (and step)") from None
        sizes = list(range(start, stop + 1, step))
    elif isinstance(value, str):
        sizes = [int(x) for x in value.split(",") if x.strip().lstrip("-").isdigit()]
    elif isinstance(value, int) and not isinstance(value, bool):
        sizes = [value]
    elif isinstance(value, list):
        sizes = [int(x) for x in value if isinstance(x, int) and not isinstance(x, bool)]
    else:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise ProfileError(f"{where}: expected batch sizes >= 1, got {value!r}")
    return sorted(set(sizes))


def load_data(path: Path | None) -> tuple[dict[str, np.ndarray], str]:
    """The arrays of ``--data`` (by input name, and ``labels``), and the file's name as the dataset's."""
    if path is None:
        return {}, ""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}, path.name
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such data file") from None
    except ValueError as exc:
        raise ProfileError(f"{path}: not a .npz of plain arrays ({exc})") from None


def run(args) -> int:
    settings = model_analyzer_config(args.config) if args.config else {}
    url = args.url or settings.get("url") or "127.0.0.1:8001"
    models = args.models.split(",") if args.models else settings.get("models", [])
    batch_sizes = (_batch_sizes(args.batch_sizes, "--batch-sizes") if args.batch_sizes
                   else settings.get("batch_sizes", list(BATCH_SIZES)))
    data, data_name = load_data(args.data)
    accuracies = read_accuracies(args.accuracy) if args.accuracy else {}
    client = grpcclient.InferenceServerClient(url)
    try:
        if not client.is_server_live():
            raise ProfileError(f"no Triton answers at {url}")
    except InferenceServerException as exc:
        raise ProfileError(f"no Triton answers at {url} ({exc.message()})") from None
    http_metrics = _metrics_reader(args.metrics_url)
    measured = profile_models(client, models, batch_sizes=batch_sizes,
                              repeats=args.repeats, warmup=args.warmup, load_repeats=args.load_repeats,
                              accuracies=accuracies, data=data, data_name=data_name,
                              shapes=parse_shapes(args.shape), output=args.output, metrics=http_metrics,
                              progress=_stderr)
    version = client.get_server_metadata(as_json=True).get("version", "unknown")
    profile = to_profile(measured, name=args.name or args.out.stem, device_kind=args.device_kind,
                         triton_version=version, url=url, command=shlex.join(["accscale", *args.argv]),
                         repeats=args.repeats, warmup=args.warmup)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(args.out)
    Profile.load(args.out)  # what the sidecar will read: validated as it will be
    print(f"profile: {args.out} ({len(profile.variants)} models, device kind {args.device_kind!r})")
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _metrics_reader(url: str | None) -> Callable[[], int | None]:
    if not url:
        return lambda: None
    import urllib.request  # lazy: only with --metrics-url

    def read() -> int | None:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return gpu_memory_used(answer.read().decode())
    return read


def validate(path: Path) -> int:
    """``accscale profile validate``: load as the sidecar does, then say what the profile holds."""
    profile = Profile.load(path)
    kinds = profile.device_kinds
    sizes = sorted({b for v in profile.variants for c in v.latency.values() for b in c.batch_sizes})
    loads = [v.load_ms for v in profile.variants if v.load_ms is not None]
    print(f"{path}: valid accscale/profile/v1, {len(profile.variants)} variants "
          f"({', '.join(sorted({v.actuation.kind for v in profile.variants}))})")
    print(f"  accuracy {100 * profile.variants[0].accuracy:.2f}% .. {100 * profile.variants[-1].accuracy:.2f}%; "
          f"device kinds {', '.join(kinds)}; batch sizes {', '.join(map(str, sizes))}")
    print(f"  load times: {len(loads)} of {len(profile.variants)} measured"
          + (f" ({min(loads):.0f} .. {max(loads):.0f} ms)" if loads else ""))
    for kind in kinds:
        if dominated := profile.dominated(kind):
            print(f"  on {kind}, dominated (slower and no more accurate than another): {', '.join(dominated)}")
    return 0
