"""Where built artifacts live, and building them once: trained supernet, then calibration.

``build/<preset>/`` holds ``supernet.pt`` (trained weights), ``calibration.npz`` (every
searched subnet with its SubnetNorm statistics and accuracy) and ``profile.json``. Each has
a ``.stamp`` beside it: a hash of what it was built from (the training preset and the data
for the weights, the weights and search budget for the calibration, the calibration and the
graph writer for the profile). An artifact is rebuilt when it is missing or its stamp no
longer matches, so a changed preset or a retrained supernet never meets stale statistics.
``make clean`` starts over.
"""

from __future__ import annotations

import json
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

from export import data, onnx_writer, train
from export.cache import exclusive, file_hash, fresh, hash_parts, stamp
from export.presets import DEFAULT_BUILD_DIR, MEASURED_BATCH_SIZES, PROFILE_REPEATS, Preset
from export.profiler import (
    CALIBRATION_IMAGES,
    Calibration,
    Candidate,
    cached_profile,
    profile_supernet,
    search,
)
from export.subnetact import SubNetAct
from scheduler_sidecar.core.profile import Profile

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
        """The trained supernet, training it first if there is no up-to-date checkpoint."""
        key = hash_parts(json.dumps(self.preset.training_fields(), sort_keys=True), repr(data.FINGERPRINT))
        with exclusive(self.folder):
            if not fresh(self.checkpoint, key):
                log.info("training the %r supernet (cached in %s)", self.preset.name, self.checkpoint)
                train.save(train.train(self.preset), self.checkpoint)
                stamp(self.checkpoint, key)
        return train.load(self.checkpoint)

    def calibration(self, act: SubNetAct) -> Calibration:
        """Every searched subnet with its statistics, searching first if not up to date."""
        key = hash_parts(file_hash(self.checkpoint), str(self.preset.search_candidates), str(CALIBRATION_IMAGES),
                         repr(data.HELDOUT_FINGERPRINT))
        with exclusive(self.folder):
            if not fresh(self.calibration_path, key):
                log.info("searching %d subnets (cached in %s)", self.preset.search_candidates, self.calibration_path)
                search(act, self.preset).save(self.calibration_path)
                stamp(self.calibration_path, key)
        return Calibration.load(self.calibration_path, act.layout, len(act.norms))

    def profiled(self, act: SubNetAct, calibration: Calibration, *, mode: str = "triton",
                 repeats: int = PROFILE_REPEATS, rebuild: bool = False, out: Path | None = None) -> tuple[Profile, list[Candidate]]:
        """The Pareto profile and its candidates, measuring first if not cached (or ``rebuild``)."""
        path = out or self.profile_path
        # the graph writer is part of the key: latency is measured on the exported graph
        key = hash_parts(file_hash(self.calibration_path), file_hash(Path(onnx_writer.__file__)), mode,
                         str(repeats), repr(MEASURED_BATCH_SIZES))
        source = (f"accscale profile --preset {self.preset.name} --mode {mode} on {platform.node()} "
                  f"({platform.machine()})")
        return cached_profile(self.folder, path, key, calibration, rebuild=rebuild, measure=lambda: profile_supernet(
            act, calibration, mode=mode, repeats=repeats, name=f"digits-supernet-{self.preset.name}", source=source))
