"""The GPU runtime: SubNetAct's supernets, and their static subnets, as torch on CUDA (or on the CPU, for tests).

The CPU runtime is onnxruntime (:mod:`python_backend.runners`), whose speed comes from folding each subnet's norms
into its convolutions and reordering weights per subnet, which copies them. On a GPU, SuperServe runs the supernet
as the paper describes (section 3.1), and so does this module:

- the weights are loaded once, from ``weights.npz`` beside the model's ``model.onnx`` (:func:`write_weights`);
- WeightSlice is a view: the first output channels of a convolution (``w[:m]``), the first rows or columns of a
  linear layer, no copy;
- SubnetNorm is a view too: row ``i`` of each norm's [S, C] mean and variance tables, its first ``m`` channels,
  with gamma and beta shared, run unfused (``batch_norm`` on the GPU costs one small kernel);
- LayerSelect is which blocks run.

Actuating a subnet is picking its :class:`Plan`, a list of those views built once per subnet when the model loads
(metadata only: a view holds no memory). A static subnet is the same network with weights that are already its
own size, run by the same code with one plan, so that the supernet and the static export differ only in where
their weights live.

# Decision (the layout of weights sliced along their input dimension): a block's second convolution and a
# transformer layer's output and second feed-forward projections read only their first inputs, ``w[:, :m]``, a
# strided view. cuDNN copies a strided convolution weight on every call (a transient copy; on an H100 it cost the
# CNN's subnets 6-20% at every batch size). The default layout, "prefix", stores each such weight once, when the
# model loads, so that every subnet's slice is a contiguous prefix of it: a convolution's as a transposed
# convolution's [in, out, kh, kw] with its kernel flipped (``conv_transpose2d`` with stride 1 and padding 1
# computes the same correlation), a linear layer's as [in, out] (``b + x @ w[:m]``). "strided" keeps the plain
# layout and its strided views. A static subnet runs in the same layout as the supernet, so that the two differ
# only in where their weights live; the bench reports both layouts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from python_backend.control import ControlLayout, channels

WEIGHTS_FILE = "weights.npz"  # beside model.onnx: the network's tensors under the names below, for this runtime
ARCHITECTURE_KEY = "__architecture__"  # the JSON architecture, stored in the same file as bytes
WEIGHT_LAYOUTS = ("prefix", "strided")
INPUT_SLICED = (".conv2", ".out.w", ".ffn2.w")  # the weights a subnet slices along their input dimension


def write_weights(path: Path, architecture: dict, tensors: dict[str, np.ndarray]) -> None:
    """``tensors`` (float32, canonical names) and ``architecture`` as one ``weights.npz``."""
    encoded = np.frombuffer(json.dumps(architecture).encode(), dtype=np.uint8)
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    with open(path, "wb") as f:
        np.savez(f, **arrays, **{ARCHITECTURE_KEY: encoded})


def read_weights(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as raw:
        arrays = {k: raw[k] for k in raw.files}
    architecture = json.loads(arrays.pop(ARCHITECTURE_KEY).tobytes().decode())
    return architecture, arrays


@dataclass(frozen=True)
class Plan:
    """One subnet, ready to run: its forward function and the weight views it takes."""

    run: Callable[..., object]
    views: tuple

    def __call__(self, x):
        return self.run(x, self.views)


class TorchNetwork:
    """A network of ``weights.npz`` on ``device``; ``plan(row, index)`` builds the views of one subnet."""

    def __init__(self, version_dir: Path, device: str = "cpu", layout: str = "prefix") -> None:
        import torch  # lazy: only models that run on torch import it

        if layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"weight_layout must be one of {WEIGHT_LAYOUTS}, got {layout!r}")
        self.torch = torch
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # TF32 would put convolutions and matrix products about 1e-3 away from the CPU runtime's float32
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        self.architecture, arrays = read_weights(version_dir / WEIGHTS_FILE)
        self.family = self.architecture["family"]
        if self.family not in ("cnn", "transformer"):
            raise ValueError(f"{WEIGHTS_FILE}: unknown family {self.family!r}")
        self.layout = layout
        self.weights = {k: self._load(k, v) for k, v in arrays.items()}

    def _load(self, name: str, value: np.ndarray):
        t = self.torch.from_numpy(value)
        if self.layout == "prefix" and name.endswith(INPUT_SLICED):
            # input dimension first, so that the first m inputs are a contiguous prefix
            t = (t.flip(2, 3).transpose(0, 1) if t.ndim == 4 else t.t()).contiguous()
        return t.to(self.device)

    def _input_slice(self, name: str, m: int):
        """The first ``m`` inputs of weight ``name``: a contiguous prefix in the "prefix" layout, else strided."""
        w = self.weights[name]
        return w[:m] if self.layout == "prefix" else w[:, :m]

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def full_plan(self) -> Plan:
        """Every block at the width its weights have: a static subnet, or the supernet's largest subnet."""
        if self.family == "cnn":
            stages = [[b["mid"] for b in stage] for stage in self.architecture["stages"]]
            return self._cnn_plan(stages, 0)
        return self._transformer_plan([(layer["heads"], layer["units"]) for layer in self.architecture["layers"]])

    def plan(self, row: Sequence[int], index: int) -> Plan:
        """Subnet ``row`` (a control row of the supernet's layout) with row ``index`` of the norm statistics."""
        layout = ControlLayout(tuple(self.architecture["max_depths"]), tuple(self.architecture["width_choices"]))
        row = layout.validate(row)
        choices, m = layout.width_choices, layout.num_stages
        if self.family == "cnn":
            stages = [[channels(choices[row[m + layout.block_index(s, b)]], block["mid"])
                       for b, block in enumerate(blocks[: row[s]])]
                      for s, blocks in enumerate(self.architecture["stages"])]
            return self._cnn_plan(stages, index)
        return self._transformer_plan([(channels(choices[w], layer["heads"]), channels(choices[w], layer["units"]))
                                       for w, layer in zip(row[1 : 1 + row[0]], self.architecture["layers"])])

    # the CNN: stem, residual blocks (conv-norm-relu-conv-norm, shortcut), mean pool, linear head

    def _norm(self, name: str, index: int, c: int) -> tuple:
        p = self.weights
        return (p[f"{name}.mean"][index, :c], p[f"{name}.var"][index, :c], p[f"{name}.gamma"][:c],
                p[f"{name}.beta"][:c])

    def _cnn_plan(self, stages: list[list[int]], index: int) -> Plan:
        p, arch = self.weights, self.architecture
        stem = (p["stem.conv"], self._norm("stem.bn", index, p["stem.conv"].shape[0]))
        blocks = []
        for s, mids in enumerate(stages):
            for b, mid in enumerate(mids):
                spec, name = arch["stages"][s][b], f"s{s}.b{b}"
                out = spec["out"]
                conv2 = self._input_slice(f"{name}.conv2", mid)
                shortcut = None
                if spec["shortcut"]:
                    shortcut = (p[f"{name}.short.conv"], self._norm(f"{name}.short.bn", index, out))
                blocks.append((spec["stride"], p[f"{name}.conv1"][:mid], self._norm(f"{name}.bn1", index, mid),
                               conv2, self._norm(f"{name}.bn2", index, out), shortcut))
        return Plan(self._cnn_forward, (stem, tuple(blocks), p["head.w"], p["head.b"]))

    def _cnn_forward(self, x, views):
        F = self.torch.nn.functional
        eps = self.architecture["eps"]

        def norm(h, stats):
            mean, var, gamma, beta = stats
            return F.batch_norm(h, mean, var, gamma, beta, False, 0.0, eps)

        conv2 = (lambda h, w: F.conv_transpose2d(h, w, padding=1)) if self.layout == "prefix" else \
            (lambda h, w: F.conv2d(h, w, padding=1))
        (stem_w, stem_norm), blocks, head_w, head_b = views
        h = self.torch.relu(norm(F.conv2d(x, stem_w, padding=1), stem_norm))
        for stride, w1, n1, w2, n2, shortcut in blocks:
            y = self.torch.relu(norm(F.conv2d(h, w1, stride=stride, padding=1), n1))
            y = norm(conv2(y, w2), n2)
            if shortcut is not None:
                h = norm(F.conv2d(h, shortcut[0], stride=stride), shortcut[1])
            h = self.torch.relu(y + h)
        return F.linear(h.mean(dim=(2, 3)), head_w, head_b)

    # the transformer: embeddings, pre-norm encoder layers, final norm, mean over the tokens, linear head

    def _transformer_plan(self, widths: list[tuple[int, int]]) -> Plan:
        p, dh = self.weights, self.architecture["head_dim"]
        layers = []
        for i, (heads, units) in enumerate(widths):
            inner, name = heads * dh, f"l{i}"
            qkv = tuple((p[f"{name}.{k}.w"][:inner], p[f"{name}.{k}.b"][:inner]) for k in ("query", "key", "value"))
            layers.append((heads, (p[f"{name}.norm1.w"], p[f"{name}.norm1.b"]), qkv,
                           (self._input_slice(f"{name}.out.w", inner), p[f"{name}.out.b"]),
                           (p[f"{name}.norm2.w"], p[f"{name}.norm2.b"]),
                           (p[f"{name}.ffn1.w"][:units], p[f"{name}.ffn1.b"][:units]),
                           (self._input_slice(f"{name}.ffn2.w", units), p[f"{name}.ffn2.b"])))
        return Plan(self._transformer_forward, (p["embed"], p["position"], tuple(layers), (p["norm.w"], p["norm.b"]),
                                                (p["head.w"], p["head.b"])))

    def _transformer_forward(self, tokens, views):
        F, torch = self.torch.nn.functional, self.torch
        arch = self.architecture
        dh, eps = arch["head_dim"], arch["eps"]
        embed, position, layers, final_norm, head = views
        keep = (tokens != 0).to(torch.float32)
        mask = ((1.0 - keep) * arch["mask_bias"])[:, None, None, :]
        x = F.embedding(tokens, embed) + position
        n, t, d = x.shape
        scale = 1 / math.sqrt(dh)

        def input_sliced(h, w, b):  # "prefix": [in, out] weights, b + h @ w in one matrix product
            return torch.addmm(b, h.reshape(-1, h.shape[-1]), w).view(n, t, -1)

        if self.layout == "strided":
            input_sliced = F.linear  # noqa: F811 - the plain [out, in] layout
        for heads, norm1, qkv, out, norm2, ffn1, ffn2 in layers:
            h = F.layer_norm(x, (d,), *norm1, eps)
            q, k, v = (F.linear(h, *lin).view(n, t, heads, dh).transpose(1, 2) for lin in qkv)
            scores = (q @ k.transpose(-1, -2)) * scale + mask
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, heads * dh)
            x = x + input_sliced(context, *out)
            u = F.linear(F.layer_norm(x, (d,), *norm2, eps), *ffn1)
            x = x + input_sliced(F.gelu(u), *ffn2)
        x = F.layer_norm(x, (d,), *final_norm, eps)
        pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1.0)
        return F.linear(pooled, *head)


class TorchEngine:
    """Runs plans on numpy batches: the input to the device, the logits back."""

    def __init__(self, version_dir: Path, device: str = "cpu", layout: str = "prefix", threads: int = 1) -> None:
        self.network = TorchNetwork(version_dir, device, layout)
        self.torch = self.network.torch
        if self.network.device.type == "cpu":  # the model's intra_op_threads, as onnxruntime's (one model a process)
            self.torch.set_num_threads(threads)

    def __call__(self, plan: Plan, batch: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch)).to(self.network.device, non_blocking=True)
            return plan(x).cpu().numpy()
