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
  ``model_memory_ratio`` leaves the server's own memory out (the same for both);
  ``weights_ratio`` compares the weights alone (the separate ONNX files over the supernet's).
- ``exec_overhead``: per batch size, latency of a subnet through the supernet over the same
  subnet exported statically, both loaded in one server and called alternately (each request
  built before it is timed).

With ``--breakdown``, no server: where each subnet's time goes in the two graphs under onnxruntime's profiler
(:mod:`export.overheads`), per batch size.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from export.bench_torch import timed_ms
from export.commands import add_family_option
from export.presets import DEFAULT_BUILD_DIR, NORMS, PRESETS
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
    p.add_argument("--device", choices=("cuda", "cpu"),
                   help="instead: the GPU runtime (torch) on this device, without a server (export.bench_torch)")
    p.add_argument("--bench-set", type=Path,
                   help="with --device: the models and inputs `scripts/gpu_check.py bundle` exported (default: export "
                        "the built supernet now)")
    p.add_argument("--weight-layout", choices=("prefix", "strided"), default="prefix",
                   help="with --device: how the GPU runtime lays out the weights subnets slice along their input "
                        "dimension (python_backend/torch_runtime.py)")
    add_family_option(p)
    p.add_argument("--norms", choices=NORMS,
                   help="the CNN supernet's graph, as `accscale export --norms` writes it (default: shared)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.spread < 1 or args.loads < 1:
        raise ConfigError(f"--repeats, --spread and --loads must be >= 1, got {args.repeats}, {args.spread} and "
                          f"{args.loads}")
    if args.norms and args.family != "cnn":
        raise ConfigError("--norms chooses how the CNN's SubnetNorm is written; the transformer has no norms to fold")
    export = {"norms": args.norms} if args.norms else {}
    if args.device:
        return _run_torch(args)
    if args.breakdown:
        rows = bench_breakdown(args.family, args.preset, args.build_dir, spread=args.spread, repeats=args.repeats,
                               **export)
        if args.json:
            print(json.dumps({"breakdown": rows}))
        else:
            print(markdown_table(rows, list(rows[0])))
        return 0
    result = bench_subnetact(args.family, args.preset, args.build_dir, spread=args.spread, repeats=args.repeats,
                             loads=args.loads, **export)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"actuation_ratio {result['actuation_ratio']:.1f}  (load {result['load_ms']:.1f} ms vs switch "
              f"{result['switch_ms']:.2f} ms)")
        print(f"memory_ratio    {result['memory_ratio']:.2f}  ({result['memory_separate_mib']:.0f} MiB for "
              f"{args.spread} models vs {result['memory_supernet_mib']:.0f} MiB; the models alone "
              f"{result['model_memory_ratio']:.2f}: {result['model_memory_separate_mib']:.0f} vs "
              f"{result['model_memory_supernet_mib']:.0f} MiB)")
        for b, ratio in result["exec_overhead"].items():
            print(f"exec_overhead   batch {b:>2}: {ratio:.2f}")
    return 0


def _run_torch(args: argparse.Namespace) -> int:
    from export import bench_torch  # lazy: torch

    if args.norms or args.breakdown:
        raise ConfigError("--norms and --breakdown are the onnxruntime graph's; the GPU runtime (--device) has neither")
    if args.device == "cuda":
        import torch  # lazy: torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--device cuda: torch {torch.__version__} finds no CUDA device here; --device cpu runs "
                              f"the same bench on the CPU")
    with tempfile.TemporaryDirectory(prefix="accscale-bench-") as tmp:
        bench_set = args.bench_set or bench_torch.write_bench_set(args.family, args.preset, args.build_dir,
                                                                  args.spread, Path(tmp), onnx=False)
        result = bench_torch.bench(bench_set, args.device, repeats=args.repeats, loads=args.loads,
                                   layout=args.weight_layout)
    if args.json:
        print(json.dumps(result))
    else:
        print(markdown_table(result["goals"], ["goal", "target", "measured", "met"]))
    return 0


def bench_breakdown(family: str, preset: str, build_dir: Path, *, spread: int, repeats: int,
                    **export: str) -> list[dict]:
    """:func:`export.overheads.breakdown` of each of ``spread`` Pareto subnets at each of EXEC_BATCH_SIZES."""
    from export.overheads import breakdown  # lazy: onnxruntime
    from export.supernets import build  # lazy: onnx, torch

    built = build(family, preset, build_dir)
    chosen, inputs = built.chosen(spread), built.samples[:EXEC_BATCH_SIZES[-1]]
    with tempfile.TemporaryDirectory(prefix="accscale-bench-") as tmp:
        repo = Path(tmp)
        supernet = built.export_supernet(built.pareto, repo, **export) / "1"
        statics = {c.subnet_id: built.export_static(c, repo) / "1" for c in chosen}
        return [breakdown(supernet, statics[c.subnet_id], c.subnet_id, inputs[:b], repeats)
                for c in chosen for b in EXEC_BATCH_SIZES]


def bench_subnetact(family: str, preset: str, build_dir: Path, *, spread: int, repeats: int, loads: int,
                    **export: str) -> dict:
    from export.repository import static_model_name  # lazy: onnx, torch
    from export.supernets import build  # lazy: onnx, torch

    built = build(family, preset, build_dir)
    pareto, chosen, supernet = built.pareto, built.chosen(spread), built.model_name
    images = np.ascontiguousarray(built.samples[:EXEC_BATCH_SIZES[-1]])
    with tempfile.TemporaryDirectory(prefix="accscale-bench-") as tmp:
        repo = Path(tmp)
        built.export_supernet(pareto, repo, **export)
        statics = [built.export_static(c, repo).name for c in chosen]
        weights_separate = sum((repo / name / "1" / "model.onnx").stat().st_size for name in statics)
        weights_supernet = (repo / supernet / "1" / "model.onnx").stat().st_size
        with TritonServer(repository=repo, models=[supernet]) as server, _client(server) as client:
            for c in pareto:  # touch every subnet once, as serving would
                _infer(client, supernet, images[:1], c.row)
            memory_supernet, models_supernet = _pss_bytes(server.pid)
            switch = [timed_ms(lambda i=i: _infer(client, supernet, images[:1], pareto[i % len(pareto)].row))
                      for i in range(repeats)]  # every call names a different subnet than the one before
        with TritonServer(repository=repo, models=statics) as server, _client(server) as client:
            for name in statics:
                _infer(client, name, images[:1])
            memory_separate, models_separate = _pss_bytes(server.pid)
            client.load_model(supernet)
            overhead = {b: _exec_ratios(client, chosen, images[:b], repeats, supernet) for b in EXEC_BATCH_SIZES}
            load = []
            for i in range(loads):
                name = statics[i % len(statics)]
                client.unload_model(name)
                _wait_unloaded(client, name)
                load.append(timed_ms(lambda name=name: (client.load_model(name), _infer(client, name, images[:1]))))
    switch_ms, load_ms = statistics.median(switch), statistics.median(load)
    return {
        "family": family,
        **export,
        "actuation_ratio": load_ms / switch_ms,
        "load_ms": load_ms,
        "switch_ms": switch_ms,
        "memory_ratio": memory_separate / memory_supernet,
        "memory_separate_mib": memory_separate / 2**20,
        "memory_supernet_mib": memory_supernet / 2**20,
        "model_memory_ratio": models_separate / models_supernet,
        "model_memory_separate_mib": models_separate / 2**20,
        "model_memory_supernet_mib": models_supernet / 2**20,
        "weights_ratio": weights_separate / weights_supernet,
        "separate_models": len(statics),
        "supernet_subnets": len(pareto),
        "exec_overhead": {str(b): max(r.values()) for b, r in overhead.items()},
        "exec_overhead_median": {str(b): statistics.median(r.values()) for b, r in overhead.items()},
        "exec_overhead_by_subnet": {str(b): r for b, r in overhead.items()},
        "static_model_names": [static_model_name(supernet, c.subnet_id) for c in chosen],
    }


def _exec_ratios(client, chosen, x: np.ndarray, repeats: int, supernet: str) -> dict[str, float]:
    """Median supernet latency over median static latency, per subnet, calls interleaved."""
    from export.repository import static_model_name  # lazy: onnx, torch

    ratios = {}
    for c in chosen:
        static = static_model_name(supernet, c.subnet_id)
        # the requests are built before the clock starts: what is timed is serving them, not the client's numpy
        dynamic_call = functools.partial(client.infer, supernet, _inputs(x, c.row))
        static_call = functools.partial(client.infer, static, _inputs(x))
        dynamic, fixed = [], []
        for _ in range(2):  # warm-up
            dynamic_call(), static_call()
        for _ in range(repeats):
            dynamic.append(timed_ms(dynamic_call))
            fixed.append(timed_ms(static_call))
        ratios[c.subnet_id] = statistics.median(dynamic) / statistics.median(fixed)
    log.info("batch %d: supernet/static latency %s", len(x), {k: round(v, 3) for k, v in ratios.items()})
    return ratios


def _client(server):
    import tritonclient.grpc as grpcclient  # lazy: tritonclient

    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(client, model: str, x: np.ndarray, row: tuple[int, ...] | None = None) -> np.ndarray:
    return client.infer(model, _inputs(x, row)).as_numpy("LOGITS")


def _inputs(x: np.ndarray, row: tuple[int, ...] | None = None) -> list:
    """A request's tensors: ``x`` as INPUT, and every row running subnet ``row`` if given."""
    import tritonclient.grpc as grpcclient  # lazy: tritonclient
    from tritonclient.utils import np_to_triton_dtype  # lazy: tritonclient

    inputs = [grpcclient.InferInput("INPUT", list(x.shape), np_to_triton_dtype(x.dtype))]
    inputs[0].set_data_from_numpy(x)
    if row is not None:
        control = np.tile(np.asarray(row, dtype=np.int32), (len(x), 1))
        inputs.append(grpcclient.InferInput("CONTROL", list(control.shape), "INT32"))
        inputs[1].set_data_from_numpy(control)
    return inputs


def _wait_unloaded(client, name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.is_model_ready(name) and time.monotonic() < deadline:
        time.sleep(0.05)


def _pss_bytes(pid: int) -> tuple[int, int]:
    """PSS of a tritonserver and all its descendants, and of the descendants alone (the python-backend stubs, one
    per model instance: the models' own memory, without the server's)."""
    import psutil  # lazy: psutil

    root = psutil.Process(pid)
    models = sum(p.memory_full_info().pss for p in root.children(recursive=True))
    return root.memory_full_info().pss + models, models
