"""Scenes for the Loki pipeline: 64x64 frames holding a varying number of distorted digits and simple shapes.

Each scene has 0-6 digits (scikit-learn's 8x8 digits, upscaled to 10-14 px, dimmed or brightened) and 0-2
shapes (a filled square or a filled disc, 8-12 px) on a noisy background; centres are at least 9 px apart,
so neighbours may touch. Digits of the training scenes and of the held-out scenes come from disjoint source
images (split once), so no digit image is in both. An object is (row, col, kind, label): kind 0 a digit
(label 0-9), kind 1 a shape (label 0 square, 1 disc).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from python_backend.pipeline import SIZE, STRIDE

MAX_DIGITS, MAX_SHAPES = 6, 2
MIN_DISTANCE = 9.0  # px between object centres
NOISE_STD = 0.12
SPLIT_SEED = 5
DIGIT, SHAPE = 0, 1


@dataclass(frozen=True)
class Scenes:
    frames: np.ndarray  # float32 [N, 1, SIZE, SIZE], background ~0, objects up to ~1
    objects: tuple[np.ndarray, ...]  # per frame: int [K, 4] (row, col, kind, label)

    def __len__(self) -> int:
        return len(self.frames)


@lru_cache(maxsize=2)
def _digit_sources(split: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # lazy: sklearn

    digits = load_digits()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(digits.images))
    cut = int(0.7 * len(order))
    idx = order[:cut] if split == "train" else order[cut:]
    return (digits.images[idx] / 16.0).astype(np.float32), digits.target[idx]


def _resize(image: np.ndarray, side: int) -> np.ndarray:
    """Bilinear resize of a square image to ``side`` x ``side``."""
    n = image.shape[0]
    grid = (np.arange(side) + 0.5) * n / side - 0.5
    i0 = np.clip(np.floor(grid).astype(int), 0, n - 1)
    i1 = np.clip(i0 + 1, 0, n - 1)
    f = np.clip(grid - i0, 0, 1)
    rows = image[i0] * (1 - f)[:, None] + image[i1] * f[:, None]
    return rows[:, i0] * (1 - f)[None, :] + rows[:, i1] * f[None, :]


def _shape(label: int, side: int) -> np.ndarray:
    yy, xx = np.mgrid[:side, :side] + 0.5
    if label == 0:
        return np.ones((side, side), np.float32)
    r = side / 2
    return (((yy - r) ** 2 + (xx - r) ** 2) <= r * r).astype(np.float32)


def generate(n: int, split: str, seed: int) -> Scenes:
    """``n`` scenes; ``split`` ("train" or "heldout") picks the digit source images."""
    rng = np.random.default_rng(seed)
    images, labels = _digit_sources(split)
    frames = rng.normal(0.0, NOISE_STD, (n, 1, SIZE, SIZE)).astype(np.float32)
    objects = []
    for i in range(n):
        kinds = [DIGIT] * int(rng.integers(0, MAX_DIGITS + 1)) + [SHAPE] * int(rng.integers(0, MAX_SHAPES + 1))
        placed: list[tuple[int, int, int, int]] = []
        for kind in kinds:
            side = int(rng.integers(10, 15)) if kind == DIGIT else int(rng.integers(8, 13))
            for _ in range(30):  # a free spot, if there is one
                r, c = (int(x) for x in rng.integers(side // 2 + 1, SIZE - side // 2 - 1, size=2))
                if all((r - q[0]) ** 2 + (c - q[1]) ** 2 >= MIN_DISTANCE ** 2 for q in placed):
                    break
            else:
                continue
            if kind == DIGIT:
                j = int(rng.integers(len(images)))
                patch, label = _resize(images[j], side), int(labels[j])
            else:
                label = int(rng.integers(2))
                patch = _shape(label, side)
            patch = patch * float(rng.uniform(0.6, 1.0))
            top, left = r - side // 2, c - side // 2
            view = frames[i, 0, top:top + side, left:left + side]
            np.maximum(view, patch + view * (patch == 0), out=view)
            placed.append((r, c, kind, label))
        objects.append(np.array(placed, dtype=np.int64).reshape(-1, 4))
    return Scenes(np.clip(frames, -1.0, 1.5), tuple(objects))


def heatmap_targets(scenes: Scenes) -> np.ndarray:
    """Per frame and STRIDE x STRIDE cell: 0 background, 1 a digit's centre, 2 a shape's: int64 [N, S/4, S/4]."""
    cells = SIZE // STRIDE
    target = np.zeros((len(scenes), cells, cells), np.int64)
    for i, objs in enumerate(scenes.objects):
        for r, c, kind, _ in objs:
            target[i, r // STRIDE, c // STRIDE] = 1 + kind
    return target
