"""The Triton python-backend model shared by every exported model in the repository.

``model_repository/<model>/1/model.py`` only re-exports :class:`TritonPythonModel`. The
model's ``config.pbtxt`` parameter ``runner`` says what to run: ``supernet`` (INPUT plus
CONTROL, see :class:`~python_backend.runners.SupernetRunner`), ``static`` (INPUT only) or ``components``
(the Loki pipeline's classical detector, no network); its instance group, or the parameter ``runtime``, says on what
(:func:`runtime_of`: onnxruntime on the CPU, torch on a ``KIND_GPU`` instance's GPU).
Every request gets its own response: a request whose CONTROL names no calibrated subnet
gets INVALID_ARGUMENT and the other requests of the same dynamic batch are still served.
A server started with ``accscale triton --emulate-slowdown F`` emulates a slower device kind
(:mod:`python_backend.emulation`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backend import emulation
from python_backend.control import ControlError
from python_backend.runners import ComponentsRunner, Runtime, StaticRunner, SupernetRunner, release_free_heap

RUNNERS = {"supernet": SupernetRunner, "static": StaticRunner, "components": ComponentsRunner}


def runtime_of(args: dict, params: dict[str, str]) -> Runtime:
    """The runtime an instance runs: the config parameter ``runtime`` if set (``onnxruntime`` or ``torch``), else
    torch on the instance's GPU for a ``KIND_GPU`` instance group and onnxruntime on the CPU otherwise;
    ``weight_layout`` is the GPU runtime's (:mod:`python_backend.torch_runtime`)."""
    gpu = args.get("model_instance_kind") == "GPU"
    engine = params.get("runtime", "torch" if gpu else "onnxruntime")
    device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu and engine == "torch" else "cpu"
    return Runtime(engine, device, params.get("weight_layout", "prefix"))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        kind = params.get("runner", "")
        if kind not in RUNNERS:
            raise pb_utils.TritonModelException(f"parameter 'runner' must be one of {sorted(RUNNERS)}, got {kind!r}")
        version_dir = Path(args["model_repository"]) / args["model_version"]
        try:
            runtime = runtime_of(args, params)
            self.runner = RUNNERS[kind](version_dir, threads=int(params.get("intra_op_threads", "1")),
                                        runtime=runtime)
        except (ValueError, OSError, ImportError) as exc:  # a runtime this model cannot take, or not installed here
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from None
        self.has_control = kind == "supernet"
        try:
            self.metric_family, counter = emulation.compute_counter(pb_utils, args["model_name"])
            self.padding = emulation.Padding(emulation.slowdown(), version_dir, counter)
        except ValueError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        self._warm_up(config)
        release_free_heap()

    def _warm_up(self, config: dict) -> None:
        """Run every variant at every power-of-two batch size up to the maximum before Triton calls us ready.

        A subnet's first calls at a batch shape ran several times their profiled latency (onnxruntime
        plans memory per shape, the stub maps new shared memory), so requests sent right after "ready"
        missed deadlines that later ones met (issue 14). Done here rather than with Triton's
        ``model_warmup``, which cannot enumerate the subnets a CONTROL tensor selects; it runs once per
        model instance, each instance having its own session.
        """
        (image,) = [t for t in config["input"] if t["name"] == "INPUT"]
        sizes = [1 << i for i in range(int(config.get("max_batch_size", 1)).bit_length())]
        start = time.perf_counter()
        dims = [int(d) for d in image["dims"]]  # int64 fields come as strings in the JSON config
        dtype = pb_utils.triton_string_to_numpy(image["data_type"])  # images, or a transformer's token ids
        runs = sum(self.runner.warm_up(np.zeros((b, *dims), dtype)) for b in sizes)
        pb_utils.Logger.log_info(f"{config['name']}: warmed up with {runs} runs (batch sizes {sizes}) "
                                 f"in {time.perf_counter() - start:.2f} s")

    def execute(self, requests: list) -> list:
        images, subnets, sizes, errors = [], [], [], {}
        for i, request in enumerate(requests):
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if self.has_control:
                control = pb_utils.get_input_tensor_by_name(request, "CONTROL").as_numpy()
                try:
                    subnets.append(self.runner.subnet_indices(control))
                except ControlError as exc:
                    errors[i] = str(exc)
                    continue
            images.append(x)
            sizes.append(len(x))
        start = time.perf_counter()
        try:
            outputs = iter(self._run(images, subnets, sizes))
        except Exception as exc:  # noqa: BLE001 - every request still gets its own answer
            failure = pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)
            return [self._error(errors[i]) if i in errors else pb_utils.InferenceResponse(error=failure)
                    for i in range(len(requests))]
        # which subnets ran matters only to an emulation without a latency profile: not worked out per batch else
        ran = tuple(np.unique(np.concatenate(subnets)).tolist()) if subnets and self.padding.by_subnet else ()
        self.padding.pad(sum(sizes), start, ran)
        return [
            self._error(errors[i]) if i in errors
            else pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("LOGITS", next(outputs))])
            for i in range(len(requests))
        ]

    @staticmethod
    def _error(message: str):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))

    def _run(self, images: list, subnets: list, sizes: list) -> list:
        if not images:
            return []
        batch = np.concatenate(images) if len(images) > 1 else images[0]
        subnet_of_row = (np.concatenate(subnets) if len(subnets) > 1 else subnets[0]) if subnets else None
        logits = self.runner.run(batch, subnet_of_row)
        if len(sizes) == 1:
            return [logits]
        return np.split(logits, np.cumsum(sizes)[:-1])
