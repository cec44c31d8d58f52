"""Where a served frame's time goes in Loki's pipeline, stage by stage, live and simulated, each from the frame's
arrival at the sidecar:

- ``queue``: to the sidecar's sending it to the pipeline (live, its wait in the sidecar's queue; simulated, 0: a
  frame goes straight to its detector's queue);
- ``detect``: from there to its detector batch's result (live, the wait in Triton's queue, then the batch;
  simulated, the wait in its detector worker's queue, then the batch);
- ``classify``: from there to its last crop's label (0 for a frame with no crop);
- ``answer``: from there to the sidecar's answer. Live, a frame is answered with its request's other frames after
  their last label too, so this is the time it is held for them, the way back to the sidecar, and the way there
  (the network and Triton's queue before the BLS execution starts, which the BLS cannot see: ``detect`` counts
  from its start); simulated, a frame is answered when its last crop is, so it is 0.

Live, from the BLS model's ``STAGE_MS`` output (:mod:`python_backend.loki_bls`) and the sidecar's own latency;
simulated, from each frame's root query and the follow-ups it created.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler_sidecar.experiments.fidelity.common import p50_p99

STAGES = ("queue", "detect", "classify", "answer")


def live(frames: Sequence) -> dict[str, list[float]]:
    """Each stage's p50 and p99 (ms) over served ``frames`` (the demo's ``Frame``: its ``answer``, a
    ``read_answers`` dict with ``sent_ms``, ``detected_ms`` and ``done_ms``, and its ``sidecar_us``)."""
    sent, detected, done = (np.array([f.answer[k] for f in frames], float)
                            for k in ("sent_ms", "detected_ms", "done_ms"))
    return _table(sent, detected, done, np.array([f.sidecar_us / 1000 for f in frames], float))


def simulated(result, frames: np.ndarray) -> dict[str, list[float]]:
    """The same over the selected frames of a Loki simulation's ``result`` (``frames``: a mask over its frames)."""
    detected = ((result.finish_us - result.arrival_us) / 1000)[frames]
    done = frame_ms(result, frames)
    return _table(np.zeros_like(detected), detected, done, done)


def frame_ms(result, frames: np.ndarray) -> np.ndarray:
    """Each selected frame's latency in the simulation: from its arrival to the last answer of a query it created."""
    end = result.finish_us.astype(np.int64).copy()
    root = {}
    for r in result.follow_ups:  # a follow-up comes after its parent: each finds its frame in one pass
        frame = root.get(r.parent, r.parent)
        root[r.query_id] = frame
        end[frame] = max(end[frame], r.finish_us)
    return ((end - result.arrival_us) / 1000)[frames]


def _table(sent: np.ndarray, detected: np.ndarray, done: np.ndarray, answered: np.ndarray) -> dict[str, list[float]]:
    return dict(zip(STAGES, (p50_p99(sent), p50_p99(detected - sent), p50_p99(done - detected),
                             p50_p99(answered - done))))
