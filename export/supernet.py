"""A plain convolutional supernet in the style of OFA-ResNet, written with stock torch modules.

The network is the *largest* subnet: a stem, then stages of residual blocks, then a linear
head. Nothing in it knows about subnets; :mod:`export.subnetact` turns it into a
supernet with elastic depth per stage and elastic width per block by rewriting its module
graph (SuperServe Appendix A.1). Extracted static subnets are instances of the same
classes with fewer blocks and narrower middle layers, so one ONNX writer serves both.
"""

from __future__ import annotations

import torch
from torch import nn

from export.presets import SupernetSpec


class ResidualBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut; ``mid_channels`` is what WeightSlice narrows."""

    def __init__(self, in_channels: int, out_channels: int, mid_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, mid_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid_channels)
        self.conv2 = nn.Conv2d(mid_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class Stem(nn.Module):
    def __init__(self, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, out_channels, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Head(nn.Module):
    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


class ResNetSupernet(nn.Module):
    """Stem, ``len(stage_channels)`` stages (stride 2 from the second on), head."""

    def __init__(self, spec: SupernetSpec, depths: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.spec = spec
        depths = depths or spec.max_depths
        self.stem = Stem(spec.stage_channels[0])
        self.stages = nn.ModuleList()
        in_channels = spec.stage_channels[0]
        for s, (out_channels, depth) in enumerate(zip(spec.stage_channels, depths)):
            blocks = [
                ResidualBlock(
                    in_channels if b == 0 else out_channels,
                    out_channels,
                    spec.block_mid_channels(s, b),
                    stride=2 if (b == 0 and s > 0) else 1,
                )
                for b in range(depth)
            ]
            self.stages.append(nn.Sequential(*blocks))
            in_channels = out_channels
        self.head = Head(in_channels, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(x)
