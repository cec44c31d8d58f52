"""HybridServe (Xue, Fu, Mai, Marina, arXiv 2505.12566): confidence cascades from small to large models, with
calibrated thresholds, model pruning and skip connections, and a replica planner."""
