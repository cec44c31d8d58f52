"""Open-loop arrival traces: one file format, seeded generators, and the Twitter-derived shapes we ship.

A trace file is plain text, one query per line::

    # accscale trace: arrival_s[,slo_ms[,payload_index]] per line
    # name: bursty
    # duration_s: 60.0
    # generator: bursty(base_qps=1500.0, variant_qps=5550.0, cv2=8.0, duration_s=60.0, seed=1)
    0.000113,36.0,17
    0.000295
    0.000301,,4          # an empty field means "absent" (NaN SLO, payload -1)

``#`` starts a comment (whole-line or trailing); blank lines are ignored. Arrivals are seconds from the
start of the trace and never decrease. The leading comment block is metadata: ``name:`` and
``duration_s:`` lines are read back into the ``Trace``; every other leading comment line becomes
``Trace.comment``. The simulator and the Locust replay both read this format.

NOTE on the generators: every random process is a stationary renewal process with gamma gaps, drawn at
unit rate and mapped onto wall time through the inverse of the cumulative rate Λ(t) ("time
rescaling"). A constant rate gives the textbook gamma process (Poisson at CV² = 1, constant spacing
at CV² = 0); a ramp or a compressed count series gives a non-stationary one whose gaps, measured in
Λ-time, are still i.i.d. gamma with the requested CV².
"""

# Ambiguity (digest A10): how SuperServe's base (CV² = 0) and variant (gamma) streams combine. Chosen:
#   superposition of two independent streams, the constant one with a uniformly random phase, because
#   the paper gives each stream its own rate (Fig. 13a: λ = λ_b 1500 + λ_v 5500), and a fixed phase
#   would put every run's base arrivals at the same instants.
# Ambiguity (digest A10): the shape of the τ q/s² change. Chosen: a linear ramp of the rate,
#   λ(t) = λ1 + τ·(t − t0) until it reaches λ2, because "arrival acceleration" names dλ/dt.
# Ambiguity (digest A10): where a renewal process starts. Chosen: in its stationary state (the gap
#   covering t = 0 is length-biased), because then E[count in any window] = rate × window exactly.
# Ambiguity (digest A11): the "shape-preserving" 24 h → 120 s transformation. Chosen: the count series
#   becomes a piecewise-constant rate curve, stretched to the new duration and scaled to a mean (or
#   min-max scaled as in Loki's recipe), with Poisson arrivals inside each bin (see ``compress``),
#   because that keeps every ratio (or the order) between bins and is what Loki's published scripts do.
# Arrivals are rounded to whole microseconds, the simulator's time unit, so files stay short and
# round-trip exactly.

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from scheduler_sidecar.errors import AccscaleError

FORMAT_LINE = "accscale trace: arrival_s[,slo_ms[,payload_index]] per line"
MAX_FIELDS = 3
DATA_DIR = Path(__file__).resolve().parent / "data"
_WHITESPACE_LINE = re.compile(r"^[ \t\f\v\r]+$", re.MULTILINE)

# series name -> bin width in seconds of the file data/<name>.csv (provenance in each file's header)
SERIES_BIN_S: dict[str, float] = {
    "twitter-ramsis": 10.0,  # RAMSIS' 27-point Twitter rate curve (q/s)
    "twitter-proteus": 1.0,  # Proteus zipf_exponential/300 mobilenet, requests per second
}


class TraceError(AccscaleError, ValueError):
    """A trace file or array that breaks the format; the message names the file and line."""


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays do not compare to one bool
class Trace:
    """An open-loop arrival trace. Arrays are read-only and of equal length; build with ``from_arrivals``."""

    arrival_s: np.ndarray  # float64, seconds from the start, non-decreasing
    slo_ms: np.ndarray  # float64, NaN where the query carries no SLO
    payload_index: np.ndarray  # int64, -1 where the query names no payload
    duration_s: float  # length of the window the trace covers, >= the last arrival
    name: str = ""
    comment: str = ""  # provenance: generator, parameters, seed; may span lines

    def __post_init__(self) -> None:
        arrival_s = np.array(self.arrival_s, dtype=np.float64)
        slo_ms = np.array(self.slo_ms, dtype=np.float64)
        payload_index = np.array(self.payload_index, dtype=np.int64)
        if arrival_s.ndim != 1 or slo_ms.shape != arrival_s.shape or payload_index.shape != arrival_s.shape:
            shapes = f"{arrival_s.shape}, {slo_ms.shape}, {payload_index.shape}"
            raise TraceError(f"trace {self.name!r}: arrival_s, slo_ms and payload_index must be 1-D and "
                             f"of equal length, got shapes {shapes}")
        if not np.isfinite(arrival_s).all() or (arrival_s < 0).any() or (np.diff(arrival_s) < 0).any():
            raise TraceError(f"trace {self.name!r}: arrival_s must be finite, >= 0 and non-decreasing")
        if (slo_ms <= 0).any() or np.isinf(slo_ms).any() or (payload_index < -1).any():
            raise TraceError(f"trace {self.name!r}: slo_ms must be > 0 or NaN, payload_index >= 0 or -1")
        if arrival_s.size and not self.duration_s >= arrival_s[-1]:
            raise TraceError(f"trace {self.name!r}: duration_s {self.duration_s} is before the last arrival "
                             f"{arrival_s[-1]}")
        if "\n" in self.name:
            raise TraceError(f"trace name {self.name!r} spans lines")
        for attr, array in (("arrival_s", arrival_s), ("slo_ms", slo_ms), ("payload_index", payload_index)):
            array.setflags(write=False)
            object.__setattr__(self, attr, array)
        object.__setattr__(self, "duration_s", float(self.duration_s))

    @classmethod
    def from_arrivals(cls, arrival_s: np.ndarray, duration_s: float | None = None, *,
                      slo_ms: np.ndarray | None = None, payload_index: np.ndarray | None = None,
                      name: str = "", comment: str = "") -> Trace:
        """A trace from arrival times; absent columns filled; ``duration_s`` defaults to the last arrival."""
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        n = arrival_s.shape[0] if arrival_s.ndim else 0
        return cls(arrival_s,
                   np.full(n, np.nan) if slo_ms is None else slo_ms,
                   np.full(n, -1, dtype=np.int64) if payload_index is None else payload_index,
                   (float(arrival_s[-1]) if n else 0.0) if duration_s is None else duration_s,
                   name, comment)

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def mean_rate_qps(self) -> float:
        """Queries per second over the whole window (0 for an empty window)."""
        return len(self) / self.duration_s if self.duration_s > 0 else 0.0

    def rate_per_bin(self, bin_s: float = 1.0) -> np.ndarray:
        """Arrival rate (q/s) in bins of ``bin_s`` covering [0, duration_s); the last bin may be shorter."""
        if bin_s <= 0:
            raise TraceError(f"bin_s must be > 0, got {bin_s}")
        # the tolerance keeps 120 s / 0.1 s at 1200 bins despite float rounding
        n_bins = max(0, math.ceil(self.duration_s / bin_s - 1e-9))
        if n_bins == 0:
            return np.zeros(0)
        index = np.minimum((self.arrival_s // bin_s).astype(np.int64), n_bins - 1)
        counts = np.bincount(index, minlength=n_bins)
        width_s = np.minimum(bin_s, self.duration_s - bin_s * np.arange(n_bins))
        return counts / width_s

    def to_text(self) -> str:
        """The file format: a metadata header, then one ``arrival_s[,slo_ms[,payload_index]]`` per line."""
        header = [FORMAT_LINE, f"name: {self.name}", f"duration_s: {self.duration_s!r}"]
        header += self.comment.splitlines()
        lines = [f"# {h}".rstrip() for h in header]
        # repr() is the shortest string that reads back to the same float
        arrivals = map(repr, self.arrival_s.tolist())
        has_slo = ~np.isnan(self.slo_ms)
        has_payload = self.payload_index >= 0
        if not has_slo.any() and not has_payload.any():
            lines.extend(arrivals)
        else:
            slos = [repr(v) if ok else "" for v, ok in zip(self.slo_ms.tolist(), has_slo.tolist())]
            payloads = [str(v) if v >= 0 else "" for v in self.payload_index.tolist()]
            lines.extend(f"{a},{s},{p}".rstrip(",") for a, s, p in zip(arrivals, slos, payloads))
        return "\n".join(lines) + "\n"

    def save(self, path: Path | str) -> None:
        Path(path).write_text(self.to_text())

    @classmethod
    def load(cls, path: Path | str) -> Trace:
        """Read and validate a trace file; a ``TraceError`` names the file and line of the first problem."""
        path = Path(path)
        return cls.from_text(path.read_text(), source=str(path), default_name=path.stem)

    @classmethod
    def from_text(cls, text: str, source: str = "<text>", default_name: str = "") -> Trace:
        """Parse the file format (see the module docstring); ``source`` prefixes error messages."""
        lines = text.splitlines()
        name, duration_s, comment, first = _read_header(lines, source)
        body = lines[first:]
        data = "\n".join(body)
        if "#" in data or "" in body or _WHITESPACE_LINE.search(data):  # comments or blank lines to drop
            cleaned = [line.partition("#")[0] for line in body]
            linenos: Sequence[int] = [i for i, line in enumerate(cleaned, first + 1) if line.strip()]
            data = "\n".join(cleaned[i - first - 1] for i in linenos)
        else:
            linenos = range(first + 1, first + 1 + len(body))  # 1-based line number of each data row
        arrival_s, slo_ms, payload_index = _parse_columns(data, linenos, source)
        if duration_s is None:
            duration_s = float(arrival_s[-1]) if arrival_s.size else 0.0
        elif arrival_s.size and duration_s < arrival_s[-1]:
            raise TraceError(f"{source}: header duration_s {duration_s!r} is before the last arrival "
                             f"{arrival_s[-1].item()!r} (line {linenos[-1]})")
        name = default_name if name is None else name
        return cls(arrival_s, slo_ms, payload_index, duration_s, name, comment)


def _read_header(lines: list[str], source: str) -> tuple[str | None, float | None, str, int]:
    """Metadata from the leading comment block: (name, duration_s, the other comment lines, lines read)."""
    name: str | None = None
    duration_s: float | None = None
    comment: list[str] = []
    first = len(lines)
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            first = lineno - 1
            break
        text = stripped[1:].removeprefix(" ")
        key, _, value = text.partition(":")
        if text == FORMAT_LINE:
            continue
        if key == "name":
            name = value.strip()
        elif key == "duration_s":
            try:
                duration_s = float(value)
            except ValueError:
                raise TraceError(f"{source}:{lineno}: duration_s {value.strip()!r} is not a number") from None
            if not (math.isfinite(duration_s) and duration_s >= 0):
                raise TraceError(f"{source}:{lineno}: duration_s {value.strip()!r} must be finite and >= 0")
        else:
            comment.append(text)
    return name, duration_s, "\n".join(comment), first


def _parse_columns(data: str, linenos: Sequence[int],
                   source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns of ``data``: comment-free, non-blank rows joined by newlines, validated.

    Fast path (about 1.5 s per million three-field lines): fields per row are counted with numpy on the
    raw bytes, the text is split once, and each column is parsed with ``map(float, ...)``. Only when a
    column fails does a slow scan look for the line to blame.
    """
    n = len(linenos)
    if n == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    raw = np.frombuffer(data.encode(), np.uint8)
    row_of_comma = np.searchsorted(np.flatnonzero(raw == ord("\n")), np.flatnonzero(raw == ord(",")))
    num_commas = np.bincount(row_of_comma, minlength=n)
    too_many = np.flatnonzero(num_commas >= MAX_FIELDS)
    if too_many.size:
        k = int(too_many[0])
        raise TraceError(f"{source}:{linenos[k]}: {num_commas[k] + 1} fields; a line is "
                         "arrival_s[,slo_ms[,payload_index]]")
    width = int(num_commas.max()) + 1
    if num_commas.min() < width - 1:  # pad short rows so that every row splits into `width` cells
        data = "\n".join(row + "," * (width - 1 - c) for row, c in zip(data.split("\n"), num_commas.tolist()))
    cells = data.replace("\n", ",").split(",")
    columns = [cells[j::width] for j in range(width)]

    arrival_s = _parse(columns[0], float, "arrival_s", linenos, source)
    _blame(~np.isfinite(arrival_s), arrival_s, "arrival_s", "is not finite", linenos, source)
    _blame(arrival_s < 0, arrival_s, "arrival_s", "is negative", linenos, source)
    decreasing = np.flatnonzero(np.diff(arrival_s) < 0)
    if decreasing.size:
        k = int(decreasing[0]) + 1
        raise TraceError(f"{source}:{linenos[k]}: arrival_s {arrival_s[k].item()!r} is before the previous "
                         f"line's {arrival_s[k - 1].item()!r}; arrivals must not decrease")

    slo_ms = np.full(n, np.nan)
    if width > 1:
        values, present = _parse_optional(columns[1], float, "slo_ms", linenos, source)
        _blame(present & ~np.isfinite(values), values, "slo_ms", "is not finite", linenos, source)
        _blame(present & (values <= 0), values, "slo_ms", "must be > 0", linenos, source)
        slo_ms[present] = values[present]
    payload_index = np.full(n, -1, dtype=np.int64)
    if width > 2:
        values, present = _parse_optional(columns[2], int, "payload_index", linenos, source)
        _blame(present & (values < 0), values, "payload_index", "is negative", linenos, source)
        payload_index[present] = values[present]
    return arrival_s, slo_ms, payload_index


def _parse_optional(cells: list[str], kind: type, field: str, linenos: Sequence[int],
                    source: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, present) of an optional column, where an empty cell means absent."""
    try:
        return _parse(cells, kind, field, linenos, source), np.ones(len(cells), dtype=bool)
    except TraceError:  # empty cells, or a bad one that the second parse blames
        present = np.fromiter((bool(c.strip()) for c in cells), bool, count=len(cells))
        filled = [c if p else "1" for c, p in zip(cells, present.tolist())]
        return _parse(filled, kind, field, linenos, source), present


def _parse(cells: list[str], kind: type, field: str, linenos: Sequence[int], source: str) -> np.ndarray:
    dtype = np.float64 if kind is float else np.int64
    try:
        return np.fromiter(map(kind, cells), dtype, count=len(cells))
    except ValueError:
        for k, cell in enumerate(cells):
            try:
                kind(cell)
            except ValueError:
                what = "is missing" if not cell.strip() else \
                    f"{cell.strip()!r} is not {'a number' if kind is float else 'an integer'}"
                raise TraceError(f"{source}:{linenos[k]}: {field} {what}") from None
        raise


def _blame(bad: np.ndarray, values: np.ndarray, field: str, what: str, linenos: Sequence[int],
           source: str) -> None:
    if bad.any():
        k = int(np.argmax(bad))
        raise TraceError(f"{source}:{linenos[k]}: {field} {values[k].item()!r} {what}")


# ---------------------------------------------------------------------------------------------- generators


def constant(rate_qps: float, duration_s: float) -> Trace:
    """Evenly spaced arrivals at 0, 1/rate, 2/rate, ... up to (not including) ``duration_s``."""
    _check_positive(rate_qps=rate_qps, duration_s=duration_s)
    n = math.ceil(rate_qps * duration_s - 1e-9)
    return _finish(np.arange(n) / rate_qps, duration_s, "constant",
                   _describe("constant", rate_qps=rate_qps, duration_s=duration_s))


def poisson(rate_qps: float, duration_s: float, seed: int) -> Trace:
    """A Poisson process of ``rate_qps`` over [0, duration_s)."""
    _check_positive(rate_qps=rate_qps, duration_s=duration_s)
    arrival_s = _unit_renewal(np.random.default_rng(seed), 1.0, rate_qps * duration_s) / rate_qps
    return _finish(arrival_s, duration_s, "poisson",
                   _describe("poisson", rate_qps=rate_qps, duration_s=duration_s, seed=seed))


def gamma(rate_qps: float, cv2: float, duration_s: float, seed: int) -> Trace:
    """A stationary renewal process with gamma gaps: shape k = 1/CV², scale CV²/λ (mean 1/λ).

    ``cv2 = 0`` gives constant spacing 1/λ with a random phase; ``cv2 = 1`` is Poisson.
    """
    _check_positive(rate_qps=rate_qps, duration_s=duration_s)
    arrival_s = _unit_renewal(np.random.default_rng(seed), cv2, rate_qps * duration_s) / rate_qps
    return _finish(arrival_s, duration_s, "gamma",
                   _describe("gamma", rate_qps=rate_qps, cv2=cv2, duration_s=duration_s, seed=seed))


def bursty(base_qps: float, variant_qps: float, cv2: float, duration_s: float, seed: int) -> Trace:
    """SuperServe's (InferLine's) bursty trace: a CV² = 0 base stream plus a gamma stream of CV² ``cv2``.

    The streams are independent and superposed; the base stream has a uniformly random phase. The mean
    rate is ``base_qps + variant_qps``.
    """
    _check_positive(base_qps=base_qps, variant_qps=variant_qps, duration_s=duration_s)
    rng = np.random.default_rng(seed)
    base_s = _unit_renewal(rng, 0.0, base_qps * duration_s) / base_qps
    variant_s = _unit_renewal(rng, cv2, variant_qps * duration_s) / variant_qps
    return _finish(np.sort(np.concatenate([base_s, variant_s])), duration_s, "bursty",
                   _describe("bursty", base_qps=base_qps, variant_qps=variant_qps, cv2=cv2,
                             duration_s=duration_s, seed=seed))


def time_varying(rate1_qps: float, rate2_qps: float, tau_qps2: float, cv2: float, duration_s: float,
                 ramp_start_s: float, seed: int) -> Trace:
    """SuperServe's time-varying trace: rate λ1, then a linear ramp at τ q/s² to λ2, then λ2.

    λ(t) = λ1 for t < t0 = ``ramp_start_s``; λ1 ± τ·(t − t0) for the (|λ2 − λ1|/τ)-second ramp; λ2 after.
    Arrivals are a unit-rate stationary gamma renewal process (CV² ``cv2``) mapped through Λ⁻¹, where
    Λ(t) = ∫₀ᵗ λ, so the count in any window has mean ∫λ over it.
    """
    _check_positive(rate1_qps=rate1_qps, rate2_qps=rate2_qps, tau_qps2=tau_qps2, duration_s=duration_s)
    if ramp_start_s < 0:
        raise TraceError(f"ramp_start_s must be >= 0, got {ramp_start_s}")
    ramp_s = abs(rate2_qps - rate1_qps) / tau_qps2
    accel_qps2 = math.copysign(tau_qps2, rate2_qps - rate1_qps)
    # Λ at the start and the end of the ramp
    lam_start = rate1_qps * ramp_start_s
    lam_end = lam_start + 0.5 * (rate1_qps + rate2_qps) * ramp_s

    def cumulative(t_s: float) -> float:
        if t_s <= ramp_start_s:
            return rate1_qps * t_s
        s = min(t_s - ramp_start_s, ramp_s)
        after_s = max(0.0, t_s - ramp_start_s - ramp_s)
        return lam_start + rate1_qps * s + 0.5 * accel_qps2 * s * s + rate2_qps * after_s

    epochs = _unit_renewal(np.random.default_rng(seed), cv2, cumulative(duration_s))
    arrival_s = np.empty_like(epochs)
    before, after = epochs < lam_start, epochs >= lam_end
    during = ~(before | after)
    arrival_s[before] = epochs[before] / rate1_qps
    # inverse of λ1·s + a·s²/2 = y, in the form without cancellation: s = 2y / (λ1 + sqrt(λ1² + 2a·y))
    y = epochs[during] - lam_start
    arrival_s[during] = ramp_start_s + 2 * y / (rate1_qps + np.sqrt(rate1_qps ** 2 + 2 * accel_qps2 * y))
    arrival_s[after] = ramp_start_s + ramp_s + (epochs[after] - lam_end) / rate2_qps
    return _finish(arrival_s, duration_s, "time-varying",
                   _describe("time_varying", rate1_qps=rate1_qps, rate2_qps=rate2_qps, tau_qps2=tau_qps2,
                             cv2=cv2, duration_s=duration_s, ramp_start_s=ramp_start_s, seed=seed))


def compress(counts_per_bin: np.ndarray, bin_s_in: float, duration_s: float | None,
             mean_rate_qps: float | None, seed: int, within_bin: Literal["poisson", "uniform"] = "poisson",
             scale: Literal["mean", "minmax"] = "mean", min_rate_qps: float | None = None,
             max_rate_qps: float | None = None) -> Trace:
    """Shape-preserving compression of a count series (e.g. Azure Functions per-minute counts, 24 h → 120 s).

    "Shape-preserving" means: with n bins of counts c_j, the trace follows the piecewise-constant rate
    λ(t) = λ_j on compressed bin j = [j·w, (j+1)·w), w = duration_s / n (so time is rescaled by
    duration_s / (n·bin_s_in); ``duration_s=None`` keeps the original length n·bin_s_in), where
      * ``scale="mean"``: λ_j = c_j · mean_rate_qps / mean(c). Ratios between bins, relative peaks and the
        order of bins are kept, and the mean rate is ``mean_rate_qps``;
      * ``scale="minmax"`` (Loki's recipe): λ_j is c_j mapped affinely from [min c, max c] onto
        [min_rate_qps, max_rate_qps]. The order of bins and ratios of differences are kept.
    Within bins, arrivals are Poisson (``within_bin="poisson"``) or evenly spaced with a random phase that
    carries across bins (``"uniform"``: bin j then holds λ_j·w arrivals, give or take one).
    """
    counts = np.asarray(counts_per_bin, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0 or not np.isfinite(counts).all() or (counts < 0).any():
        raise TraceError("counts_per_bin must be a non-empty 1-D series of finite counts >= 0")
    _check_positive(bin_s_in=bin_s_in)
    if duration_s is None:
        duration_s = counts.size * bin_s_in
    _check_positive(duration_s=duration_s)
    if scale == "mean":
        if mean_rate_qps is None or min_rate_qps is not None or max_rate_qps is not None:
            raise TraceError("scale='mean' takes mean_rate_qps, not min_rate_qps/max_rate_qps")
        _check_positive(mean_rate_qps=mean_rate_qps)
        if counts.sum() == 0:
            raise TraceError("counts_per_bin is all zeros: there is no shape to scale to a mean")
        rate_qps = counts * (mean_rate_qps / counts.mean())
    elif scale == "minmax":
        if mean_rate_qps is not None or min_rate_qps is None or max_rate_qps is None:
            raise TraceError("scale='minmax' takes min_rate_qps and max_rate_qps, not mean_rate_qps")
        if not 0 <= min_rate_qps < max_rate_qps:
            raise TraceError(f"need 0 <= min_rate_qps < max_rate_qps, got {min_rate_qps}, {max_rate_qps}")
        if counts.min() == counts.max():
            raise TraceError("counts_per_bin is constant: there is no range to min-max scale")
        unit = (counts - counts.min()) / (counts.max() - counts.min())
        rate_qps = min_rate_qps + unit * (max_rate_qps - min_rate_qps)
    else:
        raise TraceError(f"unknown scale {scale!r}; choose 'mean' or 'minmax'")
    if within_bin not in ("poisson", "uniform"):
        raise TraceError(f"unknown within_bin {within_bin!r}; choose 'poisson' or 'uniform'")

    width_s = duration_s / counts.size
    edges_s = width_s * np.arange(counts.size + 1)
    lam_edges = np.concatenate([[0.0], np.cumsum(rate_qps * width_s)])
    cv2 = 1.0 if within_bin == "poisson" else 0.0
    epochs = _unit_renewal(np.random.default_rng(seed), cv2, lam_edges[-1])
    # Λ is piecewise linear, so interpolation inverts it exactly; zero-rate bins are flat and get no arrivals
    arrival_s = np.interp(epochs, lam_edges, edges_s)
    return _finish(arrival_s, duration_s, "compress",
                   _describe("compress", n_bins=counts.size, bin_s_in=bin_s_in, duration_s=duration_s,
                             mean_rate_qps=mean_rate_qps, seed=seed, within_bin=within_bin, scale=scale,
                             min_rate_qps=min_rate_qps, max_rate_qps=max_rate_qps))


def steps(rates_qps: Sequence[float], step_s: float, seed: int) -> Trace:
    """Poisson arrivals at ``rates_qps[j]`` in the j-th step of ``step_s`` seconds: quiet spells and bursts of
    chosen rates (a rate of 0 leaves its step empty)."""
    rates = np.asarray(rates_qps, dtype=np.float64)
    if rates.ndim != 1 or rates.size == 0 or not np.isfinite(rates).all() or (rates < 0).any() or rates.sum() == 0:
        raise TraceError("rates_qps must be a non-empty series of finite rates >= 0, not all 0")
    _check_positive(step_s=step_s)
    trace = compress(rates, step_s, None, float(rates.mean()), seed)
    return dataclasses.replace(trace, name="steps", comment=_describe(
        "steps", rates_qps=[round(float(r), 3) for r in rates], step_s=step_s, seed=seed))


def with_slo(trace: Trace, slo_ms: float) -> Trace:
    """The same arrivals, every query carrying ``slo_ms``."""
    _check_positive(slo_ms=slo_ms)
    return dataclasses.replace(trace, slo_ms=np.full(len(trace), float(slo_ms)),
                               comment=_append(trace.comment, f"with_slo(slo_ms={slo_ms!r})"))


def with_payloads(trace: Trace, n_payloads: int, seed: int) -> Trace:
    """The same arrivals, each naming a payload drawn uniformly from ``range(n_payloads)``."""
    if n_payloads < 1:
        raise TraceError(f"n_payloads must be >= 1, got {n_payloads}")
    index = np.random.default_rng(seed).integers(0, n_payloads, size=len(trace), dtype=np.int64)
    step = f"with_payloads(n_payloads={n_payloads}, seed={seed})"
    return dataclasses.replace(trace, payload_index=index, comment=_append(trace.comment, step))


def read_series(path: Path | str) -> np.ndarray:
    """A count or rate series: one number per line, ``#`` comments and blank lines ignored."""
    path = Path(path)
    values = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        text = line.partition("#")[0].strip()
        if text:
            try:
                values.append(float(text))
            except ValueError:
                raise TraceError(f"{path}:{lineno}: {text!r} is not a number") from None
    return np.asarray(values)


def load_series(name: str) -> np.ndarray:
    """One of the series shipped in ``loadtest/data`` (bin width: ``SERIES_BIN_S[name]``)."""
    if name not in SERIES_BIN_S:
        raise TraceError(f"unknown series {name!r}; choose one of {sorted(SERIES_BIN_S)}")
    return read_series(DATA_DIR / f"{name}.csv")


def _unit_renewal(rng: np.random.Generator, cv2: float, horizon: float) -> np.ndarray:
    """Epochs in [0, horizon) of a stationary unit-rate renewal process with gamma gaps of CV² ``cv2``."""
    if cv2 < 0:
        raise TraceError(f"cv2 must be >= 0, got {cv2}")
    if cv2 == 0:
        return np.arange(rng.uniform(), horizon, 1.0)
    shape = 1.0 / cv2
    # stationarity: the gap covering 0 is length-biased (Gamma(k + 1)), and 0 falls uniformly inside it
    end = rng.uniform() * rng.gamma(shape + 1.0, cv2)
    chunks = [np.array([end])]
    while end < horizon:
        remaining = horizon - end
        # enough gaps to pass the horizon with high probability; the loop covers the rare shortfall
        gaps = rng.gamma(shape, cv2, size=int(remaining + 6 * math.sqrt(cv2 * remaining) + 16))
        chunks.append(end + np.cumsum(gaps))
        end = float(chunks[-1][-1])
    epochs = np.concatenate(chunks)
    return epochs[epochs < horizon]


def _finish(arrival_s: np.ndarray, duration_s: float, name: str, comment: str) -> Trace:
    """Round to microseconds (rounding keeps the order) and wrap."""
    return Trace.from_arrivals(np.minimum(np.round(arrival_s, 6), duration_s), duration_s, name=name,
                               comment=comment)


def _check_positive(**values: float) -> None:
    for key, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise TraceError(f"{key} must be a finite number > 0, got {value}")


def _describe(generator: str, **params: object) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items() if v is not None)
    return f"generator: {generator}({shown})"


def _append(comment: str, line: str) -> str:
    return f"{comment}\n{line}" if comment else line
