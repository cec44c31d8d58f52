"""scikit-learn's handwritten digits, upscaled for the supernet, split once with a fixed seed.

The 1,797 8x8 images ship with scikit-learn, so nothing is downloaded. Splits: ``train``
(training and SubnetNorm calibration) and ``heldout`` (accuracy in profiles, and the
payloads clients send).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SPLIT_SEED = 20240101
HELDOUT_FRACTION = 0.3


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # float32 [N, 1, S, S], normalised to zero mean, unit variance
    labels: np.ndarray  # int64 [N]


@lru_cache(maxsize=4)
def load(image_size: int = 16) -> dict[str, Split]:
    """``{"train": Split, "heldout": Split}``; deterministic for a given ``image_size``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = upscale(digits.images.astype(np.float32) / 16.0, image_size)
    images = ((images - 0.5) / 0.5)[:, None, :, :].astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=HELDOUT_FRACTION, random_state=SPLIT_SEED, stratify=labels
    )
    return {"train": Split(x_tr, y_tr), "heldout": Split(x_te, y_te)}


def upscale(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of [N, H, W] images to [N, size, size]."""
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(images)[:, None]
    return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)[:, 0].numpy()
