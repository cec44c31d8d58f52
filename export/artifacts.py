"""Where built artifacts live, and building them once: trained supernet, then calibration.

``build/<preset>/`` holds ``supernet.pt`` (trained weights), ``calibration.npz`` (every
searched subnet with its SubnetNorm statistics and accuracy) and ``profile.json``. Each
is rebuilt only when missing; delete the folder (or ``make clean``) to start over.
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass
from pathlib import Path

from export import train
from export.presets import DEFAULT_BUILD_DIR, Preset
from export.profiler import Calibration, Candidate, profile_supernet, search
from export.subnetact import SubNetAct
from scheduler_sidecar.profile import Profile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Artifacts:
    preset: Preset
    build_dir: Path = DEFAULT_BUILD_DIR

    @property
    def folder(self) -> Path:
        return self.build_dir / self.preset.name

    @property
    def checkpoint(self) -> Path:
        return self.folder / "supernet.pt"

    @property
    def calibration_path(self) -> Path:
        return self.folder / "calibration.npz"

    @property
    def profile_path(self) -> Path:
        return self.folder / "profile.json"

    def supernet(self) -> SubNetAct:
        """The trained supernet, training it first if there is no checkpoint."""
        if not self.checkpoint.exists():
            log.info("training the %r supernet (cached in %s)", self.preset.name, self.checkpoint)
            train.save(train.train(self.preset), self.checkpoint)
        return train.load(self.checkpoint)

    def calibration(self, act: SubNetAct) -> Calibration:
        """Every searched subnet with its statistics, searching first if not cached."""
        if not self.calibration_path.exists():
            log.info("searching %d subnets (cached in %s)", self.preset.search_candidates, self.calibration_path)
            search(act, self.preset).save(self.calibration_path)
        return Calibration.load(self.calibration_path, act)

    def profiled(self, act: SubNetAct, calibration: Calibration, *, mode: str = "triton", repeats: int = 20,
                 rebuild: bool = False, out: Path | None = None) -> tuple[Profile, list[Candidate]]:
        """The Pareto profile and its candidates, measuring first if not cached (or ``rebuild``)."""
        path = out or self.profile_path
        if path.exists() and not rebuild:
            profile = Profile.load(path)
            return profile, calibration.select([v.id for v in profile.variants])
        source = f"accscale profile --preset {self.preset.name} --mode {mode} on {platform.node()} ({platform.machine()})"
        profile, kept = profile_supernet(act, calibration, mode=mode, repeats=repeats,
                                         name=f"digits-supernet-{self.preset.name}", source=source)
        profile.save(path)
        return profile, kept
