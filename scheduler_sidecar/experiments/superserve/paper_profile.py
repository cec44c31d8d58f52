"""Paper-scale profiles for simulation: SuperServe's CNN SubNets on 8 RTX2080Ti workers.

NOTE on the construction. SuperServe (Khare et al., NSDI '25) profiles ~10^3 Pareto SubNets of an
OFAResNet SuperNet on an RTX2080Ti (section 4.2, Fig. 6, Fig. 12) but prints no table of them, so
``build_superserve_profile`` rebuilds a stand-in from the numbers the text does give. Section (§),
figure and appendix (A.x) numbers are the paper's; "digest" is the project's SuperServe digest.
The figures quoted below are those of the default build (seed 0), which is kept in
``profiles/superserve_paper.json``.

1. *Search* (§5: the profiler runs OFA's NAS [8]). Subnets of OFA-MobileNetV3 w1.2: per block
   (20) a kernel size in {3, 5, 7} and an expand ratio in {3, 4, 6}, per stage (5) a depth in
   {2, 3, 4}, and an input resolution in {160, 176, 192, 208, 224} px. This is the space of the
   only accuracy predictor we have offline. The search is a seeded evolutionary one, as OFA's own
   NAS is. It starts from the 135 uniform configs (one k, e and d for the whole net, at every r)
   and NUM_RANDOM_INIT = 2000 random ones. Then NUM_GENERATIONS = 25 generations of
   CHILDREN_PER_GENERATION = 1000 children of the current (MACs, predicted accuracy) Pareto
   front follow. Half the children are a uniform crossover with a neighbour on the front, and
   every gene mutates with probability MUTATION_PROB = 0.05. 27,135 subnets are scored in all.
2. *Accuracy*: OFA's accuracy predictor (mit-han-lab/once-for-all, ``ofa/tutorial/
   accuracy_predictor.py``; weights in ``profiles/data/``). It is a 128-400-400-400-1 ReLU MLP,
   run here in float64 numpy. Its input is a one-hot kernel size (3 slots) and a one-hot expand
   ratio (3 slots) per block, all zero for blocks beyond their stage's depth, followed by a
   one-hot resolution over 8 slots at (r - 112) // 16. The slot order is ascending, (3, 5, 7)
   and (3, 4, 6): OFA builds its maps from ``list(set(keys))``, and CPython iterates these
   small-int sets in ascending order. This was checked against OFA's own ``spec2feats`` on the
   original state_dict, and the tests pin three predictions. Predictions are rounded to 1e-9,
   so that a different BLAS summation order cannot reorder near-ties.
3. *Cost*: multiply-accumulates (MACs) per image, counted analytically from OFA's
   ``OFAMobileNetV3``. At w1.2 the widths are [24, 24, 32, 48, 96, 136, 192], 1152 and 1536, and
   the strides [1, 2, 2, 2, 1, 2]. SE (reduction 4) sits in stages 2, 4 and 5, and the middle
   channels are make_divisible(round(in * e), 8). The count covers convolutions, SE and the
   classifier, not BatchNorm or activations. The space runs from 100 M to 843 M MACs.
4. *Pareto front* in (MACs, predicted accuracy): each point costs strictly more, and is strictly
   more accurate, than the one before. Seed 0 gives 238 points, from 100 M to 615 M MACs.
5. *Accuracy mapping*: the predictor reads 75.31 % for the smallest subnet and 84.76 % at the top
   of the front, well above OFA's published ImageNet numbers, so only its order is used. The
   front's predicted span is mapped affinely onto the paper's [73.82 %, 80.16 %], its lowest and
   highest CNN SubNets (A.2, A.3). Then the subnet nearest to each named accuracy gets exactly
   that accuracy: 76.69 and 78.25 (§6.3.1), 79.44 (§6.3.2), which are the Clipper+ versions, and
   the two extremes. Each moves by less than half the gap to its neighbours, so the order holds.
6. *Variants*: ``num_variants`` of them (default 200; the paper has ~10^3, §4.2), spread evenly in
   accuracy over the front and always including the five named subnets. Before that, a subnet is
   left out when its rounded accuracy or latency at some batch size does not exceed its
   predecessor's (237 of the 238 remain). So every kept variant is strictly slower, at every
   batch size, and strictly more accurate than the one before it.
7. *Latency* on DEVICE_KIND = "rtx2080ti-sim" (§6.1's GPU, simulated), for every batch size
   1..16 (§4.2: l_phi_max(|B| = 16)):

       p50_ms(b) = fixed_overhead_ms(macs) + per_sample_ms(macs) * b ** BATCH_EXPONENT
       p99_ms(b) = P99_OVER_P50 * p50_ms(b)

   Both terms are affine in MACs between the cheapest and the costliest subnet of the front.
   BATCH_EXPONENT = 0.9 models the GPU's sub-linear batching: a batch of 2 costs 1.87x the
   per-sample term of a batch of 1. The cheapest subnet's fixed overhead is FIXED_OVERHEAD_MS
   = 2 ms per batch (dispatch, in-place actuation under 1 ms (Fig. 5b), kernel launches). Both
   terms grow with MACs, so latency rises with batch size (P1) and with accuracy along the front
   (P2). The least accurate subnet fits a larger batch than the most accurate one in the same
   latency (P3): batch 16 in the 12.8 ms the most accurate needs for batch 3, and batch 13 in
   the 9.5 ms it needs for batch 2. P1-P3 are §4.2's three properties.
8. *Calibration*. The capacity rule: a subnet's capacity on NUM_WORKERS = 8 workers (§6.1) at
   SLO_MS = 36 ms (Fig. 9) is the maximum of 8 * b / p50_ms(b) over the batch sizes with
   p50_ms(b) <= SLO_MS / 2, because a query may wait out one whole batch and then be served in
   the next. The per-sample terms of the extremes are fitted, with the 2 ms overhead, to
   SMALLEST_CAPACITY_QPS = 12000 q/s and LARGEST_CAPACITY_QPS = 2000 q/s (A20 below).
   Fig. 11a is consistent: 4 workers sustain 3500 q/s on low-accuracy subnets (6000 here). The
   exact latencies and capacities of the named subnets are printed by ``accscale paper-profile
   superserve`` and kept in the profile's metadata. The calibration also takes other targets.
   If the costliest subnet's batch-1 latency would then fall below the cheapest subnet's batch-2
   latency (3.33 ms by default, so a largest capacity above about 6950 q/s), its fixed overhead
   is raised until the two are equal. This "P3 anchor" keeps P3 at every batch size, as long as
   the largest capacity stays below about 95 % of the smallest (11,450 q/s by default).
9. *Memory*: ``memory_bytes`` counts the fp32 weights and BatchNorm statistics of the subnet as a
   separate model, which is what Clipper+ or INFaaS would load. With SubNetAct all variants share
   one supernet, whose size is ``metadata["supernet_weight_bytes"]`` (Fig. 5a).

# Ambiguity (digest A20), the smallest subnet: Fig. 5c has it sustain about 8000 q/s on 8 GPUs,
# but Fig. 8c serves MAF peaks of 8750 q/s at five nines, Fig. 9 keeps attainment above 0.999 at
# 1500 + 5550 q/s with CV^2 = 8, and Fig. 13a runs at 76-78 % (not at the minimum) at 7000 q/s:
# a system whose cheapest subnet saturates at 8000 q/s could do none of this, since serving 8750
# q/s peaks at five nines, or 7000 q/s two to four points above the minimum accuracy, needs
# headroom above the peak. Chosen: 12000 q/s, about 1.4x the highest rate the paper serves at
# five nines (8750 q/s); Fig. 5c's "point-based open-loop" set-up is not described and may batch
# differently. The consequence for the reproduction is stated with its results: with the
# smallest subnet at 8000 q/s (``--smallest-capacity-qps 8000``), SlackFit and the other
# slack-greedy policies fall to about 0.7 attainment on Fig. 9's hardest cell, INFaaS does not.
# Ambiguity (digest A20): Fig. 5c has the largest SubNet sustain about 2000 q/s on 8 GPUs, but
# A.3 has 80.16 % "diverge" only at 7000 q/s, and §6.3.2 has Clipper+(79.44) degrade between 6800
# and 7800 q/s; no profile matches both. Chosen: Fig. 5c's reading, with the largest subnet at
# 2000 q/s. It is the paper's only direct measurement of single-subnet capacity, it keeps a wide
# accuracy-for-throughput trade, which the paper is about (6x here, 4x in Fig. 5c), and it keeps
# P3 strong (A.2). The other reading was tried: largest at 6800 q/s, which puts Clipper+(79.44)
# at 8005 q/s. Under it the whole range buys only 1.76x throughput, and in this project's
# simulator (8 workers, 36 ms, CV^2 = 2) SlackFit then serves 80.16 % at every rate up to
# 6400 q/s, 2500 included (Fig. 13b: about 79.2 %), and trades accuracy only above that (78.5 %
# at 9000 q/s). With the chosen reading, SlackFit serves 79.2 % at 2500 and 3000 q/s, 78.5 % at
# 5000 and 77.4 % at 6400, all at attainment 1.0. Meanwhile the accurate Clipper+ versions
# fail, as in Figs. 9 and 10. A.3's and §6.3.2's statements still hold in direction: 80.16 %
# diverges at 7000 q/s, and Clipper+(79.44) degrades at 6800-7800 q/s, only from lower rates.
# The evaluation's reading is one option away (``--largest-capacity-qps 6800``). Known gaps:
# A.2's FLOPs relation holds neither in latency (10.7 ms vs 9.5 ms) nor in MACs, where the
# front spans 6.1x (A.2 implies more than 8x).
# Ambiguity (digest A13, §2.6): the paper's SuperNet is OFAResNet, but the only offline accuracy
# source is OFA's MobileNetV3 predictor. Chosen: OFA-MobileNetV3 subnets and encoding, served
# under the model name "superserve_ofa_resnet", because the profile stands in for the paper's
# ResNet SuperNet and only the order of its accuracies and costs carries over.
# Ambiguity (digest A9): which batch sizes are profiled. Chosen: every size 1..16, because
# SlackFit's buckets and MaxAcc's and MaxBatch's binary searches then get the finest choice.
# Ambiguity (digest A23): there is no RTX2080Ti here. Chosen: a synthetic latency model on the
# device kind "rtx2080ti-sim", calibrated to the paper's capacities, because measured CPU
# latencies would not have the paper's scale.
# Ambiguity (tail latency, digest A5): the paper gives none. Chosen: p99 = 1.05 x p50, because
# §5 relies on GPU inference latency being predictable.
# Ambiguity (control row): the paper names only (D, W). Chosen: the 46 integers
# [resolution_px, depth x 5, kernel x 20, expand x 20], with 0 for blocks a stage skips, because
# they identify an OFA subnet uniquely and are what OFA's set_active_subnet takes.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler_sidecar.core.profile import (
    PROFILES_DIR,
    Actuation,
    LatencyCurve,
    Profile,
    ProfileError,
    Variant,
)
from scheduler_sidecar.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_PREDICTOR_PATH = PROFILES_DIR / "data" / "ofa_mbv3_acc_predictor.npz"
DEFAULT_OUT = Path("profiles/superserve_paper.json")

SUPERNET_MODEL = "superserve_ofa_resnet"
DEVICE_KIND = "rtx2080ti-sim"
PROFILE_NAME = "superserve-paper-cnn"

# the paper's named CNN SubNet accuracies (A.2, section 6.3.1, section 6.3.2, A.3), as fractions
LEAST_ACCURACY, MOST_ACCURACY = 0.7382, 0.8016
CLIPPER_PLUS_ACCURACIES = (0.7669, 0.7825, 0.7944)
NAMED_ACCURACIES = (LEAST_ACCURACY, *CLIPPER_PLUS_ACCURACIES, MOST_ACCURACY)

# serving set-up of the evaluation (section 6.1, Fig. 9) and the profile's batch sizes (section 4.2)
NUM_WORKERS = 8
SLO_MS = 36.0
BATCH_SIZES = tuple(range(1, 17))

# latency model (see the module note, items 7 and 8)
FIXED_OVERHEAD_MS = 2.0  # per batch: dispatch, actuation (< 1 ms, Fig. 5b), kernel launches
BATCH_EXPONENT = 0.9  # per-sample term grows as b ** 0.9: sub-linear batching efficiency
P99_OVER_P50 = 1.05  # tail latency factor
SMALLEST_CAPACITY_QPS = 12000.0  # 73.82 % on 8 workers at 36 ms (Figs. 8c, 9, 13a; A20)
LARGEST_CAPACITY_QPS = 2000.0  # 80.16 % on 8 workers at 36 ms (Fig. 5c; A20)

# search (see the module note, item 1)
NUM_RANDOM_INIT = 2000
NUM_GENERATIONS = 25
CHILDREN_PER_GENERATION = 1000
MUTATION_PROB = 0.05
PREDICTION_DECIMALS = 9

# OFA-MobileNetV3 search space, w1.2 (ofa/imagenet_classification/elastic_nn/networks/ofa_mbv3.py)
KERNEL_SIZES = (3, 5, 7)
EXPAND_RATIOS = (3, 4, 6)
DEPTHS = (2, 3, 4)
RESOLUTIONS_PX = (160, 176, 192, 208, 224)
NUM_STAGES, MAX_BLOCKS_PER_STAGE = 5, 4
NUM_BLOCKS = NUM_STAGES * MAX_BLOCKS_PER_STAGE
WIDTH_MULT = 1.2
_BASE_WIDTHS = (16, 16, 24, 40, 80, 112, 160)  # first conv, first block, then the 5 stages
_STAGE_STRIDES = (2, 2, 2, 1, 2)
_STAGE_SE = (False, True, False, True, True)
_NUM_CLASSES = 1000
CONTROL_LAYOUT = "resolution_px, depth[5], kernel[20], expand[20]; 0 = block skipped by its stage's depth"


def _make_divisible(value: float, divisor: int = 8) -> int:
    """OFA's ``make_divisible``: round to a multiple of ``divisor``, never down by more than 10 %."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


_WIDTHS = tuple(_make_divisible(w * WIDTH_MULT) for w in _BASE_WIDTHS)  # (24, 24, 32, 48, 96, 136, 192)
_FINAL_EXPAND = _make_divisible(960 * WIDTH_MULT)  # 1152
_LAST_CHANNEL = _make_divisible(1280 * WIDTH_MULT)  # 1536


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size + 2 * (kernel // 2) - kernel) // stride + 1


def _cost_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """MACs and parameter counts, split into a fixed part and one entry per (block, k, e).

    Returns ``base_macs[r]``, ``block_macs[block, r, k, e]``, ``block_params[block, k, e]``,
    ``base_params`` and ``supernet_params`` (every block at its largest kernel and expand ratio).
    """
    def bn(channels: int) -> int:  # weight, bias, running mean, running variance
        return 4 * channels

    c_stem, c_first = _WIDTHS[0], _WIDTHS[1]
    base_params = (27 * c_stem + bn(c_stem) + 9 * c_first + bn(c_first) + c_first * c_first + bn(c_first)
                   + _WIDTHS[-1] * _FINAL_EXPAND + bn(_FINAL_EXPAND) + _FINAL_EXPAND * _LAST_CHANNEL
                   + _LAST_CHANNEL * _NUM_CLASSES + _NUM_CLASSES)
    base_macs = np.zeros(len(RESOLUTIONS_PX))
    block_macs = np.zeros((NUM_BLOCKS, len(RESOLUTIONS_PX), len(KERNEL_SIZES), len(EXPAND_RATIOS)))
    block_params = np.zeros((NUM_BLOCKS, len(KERNEL_SIZES), len(EXPAND_RATIOS)), dtype=np.int64)
    for ri, r in enumerate(RESOLUTIONS_PX):
        size = _conv_out(r, 3, 2)
        macs = size * size * (27 * c_stem + 9 * c_first + c_first * c_first)
        for s in range(NUM_STAGES):
            c_out = _WIDTHS[2 + s]
            for j in range(MAX_BLOCKS_PER_STAGE):
                block, c_in = s * MAX_BLOCKS_PER_STAGE + j, (_WIDTHS[1 + s] if j == 0 else c_out)
                stride, size_in = (_STAGE_STRIDES[s], size) if j == 0 else (1, _conv_out(size, 3, _STAGE_STRIDES[s]))
                for ki, k in enumerate(KERNEL_SIZES):
                    for ei, e in enumerate(EXPAND_RATIOS):
                        mid = _make_divisible(round(c_in * e))
                        se_mid = _make_divisible(mid // 4)
                        size_out = _conv_out(size_in, k, stride)
                        m = size_in * size_in * c_in * mid + size_out * size_out * (k * k * mid + mid * c_out)
                        p = c_in * mid + bn(mid) + k * k * mid + bn(mid) + mid * c_out + bn(c_out)
                        if _STAGE_SE[s]:
                            m += 2 * mid * se_mid
                            p += 2 * mid * se_mid + mid + se_mid
                        block_macs[block, ri, ki, ei] = m
                        block_params[block, ki, ei] = p
            size = _conv_out(size, 3, _STAGE_STRIDES[s])
        base_macs[ri] = macs + size * size * _WIDTHS[-1] * _FINAL_EXPAND + _FINAL_EXPAND * _LAST_CHANNEL \
            + _LAST_CHANNEL * _NUM_CLASSES
    supernet_params = base_params + int(block_params[:, -1, -1].sum())
    return base_macs, block_macs, block_params, base_params, supernet_params


_BASE_MACS, _BLOCK_MACS, _BLOCK_PARAMS, _BASE_PARAMS, SUPERNET_PARAMS = _cost_tables()


@dataclass(frozen=True)
class Subnets:
    """A population of OFA-MobileNetV3 subnets as index arrays into the search space.

    ``kernel[n, 20]``, ``expand[n, 20]`` and ``depth[n, 5]`` index KERNEL_SIZES, EXPAND_RATIOS and
    DEPTHS; ``resolution[n]`` indexes RESOLUTIONS_PX. Genes of skipped blocks carry no meaning.
    """

    kernel: np.ndarray
    expand: np.ndarray
    depth: np.ndarray
    resolution: np.ndarray

    def __len__(self) -> int:
        return len(self.resolution)

    def take(self, index: np.ndarray) -> Subnets:
        return Subnets(self.kernel[index], self.expand[index], self.depth[index], self.resolution[index])

    @staticmethod
    def concat(parts: list[Subnets]) -> Subnets:
        return Subnets(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("kernel", "expand", "depth",
                                                                                    "resolution")))

    def active(self) -> np.ndarray:
        """``[n, 20]`` bool: blocks within their stage's depth."""
        depth = np.asarray(DEPTHS)[self.depth]
        return (np.arange(MAX_BLOCKS_PER_STAGE)[None, None, :] < depth[:, :, None]).reshape(len(self), NUM_BLOCKS)

    def macs(self) -> np.ndarray:
        """Multiply-accumulates per image."""
        blocks = _BLOCK_MACS[np.arange(NUM_BLOCKS)[None, :], self.resolution[:, None], self.kernel, self.expand]
        return _BASE_MACS[self.resolution] + (blocks * self.active()).sum(axis=1)

    def params(self) -> np.ndarray:
        """Weights and BatchNorm statistics of each subnet extracted as a separate model."""
        blocks = _BLOCK_PARAMS[np.arange(NUM_BLOCKS)[None, :], self.kernel, self.expand]
        return _BASE_PARAMS + (blocks * self.active()).sum(axis=1)

    def features(self) -> np.ndarray:
        """``[n, 128]`` float64: the accuracy predictor's input (OFA's ``spec2feats``)."""
        n, active = len(self), self.active()
        feats = np.zeros((n, 2 * 3 * NUM_BLOCKS + 8))
        rows, blocks = np.nonzero(active)
        feats[rows, blocks * 3 + self.kernel[rows, blocks]] = 1.0
        feats[rows, 3 * NUM_BLOCKS + blocks * 3 + self.expand[rows, blocks]] = 1.0
        feats[np.arange(n), 6 * NUM_BLOCKS + (np.asarray(RESOLUTIONS_PX)[self.resolution] - 112) // 16] = 1.0
        return feats

    def controls(self) -> np.ndarray:
        """``[n, 46]`` int: the canonical control rows (CONTROL_LAYOUT)."""
        active = self.active()
        kernel = np.where(active, np.asarray(KERNEL_SIZES)[self.kernel], 0)
        expand = np.where(active, np.asarray(EXPAND_RATIOS)[self.expand], 0)
        return np.concatenate([np.asarray(RESOLUTIONS_PX)[self.resolution][:, None], np.asarray(DEPTHS)[self.depth],
                               kernel, expand], axis=1)

    @classmethod
    def from_configs(cls, kernel: list[list[int]], expand: list[list[int]], depth: list[list[int]],
                     resolution_px: list[int]) -> Subnets:
        """From OFA-style values (e.g. ``kernel=[[7] * 20]``), not indices."""
        def index(values: object, space: tuple[int, ...]) -> np.ndarray:
            return np.searchsorted(np.asarray(space), np.asarray(values))
        return cls(index(kernel, KERNEL_SIZES), index(expand, EXPAND_RATIOS), index(depth, DEPTHS),
                   index(resolution_px, RESOLUTIONS_PX))


class AccuracyPredictor:
    """OFA's ImageNet top-1 predictor for OFA-MobileNetV3 w1.2 subnets, in numpy float64."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.layers = layers  # (weight [out, in], bias [out]) per Linear layer; ReLU between them

    @classmethod
    def from_npz(cls, path: Path = DEFAULT_PREDICTOR_PATH) -> AccuracyPredictor:
        try:
            with np.load(path) as data:
                layers = [(data[f"w{i}"].astype(np.float64), data[f"b{i}"].astype(np.float64)) for i in range(4)]
        except FileNotFoundError:
            raise ProfileError(f"{path}: accuracy predictor weights not found (they ship in profiles/data/)") from None
        return cls(layers)

    def predict(self, subnets: Subnets) -> np.ndarray:
        """Predicted top-1 as a fraction, rounded to PREDICTION_DECIMALS."""
        x = subnets.features()
        for i, (weight, bias) in enumerate(self.layers):
            x = x @ weight.T + bias
            if i < len(self.layers) - 1:
                x = np.maximum(x, 0.0)
        return np.round(x[:, 0], PREDICTION_DECIMALS)


def pareto_indices(macs: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
    """Indices of the points no other point dominates, by ascending MACs (and accuracy)."""
    order = np.lexsort((-accuracy, macs))
    sorted_acc = accuracy[order]
    best_before = np.maximum.accumulate(np.concatenate([[-np.inf], sorted_acc[:-1]]))
    return order[sorted_acc > best_before]


@dataclass(frozen=True)
class SearchResult:
    front: Subnets  # the Pareto subnets, ascending MACs and predicted accuracy
    macs: np.ndarray
    predicted: np.ndarray  # predictor output, fraction
    num_scored: int


def search_pareto_subnets(predictor: AccuracyPredictor, *, seed: int = 0, num_random: int = NUM_RANDOM_INIT,
                          num_generations: int = NUM_GENERATIONS,
                          children_per_generation: int = CHILDREN_PER_GENERATION) -> SearchResult:
    """Seeded evolutionary search for the (MACs, predicted accuracy) Pareto front (module note, item 1)."""
    rng = np.random.default_rng(seed)
    nk, ne, nd, nr = len(KERNEL_SIZES), len(EXPAND_RATIOS), len(DEPTHS), len(RESOLUTIONS_PX)
    grid = np.array(np.meshgrid(range(nk), range(ne), range(nd), range(nr), indexing="ij")).reshape(4, -1).T
    uniform = Subnets(np.repeat(grid[:, :1], NUM_BLOCKS, 1), np.repeat(grid[:, 1:2], NUM_BLOCKS, 1),
                      np.repeat(grid[:, 2:3], NUM_STAGES, 1), grid[:, 3])
    sampled = Subnets(rng.integers(0, nk, (num_random, NUM_BLOCKS)), rng.integers(0, ne, (num_random, NUM_BLOCKS)),
                     rng.integers(0, nd, (num_random, NUM_STAGES)), rng.integers(0, nr, num_random))
    pool = Subnets.concat([uniform, sampled])
    macs, acc = pool.macs(), predictor.predict(pool)
    for _ in range(num_generations):
        front = pareto_indices(macs, acc)
        n, half = children_per_generation, children_per_generation // 2
        pos = rng.integers(0, len(front), n)
        child = pool.take(front[pos])
        kernel, expand, depth, resolution = (child.kernel.copy(), child.expand.copy(), child.depth.copy(),
                                             child.resolution.copy())
        # uniform crossover of the first half with a neighbour on the front
        mate = pool.take(front[np.clip(pos[:half] + rng.choice([-1, 1], half), 0, len(front) - 1)])
        swap = rng.random((half, NUM_BLOCKS)) < 0.5
        kernel[:half] = np.where(swap, mate.kernel, kernel[:half])
        expand[:half] = np.where(swap, mate.expand, expand[:half])
        swap_stage = rng.random((half, NUM_STAGES)) < 0.5
        depth[:half] = np.where(swap_stage, mate.depth, depth[:half])
        # per-gene mutation (resolution at half the rate: it moves every layer's cost at once)
        for genes, size in ((kernel, nk), (expand, ne), (depth, nd)):
            hit = rng.random(genes.shape) < MUTATION_PROB
            genes[hit] = rng.integers(0, size, int(hit.sum()))
        hit = rng.random(n) < MUTATION_PROB / 2
        resolution[hit] = rng.integers(0, nr, int(hit.sum()))
        children = Subnets(kernel, expand, depth, resolution)
        pool = Subnets.concat([pool, children])
        macs, acc = np.concatenate([macs, children.macs()]), np.concatenate([acc, predictor.predict(children)])
    front = pareto_indices(macs, acc)
    return SearchResult(pool.take(front), macs[front], acc[front], len(pool))


def capacity_qps(curve: LatencyCurve, *, num_workers: int = NUM_WORKERS, slo_ms: float = SLO_MS) -> float:
    """Max sustained q/s of one variant: max of num_workers * b / p50(b) over b with p50(b) <= slo_ms / 2."""
    rates = [num_workers * b * 1000.0 / p50 for b, p50 in zip(curve.batch_sizes, curve.p50_ms) if p50 <= slo_ms / 2]
    return max(rates, default=0.0)


def _fit_per_sample_ms(capacity_target_qps: float, overhead_ms: Callable[[float], float], *, batch_exponent: float,
                       num_workers: int, slo_ms: float, upper_ms: float) -> float:
    """The per-sample term in (0, upper_ms) whose capacity is closest to the target.

    ``overhead_ms(per_sample_ms)`` gives the fixed overhead that goes with it. Capacity falls as the
    per-sample term grows, in steps where the largest batch within SLO / 2 drops by one, so a
    target inside a step cannot be hit exactly; the nearer side is taken.
    """
    def capacity(per_sample_ms: float) -> float:
        curve = [overhead_ms(per_sample_ms) + per_sample_ms * b ** batch_exponent for b in BATCH_SIZES]
        return capacity_qps(LatencyCurve(BATCH_SIZES, tuple(curve), tuple(curve)), num_workers=num_workers,
                            slo_ms=slo_ms)

    low, high = 0.0, upper_ms  # capacity(low) > target >= capacity(high)
    if capacity(high * (1 - 1e-12)) > capacity_target_qps:
        raise ConfigError(f"no latency curve of this form sustains as little as {capacity_target_qps:g} q/s")
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if capacity(mid) > capacity_target_qps else (low, mid)
    if low > 0 and abs(capacity(low) - capacity_target_qps) < abs(capacity(high) - capacity_target_qps):
        return low
    return high


@dataclass(frozen=True)
class LatencyModel:
    """p50_ms(b) = fixed_overhead_ms(macs) + per_sample_ms(macs) * b ** batch_exponent (module note, item 7).

    Both terms are affine in MACs between the cheapest subnet (``*_min_ms``) and the costliest (``*_max_ms``).
    """

    macs_min: float
    macs_max: float
    fixed_overhead_min_ms: float
    fixed_overhead_max_ms: float
    per_sample_min_ms: float
    per_sample_max_ms: float
    batch_exponent: float = BATCH_EXPONENT
    p99_over_p50: float = P99_OVER_P50

    @classmethod
    def calibrate(cls, macs_min: float, macs_max: float, *, smallest_capacity_qps: float = SMALLEST_CAPACITY_QPS,
                  largest_capacity_qps: float = LARGEST_CAPACITY_QPS, num_workers: int = NUM_WORKERS,
                  slo_ms: float = SLO_MS) -> LatencyModel:
        """Fit both extremes to their capacities (module note, item 8).

        Both start from FIXED_OVERHEAD_MS. If the costliest subnet's batch-1 latency then falls below
        the cheapest's batch-2 latency, its overhead is raised until the two are equal (the P3 anchor).
        """
        if largest_capacity_qps > smallest_capacity_qps:
            raise ConfigError(f"the largest subnet cannot sustain more ({largest_capacity_qps:g} q/s) "
                             f"than the smallest ({smallest_capacity_qps:g} q/s)")
        def fit(target_qps: float, overhead_ms: Callable[[float], float], upper_ms: float) -> float:
            return _fit_per_sample_ms(target_qps, overhead_ms, batch_exponent=BATCH_EXPONENT,
                                      num_workers=num_workers, slo_ms=slo_ms, upper_ms=upper_ms)

        per_sample_min = fit(smallest_capacity_qps, lambda _: FIXED_OVERHEAD_MS, slo_ms)
        per_sample_max = fit(largest_capacity_qps, lambda _: FIXED_OVERHEAD_MS, slo_ms)
        overhead_max = FIXED_OVERHEAD_MS
        batch2_ms = FIXED_OVERHEAD_MS + per_sample_min * 2 ** BATCH_EXPONENT
        if overhead_max + per_sample_max < batch2_ms:  # the P3 anchor
            per_sample_max = fit(largest_capacity_qps, lambda ps: batch2_ms - ps, batch2_ms - FIXED_OVERHEAD_MS)
            overhead_max = batch2_ms - per_sample_max
        return cls(macs_min, macs_max, FIXED_OVERHEAD_MS, overhead_max, per_sample_min, per_sample_max)

    def _share(self, macs: float) -> float:
        span = self.macs_max - self.macs_min
        return (macs - self.macs_min) / span if span > 0 else 0.0

    def fixed_overhead_ms(self, macs: float) -> float:
        return self.fixed_overhead_min_ms + (self.fixed_overhead_max_ms - self.fixed_overhead_min_ms) * self._share(macs)

    def per_sample_ms(self, macs: float) -> float:
        return self.per_sample_min_ms + (self.per_sample_max_ms - self.per_sample_min_ms) * self._share(macs)

    def curve(self, macs: float, batch_sizes: tuple[int, ...] = BATCH_SIZES) -> LatencyCurve:
        """The latency curve, rounded as profile files store it (4 decimals of a ms)."""
        overhead, per_sample = self.fixed_overhead_ms(macs), self.per_sample_ms(macs)
        p50 = [overhead + per_sample * b ** self.batch_exponent for b in batch_sizes]
        return LatencyCurve(batch_sizes, tuple(round(x, 4) for x in p50),
                            tuple(round(self.p99_over_p50 * x, 4) for x in p50))

    def to_json(self) -> dict[str, object]:
        return {"formula": "p50_ms(b) = fixed_overhead_ms(macs) + per_sample_ms(macs) * b ** batch_exponent, "
                           "both terms affine in macs between the extremes; p99_ms = p99_over_p50 * p50_ms",
                "macs_min": int(self.macs_min), "macs_max": int(self.macs_max),
                "fixed_overhead_min_ms": round(self.fixed_overhead_min_ms, 6),
                "fixed_overhead_max_ms": round(self.fixed_overhead_max_ms, 6),
                "per_sample_min_ms": round(self.per_sample_min_ms, 6),
                "per_sample_max_ms": round(self.per_sample_max_ms, 6),
                "batch_exponent": self.batch_exponent, "p99_over_p50": self.p99_over_p50}


def _distinct(accuracy: np.ndarray, curves: list[LatencyCurve]) -> list[int]:
    """Indices (ascending) whose rounded accuracy and latency at every batch size rise strictly.

    The first and the last index are always kept: a clash with the last drops its predecessor.
    """
    def above(i: int, j: int) -> bool:
        return round(float(accuracy[i]), 6) > round(float(accuracy[j]), 6) and all(
            a > b for a, b in zip(curves[i].p50_ms, curves[j].p50_ms))

    kept = [0]
    for i in range(1, len(curves)):
        if above(i, kept[-1]):
            kept.append(i)
        elif i == len(curves) - 1 and len(kept) > 1:
            kept[-1] = i  # the predecessor of the predecessor is below it, as it is below the dropped one
    if len(kept) < 2:
        raise ProfileError("the Pareto front collapsed to a single distinct subnet")
    return kept


def _pick(accuracy: np.ndarray, num_variants: int, required: list[int]) -> list[int]:
    """``num_variants`` indices spread evenly in accuracy, ``required`` among them (ascending)."""
    if len(accuracy) <= num_variants:
        return list(range(len(accuracy)))
    picked = set(required)
    free = np.ones(len(accuracy), dtype=bool)
    free[required] = False
    remaining = num_variants - len(picked)
    for target in np.linspace(accuracy[0], accuracy[-1], remaining + 2)[1:-1]:
        candidates = np.flatnonzero(free)
        best = int(candidates[np.argmin(np.abs(accuracy[candidates] - target))])
        picked.add(best)
        free[best] = False
    return sorted(picked)


def build_superserve_profile(seed: int = 0, num_variants: int = 200, *,
                             largest_capacity_qps: float = LARGEST_CAPACITY_QPS,
                             smallest_capacity_qps: float = SMALLEST_CAPACITY_QPS,
                             predictor_path: Path = DEFAULT_PREDICTOR_PATH) -> Profile:
    """SuperServe's CNN profile at paper scale (module note); deterministic for a given seed."""
    if num_variants < len(NAMED_ACCURACIES):
        raise ConfigError(f"num_variants must be at least {len(NAMED_ACCURACIES)} (the paper's named subnets)")
    predictor = AccuracyPredictor.from_npz(predictor_path)
    found = search_pareto_subnets(predictor, seed=seed)
    log.info("scored %d subnets; the Pareto front has %d", found.num_scored, len(found.macs))
    lo, hi = float(found.predicted[0]), float(found.predicted[-1])
    accuracy = LEAST_ACCURACY + (found.predicted - lo) / (hi - lo) * (MOST_ACCURACY - LEAST_ACCURACY)
    model = LatencyModel.calibrate(float(found.macs[0]), float(found.macs[-1]),
                                   smallest_capacity_qps=smallest_capacity_qps,
                                   largest_capacity_qps=largest_capacity_qps)
    curves = [model.curve(float(m)) for m in found.macs]
    distinct = _distinct(accuracy, curves)
    accuracy = accuracy[distinct]
    named = {target: int(np.argmin(np.abs(accuracy - target))) for target in NAMED_ACCURACIES}
    if len(set(named.values())) < len(named):
        raise ProfileError("the Pareto front is too sparse to hold every named accuracy apart")
    picked = _pick(accuracy, num_variants, sorted(set(named.values())))
    for target, i in named.items():
        accuracy[i] = target
    if np.any(np.diff(np.round(accuracy[picked], 6)) <= 0):
        raise ProfileError("snapping the named accuracies reordered the variants")

    subnets = found.front.take(np.asarray(distinct)[picked])
    controls, params = subnets.controls(), subnets.params()
    variants = []
    for rank, i in enumerate(picked):
        j = distinct[i]
        acc = round(float(accuracy[i]), 6)
        variants.append(Variant(
            id=f"ofa-{rank:03d}-a{100 * acc:.2f}", accuracy=acc,
            actuation=Actuation("supernet", SUPERNET_MODEL, tuple(int(c) for c in controls[rank])),
            latency={DEVICE_KIND: curves[j]}, memory_bytes=4 * int(params[rank]),
            extras={"macs": int(found.macs[j]), "gflops": round(2 * float(found.macs[j]) / 1e9, 4),
                    "predicted_top1": round(float(found.predicted[j]), 6),
                    "resolution_px": int(controls[rank][0])}))
    named_ids = {f"{100 * t:.2f}": variants[picked.index(i)].id for t, i in named.items()}
    capacities = {v.id: round(capacity_qps(v.latency[DEVICE_KIND]), 1) for v in variants}
    metadata = {
        "paper": "SuperServe: Fine-Grained Inference Serving for Unpredictable Workloads (NSDI '25)",
        "built_by": f"accscale paper-profile superserve --seed {seed} --num-variants {num_variants}"
                    + (f" --largest-capacity-qps {largest_capacity_qps:g}"
                       if largest_capacity_qps != LARGEST_CAPACITY_QPS else "")
                    + (f" --smallest-capacity-qps {smallest_capacity_qps:g}"
                       if smallest_capacity_qps != SMALLEST_CAPACITY_QPS else ""),
        "design_note": "scheduler_sidecar/experiments/superserve/paper_profile.py",
        "search_space": "OFA-MobileNetV3 w1.2: kernel {3,5,7} x expand {3,4,6} per block (20), "
                        "depth {2,3,4} per stage (5), resolution {160..224} px",
        "control_layout": CONTROL_LAYOUT,
        "accuracy_predictor": "profiles/data/ofa_mbv3_acc_predictor.npz (see profiles/data/README.md)",
        "seed": seed, "num_scored": found.num_scored, "pareto_front_size": len(found.macs),
        "distinct_front_size": len(distinct), "num_variants": len(variants),
        "accuracy_mapping": {"predicted_min": round(lo, 6), "predicted_max": round(hi, 6),
                             "mapped_to": [LEAST_ACCURACY, MOST_ACCURACY]},
        "named_variants": named_ids,
        "latency_model": model.to_json(),
        "capacity_rule": f"max over b of {NUM_WORKERS} * b / p50_ms(b) with p50_ms(b) <= {SLO_MS:g} / 2",
        "capacity_qps": {"smallest": capacities[variants[0].id], "largest": capacities[variants[-1].id],
                         **{k: capacities[v] for k, v in named_ids.items()}},
        "calibration": {"smallest_capacity_qps": smallest_capacity_qps,
                        "largest_capacity_qps": largest_capacity_qps,
                        "num_workers": NUM_WORKERS, "slo_ms": SLO_MS,
                        "a20": "smallest calibrated to Figs. 8c, 9 and 13a (12000 q/s, not Fig. 5c's 8000), "
                               "largest to Fig. 5c (2000 q/s), not to A.3 / section 6.3.2"},
        "supernet_weight_bytes": 4 * SUPERNET_PARAMS,
    }
    source = ("synthetic: SuperServe's published numbers (NSDI '25), OFA-MobileNetV3 accuracy predictor, "
              f"a latency model calibrated to 8 RTX2080Ti workers at a 36 ms SLO (seed {seed})")
    return Profile(PROFILE_NAME, source, tuple(variants), metadata)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("paper-profile", help="build a paper-scale profile for simulation",
                              description="Build a profile from a paper's published numbers, for the simulator.")
    papers = p.add_subparsers(dest="paper", metavar="PAPER", required=True)
    s = papers.add_parser("superserve", help="SuperServe's CNN SubNets on 8 RTX2080Ti workers (simulated)",
                          description="Search OFA subnets, predict their accuracy, map it onto SuperServe's "
                                      "73.82-80.16 % and model RTX2080Ti latency calibrated to the paper's "
                                      "capacities. The design note is in scheduler_sidecar/experiments/superserve/paper_profile.py.")
    s.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"where to write the profile JSON (default: {DEFAULT_OUT})")
    s.add_argument("--seed", type=int, default=0, help="seed of the subnet search (default: 0)")
    s.add_argument("--num-variants", type=int, default=200,
                   help="Pareto subnets to keep, spread evenly in accuracy (default: 200)")
    s.add_argument("--largest-capacity-qps", type=float, default=LARGEST_CAPACITY_QPS,
                   help=f"8-worker capacity of the most accurate subnet at 36 ms, q/s (default: "
                        f"{LARGEST_CAPACITY_QPS:g}, Fig. 5c; 6800 is the evaluation's reading of A20)")
    s.add_argument("--smallest-capacity-qps", type=float, default=SMALLEST_CAPACITY_QPS,
                   help=f"8-worker capacity of the least accurate subnet at 36 ms, q/s "
                        f"(default: {SMALLEST_CAPACITY_QPS:g}, Figs. 8c, 9 and 13a; Fig. 5c reads 8000)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    profile = build_superserve_profile(args.seed, args.num_variants, largest_capacity_qps=args.largest_capacity_qps,
                                       smallest_capacity_qps=args.smallest_capacity_qps)
    profile.save(args.out)
    first, last = profile.variants[0], profile.variants[-1]
    c_first, c_last = first.latency[DEVICE_KIND], last.latency[DEVICE_KIND]
    meta = profile.metadata
    print(f"wrote {args.out}: {len(profile.variants)} Pareto subnets (front of {meta['pareto_front_size']} "
          f"from {meta['num_scored']} scored)")
    print(f"  accuracy      {100 * first.accuracy:.2f} .. {100 * last.accuracy:.2f} %")
    print(f"  p50 batch 1   {c_first.p50_at(1):.2f} .. {c_last.p50_at(1):.2f} ms")
    print(f"  p50 batch 16  {c_first.p50_at(16):.2f} .. {c_last.p50_at(16):.2f} ms")
    print(f"  capacity on {NUM_WORKERS} workers at {SLO_MS:g} ms: smallest {capacity_qps(c_first):.0f} q/s, "
          f"largest {capacity_qps(c_last):.0f} q/s")
    print("  named: " + ", ".join(f"{k} % {meta['capacity_qps'][k]:.0f} q/s" for k in meta["named_variants"]))
    return 0
