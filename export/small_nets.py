"""Small torch networks trained here and written as ONNX: the Loki pipeline's stages and HybridServe's family.

Only what :func:`to_onnx` can write: Conv2d, ReLU, MaxPool2d (2x2), Flatten and Linear in a Sequential.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def cnn(channels: tuple[int, ...] | None, classes: int, side: int = 16):
    """A classifier of ``side`` x ``side`` images: per entry of ``channels`` a 3x3 convolution, ReLU and 2x2 max
    pooling, then a linear layer; ``None`` is a linear model of the pixels."""
    import torch.nn as nn  # lazy: torch

    if channels is None:
        return nn.Sequential(nn.Flatten(), nn.Linear(side * side, classes))
    layers, inputs = [], 1
    for c in channels:
        layers += [nn.Conv2d(inputs, c, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)]
        inputs, side = c, side // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(inputs * side * side, classes))


def train(net, x: np.ndarray, y: np.ndarray, epochs: int, weight: list[float] | None = None, seed: int = 0,
          augment=None):
    """Adam, minibatches of 64; ``augment(x_batch, rng)``, if given, draws fresh inputs for every batch."""
    import torch  # lazy: torch

    torch.manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    loss = torch.nn.CrossEntropyLoss(weight=torch.tensor(weight) if weight else None)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for batch in np.array_split(rng.permutation(len(x)), max(1, len(x) // 64)):
            opt.zero_grad()
            inputs = xt[batch] if augment is None else torch.from_numpy(augment(x[batch], rng))
            loss(net(inputs), yt[batch]).backward()
            opt.step()
    return net.eval()


def to_onnx(net, input_dims: tuple[int, ...], output_dims: tuple[int, ...], name: str) -> onnx.ModelProto:
    """A plain torch Sequential (Conv2d, ReLU, MaxPool2d, Flatten, Linear) as INPUT [N, *dims] -> LOGITS."""
    import torch.nn as nn  # lazy: torch

    nodes, inits, x = [], [], "INPUT"
    layers = list(net)
    for i, layer in enumerate(layers):
        out = "LOGITS" if i == len(layers) - 1 else f"x{i}"
        if isinstance(layer, nn.Conv2d):
            inits += [numpy_helper.from_array(layer.weight.detach().numpy(), f"w{i}"),
                      numpy_helper.from_array(layer.bias.detach().numpy(), f"b{i}")]
            p = layer.padding[0]
            nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [out], strides=list(layer.stride),
                                          pads=[p, p, p, p], kernel_shape=list(layer.kernel_size)))
        elif isinstance(layer, nn.ReLU):
            nodes.append(helper.make_node("Relu", [x], [out]))
        elif isinstance(layer, nn.MaxPool2d):
            nodes.append(helper.make_node("MaxPool", [x], [out], kernel_shape=[2, 2], strides=[2, 2]))
        elif isinstance(layer, nn.Flatten):
            nodes.append(helper.make_node("Flatten", [x], [out], axis=1))
        elif isinstance(layer, nn.Linear):
            inits += [numpy_helper.from_array(layer.weight.detach().numpy(), f"w{i}"),
                      numpy_helper.from_array(layer.bias.detach().numpy(), f"b{i}")]
            nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [out], transB=1))
        else:
            raise TypeError(f"cannot write {type(layer).__name__}")
        x = out
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["N", *input_dims])],
                              [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["N", *output_dims])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the onnxruntime in Triton's python backend reads
    onnx.checker.check_model(model)
    return model
