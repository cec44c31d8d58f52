"""Any ONNX model on Triton's python backend: the stand-in for Triton's onnxruntime backend where only the python
backend runs (the CPU tritonserver that nvidia-pytriton ships).

``accscale add-model FILE.onnx`` writes the model folder: its config's inputs and outputs are the graph's, by
name, type and shape. The requests of a dynamic batch whose inputs have the same shapes past the batch dimension
run as one call and are split back; any other request runs alone, and a request that fails gets its own error
without failing its neighbours. A server started with ``accscale triton --emulate-slowdown F`` emulates a slower
device kind (:mod:`python_backend.emulation`). On a Triton with the onnxruntime backend the same ``model.onnx``
is served by ``platform: "onnxruntime_onnx"``; the profile and the sidecar do not change.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backend import emulation
from python_backend.runners import MODEL_FILE, make_session, release_free_heap


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        # a KIND_GPU instance runs on its GPU where onnxruntime-gpu is installed (the CPU otherwise)
        device_id = int(args.get("model_instance_device_id", 0)) if args.get("model_instance_kind") == "GPU" else None
        self.session = make_session(version_dir / MODEL_FILE, int(params.get("intra_op_threads", "1")),
                                    device_id=device_id)
        release_free_heap()
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        self.batching = int(config.get("max_batch_size", 0)) > 0
        try:
            self.metric_family, counter = emulation.compute_counter(pb_utils, args["model_name"])
            self.padding = emulation.Padding(emulation.slowdown(), version_dir, counter)
        except ValueError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None

    def execute(self, requests: list) -> list:
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        groups: dict[object, list[int]] = {}
        for i, feed in enumerate(feeds):
            # one call for the requests whose rows have the same shapes and types; without batching, each alone
            key = tuple((n, a.shape[1:], a.dtype.str) for n, a in feed.items()) if self.batching else i
            groups.setdefault(key, []).append(i)
        responses: list = [None] * len(requests)
        start, rows = time.perf_counter(), 0
        for members in groups.values():
            try:
                outputs = self._run([feeds[i] for i in members])
            except Exception as exc:  # noqa: BLE001 - a failed call answers its own requests only
                error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INVALID_ARG)
                for i in members:
                    responses[i] = pb_utils.InferenceResponse(error=error)
                continue
            for i, values in zip(members, outputs):
                responses[i] = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(n, v) for n, v in zip(self.outputs, values)])
            rows += sum(len(next(iter(feeds[i].values()))) if self.batching else 1 for i in members)
        self.padding.pad(rows, start)
        return responses

    def _run(self, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        """Each feed's outputs, from one session call over all of them."""
        if len(feeds) == 1:
            return [self.session.run(self.outputs, feeds[0])]
        merged = {n: np.concatenate([f[n] for f in feeds]) for n in self.inputs}
        cuts = np.cumsum([len(f[self.inputs[0]]) for f in feeds])[:-1]
        values = self.session.run(self.outputs, merged)
        return [list(parts) for parts in zip(*(np.split(v, cuts) for v in values))]
