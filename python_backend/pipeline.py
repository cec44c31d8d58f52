"""What the Loki pipeline's models and its BLS model compute around the networks: crops, the classical detector,
and turning a detector's heatmap into detections.

Every detector answers the same way: LOGITS [3, SIZE/4, SIZE/4], per 4x4 cell the scores of background, a
digit's centre and a shape's centre. A detection is a cell whose object probability (1 - background) is above
0.5 and the largest in its 3x3 neighbourhood; its centre is the cell's, its kind the likelier of the two.
The classical detector (threshold and connected components, no training) writes a one-hot heatmap of the
same form, so the pipeline treats all detectors alike.
"""

from __future__ import annotations

import numpy as np

SIZE, CROP, STRIDE = 64, 16, 4
MAX_OBJECTS = 12  # detections the pipeline answers per frame (scenes hold at most 8 objects)
THRESHOLD = 0.35  # the classical detector's foreground level
MIN_AREA = 12  # px: smaller components are noise
SQUARENESS = 0.7  # fill of its bounding box above which a component is a shape (digits fill far less)


def crops(frame: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """CROP x CROP windows of ``frame`` [1, SIZE, SIZE] around each (row, col) of ``centres``: [K, 1, CROP, CROP]."""
    half = CROP // 2
    padded = np.pad(frame[0], half)
    out = np.empty((len(centres), 1, CROP, CROP), np.float32)
    for k, (r, c) in enumerate(np.asarray(centres, dtype=np.int64).reshape(-1, 2)):
        out[k, 0] = padded[r:r + CROP, c:c + CROP]
    return out


def decode(heatmap: np.ndarray) -> np.ndarray:
    """Detections of one frame's LOGITS [3, H, W]: int64 [K, 3] (row, col, kind), kind 0 a digit, 1 a shape."""
    z = heatmap - heatmap.max(axis=0, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=0, keepdims=True)
    obj = 1.0 - p[0]
    padded = np.pad(obj, 1, constant_values=-1.0)
    h, w = obj.shape
    neighbourhood = np.max([padded[i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=0)
    rows, cols = np.nonzero((obj > 0.5) & (obj >= neighbourhood))
    kinds = (p[2, rows, cols] > p[1, rows, cols]).astype(np.int64)
    return np.stack([rows * STRIDE + STRIDE // 2, cols * STRIDE + STRIDE // 2, kinds], axis=1).astype(np.int64)


def components(frames: np.ndarray) -> np.ndarray:
    """The classical detector on frames [N, 1, SIZE, SIZE]: one-hot LOGITS [N, 3, SIZE/4, SIZE/4]."""
    from scipy import ndimage  # lazy: scipy, for the classical detector alone

    cells = SIZE // STRIDE
    out = np.zeros((len(frames), 3, cells, cells), np.float32)
    out[:, 0] = 10.0
    for i, frame in enumerate(frames):
        labels, count = ndimage.label(frame[0] > THRESHOLD)
        for k, box in enumerate(ndimage.find_objects(labels), start=1):
            mask = labels[box] == k
            area = int(mask.sum())
            if area < MIN_AREA:
                continue
            r, c = ndimage.center_of_mass(mask)
            r, c = int(r) + box[0].start, int(c) + box[1].start
            kind = 1 if area / mask.size >= SQUARENESS else 0
            cell = out[i, :, r // STRIDE, c // STRIDE]
            cell[:] = 0.0
            cell[1 + kind] = 10.0
    return out


OUTCOMES = ("table", "rerouted", "dropped")


def read_answers(objects: np.ndarray, status: np.ndarray, models: list[str], stage_ms: np.ndarray | None = None
                 ) -> list[dict]:
    """The pipeline model's OBJECTS [N, MAX_OBJECTS, 6] and STATUS [N, 4] as one dict per frame: ``status``
    ("served" or "dropped"), ``detector``, ``plan`` (its version), ``instances`` (the stage-model instances that
    plan runs) and ``objects`` (row, col, kind, label, model, outcome); with its STAGE_MS [N, 3], ``sent_ms``,
    ``detected_ms`` and ``done_ms`` too (since the frame's arrival at the sidecar: the sidecar sent it to the
    pipeline, its detector's result, its last label)."""
    out = []
    for i, (rows, (dropped, detector, plan, instances)) in enumerate(zip(objects, status)):
        out.append({"status": "dropped" if dropped else "served",
                    "detector": models[detector] if detector >= 0 else None, "plan": int(plan),
                    "instances": int(instances),
                    "objects": [{"row": int(r), "col": int(c), "kind": int(k), "label": int(label),
                                 "model": models[m] if m >= 0 else None, "outcome": OUTCOMES[o]}
                                for r, c, k, label, m, o in rows if o >= 0]})
        if stage_ms is not None:
            out[-1]["sent_ms"], out[-1]["detected_ms"], out[-1]["done_ms"] = (float(v) for v in stage_ms[i])
    return out
