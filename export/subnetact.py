"""SubNetAct: insert LayerSelect, WeightSlice and SubnetNorm into a plain supernet.

SuperServe section 3.1 and Appendix A.1 (Algorithm 1). :func:`insert_subnetact` walks the
module graph of a :class:`~export.supernet.ResNetSupernet` and rewrites it in place:

- every block of a stage becomes a :class:`BoolModule` whose switch the stage's
  :class:`LayerSelect` owns (run the first D_m blocks of stage m);
- every ``Conv2d`` becomes a :class:`WeightSlice` that uses the first ceil(W_k * C_k)
  output channels when it produces a block's middle activation, and as many input
  channels as its input carries;
- every ``BatchNorm2d`` becomes a :class:`SubnetNorm` whose mean and variance are looked
  up per subnet index from tables calibrated on training data.

The rewritten model keeps the original parameter objects, so training through it trains
the supernet, and :class:`SubNetAct` is the single entry point that actuates a subnet.

# Ambiguity (digest A14): which BatchNorm statistics are per subnet. Chosen: all of them,
# mean and variance only; the affine parameters gamma/beta are shared and sliced, as in OFA,
# because the paper shares every non-normalisation weight.
# Ambiguity (digest A14): the variance SubnetNorm stores. Chosen: the biased batch variance
# over the calibration set, the same quantity BatchNorm normalises with during training.
# Ambiguity (digest A13): what W_k slices in a residual block. Chosen: the block's middle
# channels (conv1 output, bn1, conv2 input); the block's output width stays fixed so the
# residual sum and the next block line up, as OFA-ResNet's expand ratio does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from export.supernet import ResNetSupernet, SupernetSpec
from python_backend.control import ControlLayout, channels


class WidthHandle:
    """The active middle width of one block, shared by the block's WeightSlice layers."""

    def __init__(self, max_channels: int) -> None:
        self.max_channels = max_channels
        self.channels = max_channels


class NormState:
    """Which subnet's statistics every SubnetNorm uses, and whether it is calibrating."""

    def __init__(self) -> None:
        self.index: int | None = None  # row of the statistics tables; None = not calibrated
        self.calibrating = False


class BoolModule(nn.Module):
    """A block LayerSelect can switch off: disabled, it forwards its input unchanged."""

    def __init__(self, block: nn.Module, width: WidthHandle) -> None:
        super().__init__()
        self.block = block
        self.width = width
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) if self.enabled else x


class LayerSelect:
    """Enables the first D_m registered blocks of one stage."""

    def __init__(self) -> None:
        self.switches: list[BoolModule] = []

    def register(self, switch: BoolModule) -> None:
        self.switches.append(switch)

    def select(self, depth: int) -> None:
        for i, switch in enumerate(self.switches):
            switch.enabled = i < depth


class WeightSlice(nn.Module):
    """A convolution over the first channels of its weight (no bias: BN follows)."""

    def __init__(self, conv: nn.Conv2d, width: WidthHandle | None) -> None:
        super().__init__()
        if conv.bias is not None or conv.groups != 1:
            raise ValueError("WeightSlice expects an ungrouped convolution without bias")
        self.weight = conv.weight
        self.stride, self.padding = conv.stride, conv.padding
        self.width = width  # None: output channels are not elastic

    @property
    def out_channels(self) -> int:
        return self.width.channels if self.width else self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight[: self.out_channels, : x.shape[1]]
        return F.conv2d(x, w, None, self.stride, self.padding)


class SubnetNorm(nn.Module):
    """BatchNorm with shared gamma/beta and per-subnet mean/variance tables [S, C]."""

    def __init__(self, bn: nn.BatchNorm2d, state: NormState) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = bn.weight, bn.bias, bn.eps
        self.state = state
        c = bn.num_features
        self.register_buffer("mean_table", torch.zeros(0, c))
        self.register_buffer("var_table", torch.ones(0, c))
        self.recorded: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def num_features(self) -> int:
        return self.weight.shape[0]

    def current_stats(self, num_channels: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.state.index is None or self.state.index >= len(self.mean_table):
            raise RuntimeError("SubnetNorm: the active subnet has no calibrated statistics")
        return self.stats_of(self.state.index, num_channels)

    def stats_of(self, index: int, num_channels: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``index`` of the statistics tables, its first ``num_channels``."""
        return self.mean_table[index, :num_channels], self.var_table[index, :num_channels]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        gamma, beta = self.weight[:c], self.bias[:c]
        if self.state.calibrating:
            # momentum 1 makes batch_norm leave this batch's mean and (unbiased) variance in the buffers:
            # one pass over x, where computing them separately took three
            mean, var = x.new_zeros(c), x.new_ones(c)
            out = F.batch_norm(x, mean, var, gamma, beta, True, 1.0, self.eps)
            n = x.numel() // c
            biased = var * ((n - 1) / n)
            self.recorded = (_pad(mean, self.num_features, 0.0), _pad(biased, self.num_features, 1.0))
            return out
        if self.training:
            return F.batch_norm(x, None, None, gamma, beta, True, 0.0, self.eps)
        mean, var = self.current_stats(c)
        return F.batch_norm(x, mean, var, gamma, beta, False, 0.0, self.eps)


def _pad(t: torch.Tensor, size: int, value: float) -> torch.Tensor:
    return F.pad(t.detach(), (0, size - t.shape[0]), value=value)


@dataclass(frozen=True)
class NormStats:
    """One subnet's SubnetNorm statistics, one (mean, var) pair of length C per norm layer."""

    means: tuple[np.ndarray, ...]
    variances: tuple[np.ndarray, ...]


class SubNetAct(nn.Module):
    """A supernet with SubNetAct operators: ``set_subnet(row, index)`` then ``forward``."""

    def __init__(
        self,
        model: ResNetSupernet,
        selects: list[LayerSelect],
        widths: list[WidthHandle],
        state: NormState,
    ) -> None:
        super().__init__()
        self.model = model
        self.spec: SupernetSpec = model.spec
        self.layout: ControlLayout = model.spec.layout
        self.selects, self.widths, self.state = selects, widths, state
        self.norms = [m for m in model.modules() if isinstance(m, SubnetNorm)]
        self.row = self.layout.largest()

    @property
    def num_calibrated(self) -> int:
        return len(self.norms[0].mean_table)

    def set_subnet(self, row: Sequence[int], index: int | None = None) -> tuple[int, ...]:
        """Actuate subnet ``row`` in place; ``index`` selects its SubnetNorm statistics."""
        row = self.layout.validate(row)
        for stage, select in enumerate(self.selects):
            select.select(row[stage])
        for k, handle in enumerate(self.widths):
            handle.channels = channels(self.layout.width_choices[row[self.layout.num_stages + k]],
                                       handle.max_channels)
        self.state.index = index
        self.row = row
        return row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    @torch.no_grad()
    def calibrate(self, row: Sequence[int], images: torch.Tensor) -> NormStats:
        """SubnetNorm statistics of ``row`` from one forward pass over training images."""
        self.set_subnet(row)
        self.state.calibrating = True
        try:
            self.model(images)
        finally:
            self.state.calibrating = False
        # a norm that the subnet skips keeps neutral statistics (it is never used)
        recorded = [n.recorded if n.recorded is not None else _neutral(n) for n in self.norms]
        for n in self.norms:
            n.recorded = None
        return NormStats(tuple(m.numpy().copy() for m, _ in recorded), tuple(v.numpy().copy() for _, v in recorded))

    def set_norm_tables(self, stats: Sequence[NormStats]) -> None:
        """Install the statistics tables: row i of every table belongs to ``stats[i]``."""
        for j, norm in enumerate(self.norms):
            norm.mean_table = torch.from_numpy(np.stack([s.means[j] for s in stats])).float()
            norm.var_table = torch.from_numpy(np.stack([s.variances[j] for s in stats])).float()


def _neutral(norm: SubnetNorm) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(norm.num_features), torch.ones(norm.num_features)


def _instrument(module: nn.Module, width: WidthHandle | None, state: NormState) -> None:
    """Algorithm 1, lines 14-22: WeightSlice for convolutions, SubnetNorm for BatchNorms.

    Inside a block every main-path convolution but the last produces middle channels and
    is width-elastic; the shortcut and the last convolution keep the block's output width.
    """
    main_convs = [m for name, m in module.named_modules()
                  if isinstance(m, nn.Conv2d) and not name.startswith("shortcut")]
    elastic = {id(m) for m in main_convs[:-1]} if width else set()
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.Conv2d):
            new: nn.Module = WeightSlice(child, width if id(child) in elastic else None)
        elif isinstance(child, nn.BatchNorm2d):
            new = SubnetNorm(child, state)
        else:
            continue
        parent_name, _, attr = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, attr, new)


def insert_subnetact(model: ResNetSupernet) -> SubNetAct:
    """Rewrite ``model`` in place with SubNetAct operators and return its controller."""
    state = NormState()
    selects: list[LayerSelect] = []
    widths: list[WidthHandle] = []
    _instrument(model.stem, None, state)
    for stage in model.stages:  # STAGES(M)
        select = LayerSelect()
        for i, block in enumerate(stage):  # GETMODULES(M, s): the stage's blocks
            width = WidthHandle(block.conv1.out_channels)
            _instrument(block, width, state)
            stage[i] = switch = BoolModule(block, width)  # TOBOOLMODULE
            select.register(switch)
            widths.append(width)
        selects.append(select)
    return SubNetAct(model, selects, widths, state)


def build(spec: SupernetSpec) -> SubNetAct:
    return insert_subnetact(ResNetSupernet(spec))


@torch.no_grad()
def extract_subnet(act: SubNetAct) -> ResNetSupernet:
    """The active subnet as a plain, static network (sliced weights, its own BN statistics)."""
    layout, spec = act.layout, act.spec
    depths = act.row[: layout.num_stages]
    mids = tuple(
        tuple(act.widths[layout.block_index(s, b)].channels for b in range(depths[s]))
        for s in range(layout.num_stages)
    )
    static = ResNetSupernet(
        SupernetSpec(spec.image_size, spec.num_classes, spec.stage_channels, spec.max_depths,
                     spec.width_choices, mids),
        depths=tuple(depths),
    ).eval()
    source = dict(act.model.named_modules())
    for name, target in static.named_modules():
        src = source[_instrumented_name(name)]
        if isinstance(target, nn.Conv2d):
            out_c, in_c = target.weight.shape[:2]
            target.weight.copy_(src.weight[:out_c, :in_c])
        elif isinstance(target, nn.BatchNorm2d):
            c = target.num_features
            mean, var = src.current_stats(c)
            target.weight.copy_(src.weight[:c])
            target.bias.copy_(src.bias[:c])
            target.running_mean.copy_(mean)
            target.running_var.copy_(var)
        elif isinstance(target, nn.Linear):
            target.load_state_dict(src.state_dict())
    return static


def _instrumented_name(static_name: str) -> str:
    """``stages.0.1.conv1`` in a static subnet is ``stages.0.1.block.conv1`` in SubNetAct."""
    parts = static_name.split(".")
    if len(parts) > 3 and parts[0] == "stages":
        parts.insert(3, "block")
    return ".".join(parts)
