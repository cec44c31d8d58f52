"""``accscale bench subnetact``: SubNetAct against separately exported subnets, side by side.

Three ratios, each measured in one run on real Triton servers (SuperServe section 3.2, Fig. 5):

- ``actuation_ratio``: how long a new subnet takes to become servable. Separate models:
  ``load_model`` through Triton's model-control API plus the first answer. SubNetAct: a
  request that switches to another subnet, answer included (the switch itself is only a
  different CONTROL row). Both medians of repeated switches.
- ``memory_ratio``: proportional set size (PSS, so shared libraries count once) of
  tritonserver and its python-backend stubs serving ``--spread`` Pareto subnets as separate
  models, over the same for the one supernet model serving every Pareto subnet. Each
  python-backend model is its own process, so this is mostly process memory;
  ``weights_ratio`` compares the weights alone (the separate ONNX files over the supernet's).
- ``exec_overhead``: per batch size, latency of a subnet through the supernet over the same
  subnet exported statically, both loaded in one server and called alternately.

With ``--breakdown``, no server: where each subnet's time goes in the two graphs under onnxruntime's profiler
(:mod:`export.overheads`), per batch size.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from export.presets import DEFAULT_BUILD_DIR, PRESETS, get_preset
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.processes.triton_launcher import TritonServer
from scheduler_sidecar.sim.results import markdown_table

log = logging.getLogger(__name__)

EXEC_BATCH_SIZES = (1, 4, 16)


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("subnetact", help="in-place subnet actuation vs separately exported subnets",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="full", help="which built supernet (default: full)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where `accscale profile` cached it")
    p.add_argument("--spread", type=int, default=6,
                   help="Pareto subnets, uniformly spaced in accuracy, served as separate models (paper: 6)")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per measurement (default: 30)")
    p.add_argument("--loads", type=int, default=5, help="timed model loads (default: 5)")
    p.add_argument("--breakdown", action="store_true",
                   help="instead: where each subnet's time goes in the supernet and static graphs, by operator "
                        "category, in onnxruntime without a server")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.spread < 1 or args.loads < 1:
        raise ConfigError(f"--repeats, --spread and --loads must be >= 1, got {args.repeats}, {args.spread} and "
                          f"{args.loads}")
    if args.breakdown:
        rows = bench_breakdown(get_preset(args.preset), args.build_dir, spread=args.spread, repeats=args.repeats)
        if args.json:
            print(json.dumps({"breakdown": rows}))
        else:
            print(markdown_table(rows, list(rows[0])))
        return 0
    result = bench_subnetact(get_preset(args.preset), args.build_dir, spread=args.spread, repeats=args.repeats,
                             loads=args.loads)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"actuation_ratio {result['actuation_ratio']:.1f}  (load {result['load_ms']:.1f} ms vs switch "
              f"{result['switch_ms']:.2f} ms)")
        print(f"memory_ratio    {result['memory_ratio']:.2f}  ({result['memory_separate_mib']:.0f} MiB for "
              f"{args.spread} models vs {result['memory_supernet_mib']:.0f} MiB)")
        for b, ratio in result["exec_overhead"].items():
            print(f"exec_overhead   batch {b:>2}: {ratio:.2f}")
    return 0


def _built(preset, build_dir: Path, spread: int):
    """The preset's supernet, its Pareto subnets and ``spread`` of them uniformly spaced in accuracy."""
    from export.artifacts import Artifacts  # lazy: onnx, torch

    artifacts = Artifacts(preset, build_dir)
    if not artifacts.profile_path.exists():
        raise SystemExit(f"no profile at {artifacts.profile_path}: run `accscale profile --preset {preset.name}` first")
    act = artifacts.supernet()
    calibration = artifacts.calibration(act)
    profile = Profile.load(artifacts.profile_path)
    return act, calibration.select([v.id for v in profile.variants]), calibration.select(
        [v.id for v in profile.spread(spread)])


def bench_breakdown(preset, build_dir: Path, *, spread: int, repeats: int) -> list[dict]:
    """:func:`export.overheads.breakdown` of each of ``spread`` Pareto subnets at each of EXEC_BATCH_SIZES."""
    from export.overheads import breakdown  # lazy: onnxruntime
    from export.profiler import export_static, export_supernet  # lazy: onnx, torch

    act, pareto, chosen = _built(preset, build_dir, spread)
    images = _images(act.spec.image_size)
    with tempfile.TemporaryDirectory(prefix="accscale-bench-") as tmp:
        repo = Path(tmp)
        supernet = export_supernet(act, pareto, repo) / "1"
        statics = {c.subnet_id: export_static(act, c, repo) / "1" for c in chosen}
        return [breakdown(supernet, statics[c.subnet_id], c.subnet_id, images[:b], repeats)
                for c in chosen for b in EXEC_BATCH_SIZES]


def bench_subnetact(preset, build_dir: Path, *, spread: int, repeats: int, loads: int) -> dict:
    from export.profiler import SUPERNET_MODEL, export_static, export_supernet  # lazy: onnx, torch
    from export.repository import static_model_name  # lazy: onnx, torch

    act, pareto, chosen = _built(preset, build_dir, spread)
    images = _images(act.spec.image_size)
    with tempfile.TemporaryDirectory(prefix="accscale-bench-") as tmp:
        repo = Path(tmp)
        export_supernet(act, pareto, repo)
        statics = [export_static(act, c, repo).name for c in chosen]
        weights_separate = sum((repo / name / "1" / "model.onnx").stat().st_size for name in statics)
        weights_supernet = (repo / SUPERNET_MODEL / "1" / "model.onnx").stat().st_size
        with TritonServer(repository=repo, models=[SUPERNET_MODEL]) as server, _client(server) as client:
            for c in pareto:  # touch every subnet once, as serving would
                _infer(client, SUPERNET_MODEL, images[:1], c.row)
            memory_supernet = _pss_bytes(server.pid)
            switch = [_timed(lambda i=i: _infer(client, SUPERNET_MODEL, images[:1], pareto[i % len(pareto)].row))
                      for i in range(repeats)]  # every call names a different subnet than the one before
        with TritonServer(repository=repo, models=statics) as server, _client(server) as client:
            for name in statics:
                _infer(client, name, images[:1])
            memory_separate = _pss_bytes(server.pid)
            client.load_model(SUPERNET_MODEL)
            overhead = {b: _exec_ratios(client, chosen, images[:b], repeats, SUPERNET_MODEL) for b in EXEC_BATCH_SIZES}
            load = []
            for i in range(loads):
                name = statics[i % len(statics)]
                client.unload_model(name)
                _wait_unloaded(client, name)
                load.append(_timed(lambda name=name: (client.load_model(name), _infer(client, name, images[:1]))))
    switch_ms, load_ms = statistics.median(switch), statistics.median(load)
    return {
        "actuation_ratio": load_ms / switch_ms,
        "load_ms": load_ms,
        "switch_ms": switch_ms,
        "memory_ratio": memory_separate / memory_supernet,
        "memory_separate_mib": memory_separate / 2**20,
        "memory_supernet_mib": memory_supernet / 2**20,
        "weights_ratio": weights_separate / weights_supernet,
        "separate_models": len(statics),
        "supernet_subnets": len(pareto),
        "exec_overhead": {str(b): max(r.values()) for b, r in overhead.items()},
        "exec_overhead_median": {str(b): statistics.median(r.values()) for b, r in overhead.items()},
        "exec_overhead_by_subnet": {str(b): r for b, r in overhead.items()},
        "static_model_names": [static_model_name(SUPERNET_MODEL, c.subnet_id) for c in chosen],
    }


def _exec_ratios(client, chosen, x: np.ndarray, repeats: int, supernet: str) -> dict[str, float]:
    """Median supernet latency over median static latency, per subnet, calls interleaved."""
    from export.repository import static_model_name  # lazy: onnx, torch

    ratios = {}
    for c in chosen:
        static = static_model_name(supernet, c.subnet_id)
        dynamic, fixed = [], []
        for _ in range(2):  # warm-up
            _infer(client, supernet, x, c.row), _infer(client, static, x)
        for _ in range(repeats):
            dynamic.append(_timed(lambda c=c, x=x: _infer(client, supernet, x, c.row)))
            fixed.append(_timed(lambda static=static, x=x: _infer(client, static, x)))
        ratios[c.subnet_id] = statistics.median(dynamic) / statistics.median(fixed)
    log.info("batch %d: supernet/static latency %s", len(x), {k: round(v, 3) for k, v in ratios.items()})
    return ratios


def _images(image_size: int) -> np.ndarray:
    from export import data  # lazy: torch

    return np.ascontiguousarray(data.load(image_size)["heldout"].images[:16])


def _client(server):
    import tritonclient.grpc as grpcclient  # lazy: tritonclient

    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(client, model: str, x: np.ndarray, row: tuple[int, ...] | None = None) -> np.ndarray:
    import tritonclient.grpc as grpcclient  # lazy: tritonclient

    inputs = [grpcclient.InferInput("INPUT", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    if row is not None:
        control = np.tile(np.asarray(row, dtype=np.int32), (len(x), 1))
        inputs.append(grpcclient.InferInput("CONTROL", list(control.shape), "INT32"))
        inputs[1].set_data_from_numpy(control)
    return client.infer(model, inputs).as_numpy("LOGITS")


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def _wait_unloaded(client, name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.is_model_ready(name) and time.monotonic() < deadline:
        time.sleep(0.05)


def _pss_bytes(pid: int) -> int:
    """PSS of a process and all its descendants (the python-backend stubs)."""
    import psutil  # lazy: psutil

    root = psutil.Process(pid)
    return sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)])
