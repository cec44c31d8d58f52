"""``accscale bench subnetact --device cuda``: SubNetAct on the GPU runtime against separately loaded subnets.

The same three comparisons as the Triton bench (:mod:`export.bench`), for the torch runtime
(:mod:`python_backend.torch_runtime`), without a server: the models are the repository's own python-backend models,
run through Triton's model interface with :mod:`python_backend.standin` in place of Triton's utilities, their
runtime chosen as Triton would choose it for a ``KIND_GPU`` instance (``--device cpu``: a CPU instance of the torch
runtime, the dry run).

- actuation: a request naming another subnet than the one before, answer included, against loading a separate
  model and its first answer. A separate model is loaded twice: in this process (``load_in_process_ms``: weights
  to the device, the warm-up every model runs at each batch size), and as Triton's python backend loads a model,
  in a new process (``load_ms``: the stub's interpreter, torch, the device's context, the same load).
- memory: one process per model, as Triton runs each model's stub: the supernet's against the ``spread`` static
  subnets' summed; ``torch.cuda.memory_allocated`` (the tensors a model holds: its weights), ``max_memory_reserved``
  (what torch's allocator took, activations of the warm-up included) and NVML's figure for the process (the CUDA
  context included).
- execution: per batch size, each spread subnet through the supernet against its static export, both loaded in
  this process and called alternately; ``exec_overhead`` is the worst subnet's median ratio.

A bench set (:func:`write_bench_set`) is the supernet and the spread static subnets exported with their inputs,
so that a machine without the training caches (the GPU machine) can run the bench.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from python_backend import standin
from python_backend.runners import MODEL_FILE

BATCH_SIZES = (1, 16, 64)
MANIFEST = "bench-set.json"
SAMPLES = "samples.npy"
BUNDLE_ENV = "ACCSCALE_GPU_BUNDLE"  # where the GPU tests find `make gpu-bundle`'s bench sets
GOALS = {"actuation_ratio": 1000.0, "memory_ratio": 2.5, "exec_overhead": 1.10}  # issue 48's goals on the GPU


def write_bench_set(family: str, preset: str, build_dir: Path, spread: int, out: Path, *, onnx: bool = True,
                    profiled: bool = True) -> Path:
    """Export ``family``'s supernet and its ``spread`` static subnets to ``out/repo``, with held-out inputs;
    without ``onnx``, only what the GPU runtime reads (the full CNN's graphs would double its 38 MiB); without
    ``profiled``, every searched subnet, none profiled (a profile is measured through Triton)."""
    from export.supernets import build  # lazy: onnx, torch

    built = build(family, preset, build_dir, profiled=profiled)
    chosen = built.chosen(spread)
    repo = out / "repo"
    built.export_supernet(built.pareto, repo)
    statics = {built.export_static(c, repo).name: list(c.row) for c in chosen}
    if not onnx:
        for graph in repo.glob(f"*/1/{MODEL_FILE}"):
            graph.unlink()
    np.save(out / SAMPLES, np.ascontiguousarray(built.samples[: max(BATCH_SIZES)]))
    manifest = {"family": family, "preset": preset, "supernet": built.model_name, "statics": statics,
                "subnets": [list(c.row) for c in built.pareto]}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out


def _request(x: np.ndarray, row: list[int] | None = None):
    inputs = {"INPUT": x}
    if row is not None:
        inputs["CONTROL"] = np.tile(np.asarray(row, dtype=np.int32), (len(x), 1))
    return standin.InferenceRequest(inputs)


def _answer(model, request) -> np.ndarray:
    (response,) = model.execute([request])
    if response.has_error():
        raise RuntimeError(response.error().message())
    return standin.get_output_tensor_by_name(response, "LOGITS").as_numpy()


def timed_ms(call: Callable[[], object]) -> float:
    """Milliseconds ``call()`` took."""
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def _kind(device: str) -> str:
    return "GPU" if device == "cuda" else "CPU"


def _load(model_dir: Path, device: str, layout: str = "prefix"):
    return standin.load(model_dir, _kind(device), parameters={"runtime": "torch", "weight_layout": layout})


PARTS = ("actuation", "memory", "execution")


def bench(bench_set: Path, device: str, *, repeats: int = 30, loads: int = 5, layout: str = "prefix",
          parts: tuple[str, ...] = PARTS) -> dict:
    """The comparisons of ``parts`` on ``bench_set``, one run; ``device`` "cuda" or "cpu"."""
    manifest = json.loads((bench_set / MANIFEST).read_text())
    repo, supernet = bench_set / "repo", manifest["supernet"]
    statics = list(manifest["statics"])
    samples = np.load(bench_set / SAMPLES)
    model = _load(repo / supernet, device, layout)
    rows = manifest["subnets"]
    for row in rows:  # touch every subnet once, as serving would
        _answer(model, _request(samples[:1], row))
    result = {"family": manifest["family"], "preset": manifest["preset"], "device": device, "weight_layout": layout,
              "device_name": _device_name(device), "separate_models": len(statics), "supernet_subnets": len(rows)}
    if "actuation" in parts:
        requests = [_request(samples[:1], rows[i % len(rows)]) for i in range(repeats)]
        switch = [timed_ms(lambda r=r: _answer(model, r)) for r in requests]
        in_process, process = [], []
        for i in range(loads):
            name = statics[i % len(statics)]
            request = _request(samples[:1])
            in_process.append(timed_ms(lambda name=name, request=request: _answer(_load(repo / name, device, layout),
                                                                                 request)))
            process.append(_load_in_new_process(repo / name, device, layout))
        switch_ms, load_ms, load_local_ms = (statistics.median(v) for v in (switch, process, in_process))
        result |= {"actuation_ratio": load_ms / switch_ms, "actuation_ratio_in_process": load_local_ms / switch_ms,
                   "switch_ms": switch_ms, "load_ms": load_ms, "load_in_process_ms": load_local_ms}
    if "execution" in parts:
        overhead = {b: _exec_ratios(model, repo, manifest, samples[:b], repeats, device, layout) for b in BATCH_SIZES}
        for suffix, at in (("", "model"), ("_runner", "runner")):  # through the model's execute, and the runner alone
            result |= {f"exec_overhead{suffix}": {str(b): max(r[at].values()) for b, r in overhead.items()},
                       f"exec_overhead{suffix}_median": {str(b): statistics.median(r[at].values())
                                                         for b, r in overhead.items()},
                       f"exec_overhead{suffix}_by_subnet": {str(b): r[at] for b, r in overhead.items()}}
        result["exec_ms_by_subnet"] = {str(b): r["ms"] for b, r in overhead.items()}
    if "memory" in parts:
        memory_statics = [_memory_in_new_process([repo / s], device, layout) for s in statics]
        result["memory"] = {"supernet": _memory_in_new_process([repo / supernet], device, layout),
                            "separate": _summed(memory_statics)}
        for key in ("weights_bytes", "allocated_bytes", "max_reserved_bytes", "nvml_bytes", "rss_bytes"):
            a, b = result["memory"]["separate"].get(key), result["memory"]["supernet"].get(key)
            result[f"memory_ratio_{key.removesuffix('_bytes')}"] = a / b if a and b else None
        result["memory_ratio"] = result["memory_ratio_allocated"]  # on a GPU: what torch allocated, per process
    result["goals"] = goals(result)
    return result


def goals(result: dict) -> list[dict]:
    """The issue's goals against this run (those it measured): actuation against a model loaded as Triton loads one;
    memory as torch counts what each model's process holds (``memory_ratio``) and as the weights alone; the worst
    subnet's execution overhead over the batch sizes."""
    measured = {"actuation_ratio": ("actuation_ratio", result.get("actuation_ratio")),
                "memory_ratio": ("memory_ratio", result.get("memory_ratio")),
                "memory_ratio_weights": ("memory_ratio", result.get("memory_ratio_weights")),
                "exec_overhead": ("exec_overhead", max(result["exec_overhead"].values())
                                  if "exec_overhead" in result else None)}
    return [{"goal": name, "target": (">= " if goal != "exec_overhead" else "<= ") + str(GOALS[goal]),
             "measured": round(v, 3), "met": v <= GOALS[goal] if goal == "exec_overhead" else v >= GOALS[goal]}
            for name, (goal, v) in measured.items() if v is not None]


def _summed(parts: list[dict]) -> dict:
    keys = {k for p in parts for k, v in p.items() if isinstance(v, int | float)}
    return {k: sum(p[k] for p in parts) if all(p.get(k) is not None for p in parts) else None for k in sorted(keys)}


def _exec_ratios(model, repo: Path, manifest: dict, x: np.ndarray, repeats: int, device: str,
                 layout: str) -> dict[str, dict]:
    """Median supernet latency over median static latency, per spread subnet, calls interleaved: through the models'
    ``execute`` (``model``: the request path included, as Triton calls them) and their runners alone (``runner``),
    with the medians in milliseconds (``ms``)."""
    ratios: dict[str, dict] = {"model": {}, "runner": {}, "ms": {}}
    for name, row in manifest["statics"].items():
        static = _load(repo / name, device, layout)
        subnet = model.runner.subnet_indices(np.tile(np.asarray(row, dtype=np.int32), (len(x), 1)))
        # the requests are built before the clock starts: what is timed is the model serving them
        calls = {"model": (functools.partial(_answer, model, _request(x, row)),
                           functools.partial(_answer, static, _request(x))),
                 "runner": (functools.partial(model.runner.run, x, subnet), functools.partial(static.runner.run, x))}
        for at, (dynamic_call, static_call) in calls.items():
            for _ in range(3):  # warm-up
                dynamic_call(), static_call()
            dynamic, fixed = [], []
            for _ in range(repeats):
                dynamic.append(timed_ms(dynamic_call))
                fixed.append(timed_ms(static_call))
            ratios[at][name] = statistics.median(dynamic) / statistics.median(fixed)
            if at == "model":
                ratios["ms"][name] = [statistics.median(dynamic), statistics.median(fixed)]
    return ratios


def _child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def _load_in_new_process(model_dir: Path, device: str, layout: str) -> float:
    """Milliseconds from starting a process to its first answer from ``model_dir``, as the python backend's stub."""
    start = time.perf_counter()
    out = _child(["answer", str(model_dir), device, layout])
    took = (time.perf_counter() - start) * 1e3
    if "answered" not in out.stdout:
        raise RuntimeError(f"{model_dir.name}: the new process gave no answer: {out.stderr[-2000:]}")
    return took


def _memory_in_new_process(model_dirs: list[Path], device: str, layout: str) -> dict:
    out = _child(["memory", device, layout, *map(str, model_dirs)])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(args: list[str], timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """This module as a new process (a model's own, as Triton runs each model's stub); its error, if any, with its
    stderr's end."""
    out = subprocess.run([sys.executable, "-m", "export.bench_torch", *args], capture_output=True, text=True,
                         env=_child_env(), timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])}: exited {out.returncode}: {out.stderr[-2000:]}")
    return out


def _device_name(device: str) -> str:
    import torch  # lazy: torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def _nvml_bytes() -> int | None:
    """NVML's GPU memory of this process (its CUDA context included), or None where NVML cannot say."""
    try:
        import pynvml  # lazy: nvidia-ml-py, on GPU machines only

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        used = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
        return int(used[0]) if used and used[0] is not None else None
    except Exception:  # noqa: BLE001 - no NVML, no driver, or a process table NVML does not fill in a VM
        return None


def _memory(model_dirs: list[Path], device: str, layout: str) -> dict:
    """What loading ``model_dirs`` (each warmed up at every batch size, every subnet) holds in this process."""
    import psutil  # lazy: psutil
    import torch  # lazy: torch

    models = [_load(d, device, layout) for d in model_dirs]
    weights = sum(m.runner.network.bytes() for m in models)
    result = {"weights_bytes": weights, "rss_bytes": psutil.Process().memory_info().rss}
    if device == "cuda":
        torch.cuda.synchronize()
        result |= {"allocated_bytes": torch.cuda.memory_allocated(),
                   "max_reserved_bytes": torch.cuda.max_memory_reserved(), "nvml_bytes": _nvml_bytes()}
    return result


def main(argv: list[str]) -> int:
    """The child processes' side: ``answer MODEL_DIR DEVICE LAYOUT`` or ``memory DEVICE LAYOUT MODEL_DIR...``."""
    if argv[0] == "answer":
        model_dir, device, layout = Path(argv[1]), argv[2], argv[3]
        model = _load(model_dir, device, layout)
        (spec,) = [t for t in standin.model_config(model_dir)["input"] if t["name"] == "INPUT"]
        x = np.zeros((1, *map(int, spec["dims"])), dtype=standin.triton_string_to_numpy(spec["data_type"]))
        _answer(model, _request(x))
        print("answered")
        return 0
    if argv[0] == "memory":
        print(json.dumps(_memory([Path(p) for p in argv[3:]], argv[1], argv[2])))
        return 0
    raise SystemExit(f"unknown command {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
