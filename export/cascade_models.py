"""HybridServe's model family, trained here: four CNNs of growing width and depth on scikit-learn's digits (16x16),
each its own Triton model, with a temperature fitted per model.

Inputs come at three difficulties (a cascade saves little when every input is hard): clean (pixel noise only),
mildly distorted (small rotation, scale and shift) and occluded (the supernet's full distortion, a 7-pixel
occluding square included), drawn 50/30/20. The 1,797 source images are split once into training, calibration
(temperatures), search (thresholds) and test, by source image, so distorted copies of one digit never straddle
splits; each evaluation split holds ``copies`` distorted copies of each of its digits, difficulties drawn per copy.

Built once into ``folder``: ``cascade.json`` (per model: channels, temperature, NLL before and after, accuracy per
split and difficulty, latency per batch size, cost per request in worker-seconds) and ``predictions.npz``
(every model's logits on every evaluation split, the labels, difficulties and the test and search images). A changed
recipe rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from export import repository, small_nets
from export.cache import exclusive
from export.data import distort, upscale
from export.profiler import percentile, time_rounds
from python_backend.emulation import write_latency
from python_backend.runners import MODEL_FILE, make_session
from scheduler_sidecar.systems.hybridserve.calibration import fit_temperature, nll

log = logging.getLogger(__name__)

FAMILY = {"cascade_xs": (4,), "cascade_s": (8, 16), "cascade_m": (16, 32), "cascade_l": (32, 64, 128)}
SIDE, CLASSES = 16, 10
SPLITS = {"train": 0.5, "calibration": 0.15, "search": 0.15, "test": 0.2}  # of the source images
DIFFICULTIES = ("clean", "mild", "occluded")
MIX = (0.5, 0.3, 0.2)
# keyword arguments of export.data.distort per difficulty; "occluded" is its default, the supernet's task
DISTORTIONS = {
    "clean": {"rotation_deg": 0.0, "scale_range": (1.0, 1.0), "shift_fraction": 0.0, "occlusion_fraction": 0.0,
              "noise_std": 0.1},
    "mild": {"rotation_deg": 15.0, "scale_range": (0.9, 1.1), "shift_fraction": 0.08, "occlusion_fraction": 0.0,
             "noise_std": 0.2},
    "occluded": {},
}
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
COST_BATCH = 32  # cost per request: a full batch's p50 over its size (what a busy worker pays per request)
SEED = 5


@dataclass(frozen=True)
class Recipe:
    epochs: int = 120
    copies: int = 6  # distorted copies of each evaluation digit
    repeats: int = 30  # timed rounds per batch size

    def key(self) -> str:
        return hashlib.sha256(json.dumps({**asdict(self), "family": FAMILY, "mix": MIX, "version": 2},
                                         sort_keys=True).encode()).hexdigest()


def split_sources(count: int) -> dict[str, np.ndarray]:
    """Source-image indices per split: one shuffled partition, so no digit is in two splits."""
    order = np.random.default_rng(SEED).permutation(count)
    cuts = np.cumsum([round(f * count) for f in SPLITS.values()])[:-1]
    return dict(zip(SPLITS, np.split(order, cuts)))


def mixed(images: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(each image at a difficulty drawn by MIX, the difficulty's index)."""
    import torch  # lazy: torch


    kind = rng.choice(len(DIFFICULTIES), size=len(images), p=MIX)
    out = np.empty_like(images)
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    for k, name in enumerate(DIFFICULTIES):
        rows = kind == k
        if rows.any():
            out[rows] = distort(torch.from_numpy(images[rows]), generator, **DISTORTIONS[name]).numpy()
    return out, kind


def build(folder: Path, recipe: Recipe = Recipe()) -> Path:
    """Train, calibrate, export and profile the family into ``folder`` unless it is up to date; its cascade.json."""
    stamp = folder / "cascade.json"
    with exclusive(folder):
        if not (stamp.exists() and json.loads(stamp.read_text()).get("recipe_key") == recipe.key()):
            _build(folder, recipe, stamp)
    return stamp


def _build(folder: Path, recipe: Recipe, stamp: Path) -> None:
    from sklearn.datasets import load_digits  # lazy: sklearn

    log.info("building HybridServe's model family into %s", folder)
    digits = load_digits()
    images = ((upscale(digits.images.astype(np.float32) / 16.0, SIDE) - 0.5) / 0.5)[:, None].astype(np.float32)
    labels = digits.target.astype(np.int64)
    sources = split_sources(len(images))
    rng = np.random.default_rng(SEED)
    evals = {}
    for split in ("calibration", "search", "test"):
        idx = np.tile(sources[split], recipe.copies)
        x, kind = mixed(images[idx], rng)
        evals[split] = {"images": x, "labels": labels[idx], "difficulty": kind, "source": idx}
    train_x, train_y = images[sources["train"]], labels[sources["train"]]
    models, arrays = {}, {f"{s}_{k}": v for s, e in evals.items() for k, v in e.items() if k != "images"}
    for s in ("search", "test"):
        arrays[f"{s}_images"] = evals[s]["images"]
    for name, channels in FAMILY.items():
        net = small_nets.train(small_nets.cnn(channels, CLASSES, SIDE), train_x, train_y, recipe.epochs, seed=SEED,
                               augment=lambda x, r: mixed(x, r)[0])
        model_dir = repository.write_model(folder / "repository", name,
                                           small_nets.to_onnx(net, (1, SIDE, SIDE), (CLASSES,), name), [1, SIDE, SIDE],
                                           CLASSES, {"runner": "static", "intra_op_threads": "1"},
                                           max_batch_size=BATCH_SIZES[-1])
        session = make_session(model_dir / "1" / MODEL_FILE, 1)
        logits = {s: session.run(["LOGITS"], {"INPUT": e["images"]})[0] for s, e in evals.items()}
        arrays.update({f"{s}_logits_{name}": z for s, z in logits.items()})
        cal = evals["calibration"]["labels"]
        temperature = fit_temperature(logits["calibration"], cal)
        models[name] = {
            "channels": list(channels), "temperature": temperature,
            "nll": {"before": nll(logits["calibration"], cal), "after": nll(logits["calibration"], cal, temperature)},
            "accuracy": {s: _accuracy(z, evals[s]) for s, z in logits.items()},
            "latency": _profile(session, model_dir, recipe.repeats)}
        m = models[name]["latency"]
        models[name]["cost_s"] = m["p50_ms"][BATCH_SIZES.index(COST_BATCH)] / COST_BATCH / 1000
        log.info("%s: test accuracy %.1f%%, T = %.3f, %.1f us per request", name,
                 100 * models[name]["accuracy"]["test"]["all"], temperature, 1e6 * models[name]["cost_s"])
    np.savez_compressed(folder / "predictions.npz", **arrays)
    stamp.write_text(json.dumps({"recipe_key": recipe.key(), "recipe": asdict(recipe), "models": models,
                                 "cost_batch": COST_BATCH,
                                 "difficulties": list(DIFFICULTIES), "mix": list(MIX),
                                 "split_sizes": {s: int(len(e["labels"])) for s, e in evals.items()}}, indent=1))


def _accuracy(logits: np.ndarray, split: dict) -> dict[str, float]:
    right = logits.argmax(axis=1) == split["labels"]
    return {"all": float(right.mean()),
            **{d: float(right[split["difficulty"] == k].mean()) for k, d in enumerate(DIFFICULTIES)}}


def _profile(session, model_dir: Path, repeats: int) -> dict[str, list[float]]:
    """p50 and p99 per batch size (onnxruntime, one thread); the p50s also go beside the model for emulation."""
    inputs = [np.random.default_rng(b).normal(0, 0.3, (b, 1, SIDE, SIDE)).astype(np.float32) for b in BATCH_SIZES]
    samples = time_rounds([lambda x=x: session.run(["LOGITS"], {"INPUT": x}) for x in inputs], repeats)
    p50 = [percentile(s, 50) for s in samples]
    write_latency(model_dir / "1", list(BATCH_SIZES), p50)
    return {"batch_sizes": list(BATCH_SIZES), "p50_ms": p50, "p99_ms": [percentile(s, 99) for s in samples]}
