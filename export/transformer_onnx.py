"""Write the transformer supernet, or one static subnet of it, as an ONNX graph.

The same SubNetAct control flow as the CNN's (:mod:`export.onnx_writer`): ``DEPTH`` [1] drives LayerSelect, an
``If`` chain over the layers; ``WIDTH`` [layers] drives WeightSlice, a tree of ``If`` per layer whose leaves use
the first heads and feed-forward units with constant bounds (the slices are written once per width and shared).
There is no ``SUBNET`` input: LayerNorm has no per-subnet statistics. A static subnet is the same layers at
fixed widths, without control inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from export.onnx_writer import (
    DEPTH,
    INPUT,
    LOGITS,
    WIDTH,
    Graph,
    SharedWeights,
    choice_tree,
    finish,
    layer_chain,
    width_choice,
)
from export.transformer import MASK_BIAS, ElasticEncoder, EncoderLayer

SQRT_HALF = 1 / math.sqrt(2)


class _Writer:
    def __init__(self, model: ElasticEncoder) -> None:
        self.model, self.spec = model, model.spec
        self.shared = SharedWeights()

    def linear(self, g: Graph, x: str, linear, rows: int | None = None, cols: int | None = None) -> str:
        """``x @ W.T + b`` with W's first ``rows`` outputs (and bias) or first ``cols`` inputs."""
        width, axis = (rows, 0) if cols is None else (cols, 1)
        w = self.shared(g, linear.weight, "w", width, axis, transpose=True)
        b = self.shared(g, linear.bias, "b", rows)
        return g.op("Add", [g.op("MatMul", [x, w]), b])

    def norm(self, g: Graph, x: str, norm) -> str:
        return g.op("LayerNormalization", [x, self.shared(g, norm.weight, "ln_w"), self.shared(g, norm.bias, "ln_b")],
                    axis=-1, epsilon=norm.eps)

    def layer(self, g: Graph, x: str, mask_bias: str, layer: EncoderLayer, heads: int, units: int) -> str:
        dh = layer.head_dim
        inner = heads * dh
        h = self.norm(g, x, layer.norm1)
        split = g.const(np.array([0, 0, heads, dh]), "shape")
        q, k, v = (g.op("Reshape", [self.linear(g, h, lin, rows=inner), split])
                   for lin in (layer.query, layer.key, layer.value))
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])  # [N, heads, T, dh]
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])  # [N, heads, dh, T]
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), g.const(np.array(1 / math.sqrt(dh), np.float32),
                                                                            "scale")]), mask_bias])
        context = g.op("Transpose", [g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, g.const(np.array([0, 0, inner]), "shape")])
        x = g.op("Add", [x, self.linear(g, context, layer.out, cols=inner)])
        u = self.linear(g, self.norm(g, x, layer.norm2), layer.ffn1, rows=units)
        erf = g.op("Erf", [g.op("Mul", [u, g.const(np.array(SQRT_HALF, np.float32), "c")])])
        gelu = g.op("Mul", [g.op("Mul", [u, g.const(np.array(0.5, np.float32), "c")]),
                            g.op("Add", [erf, g.const(np.array(1.0, np.float32), "c")])])
        return g.op("Add", [x, self.linear(g, gelu, layer.ffn2, cols=units)])

    def embed(self, g: Graph) -> tuple[str, str, str]:
        """Embedded tokens [N, T, d], the attention mask bias [N, 1, 1, T] and the token mask [N, T, 1]."""
        keep = g.op("Cast", [g.op("Not", [g.op("Equal", [INPUT, g.const(np.array(0), "pad")])])], to=TensorProto.FLOAT)
        bias = g.op("Mul", [g.op("Sub", [g.const(np.array(1.0, np.float32), "one"), keep]),
                            g.const(np.array(MASK_BIAS, np.float32), "mask")])
        bias = g.op("Unsqueeze", [bias, g.const(np.array([1, 2]), "axes")])
        x = g.op("Add", [g.op("Gather", [self.shared(g, self.model.embed.weight, "embed"), INPUT], axis=0),
                         self.shared(g, self.model.position, "position")])
        return x, bias, g.op("Unsqueeze", [keep, g.const(np.array([2]), "axes")])

    def pool_and_head(self, g: Graph, x: str, keep: str) -> str:
        x = self.norm(g, x, self.model.norm)
        total = g.op("ReduceSum", [g.op("Mul", [x, keep]), g.const(np.array([1]), "axes")], keepdims=0)
        count = g.op("Max", [g.op("ReduceSum", [keep, g.const(np.array([1]), "axes")], keepdims=0),
                             g.const(np.array(1.0, np.float32), "one")])
        pooled = g.op("Div", [total, count])
        head = self.model.head
        return g.op("Gemm", [pooled, self.shared(g, head.weight, "fc_w"), self.shared(g, head.bias, "fc_b")], transB=1)

    def model_proto(self, g: Graph, logits: str, inputs: list[onnx.ValueInfoProto], name: str) -> onnx.ModelProto:
        g.nodes.append(helper.make_node("Identity", [logits], [LOGITS]))
        tokens = helper.make_tensor_value_info(INPUT, TensorProto.INT64, ["N", self.spec.seq_len])
        return finish(g, [tokens, *inputs], self.spec.num_classes, name)


def supernet_model(model: ElasticEncoder, name: str = "text_supernet") -> onnx.ModelProto:
    writer, spec, layout = _Writer(model), model.spec, model.layout
    g = Graph()
    x, bias, keep = writer.embed(g)
    depth = g.op("Gather", [DEPTH, g.const(np.array(0), "stage")], axis=0)

    def layer(target: Graph, x: str, b: int) -> str:
        def leaf(branch: Graph, i: int) -> str:
            heads, units = spec.widths((1, i))[0]
            return writer.layer(branch, x, bias, model.layers[b], heads, units)

        return choice_tree(g, target, width_choice(g, target, b), len(layout.width_choices), leaf)

    x = layer_chain(g, g, x, spec.layers, depth, layer)
    inputs = [helper.make_tensor_value_info(DEPTH, TensorProto.INT64, [layout.num_stages]),
              helper.make_tensor_value_info(WIDTH, TensorProto.INT64, [layout.num_blocks])]
    return writer.model_proto(g, writer.pool_and_head(g, x, keep), inputs, name)


def static_model(model: ElasticEncoder, row: Sequence[int], name: str = "subnet") -> onnx.ModelProto:
    """Subnet ``row`` alone: its layers at their widths, weights sliced when written."""
    writer = _Writer(model)
    g = Graph()
    x, bias, keep = writer.embed(g)
    for layer, (heads, units) in zip(model.layers, model.spec.widths(model.layout.validate(row))):
        x = writer.layer(g, x, bias, layer, heads, units)
    return writer.model_proto(g, writer.pool_and_head(g, x, keep), [], name)
