"""Temperature scaling (§IV-A, Eq. 1; Guo et al., ICML 2017): one temperature per model, the one minimising the
negative log-likelihood of the calibration split. Dividing the logits by a positive T keeps every argmax, so no
prediction changes, only the confidences the thresholds are compared with."""

from __future__ import annotations

import numpy as np

LOG_T_BOUNDS = (-3.0, 3.0)  # T in [0.05, 20]


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of ``labels`` under softmax(logits / T)."""
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(labels)), labels].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T minimising :func:`nll` (bounded search over log T); 1 where the search finds nothing better, so the
    fitted NLL is never above the uncalibrated one."""
    from scipy.optimize import minimize_scalar  # lazy: scipy

    best = minimize_scalar(lambda log_t: nll(logits, labels, float(np.exp(log_t))), bounds=LOG_T_BOUNDS,
                           method="bounded", options={"xatol": 1e-4})
    t = float(np.exp(best.x))
    return t if nll(logits, labels, t) <= nll(logits, labels) else 1.0
