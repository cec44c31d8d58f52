"""Distorted handwritten digits: scikit-learn's digits, upscaled, split once, distorted.

The 1,797 8x8 images ship with scikit-learn, so nothing is downloaded. Splits: ``train``
(training and SubnetNorm calibration) and ``heldout`` (accuracy in profiles, and the
payloads clients send).

NOTE on the task. Clean digits are too easy to separate subnets: every subnet of the
supernet scores about 99%, so a profile has no accuracy to trade. Both splits are
therefore seen through random distortions (rotation, scaling, shift, an occluding square,
pixel noise): training draws fresh ones every step (augmentation), SubnetNorm calibration
sees one fixed draw, and the held-out split is distorted once with a fixed seed (several
copies of each digit, each distorted differently), so accuracy is measured on the same hard
images every time. Larger subnets cope with the distortions better, which gives the
latency-accuracy trade-off serving needs.

The occluder is what makes capacity pay: a square 7 pixels a side (of 16) hides part of each
digit, which must be recognised from what is left. Without it, a network 1/35 the size of the largest trained
to within 4.4 points of it in 12 epochs (90.6% vs 95.0%), and the default supernet's Pareto
set spanned only 2.1 points. A 6-pixel square widened that gap to 11.0 points (76.1% vs
87.0%), but the Pareto set then spanned 5 to 6.5 points depending on the held-out draw and
the epochs; with 7 pixels it spans 6.1 points (80.1% to 86.3%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

SPLIT_SEED = 20240101
HELDOUT_FRACTION = 0.3
HELDOUT_DISTORTION_SEED = 7
CALIBRATION_DISTORTION_SEED = 11
HELDOUT_COPIES = 4  # distorted copies of each held-out digit: finer accuracy steps (1/2160, not 1/540)
MAX_ROTATION_DEG = 30.0
SCALE_RANGE = (0.75, 1.25)
MAX_SHIFT_FRACTION = 0.15  # of the image side
OCCLUSION_FRACTION = 0.4375  # side of the square occluder, as a fraction of the image side
NOISE_STD = 0.35  # images are normalised to [-1, 1]
# what training depends on: a change means trained artifacts are stale (see export.artifacts)
FINGERPRINT = (SPLIT_SEED, HELDOUT_FRACTION, MAX_ROTATION_DEG, SCALE_RANGE, MAX_SHIFT_FRACTION,
               OCCLUSION_FRACTION, NOISE_STD)
# what accuracy measurement also depends on
HELDOUT_FINGERPRINT = (HELDOUT_DISTORTION_SEED, HELDOUT_COPIES, CALIBRATION_DISTORTION_SEED)


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # float32 [N, 1, S, S], pixels scaled to [-1, 1] (plus noise when distorted)
    labels: np.ndarray  # int64 [N]


@lru_cache(maxsize=4)
def load(image_size: int = 16) -> dict[str, Split]:
    """``{"train": Split, "heldout": Split}``; deterministic for a given ``image_size``."""
    from sklearn.datasets import load_digits  # lazy: sklearn
    from sklearn.model_selection import train_test_split  # lazy: sklearn

    digits = load_digits()
    images = upscale(digits.images.astype(np.float32) / 16.0, image_size)
    images = ((images - 0.5) / 0.5)[:, None, :, :].astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=HELDOUT_FRACTION, random_state=SPLIT_SEED, stratify=labels
    )
    x_te = distort(torch.from_numpy(np.tile(x_te, (HELDOUT_COPIES, 1, 1, 1))),
                   torch.Generator().manual_seed(HELDOUT_DISTORTION_SEED)).numpy()
    return {"train": Split(x_tr, y_tr), "heldout": Split(x_te, np.tile(y_te, HELDOUT_COPIES))}


def calibration_images(image_size: int, count: int) -> torch.Tensor:
    """The first ``count`` training images, distorted once with a fixed seed.

    SubnetNorm statistics must describe what the supernet saw in training, where every batch
    was distorted: statistics of the clean digits left subnets 3 points less accurate on
    average (16 random subnets, 92.3% against 95.4%).
    """
    images = torch.from_numpy(load(image_size)["train"].images[:count])
    return distort(images, torch.Generator().manual_seed(CALIBRATION_DISTORTION_SEED))


def distort(images: torch.Tensor, generator: torch.Generator, *, rotation_deg: float = MAX_ROTATION_DEG,
            scale_range: tuple[float, float] = SCALE_RANGE, shift_fraction: float = MAX_SHIFT_FRACTION,
            occlusion_fraction: float = OCCLUSION_FRACTION, noise_std: float = NOISE_STD) -> torch.Tensor:
    """Random rotation, scale, shift, an occluding square (none at fraction 0) and pixel noise, one draw per image."""
    n, side = images.shape[0], images.shape[-1]
    angle = (torch.rand(n, generator=generator) * 2 - 1) * math.radians(rotation_deg)
    lo, hi = scale_range
    scale = lo + (hi - lo) * torch.rand(n, generator=generator)
    shift = (torch.rand(n, 2, generator=generator) * 2 - 1) * (2 * shift_fraction)  # grid units span 2
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    out = F.grid_sample(images + 1.0, grid, align_corners=False) - 1.0  # the background stays at -1
    if occlusion_fraction > 0:
        out = occlude(out, round(occlusion_fraction * side), generator)
    return (out + noise_std * torch.randn(images.shape, generator=generator)).float()


def occlude(images: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """Paint a ``size`` x ``size`` square of background at a random place in each image."""
    n, side = images.shape[0], images.shape[-1]
    corner = torch.randint(0, side - size + 1, (n, 2, 1), generator=generator)
    inside = (torch.arange(side) >= corner) & (torch.arange(side) < corner + size)  # [n, 2, side]
    mask = inside[:, 0, :, None] & inside[:, 1, None, :]
    return images.masked_fill(mask[:, None], -1.0)


def upscale(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of [N, H, W] images to [N, size, size]."""
    t = torch.from_numpy(images)[:, None]
    return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)[:, 0].numpy()
