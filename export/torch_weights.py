"""The GPU runtime's ``weights.npz`` (:mod:`python_backend.torch_runtime`) of a supernet or of one static subnet.

A supernet's file holds every weight once, at full size, and each norm's [S, C] statistics tables (one row per
calibrated subnet, in SUBNET order); a static subnet's holds its own sliced weights and its statistics as a table
of one row. Both use the same names, so one forward function runs both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from export import transformer
from export.subnetact import SubNetAct, SubnetNorm
from export.supernet import ResNetSupernet


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32, copy=True)


def _norm(name: str, module: nn.Module) -> dict[str, np.ndarray]:
    if isinstance(module, SubnetNorm):
        mean, var = module.mean_table, module.var_table
    elif isinstance(module, nn.BatchNorm2d):
        mean, var = module.running_mean[None], module.running_var[None]
    else:
        raise TypeError(f"{name}: not a norm: {type(module).__name__}")
    return {f"{name}.gamma": _np(module.weight), f"{name}.beta": _np(module.bias), f"{name}.mean": _np(mean),
            f"{name}.var": _np(var)}


def cnn(net: SubNetAct | ResNetSupernet) -> tuple[dict, dict[str, np.ndarray]]:
    """A SubNetAct supernet (its SubnetNorm tables installed) or a static subnet from ``extract_subnet``."""
    model = net.model if isinstance(net, SubNetAct) else net
    tensors = {"stem.conv": _np(model.stem.conv.weight), **_norm("stem.bn", model.stem.bn)}
    stages = []
    for s, stage in enumerate(model.stages):
        blocks = []
        for b, block in enumerate(stage):
            block = getattr(block, "block", block)  # SubNetAct wraps each block in its LayerSelect switch
            name = f"s{s}.b{b}"
            tensors |= {f"{name}.conv1": _np(block.conv1.weight), **_norm(f"{name}.bn1", block.bn1),
                        f"{name}.conv2": _np(block.conv2.weight), **_norm(f"{name}.bn2", block.bn2)}
            shortcut = not isinstance(block.shortcut, nn.Identity)
            if shortcut:
                tensors |= {f"{name}.short.conv": _np(block.shortcut[0].weight),
                            **_norm(f"{name}.short.bn", block.shortcut[1])}
            blocks.append({"stride": block.conv1.stride[0], "mid": block.conv1.weight.shape[0],
                           "out": block.conv2.weight.shape[0], "shortcut": shortcut})
        stages.append(blocks)
    tensors |= {"head.w": _np(model.head.fc.weight), "head.b": _np(model.head.fc.bias)}
    spec = model.spec
    architecture = {"family": "cnn", "eps": model.stem.bn.eps, "max_depths": [len(s) for s in stages],
                    "width_choices": list(spec.width_choices), "stages": stages}
    return architecture, tensors


def encoder(model: transformer.ElasticEncoder, row: Sequence[int] | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """The transformer supernet, or with ``row`` its static subnet (the first heads and units of each layer it
    runs, copied)."""
    spec = model.spec
    widths = spec.widths(model.layout.validate(row)) if row is not None else [(spec.heads, spec.ffn)] * spec.layers
    tensors = {"embed": _np(model.embed.weight), "position": _np(model.position),
               "norm.w": _np(model.norm.weight), "norm.b": _np(model.norm.bias),
               "head.w": _np(model.head.weight), "head.b": _np(model.head.bias)}
    for i, ((heads, units), layer) in enumerate(zip(widths, model.layers)):
        inner, name = heads * spec.head_dim, f"l{i}"
        for k in ("query", "key", "value"):
            linear = getattr(layer, k)
            tensors |= {f"{name}.{k}.w": _np(linear.weight[:inner]), f"{name}.{k}.b": _np(linear.bias[:inner])}
        tensors |= {f"{name}.out.w": _np(layer.out.weight[:, :inner]), f"{name}.out.b": _np(layer.out.bias),
                    f"{name}.ffn1.w": _np(layer.ffn1.weight[:units]), f"{name}.ffn1.b": _np(layer.ffn1.bias[:units]),
                    f"{name}.ffn2.w": _np(layer.ffn2.weight[:, :units]), f"{name}.ffn2.b": _np(layer.ffn2.bias),
                    f"{name}.norm1.w": _np(layer.norm1.weight), f"{name}.norm1.b": _np(layer.norm1.bias),
                    f"{name}.norm2.w": _np(layer.norm2.weight), f"{name}.norm2.b": _np(layer.norm2.bias)}
    architecture = {"family": "transformer", "eps": model.norm.eps, "head_dim": spec.head_dim,
                    "mask_bias": transformer.MASK_BIAS, "max_depths": [len(widths)],
                    "width_choices": list(spec.width_choices),
                    "layers": [{"heads": h, "units": u} for h, u in widths]}
    return architecture, tensors
