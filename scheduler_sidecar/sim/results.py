"""What a simulation leaves behind: per-query outcomes as arrays, their summary and dynamics, CSV tables."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scheduler_sidecar.core.records import Outcome, QueryRecord

OUTCOME_CODES = {Outcome.MET: 0, Outcome.LATE: 1, Outcome.DROPPED: 2, Outcome.FAILED: 3, Outcome.REJECTED: 4,
                 Outcome.CANCELLED: 5}


@dataclass(frozen=True, slots=True)
class BatchRecord:
    start_us: int
    batch_size: int
    variant_id: str


@dataclass
class SimResult:
    """Per-query outcomes as parallel arrays (query id = index), and the run's counters."""

    arrival_us: np.ndarray
    deadline_us: np.ndarray
    finish_us: np.ndarray
    outcome: np.ndarray  # OUTCOME_CODES
    accuracy: np.ndarray  # profiled accuracy of the serving variant; NaN unless served
    batch_size: np.ndarray  # 0 unless served
    variant: list[str | None]
    decisions: int
    wall_s: float
    batches: list[BatchRecord] = field(default_factory=list)  # every dispatched batch, retried ones too
    follow_ups: list[QueryRecord] = field(default_factory=list)  # queries that batch results created
    plan_solve_s: list[float] = field(default_factory=list)  # wall time of each planner call, inline

    def count(self, outcome: Outcome) -> int:
        return int(np.count_nonzero(self.outcome == OUTCOME_CODES[outcome]))

    def summary(self) -> dict[str, float | int]:
        n = len(self.outcome)
        met = self.outcome == OUTCOME_CODES[Outcome.MET]
        end_us = max(int(self.finish_us.max(initial=0)), int(self.arrival_us.max(initial=0)))
        return {
            "queries": n,
            "met": int(met.sum()),
            "late": self.count(Outcome.LATE),
            "dropped": self.count(Outcome.DROPPED),
            "failed": self.count(Outcome.FAILED),
            "rejected": self.count(Outcome.REJECTED),
            "slo_attainment": float(met.mean()) if n else 0.0,
            "mean_serving_accuracy": float(self.accuracy[met].mean()) if met.any() else 0.0,
            "mean_batch_size": float(np.mean([b.batch_size for b in self.batches])) if self.batches else 0.0,
            "decisions": self.decisions,
            "sim_seconds": end_us / 1e6,
            "wall_seconds": self.wall_s,
            "queries_per_wall_second": n / self.wall_s if self.wall_s > 0 else float("inf"),
            **({"plans": len(self.plan_solve_s), "plan_solve_seconds": sum(self.plan_solve_s)}
               if self.plan_solve_s else {}),
        }

    def records(self) -> list[QueryRecord]:
        outcomes = {code: o for o, code in OUTCOME_CODES.items()}
        return [
            QueryRecord(i, int(self.arrival_us[i]), int(self.deadline_us[i]), int(self.finish_us[i]),
                        outcomes[int(self.outcome[i])], self.variant[i],
                        None if math.isnan(self.accuracy[i]) else float(self.accuracy[i]), int(self.batch_size[i]))
            for i in range(len(self.outcome))
        ]

    def dynamics(self, bin_s: float = 1.0) -> dict[str, np.ndarray]:
        """Per-bin ingest rate, served accuracy, batch size and attainment (SuperServe Fig. 8c)."""
        end_us = max(int(self.finish_us.max(initial=0)), int(self.arrival_us.max(initial=0)))
        bins = max(1, math.ceil(end_us / (bin_s * 1e6)))
        edges = np.arange(bins + 1) * bin_s * 1e6
        ingest = np.histogram(self.arrival_us, edges)[0] / bin_s
        met = self.outcome == OUTCOME_CODES[Outcome.MET]
        by_arrival = np.minimum((self.arrival_us / (bin_s * 1e6)).astype(np.int64), bins - 1)
        arrivals = np.bincount(by_arrival, None, bins)
        attainment = np.where(arrivals > 0, np.bincount(by_arrival, met, bins) / np.maximum(arrivals, 1), np.nan)
        by_finish = np.minimum((self.finish_us / (bin_s * 1e6)).astype(np.int64), bins - 1)
        acc_sum = np.bincount(by_finish[met], self.accuracy[met], bins)
        acc_n = np.bincount(by_finish[met], None, bins)
        starts = np.array([b.start_us for b in self.batches], dtype=np.int64)
        sizes = np.array([b.batch_size for b in self.batches], dtype=np.float64)
        by_start = np.minimum((starts / (bin_s * 1e6)).astype(np.int64), bins - 1)
        batch_sum, batch_n = np.bincount(by_start, sizes, bins), np.bincount(by_start, None, bins)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "time_s": edges[:-1] / 1e6,
                "ingest_qps": ingest,
                "served_accuracy": np.where(acc_n > 0, acc_sum / np.maximum(acc_n, 1), np.nan),
                "mean_batch_size": np.where(batch_n > 0, batch_sum / np.maximum(batch_n, 1), np.nan),
                "slo_attainment": attainment,
            }



def markdown_table(rows: list[dict], keys: list[str]) -> str:
    """The rows as a Markdown table of the columns ``keys``."""
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def write_rows(rows: list[dict], path: Path, skip: str = "") -> None:
    """One CSV line per result row, every key but ``skip`` (a nested value written elsewhere)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, [k for k in rows[0] if k != skip], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
