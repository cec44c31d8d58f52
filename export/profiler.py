"""SuperServe's SuperNet profiler: search, calibrate, measure, keep the Pareto set.

NOTE on the procedure (SuperServe section 5, "SuperNet profiler"):
1. *search* (:func:`search`): ``preset.search_candidates`` distinct subnets, each with
   SubnetNorm statistics calibrated on (distorted) training images and its top-1 accuracy
   measured on the held-out split;
2. *shortlist*: the first ``SHORTLIST_FRONTS`` Pareto fronts of (MACs, accuracy), so that
   latency is only measured where it can matter;
3. *measure*: latency per batch size 1..16 of every shortlisted subnet, through a real
   Triton server running the exported supernet (default) or through onnxruntime alone;
4. *keep* the latency-accuracy Pareto set and write the profile.

# Ambiguity (digest 3.4): the latency a Pareto set is taken on. Chosen: the mean p50 over
# the profiled batch sizes, a single cost that averages measurement noise and weighs
# every batch size SlackFit may choose.
# Ambiguity (digest A9): the batch sizes. Chosen: a profile covers every size 1..16, so a
# policy may form any batch up to SuperServe's largest; latency is timed at
# ``MEASURED_BATCH_SIZES`` and linear in between, where latency here is close to affine in
# the batch size. The calls cycle through every shortlisted subnet and measured size, so
# that a slow spell of a shared machine spreads over all of them instead of bending one
# curve or making one subnet look slower than its neighbours on the front.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from export import data, onnx_writer, repository, torch_weights
from export.cache import exclusive, fresh, stamp
from export.presets import MEASURED_BATCH_SIZES, NORMS
from export.subnetact import NormStats, SubNetAct, extract_subnet
from export.train import Preset, random_subnet
from python_backend.control import ControlError, ControlLayout
from python_backend.runners import SubnetTable, SupernetRunner
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant, pareto_front
from scheduler_sidecar.processes.triton_launcher import TritonServer

log = logging.getLogger(__name__)

CALIBRATION_IMAGES = 256  # distorted training images per SubnetNorm calibration pass
SHORTLIST_FRONTS = 3
SEED_FRACTION = 0.15  # of the search budget: uniform and random subnets before the evolutionary part
UNIFORM_DEPTH_LEVELS = 4
SUPERNET_MODEL = "digits_supernet"  # Triton model name of the default supernet


@dataclass(frozen=True)
class Candidate:
    row: tuple[int, ...]
    subnet_id: str
    accuracy: float  # top-1 on the held-out split
    macs: int  # multiply-accumulates for one image
    weight_bytes: int  # float32 parameters and statistics of the static subnet
    stats: NormStats | None  # SubnetNorm's; None for a transformer (LayerNorm keeps none)


@dataclass(frozen=True)
class Calibration:
    """Every searched subnet with its statistics; saved so exports need not search again."""

    candidates: tuple[Candidate, ...]

    def save(self, path: Path) -> None:
        arrays: dict[str, np.ndarray] = {
            "rows": np.array([c.row for c in self.candidates]),
            "accuracy": np.array([c.accuracy for c in self.candidates]),
            "macs": np.array([c.macs for c in self.candidates]),
            "weight_bytes": np.array([c.weight_bytes for c in self.candidates]),
        }
        stats = self.candidates[0].stats
        for j in range(len(stats.means) if stats else 0):
            arrays[f"mean_{j}"] = np.stack([c.stats.means[j] for c in self.candidates])
            arrays[f"var_{j}"] = np.stack([c.stats.variances[j] for c in self.candidates])
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".tmp"), "wb") as f:
            np.savez_compressed(f, **arrays)
        path.with_suffix(".tmp").replace(path)

    @classmethod
    def load(cls, path: Path, layout: ControlLayout, n_norms: int) -> Calibration:
        """Saved candidates of a supernet with ``n_norms`` SubnetNorm layers (0: none, no statistics)."""
        with np.load(path) as npz:
            raw = {key: npz[key] for key in npz.files}  # an NpzFile decompresses an array on every access
        out = []
        for i, row in enumerate(raw["rows"]):
            row_t = layout.validate(row.tolist())
            stats = NormStats(tuple(raw[f"mean_{j}"][i] for j in range(n_norms)),
                              tuple(raw[f"var_{j}"][i] for j in range(n_norms))) if n_norms else None
            out.append(Candidate(row_t, layout.subnet_id(row_t), float(raw["accuracy"][i]),
                                 int(raw["macs"][i]), int(raw["weight_bytes"][i]), stats))
        return cls(tuple(out))

    def select(self, subnet_ids: Sequence[str]) -> list[Candidate]:
        by_id = {c.subnet_id: c for c in self.candidates}
        missing = [s for s in subnet_ids if s not in by_id]
        if missing:
            raise ControlError(f"no calibrated statistics for {missing[:5]}; searched subnets are in the calibration")
        return [by_id[s] for s in subnet_ids]


def count_macs(net: nn.Module, image_size: int) -> int:
    """Multiply-accumulates of convolutions and linear layers for one image."""
    total = 0

    def hook(module: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            total += out.shape[1] * out.shape[2] * out.shape[3] * module.in_channels * module.kernel_size[0] ** 2
        else:
            total += module.in_features * module.out_features

    handles = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        net(torch.zeros(1, 1, image_size, image_size))
    for h in handles:
        h.remove()
    return total


def search(act: SubNetAct, preset: Preset) -> Calibration:
    """Evolutionary search for the (MACs, accuracy) front: ``preset.search_candidates`` subnets in all.

    The first ``SEED_FRACTION`` of the budget seeds the front along its whole cost range: the
    uniform subnets (:func:`uniform_subnets`, the smallest and the largest among them), then
    random ones. The rest goes to children of the current first two fronts, each one or two
    depth or width steps away, so that the evaluations concentrate where the Pareto set is
    (OFA's and SuperServe's NAS stage).
    """
    rng = random.Random(preset.seed + 1)
    split = data.load(act.spec.image_size)
    calib = data.calibration_images(act.spec.image_size, CALIBRATION_IMAGES)
    heldout, labels = split["heldout"].images, split["heldout"].labels
    found: dict[tuple[int, ...], Candidate] = {}
    started = time.monotonic()

    def evaluate(row: tuple[int, ...]) -> None:
        stats = act.calibrate(row, calib)
        act.set_norm_tables([stats])
        act.set_subnet(row, 0)
        static = extract_subnet(act)
        accuracy = float((static_logits(static, heldout).argmax(1) == labels).mean())
        weight_bytes = 4 * sum(t.numel() for t in static.state_dict().values() if t.is_floating_point())
        found[row] = Candidate(row, act.layout.subnet_id(row), accuracy, count_macs(static, act.spec.image_size),
                               weight_bytes, stats)
        if len(found) % 50 == 0 or len(found) == preset.search_candidates:
            log.info("searched %d/%d subnets (%.0fs)", len(found), preset.search_candidates,
                     time.monotonic() - started)

    for row in uniform_subnets(act.layout)[: preset.search_candidates]:
        evaluate(row)
    while len(found) < preset.search_candidates * SEED_FRACTION:
        row = random_subnet(act, rng)
        if row not in found:
            evaluate(row)
    misses = 0
    while len(found) < preset.search_candidates and misses < 1000:
        parent = rng.choice(shortlist(list(found.values()), fronts=2))
        child = mutate(act, parent.row, rng)
        if child in found:
            misses += 1
            continue
        evaluate(child)
    return Calibration(tuple(found.values()))


def uniform_subnets(layout: ControlLayout, levels: int = UNIFORM_DEPTH_LEVELS) -> list[tuple[int, ...]]:
    """Every block at one width choice and every stage at one of ``levels`` relative depths
    (from the smallest subnet to the largest): a ladder across the space's cost range."""
    rows = []
    for level in range(levels):
        depths = [layout.min_depth + round(level * (d - layout.min_depth) / (levels - 1)) for d in layout.max_depths]
        rows += [layout.validate(depths + [w] * layout.num_blocks) for w in range(len(layout.width_choices))]
    return list(dict.fromkeys(rows))


def static_logits(static: nn.Module, images: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Logits of a static subnet over ``images``, run by onnxruntime on its ONNX export.

    The same numbers as the torch module (to float rounding) at about three times the speed
    of torch's CPU convolutions here, which is most of what a search costs.
    """
    import onnxruntime as ort  # lazy: onnxruntime

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_writer.static_model(static).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(["LOGITS"], {"INPUT": np.ascontiguousarray(images[i : i + chunk])})[0]
                           for i in range(0, len(images), chunk)])


def mutate(act: SubNetAct, row: tuple[int, ...], rng: random.Random) -> tuple[int, ...]:
    """``row`` with one or two fields moved one step (a stage one block deeper or shallower, a block wider or narrower)."""
    layout = act.layout
    child = list(row)
    for _ in range(rng.choice((1, 2))):
        i = rng.randrange(layout.num_fields)
        lo, hi = ((layout.min_depth, layout.max_depths[i]) if i < layout.num_stages
                  else (0, len(layout.width_choices) - 1))
        child[i] = min(hi, max(lo, child[i] + rng.choice((-1, 1))))
    return layout.validate(child)


def shortlist(candidates: Sequence[Candidate], fronts: int = SHORTLIST_FRONTS) -> list[Candidate]:
    """The first ``fronts`` Pareto fronts of (MACs, accuracy)."""
    remaining = list(candidates)
    kept: list[Candidate] = []
    for _ in range(fronts):
        front = [remaining[i] for i in pareto_front([(c.macs, c.accuracy) for c in remaining])]
        kept += front
        remaining = [c for c in remaining if c not in front]
    return kept


def export_supernet(act: SubNetAct, candidates: Sequence[Candidate], repo: Path, name: str = SUPERNET_MODEL,
                    norms: str = "shared", **config: int | str) -> Path:
    """Write the supernet with SubnetNorm tables for ``candidates`` (in that SUBNET order): ``norms`` "shared"
    (:func:`~export.onnx_writer.supernet_model`) or "folded" (:func:`~export.onnx_writer.folded_supernet_model`)."""
    if norms not in NORMS:
        raise ValueError(f"norms must be one of {NORMS}, got {norms!r}")
    act.set_norm_tables([c.stats for c in candidates])
    table = SubnetTable(act.layout, tuple(c.row for c in candidates))
    model = (onnx_writer.folded_supernet_model(act, table.rows, name, costs=[c.macs for c in candidates])
             if norms == "folded" else onnx_writer.supernet_model(act, name))
    return repository.write_supernet(repo, name, model, table, act.spec.num_classes,
                                     weights=torch_weights.cnn(act), **config)


def export_static(act: SubNetAct, candidate: Candidate, repo: Path, supernet_name: str = SUPERNET_MODEL,
                  **config: int | str) -> Path:
    """Write one subnet as its own Triton model (sliced weights, its own statistics)."""
    act.set_norm_tables([candidate.stats])
    act.set_subnet(candidate.row, 0)
    name = repository.static_model_name(supernet_name, candidate.subnet_id)
    static = extract_subnet(act)
    model = onnx_writer.static_model(static, name)
    return repository.write_static(repo, name, model, act.spec.num_classes, candidate.subnet_id,
                                   weights=torch_weights.cnn(static), **config)


def percentile(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q))


def time_rounds(calls: Sequence[Callable[[], object]], repeats: int,
                progress: Callable[[int], None] | None = None) -> list[list[float]]:
    """Wall times in milliseconds of ``repeats`` rounds through ``calls``, after one untimed round;
    ``progress`` hears the number of each finished timed round."""
    samples: list[list[float]] = [[] for _ in calls]
    for round_ in range(repeats + 1):
        for call, times in zip(calls, samples):
            start = time.perf_counter()
            call()
            if round_:
                times.append((time.perf_counter() - start) * 1e3)
        if round_ and progress:
            progress(round_)
    return samples


def measure_latency(candidates: Sequence[Candidate], version_dir: Path, samples: np.ndarray, *, mode: str,
                    repeats: int, grpc_url: str | None = None, model: str = SUPERNET_MODEL,
                    batch_sizes: Sequence[int] = MEASURED_BATCH_SIZES) -> list[LatencyCurve]:
    """Latency curves (every size 1..max(``batch_sizes``)) of the exported supernet's subnets on the first
    ``samples`` (images or token ids), timed at ``batch_sizes`` via Triton (``grpc_url``) or onnxruntime.

    Every round calls every subnet at every size once, so a slow spell of the machine lands on
    all subnets alike instead of on the few measured during it: the Pareto set compares
    subnets whose latencies differ by a few percent, less than such a spell adds.
    """
    inputs = {b: np.ascontiguousarray(samples[:b]) for b in batch_sizes}
    with contextlib.ExitStack() as stack:
        if mode == "onnxruntime":
            runner = SupernetRunner(version_dir)
            infer: Callable[[np.ndarray, np.ndarray], object] = runner.infer
        else:
            import tritonclient.grpc as grpcclient  # lazy: tritonclient

            client = stack.enter_context(grpcclient.InferenceServerClient(grpc_url))
            infer = lambda x, control: _triton_infer(client, model, x, control)  # noqa: E731
        calls = [functools.partial(infer, inputs[b], np.tile(np.asarray(c.row, dtype=np.int32), (b, 1)))
                 for c in candidates for b in batch_sizes]
        started = time.monotonic()
        samples = time_rounds(calls, repeats, progress=lambda r: log.info(
            "timed round %d/%d over %d subnets (%s, %.0fs)", r, repeats, len(candidates), mode,
            time.monotonic() - started))
    every_size = tuple(range(1, max(batch_sizes) + 1))
    per_subnet = [samples[i : i + len(batch_sizes)] for i in range(0, len(samples), len(batch_sizes))]
    return [LatencyCurve(tuple(batch_sizes), tuple(percentile(s, 50) for s in subnet),
                         tuple(percentile(s, 99) for s in subnet)).interpolated(every_size)
            for subnet in per_subnet]


def _triton_infer(client, model: str, x: np.ndarray, control: np.ndarray) -> np.ndarray:
    import tritonclient.grpc as grpcclient  # lazy: tritonclient
    from tritonclient.utils import np_to_triton_dtype  # lazy: tritonclient

    inputs = [grpcclient.InferInput("INPUT", list(x.shape), np_to_triton_dtype(x.dtype)),
              grpcclient.InferInput("CONTROL", list(control.shape), "INT32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(control)
    return client.infer(model, inputs).as_numpy("LOGITS")


def profile_supernet(act: SubNetAct, calibration: Calibration, *, mode: str, repeats: int, name: str,
                     source: str) -> tuple[Profile, list[Candidate]]:
    """Measure the shortlist and return the Pareto profile with its candidates (same order)."""
    return profile_candidates(calibration.candidates, lambda short, repo: export_supernet(act, short, repo),
                              data.load(act.spec.image_size)["heldout"].images, SUPERNET_MODEL, mode=mode,
                              repeats=repeats, name=name, source=source, metadata={
                                  "control_layout": act.layout.to_json(), "dataset": "sklearn digits, held-out 30%"})


def cached_profile(folder: Path, path: Path, key: str, calibration: Calibration, *, rebuild: bool,
                   measure: Callable[[], tuple[Profile, list[Candidate]]]) -> tuple[Profile, list[Candidate]]:
    """The profile at ``path`` with its candidates if it was built from ``key`` (and not ``rebuild``), else
    ``measure()``'s, saved there; under ``folder``'s build lock."""
    with exclusive(folder):
        if not rebuild and fresh(path, key):
            profile = Profile.load(path)
            return profile, calibration.select([v.id for v in profile.variants])
        profile, kept = measure()
        profile.save(path)
        stamp(path, key)
        return profile, kept


def profile_candidates(candidates: Sequence[Candidate], export: Callable[[Sequence[Candidate], Path], Path],
                       samples: np.ndarray, model: str, *, mode: str, repeats: int, name: str, source: str,
                       metadata: dict) -> tuple[Profile, list[Candidate]]:
    """Shortlist ``candidates``, write them as supernet ``model`` with ``export(shortlist, repository)``, time
    them on ``samples`` and return the latency-accuracy Pareto profile with its candidates (same order)."""
    short = shortlist(candidates)
    log.info("measuring latency of %d shortlisted subnets (of %d searched) via %s", len(short), len(candidates), mode)
    with tempfile.TemporaryDirectory(prefix="accscale-profile-") as tmp:
        version_dir = export(short, Path(tmp)) / "1"
        if mode == "triton":
            with TritonServer(repository=Path(tmp), models=[model]) as server:
                curves = measure_latency(short, version_dir, samples, mode=mode, repeats=repeats,
                                         grpc_url=server.grpc_url, model=model)
        else:
            curves = measure_latency(short, version_dir, samples, mode=mode, repeats=repeats)
    device = "cpu" if mode == "triton" else "cpu-onnxruntime"
    keep = sorted(pareto_front([(c.mean_p50_ms, s.accuracy) for s, c in zip(short, curves)]),
                  key=lambda i: (short[i].accuracy, short[i].subnet_id))
    variants = tuple(
        Variant(short[i].subnet_id, short[i].accuracy, Actuation("supernet", model, short[i].row),
                {device: curves[i]}, memory_bytes=short[i].weight_bytes, extras={"macs": short[i].macs})
        for i in keep
    )
    metadata = {
        "measured_with": mode, "repeats": repeats, "measured_batch_sizes": list(MEASURED_BATCH_SIZES),
        "between_measured_sizes": "linear interpolation", "searched": len(candidates),
        "shortlisted": len(short), **metadata, "pareto_cost": "mean p50 latency over batch sizes",
    }
    return Profile(name, source, variants, metadata), [short[i] for i in keep]
