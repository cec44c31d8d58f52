"""Write the SubNetAct supernet, or one static subnet, as an ONNX graph.

The supernet graph carries SubNetAct's control flow as ONNX operators, driven by inputs:

- ``DEPTH`` (int64 [M]): LayerSelect is an ``If`` per block beyond a stage's first, nested:
  block b and every later block of the stage sit in the then-branch of ``DEPTH[m] > b``,
  whose else-branch forwards the input unchanged, so a shallow subnet skips the rest of a
  stage with one ``If``;
- ``WIDTH`` (int64 [K], width-choice indices): WeightSlice is a balanced tree of ``If`` on
  the block's width index, one leaf per width choice, in which the convolution weights are
  ``Slice``d with constant bounds (folded by onnxruntime when the session loads);
- ``SUBNET`` (int64 scalar): SubnetNorm is a ``Gather`` of row SUBNET from each
  BatchNorm's [S, C] mean and variance tables (inside a width leaf, tables and gamma/beta
  already sliced to that width when the graph is written).

All weights are initialisers of the main graph, shared by every subnet. A static subnet
is the same network with constant, physically sliced weights and no control inputs.

:func:`folded_supernet_model` trades memory for speed: one static subnet per calibrated subnet under a tree of
``If`` on SUBNET, so that each subnet's norms fold into its convolutions (``accscale export --norms folded``).
:mod:`export.transformer_onnx` writes the transformer family with the same ``If`` trees (:func:`choice_tree`,
:func:`layer_chain`).

NOTE: the graph is emitted directly with ``onnx.helper`` rather than through
``torch.onnx.export``: the TorchScript exporter is deprecated and the dynamo exporter does
not turn data-dependent slicing into ``Slice`` on a runtime input. One emitter serves both
graphs, so the supernet and its static subnets differ only in how parameters are obtained.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from export.subnetact import BoolModule, SubNetAct, SubnetNorm, WeightSlice
from export.supernet import ResidualBlock, ResNetSupernet
from python_backend.control import channels

OPSET = 17
# helper.make_model stamps the IR version of the installed onnx (13 from onnx 1.20 on), which older onnxruntime
# refuses: 1.23.2, the newest for Python 3.10, reads at most IR 11. IR 8 is the oldest that carries opset 17,
# as in export.families and export.small_nets.
IR_VERSION = 8
INPUT, LOGITS = "INPUT", "LOGITS"
DEPTH, WIDTH, SUBNET = "DEPTH", "WIDTH", "SUBNET"


class Graph:
    """A node list; branches share the root's initialisers and name counter."""

    def __init__(self, root: Graph | None = None) -> None:
        self.root = root.root if root else self
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def fresh(self, hint: str) -> str:
        self.root._count += 1
        return f"{hint}_{self.root._count}"

    def const(self, value: np.ndarray | torch.Tensor, hint: str) -> str:
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        name = self.fresh(hint)
        self.root.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def branch_graph(self, name: str, output: str) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])


class SharedWeights:
    """Initialisers written once per (tensor, width, axis) and shared by every branch that uses them."""

    def __init__(self) -> None:
        self.names: dict[tuple[int, int | None, int, bool], str] = {}

    def __call__(self, g: Graph, tensor: torch.Tensor, hint: str, width: int | None = None, axis: int = 0,
                 transpose: bool = False) -> str:
        """``tensor`` (a parameter or buffer: its identity is the key), its first ``width`` entries along ``axis``
        if given, transposed if asked, as one initialiser."""
        key = (id(tensor), width, axis, transpose)
        if key not in self.names:
            value = tensor if width is None else tensor.narrow(axis, 0, width)
            self.names[key] = g.const(value.t() if transpose else value, hint)
        return self.names[key]


class _Emitter(abc.ABC):
    """Shared network structure; subclasses decide how weights and statistics are obtained."""

    def conv(self, g: Graph, x: str, module: nn.Module, out: int | None = None, inp: int | None = None) -> str:
        stride, pad = module.stride[0], module.padding[0]
        weight = self.conv_weight(g, module, out, inp)
        return g.op("Conv", [x, weight], strides=[stride, stride], pads=[pad] * 4)

    @abc.abstractmethod
    def conv_weight(self, g: Graph, module: nn.Module, out: int | None, inp: int | None) -> str:
        """The weight tensor of ``module``, sliced to ``out`` output and ``inp`` input channels if given."""

    @abc.abstractmethod
    def norm(self, g: Graph, x: str, module: nn.Module, width: int | None = None) -> str:
        """BatchNorm of ``x`` with ``module``'s parameters (sliced to ``width`` channels if given)."""

    def stem(self, g: Graph, x: str, stem: nn.Module) -> str:
        return g.op("Relu", [self.norm(g, self.conv(g, x, stem.conv), stem.bn)])

    def block(self, g: Graph, x: str, block: ResidualBlock, width: int | None = None) -> str:
        h = g.op("Relu", [self.norm(g, self.conv(g, x, block.conv1, out=width), block.bn1, width)])
        h = self.norm(g, self.conv(g, h, block.conv2, inp=width), block.bn2)
        shortcut = x
        if not isinstance(block.shortcut, nn.Identity):
            shortcut = self.norm(g, self.conv(g, x, block.shortcut[0]), block.shortcut[1])
        return g.op("Relu", [g.op("Add", [h, shortcut])])

    def head(self, g: Graph, x: str, head: nn.Module) -> str:
        pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
        return g.op("Gemm", [pooled, g.const(head.fc.weight, "fc_w"), g.const(head.fc.bias, "fc_b")], transB=1)


class _StaticEmitter(_Emitter):
    def conv_weight(self, g: Graph, module: nn.Module, out: int | None, inp: int | None) -> str:
        return g.const(module.weight, "w")

    def norm(self, g: Graph, x: str, module: nn.Module, width: int | None = None) -> str:
        params = [module.weight, module.bias, module.running_mean, module.running_var]
        return g.op("BatchNormalization", [x] + [g.const(p, "bn") for p in params], epsilon=module.eps)


class _DynamicEmitter(_Emitter):
    """Weights are sliced to a block's width *inside* that width's branch, with constant
    bounds, so onnxruntime folds each slice at session load and runs prepacked kernels.

    SubnetNorm is one ``Gather`` of row SUBNET per statistic from a table that already has
    the width of the branch it is used in (tables are sliced when the graph is written, not
    at run time), so a norm costs two Gathers and the BatchNormalization itself.
    """

    def __init__(self) -> None:
        self.shared = SharedWeights()

    def slice(self, g: Graph, tensor: str, end: int, axis: int) -> str:
        return g.op("Slice", [tensor, g.const(np.array([0]), "start"), g.const(np.array([end]), "end"),
                              g.const(np.array([axis]), "axis")])

    def conv_weight(self, g: Graph, module: WeightSlice, out: int | None, inp: int | None) -> str:
        weight = self.shared(g, module.weight, "w")
        if out is not None:
            weight = self.slice(g, weight, out, 0)
        if inp is not None:
            weight = self.slice(g, weight, inp, 1)
        return weight

    def norm(self, g: Graph, x: str, module: SubnetNorm, width: int | None = None) -> str:
        params = [self.shared(g, module.weight, "gamma", width), self.shared(g, module.bias, "beta", width)]
        params += [g.op("Gather", [self.shared(g, t, "stats", width, axis=1), SUBNET], axis=0)
                   for t in (module.mean_table, module.var_table)]
        return g.op("BatchNormalization", [x] + params, epsilon=module.eps)

    def elastic_block(self, g: Graph, parent: Graph, x: str, switch: BoolModule, choice: str,
                      widths: tuple[float, ...]) -> str:
        """WeightSlice: one branch per width choice, whose convolutions slice with constant bounds."""
        return choice_tree(g, parent, choice, len(widths), lambda branch, i: self.block(
            branch, x, switch.block, channels(widths[i], switch.width.max_channels)))


class _FoldedEmitter(_Emitter):
    """One subnet of a :func:`folded_supernet_model`: weights pre-sliced when written and shared by every subnet
    that uses a block at a width, SubnetNorm as constants of this subnet's statistics, which onnxruntime folds into
    the convolutions when the session loads (a copy of the subnet's weights, scaled per output channel)."""

    def __init__(self) -> None:
        self.shared = SharedWeights()
        self.subnet = 0  # the row of the statistics tables being written

    def conv_weight(self, g: Graph, module: WeightSlice, out: int | None, inp: int | None) -> str:
        width, axis = (out, 0) if out is not None else (inp, 1)
        return self.shared(g, module.weight, "w", width, axis)

    def norm(self, g: Graph, x: str, module: SubnetNorm, width: int | None = None) -> str:
        mean, var = module.stats_of(self.subnet, width or module.num_features)
        params = [self.shared(g, module.weight, "gamma", width), self.shared(g, module.bias, "beta", width),
                  g.const(mean, "mean"), g.const(var, "var")]
        return g.op("BatchNormalization", [x] + params, epsilon=module.eps)


def choice_tree(g: Graph, parent: Graph, choice: str, n: int, leaf: Callable[[Graph, int], str],
                weights: Sequence[float] | None = None) -> str:
    """``leaf(branch, i)`` for the ``i`` that ``choice`` holds, reached through a tree of ``If`` on it: balanced (two
    levels for four choices), or with ``weights`` split where the weight is halved, so that a leaf of weight w sits
    about log2(total / w) levels deep."""

    def split(lo: int, hi: int) -> int:
        if weights is None:
            return (lo + hi) // 2
        half, total = sum(weights[lo:hi]) / 2, 0.0
        for mid in range(lo + 1, hi):
            total += weights[mid - 1]
            if total + weights[mid] / 2 >= half:
                return mid
        return hi - 1

    def subtree(p: Graph, lo: int, hi: int) -> str:
        if hi - lo == 1:
            return leaf(p, lo)
        mid = split(lo, hi)
        low, high = Graph(g), Graph(g)
        low_out, high_out = subtree(low, lo, mid), subtree(high, mid, hi)
        return p.op("If", [p.op("Less", [choice, g.const(np.array(mid), "choice")])],
                    then_branch=low.branch_graph("width_low", low_out),
                    else_branch=high.branch_graph("width_high", high_out))

    return subtree(parent, 0, n)


def layer_chain(g: Graph, parent: Graph, x: str, n: int, depth: str, layer: Callable[[Graph, str, int], str],
                b: int = 0) -> str:
    """LayerSelect over layers ``b..n-1``, emitted into ``parent`` by ``layer(graph, x, b)``: a layer beyond the
    first and every layer after it sit in the then-branch of one ``If`` (``depth > b``), so a shallow subnet
    skips the rest in one step (the first layer always runs)."""
    if b == n:
        return x
    target = parent if b == 0 else Graph(g)
    y = layer_chain(g, target, layer(target, x, b), n, depth, layer, b + 1)
    if b == 0:
        return y
    skip = Graph(g)
    skipped = skip.op("Identity", [x])
    return parent.op("If", [parent.op("Greater", [depth, g.const(np.array(b), "b")])],
                     then_branch=target.branch_graph("block_run", y),
                     else_branch=skip.branch_graph("block_skip", skipped))


def finish(g: Graph, inputs: list[onnx.ValueInfoProto], num_classes: int, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        g.nodes, name, inputs,
        [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["N", num_classes])],
        initializer=g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="accscale")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def width_choice(g: Graph, target: Graph, block: int) -> str:
    """``WIDTH[block]``, read in the graph that runs the block."""
    return target.op("Gather", [WIDTH, g.const(np.array(block), "block")], axis=0)


def _image_input(image_size: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", 1, image_size, image_size])


def static_model(net: ResNetSupernet, name: str = "subnet") -> onnx.ModelProto:
    """A plain network (e.g. from :func:`export.subnetact.extract_subnet`) as ONNX."""
    g, emit = Graph(), _StaticEmitter()
    x = emit.stem(g, INPUT, net.stem)
    for stage in net.stages:
        for block in stage:
            x = emit.block(g, x, block)
    g.nodes.append(helper.make_node("Identity", [emit.head(g, x, net.head)], [LOGITS]))
    return finish(g, [_image_input(net.spec.image_size)], net.spec.num_classes, name)


def supernet_model(act: SubNetAct, name: str = "supernet") -> onnx.ModelProto:
    """The whole supernet with SubNetAct control flow; SubnetNorm tables must be installed."""
    if act.num_calibrated == 0:
        raise ValueError("install SubnetNorm statistics (SubNetAct.set_norm_tables) before exporting")
    layout = act.layout
    g = Graph()
    emit = _DynamicEmitter()
    x = emit.stem(g, INPUT, act.model.stem)
    for s, stage in enumerate(act.model.stages):
        depth = g.op("Gather", [DEPTH, g.const(np.array(s), "stage")], axis=0)
        x = layer_chain(g, g, x, len(stage), depth, lambda target, x, b, s=s, stage=stage: emit.elastic_block(
            g, target, x, stage[b], width_choice(g, target, layout.block_index(s, b)), layout.width_choices))
    g.nodes.append(helper.make_node("Identity", [emit.head(g, x, act.model.head)], [LOGITS]))
    inputs = [
        _image_input(act.spec.image_size),
        helper.make_tensor_value_info(DEPTH, TensorProto.INT64, [layout.num_stages]),
        helper.make_tensor_value_info(WIDTH, TensorProto.INT64, [layout.num_blocks]),
        helper.make_tensor_value_info(SUBNET, TensorProto.INT64, []),
    ]
    return finish(g, inputs, act.spec.num_classes, name)


def folded_supernet_model(act: SubNetAct, rows: Sequence[tuple[int, ...]], name: str = "supernet",
                          costs: Sequence[float] | None = None) -> onnx.ModelProto:
    """The supernet as one static subnet per calibrated row (SUBNET i runs ``rows[i]``, with row i of the
    SubnetNorm tables), reached through a tree of ``If`` on SUBNET: a run crosses about log2(len(rows)) ``If``
    nodes instead of three per block, and each subnet's norms fold into its convolutions. With ``costs`` (per row,
    e.g. MACs) the tree is weighted by 1 / cost: an ``If`` costs every subnet the same (about 10 µs here), so the
    cheapest subnets, for which that weighs most, sit nearest the root. Memory grows with the number of subnets
    (each holds its folded weights); :func:`supernet_model` shares every weight instead."""
    if act.num_calibrated != len(rows):
        raise ValueError(f"{len(rows)} rows for {act.num_calibrated} calibrated SubnetNorm rows")
    layout, emit, g = act.layout, _FoldedEmitter(), Graph()

    def subnet(branch: Graph, i: int) -> str:
        emit.subnet = i
        row = layout.validate(rows[i])
        x = emit.stem(branch, INPUT, act.model.stem)
        for s, stage in enumerate(act.model.stages):
            for b in range(row[s]):
                fraction = layout.width_choices[row[layout.num_stages + layout.block_index(s, b)]]
                x = emit.block(branch, x, stage[b].block, channels(fraction, stage[b].width.max_channels))
        return emit.head(branch, x, act.model.head)

    weights = [1 / c for c in costs] if costs is not None else None
    g.nodes.append(helper.make_node("Identity", [choice_tree(g, g, SUBNET, len(rows), subnet, weights)], [LOGITS]))
    inputs = [_image_input(act.spec.image_size), helper.make_tensor_value_info(SUBNET, TensorProto.INT64, [])]
    return finish(g, inputs, act.spec.num_classes, name)


def save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
