"""Supernet architectures and build presets (no heavy imports: the CLI reads them for --help)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from python_backend.control import ControlLayout
from scheduler_sidecar.errors import ConfigError

DEFAULT_BUILD_DIR = Path("build")  # trained weights, calibration and profiles, per preset
DEFAULT_REPOSITORY = Path("model_repository")  # the Triton model repository operators mount
PROFILE_REPEATS = 14  # timed rounds over every subnet and measured batch size; a profile keeps p50 and p99
# timed batch sizes; a profile covers every size up to the largest (SuperServe's 16), linear between
MEASURED_BATCH_SIZES = (1, 2, 4, 8, 12, 16)
FAMILIES = ("cnn", "transformer")  # SubNetAct supernets: export.supernet's ResNet, export.transformer's encoder
NORMS = ("shared", "folded")  # how the CNN supernet's graph holds SubnetNorm (export.profiler.export_supernet)


@dataclass(frozen=True)
class SupernetSpec:
    """Architecture of the full supernet; presets differ only in these numbers."""

    image_size: int = 16  # digits are 8x8; upscaled so that three stages have room to downsample
    num_classes: int = 10
    stage_channels: tuple[int, ...] = (32, 64, 128)  # output channels C of each stage
    max_depths: tuple[int, ...] = (4, 4, 4)  # blocks per stage in the full network
    width_choices: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)  # elastic middle-channel fractions
    mid_channels: tuple[tuple[int, ...], ...] = field(default=(), compare=False)  # per block; () = full

    @property
    def layout(self) -> ControlLayout:
        return ControlLayout(self.max_depths, self.width_choices)

    def block_mid_channels(self, stage: int, block: int) -> int:
        if self.mid_channels:
            return self.mid_channels[stage][block]
        return self.stage_channels[stage]

    def to_dict(self) -> dict:
        return {
            "image_size": self.image_size,
            "num_classes": self.num_classes,
            "stage_channels": list(self.stage_channels),
            "max_depths": list(self.max_depths),
            "width_choices": list(self.width_choices),
        }

    @classmethod
    def from_dict(cls, raw: dict) -> SupernetSpec:
        return cls(
            image_size=raw["image_size"],
            num_classes=raw["num_classes"],
            stage_channels=tuple(raw["stage_channels"]),
            max_depths=tuple(raw["max_depths"]),
            width_choices=tuple(raw["width_choices"]),
        )


@dataclass(frozen=True)
class Preset:
    """Everything that distinguishes a quick test build from the demo's build."""

    name: str
    spec: SupernetSpec
    full_epochs: int  # phase 1: the largest network alone
    elastic_epochs: int  # phase 2: sandwich rule over the whole space
    search_candidates: int  # random subnets the profiler evaluates
    batch_size: int = 64
    lr: float = 0.05
    weight_decay: float = 5e-4
    num_random_subnets: int = 2  # sandwich rule: largest + smallest + this many random subnets
    seed: int = 0

    def training_fields(self) -> dict:
        """What the trained weights depend on (the search budget is not part of it)."""
        fields = dataclasses.asdict(self)
        del fields["search_candidates"]
        return fields


PRESETS: dict[str, Preset] = {
    # tests and CI: a narrower network, a few epochs; subnets are still meaningfully different
    "fast": Preset("fast", SupernetSpec(stage_channels=(16, 32, 64), max_depths=(3, 3, 3)),
                   full_epochs=4, elastic_epochs=6, search_candidates=90),
    # the demo's default model: wide enough that its largest subnet costs several times the smallest, and six
    # blocks deep in the middle stage, where accuracy on the distorted digits keeps growing with depth
    # budget: `make demo`'s first run must stay within 15 minutes on 2 cores, so 180 searched subnets
    # (about 4 of those minutes), 7 epochs of the largest network alone and one random subnet per
    # sandwich step (as accurate as two, 12% faster)
    "full": Preset("full", SupernetSpec(stage_channels=(48, 96, 192), max_depths=(4, 6, 4)), full_epochs=7,
                   elastic_epochs=22, search_candidates=180, num_random_subnets=1),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
