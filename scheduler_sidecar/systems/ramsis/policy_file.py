"""A generated RAMSIS policy as a file: one ``.npz`` per (profile, SLO, K, load).

Arrays (``numpy.load(path)`` reads them; no pickles):

- ``meta``: a JSON string, schema ``accscale/ramsis-policy/v1``, with the profile name, slo_ms,
  workers, load_qps, slack_steps (D), max_queue (N_w), discretization, batching, reward,
  expected_accuracy (fraction), expected_violation_rate, full_state_probability, gain,
  value-iteration sweeps and whether they converged, and generation seconds;
- ``model_ids``: the models the actions index, in the MDP's order;
- ``accuracy``: [m] their accuracy; ``latency_ms``: [m, b-1] the latencies the MDP used;
- ``slack_grid_ms``: [J] T_w;
- ``action_model``, ``action_batch``: [N_w + 1, J] int16, the action in state (n, T_j);
  model -1 and batch 0 in the empty states (the arrival action);
- ``full_model``, ``full_batch``: the action in the full state (n > N_w).

Online, a worker with n queued queries and head slack ``slack_ms`` looks up
:meth:`RamsisPolicy.action`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scheduler_sidecar.errors import ConfigError

SCHEMA = "accscale/ramsis-policy/v1"
META_KEYS = ("profile", "slo_ms", "workers", "load_qps", "slack_steps", "max_queue", "discretization",
             "batching", "reward", "expected_accuracy", "expected_violation_rate")


@dataclass(frozen=True)
class RamsisPolicy:
    meta: dict[str, Any]  # see the module docstring
    model_ids: tuple[str, ...]
    accuracy: np.ndarray
    latency_ms: np.ndarray
    slack_grid_ms: np.ndarray
    action_model: np.ndarray
    action_batch: np.ndarray
    full_model: int
    full_batch: int
    source: str = field(default="", compare=False)  # the file it came from, for messages

    @property
    def load_qps(self) -> float:
        return float(self.meta["load_qps"])

    @property
    def expected_accuracy(self) -> float:
        return float(self.meta["expected_accuracy"])

    @property
    def max_queue(self) -> int:
        return self.action_model.shape[0] - 1

    def action(self, n: int, slack_ms: float) -> tuple[str, int] | None:
        """(model id, batch) for n queued queries whose earliest deadline is ``slack_ms`` away; None if n = 0."""
        if n <= 0:
            return None
        if n > self.max_queue:
            return self.model_ids[self.full_model], self.full_batch
        j = max(int(np.searchsorted(self.slack_grid_ms, slack_ms, side="right")) - 1, 0)
        return self.model_ids[int(self.action_model[n, j])], int(self.action_batch[n, j])

    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:  # a file object keeps numpy from appending ".npz"
            np.savez_compressed(
                f, meta=np.array(json.dumps({"schema": SCHEMA, **self.meta})), model_ids=np.array(self.model_ids),
                accuracy=self.accuracy, latency_ms=self.latency_ms, slack_grid_ms=self.slack_grid_ms,
                action_model=self.action_model.astype(np.int16), action_batch=self.action_batch.astype(np.int16),
                full=np.array([self.full_model, self.full_batch], dtype=np.int16))

    @classmethod
    def load(cls, path: Path | str) -> RamsisPolicy:
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such policy file") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a RAMSIS policy .npz ({exc})") from None
        need = ("meta", "model_ids", "accuracy", "latency_ms", "slack_grid_ms", "action_model", "action_batch", "full")
        missing = [k for k in need if k not in arrays]
        if missing:
            raise ConfigError(f"{path}: missing array(s) {missing}")
        try:
            meta = json.loads(str(arrays["meta"]))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: meta: not JSON ({exc})") from None
        if meta.pop("schema", None) != SCHEMA:
            raise ConfigError(f"{path}: meta.schema is not {SCHEMA!r}")
        absent = [k for k in META_KEYS if k not in meta]
        if absent:
            raise ConfigError(f"{path}: meta: missing {absent}")
        ids = tuple(str(x) for x in arrays["model_ids"])
        am, ab, grid = arrays["action_model"], arrays["action_batch"], arrays["slack_grid_ms"]
        if am.shape != ab.shape or am.ndim != 2 or am.shape[1] != len(grid):
            raise ConfigError(f"{path}: action_model/action_batch must be [N_w + 1, {len(grid)}], got {am.shape}, "
                             f"{ab.shape}")
        if am.max(initial=-1) >= len(ids) or am[1:].min(initial=0) < 0:
            raise ConfigError(f"{path}: action_model: indices outside model_ids (0..{len(ids) - 1})")
        full_model, full_batch = (int(x) for x in arrays["full"])
        return cls(meta, ids, arrays["accuracy"], arrays["latency_ms"], grid, am, ab, full_model, full_batch,
                   source=str(path))
