"""The per-request log of a replay: one row per trace entry, answered or not, and what it sums to.

``requests.csv`` columns: ``index`` (trace line), ``scheduled_s`` (trace arrival),
``lag_ms`` (how late it was sent), ``latency_ms`` (scheduled arrival to answer, empty for
errors), ``slo_ms``, ``status`` (``ok`` or the error's status), ``variant``, ``accuracy``
(profiled, as the sidecar reported it), ``batch_size``, ``queue_ms`` and ``service_ms`` (the
sidecar's split of its own time: queued, then at the worker), ``correct`` (1/0 against the
sample's label, empty for errors), ``worker`` (the Triton that served it, as the sidecar
reported it; empty in logs written before the column was added).

A request meets its SLO if it is answered within the SLO of its *scheduled* arrival, so a
client that falls behind is charged for it. Mean serving accuracy averages the profiled
accuracy of the variants that served the requests that met their SLO (the papers' metric);
measured accuracy is the fraction of those answers that were right.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scheduler_sidecar.errors import ConfigError

COLUMNS = ("index", "scheduled_s", "lag_ms", "latency_ms", "slo_ms", "status", "variant", "accuracy",
           "batch_size", "queue_ms", "service_ms", "correct", "worker")


@dataclass
class Entry:
    index: int
    scheduled_s: float
    slo_ms: float
    lag_ms: float = 0.0
    latency_ms: float = math.nan
    status: str = "pending"
    variant: str = ""
    accuracy: float = math.nan
    batch_size: int = 0
    queue_ms: float = math.nan
    service_ms: float = math.nan
    correct: float = math.nan
    worker: str = ""


@dataclass
class RequestLog:
    entries: list[Entry] = field(default_factory=list)

    def save(self, path: Path | str) -> None:
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            for e in self.entries:
                writer.writerow([e.index, f"{e.scheduled_s:.6f}", f"{e.lag_ms:.3f}", _num(e.latency_ms, 3),
                                 f"{e.slo_ms:g}", e.status, e.variant, _num(e.accuracy, 6), e.batch_size,
                                 _num(e.queue_ms, 3), _num(e.service_ms, 3), _num(e.correct, 0), e.worker])

    @classmethod
    def load(cls, path: Path | str) -> RequestLog:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) not in (COLUMNS, COLUMNS[:-1]):
                raise ConfigError(f"{path}: not a request log (columns {reader.fieldnames}, expected {list(COLUMNS)})")
            return cls([Entry(int(r["index"]), float(r["scheduled_s"]), float(r["slo_ms"]), float(r["lag_ms"]),
                              _float(r["latency_ms"]), r["status"], r["variant"], _float(r["accuracy"]),
                              int(r["batch_size"]), _float(r["queue_ms"]), _float(r["service_ms"]),
                              _float(r["correct"]), r.get("worker", "")) for r in reader])

    def column(self, name: str) -> np.ndarray:
        return np.array([getattr(e, name) for e in self.entries])

    @property
    def met(self) -> np.ndarray:
        return self.column("latency_ms") <= self.column("slo_ms")  # NaN (errors) compares False

    @property
    def met_in_server(self) -> np.ndarray:
        """Met as the sidecar saw it: its own queue and service time within the SLO (NaN, an error, is not met).
        Beside :attr:`met`, the gap is what the front end, the event loop and the client cost."""
        return self.column("queue_ms") + self.column("service_ms") <= self.column("slo_ms")

    def unseen_ms(self) -> np.ndarray:
        """Per answered request that carried the sidecar's times: its time outside the sidecar's view (its client
        latency less the sidecar's queue and service time: the client, the network, the front end)."""
        unseen = self.column("latency_ms") - self.column("queue_ms") - self.column("service_ms")
        return unseen[np.isfinite(unseen)]

    def summary(self) -> dict[str, object]:
        n = len(self.entries)
        met = self.met
        latency = self.column("latency_ms")
        answered = np.isfinite(latency)
        errors = Counter(e.status for e in self.entries if e.status != "ok")
        unseen = self.unseen_ms()
        return {
            "queries": n,
            "answered": int(answered.sum()),
            "met": int(met.sum()),
            "errors": dict(errors),
            "slo_attainment": float(met.mean()) if n else 0.0,
            # None when no answer carried the sidecar's queue/service times (a replay direct to Triton)
            "server_attainment": float(self.met_in_server.mean()) if unseen.size else None,
            # what answered requests spent outside the sidecar's view (client, network, its front end): the
            # allowance its overhead_us should make
            "unseen_p90_ms": float(np.percentile(unseen, 90)) if unseen.size else None,
            "mean_serving_accuracy": float(self.column("accuracy")[met].mean()) if met.any() else 0.0,
            "measured_accuracy": float(np.nanmean(self.column("correct")[met])) if met.any() else 0.0,
            "p50_latency_ms": float(np.percentile(latency[answered], 50)) if answered.any() else None,
            "p99_latency_ms": float(np.percentile(latency[answered], 99)) if answered.any() else None,
            "p99_send_lag_ms": float(np.percentile(self.column("lag_ms"), 99)) if n else 0.0,
        }

    def timeline(self, bin_s: float = 1.0) -> dict[str, np.ndarray]:
        """Per-bin ingest rate, served accuracy, mean batch size and attainment (SuperServe Fig. 8c)."""
        t = self.column("scheduled_s")
        bins = max(1, math.ceil((t.max(initial=0.0) + 1e-9) / bin_s))
        index = np.minimum((t / bin_s).astype(np.int64), bins - 1)
        met, ok = self.met, self.column("status") == "ok"
        count = np.bincount(index, minlength=bins).astype(float)

        def mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
            n = np.bincount(index[mask], minlength=bins)
            total = np.bincount(index[mask], values[mask], minlength=bins)
            return np.where(n > 0, total / np.maximum(n, 1), np.nan)

        return {
            "time_s": np.arange(bins) * bin_s,
            "ingest_qps": count / bin_s,
            "served_accuracy": mean(self.column("accuracy"), met),
            "mean_batch_size": mean(self.column("batch_size").astype(float), ok),
            "slo_attainment": np.where(count > 0, np.bincount(index, met, bins) / np.maximum(count, 1), np.nan),
            "server_attainment": np.where(count > 0, np.bincount(index, self.met_in_server, bins)
                                          / np.maximum(count, 1), np.nan),
        }


def _num(value: float, digits: int) -> str:
    return "" if math.isnan(value) else f"{value:.{digits}f}"


def _float(text: str) -> float:
    return float(text) if text else math.nan
