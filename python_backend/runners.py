"""Execution of exported models with onnxruntime, independent of Triton.

:class:`SupernetRunner` is the SubNetAct runtime: it validates the CONTROL rows of a
batch, groups the rows by subnet and runs each group once through the single supernet
session (switching subnets loads nothing). :class:`StaticRunner` runs one exported
variant. Both take and return numpy arrays; the Triton adapter lives in
:mod:`python_backend.triton_model`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from python_backend.control import ControlError, ControlLayout
from python_backend.pipeline import components

SUBNETS_FILE = "subnets.json"  # beside the supernet's model.onnx: the calibrated subnets in SUBNET order
MODEL_FILE = "model.onnx"
ENGINES = ("onnxruntime", "torch")


@dataclass(frozen=True)
class Runtime:
    """What runs a model: onnxruntime (the CPU runtime, and the default) or torch on ``device`` (the GPU runtime,
    :mod:`python_backend.torch_runtime`, which reads the model's ``weights.npz``)."""

    engine: str = "onnxruntime"
    device: str = "cpu"  # torch's device: "cuda", "cuda:1" or "cpu"
    layout: str = "prefix"  # torch_runtime.WEIGHT_LAYOUTS

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"runtime must be one of {ENGINES}, got {self.engine!r}")
        if self.engine == "onnxruntime" and self.device != "cpu":
            raise ValueError(f"the onnxruntime runtime runs on the CPU here; device {self.device!r} needs runtime "
                             f"'torch'")


def providers(available: list[str], device_id: int | None = None) -> list:
    """onnxruntime's execution providers for a session: CUDA first where onnxruntime-gpu offers it (on GPU
    ``device_id``, a ``KIND_GPU`` instance's, if given), then the CPU."""
    cuda = ("CUDAExecutionProvider", {"device_id": device_id}) if device_id is not None else "CUDAExecutionProvider"
    return ([cuda] if "CUDAExecutionProvider" in available else []) + ["CPUExecutionProvider"]


def make_session(path: Path, threads: int, profile_prefix: str | None = None, device_id: int | None = None):
    """An onnxruntime session with every graph optimisation on and ``threads`` intra-op threads, on GPU
    ``device_id`` where onnxruntime can run there (:func:`providers`); with ``profile_prefix``, onnxruntime's
    profiler writes every kernel's time to a file of that prefix."""
    import onnxruntime as ort  # lazy: onnxruntime (export and the sidecar read this module's names without it)

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=providers(ort.get_available_providers(), device_id))


def release_free_heap() -> None:
    """Hand the heap that building a session freed back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    onnxruntime parses the graph, folds constants and reorders weights while a session loads, and frees most of
    what that took; glibc keeps the freed memory mapped, so a model served in its own process would hold it for
    good (the full supernet's session: 90 MiB, 48 MiB after trimming; the largest static subnet's: 57 and 24).
    """
    import ctypes  # lazy: only the Triton model calls this

    # the process's own symbols, libc's among them: no library search (ldconfig) at each model load
    malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)


@dataclass(frozen=True)
class SubnetTable:
    """The subnets a supernet export has SubnetNorm statistics for."""

    layout: ControlLayout
    rows: tuple[tuple[int, ...], ...]  # SUBNET index -> canonical control row

    def index(self) -> dict[tuple[int, ...], int]:
        return {row: i for i, row in enumerate(self.rows)}

    def feeds(self, session) -> list[dict[str, np.ndarray]]:
        """Per SUBNET index, the control inputs that run it in ``session``'s supernet graph (a graph without
        per-subnet statistics, the transformer's, has no SUBNET input)."""
        m = self.layout.num_stages
        names = {i.name for i in session.get_inputs()}
        return [{k: v for k, v in (("DEPTH", np.asarray(row[:m], dtype=np.int64)),
                                   ("WIDTH", np.asarray(row[m:], dtype=np.int64)),
                                   ("SUBNET", np.asarray(i, dtype=np.int64))) if k in names}
                for i, row in enumerate(self.rows)]

    def to_json(self) -> str:
        return json.dumps({
            "layout": json.loads(self.layout.to_json()),
            "subnets": [{"id": self.layout.subnet_id(r), "control": list(r)} for r in self.rows],
        }, indent=1)

    @classmethod
    def from_json(cls, text: str) -> SubnetTable:
        raw = json.loads(text)
        layout = ControlLayout.from_json(json.dumps(raw["layout"]))
        return cls(layout, tuple(layout.validate(s["control"]) for s in raw["subnets"]))


class SupernetRunner:
    """Runs batches whose rows may name different subnets, one session call per subnet."""

    def __init__(self, version_dir: Path, threads: int = 1, runtime: Runtime | None = None) -> None:
        self.table = SubnetTable.from_json((version_dir / SUBNETS_FILE).read_text())
        self.layout = self.table.layout
        self._index = self.table.index()
        # raw CONTROL row bytes (INT32, as Triton delivers them) -> SUBNET index: the per-request fast path
        self._by_bytes = {np.asarray(row, dtype=np.int32).tobytes(): i for i, row in enumerate(self.table.rows)}
        runtime = runtime or Runtime()
        if runtime.engine == "torch":
            from python_backend.torch_runtime import TorchEngine  # lazy: torch

            engine = TorchEngine(version_dir, runtime.device, runtime.layout, threads)
            # SubNetAct on torch: every subnet's weight and statistics views, built once; switching picks a plan
            plans = [engine.network.plan(row, i) for i, row in enumerate(self.table.rows)]
            self._run_subnet: Callable[[np.ndarray, int], np.ndarray] = lambda x, i: engine(plans[i], x)
            self.network = engine.network
        else:
            session = make_session(version_dir / MODEL_FILE, threads)
            feeds = self.table.feeds(session)  # SUBNET index -> the control inputs of the ONNX graph
            self._run_subnet = lambda x, i: session.run(["LOGITS"], {"INPUT": x, **feeds[i]})[0]

    def subnet_indices(self, control: np.ndarray) -> np.ndarray:
        """SUBNET index of every row; ControlError names the first bad row and field."""
        if control.ndim != 2:
            raise ControlError(f"CONTROL must be [batch, {self.layout.num_fields}], got shape {list(control.shape)}")
        # the usual case, every row the same subnet: comparing bytes costs a fraction of numpy's elementwise test
        if len(control) and control.tobytes() == control[0].tobytes() * len(control):
            return np.full(len(control), self._index_of(control[0], 0), dtype=np.int64)
        distinct, first, inverse = np.unique(control, axis=0, return_index=True, return_inverse=True)
        indices = np.array([self._index_of(row, int(i)) for row, i in zip(distinct, first)], dtype=np.int64)
        return indices[inverse.reshape(-1)]

    def _index_of(self, row: np.ndarray, position: int) -> int:
        key = row.tobytes() if row.dtype == np.int32 else None
        if key is not None and key in self._by_bytes:
            return self._by_bytes[key]
        index = self._validated_index(row, position)
        if key is not None and len(self._by_bytes) < 4096:  # remember non-canonical spellings too
            self._by_bytes[key] = index
        return index

    def _validated_index(self, row: np.ndarray, position: int) -> int:
        try:
            canon = self.layout.validate(row.tolist())
        except ControlError as exc:
            raise ControlError(f"CONTROL row {position}: {exc}") from None
        if canon not in self._index:
            raise ControlError(
                f"CONTROL row {position}: subnet {self.layout.subnet_id(canon)} has no SubnetNorm "
                f"statistics in this export ({len(self._index)} calibrated subnets are listed in {SUBNETS_FILE})"
            )
        return self._index[canon]

    def infer(self, images: np.ndarray, control: np.ndarray) -> np.ndarray:
        """Logits for ``images`` [N, ...] where row i runs the subnet named by ``control[i]``."""
        return self.run(images, self.subnet_indices(control))

    def run(self, images: np.ndarray, subnet_of_row: np.ndarray) -> np.ndarray:
        """Logits for ``images`` where row i runs calibrated subnet ``subnet_of_row[i]``."""
        if len(subnet_of_row) != len(images) or len(images) == 0:
            raise ControlError(f"CONTROL has {len(subnet_of_row)} rows for a batch of {len(images)} inputs")
        first = subnet_of_row[0]
        if len(subnet_of_row) == 1 or (subnet_of_row == first).all():  # the usual case: one subnet
            return self._run_subnet(images, int(first))
        out: np.ndarray | None = None
        for subnet in np.unique(subnet_of_row):
            rows = np.flatnonzero(subnet_of_row == subnet)
            group = images if len(rows) == len(images) else images[rows]
            logits = self._run_subnet(group, int(subnet))
            if len(rows) == len(images):
                return logits
            if out is None:
                out = np.empty((len(images),) + logits.shape[1:], dtype=logits.dtype)
            out[rows] = logits
        assert out is not None
        return out

    def warm_up(self, images: np.ndarray) -> int:
        """Run every calibrated subnet once on ``images`` (any input: images or token ids); returns the number of
        runs."""
        for subnet in range(len(self.table.rows)):
            self.run(images, np.full(len(images), subnet, dtype=np.int64))
        return len(self.table.rows)


class StaticRunner:
    """Runs one statically exported variant."""

    def __init__(self, version_dir: Path, threads: int = 1, runtime: Runtime | None = None) -> None:
        runtime = runtime or Runtime()
        if runtime.engine == "torch":
            from python_backend.torch_runtime import TorchEngine  # lazy: torch

            engine = TorchEngine(version_dir, runtime.device, runtime.layout, threads)
            plan = engine.network.full_plan()
            self._run: Callable[[np.ndarray], np.ndarray] = lambda x: engine(plan, x)
            self.network = engine.network
        else:
            session = make_session(version_dir / MODEL_FILE, threads)
            self._run = lambda x: session.run(["LOGITS"], {"INPUT": x})[0]

    def run(self, images: np.ndarray, subnet_of_row: np.ndarray | None = None) -> np.ndarray:
        return self._run(images)

    def warm_up(self, images: np.ndarray) -> int:
        self.run(images)
        return 1


class ComponentsRunner:
    """The Loki pipeline's classical detector (:func:`python_backend.pipeline.components`): no network."""

    def __init__(self, version_dir: Path, threads: int = 1, runtime: Runtime | None = None) -> None:
        pass

    def run(self, images: np.ndarray, subnet_of_row: np.ndarray | None = None) -> np.ndarray:
        return components(images)

    def warm_up(self, images: np.ndarray) -> int:
        self.run(images)
        return 1
