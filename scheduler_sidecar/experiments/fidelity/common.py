"""What every system's fidelity run shares: the gaps between the views, the sidecar's own view (its /metrics),
the simulated one, traces, payloads and the client's delay.
"""

from __future__ import annotations

import argparse
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from loadtest.traces import bursty
from scheduler_sidecar.errors import ConfigError

if TYPE_CHECKING:
    from loadtest.requestlog import RequestLog
    from scheduler_sidecar.core.profile import Profile


Progress = Callable[[str], None]

# a planned capacity is what a plan serves of a demand this many times what every worker on its fastest option
# serves: beyond any plan's reach
BEYOND_REACH = 2.0



def gaps(result: dict, accuracy: str = "mean_serving_accuracy") -> dict:
    """``result`` with the attainment and ``accuracy`` gaps, in points, of each live view against the simulated
    one."""
    sim = result["simulated"]
    sides = [side for side in ("client", "sidecar") if f"live_{side}" in result]
    result["accuracy_metric"] = accuracy
    for what, key in (("attainment", "slo_attainment"), ("accuracy", accuracy)):
        result[f"{what}_gap_pts"] = {side: round(100 * (result[f"live_{side}"][key] - sim[key]), 2) for side in sides}
    return result


def sidecar_view(http_url: str) -> dict:
    """SLO attainment and mean serving accuracy as the sidecar counted them (its /metrics), over all its models and
    per model (``by_model``): from the request's arrival at the sidecar, so the client's own delays are left out,
    as in the simulator. Also the mean batch the sidecar dispatched."""
    with urllib.request.urlopen(f"http://{http_url}/metrics") as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    # model -> outcome -> requests; series -> model -> its _sum and _count
    outcomes: dict[str, Counter] = defaultdict(Counter)
    for sample in families["accscale_requests"].samples:
        if sample.name.endswith("_total"):
            outcomes[sample.labels["model"]][sample.labels["outcome"]] += sample.value
    sums: dict[str, dict[str, Counter]] = {name: defaultdict(Counter) for name in ("served_accuracy", "batch_size")}
    for name, by_model in sums.items():
        for sample in families[f"accscale_{name}"].samples:
            by_model[sample.labels["model"]][sample.name.rsplit("_", 1)[-1]] += sample.value

    def view(models: list[str]) -> dict:
        counts = sum((outcomes[m] for m in models), Counter())
        counts.pop("escalated", None)  # a cascade model passed these on: the next model counts each one's end
        mean = {name: sum((by_model[m] for m in models), Counter()) for name, by_model in sums.items()}
        total = sum(counts.values())
        return {"queries": int(total), "outcomes": dict(counts),
                "slo_attainment": counts["met"] / total if total else 0.0,
                "mean_serving_accuracy": mean["served_accuracy"]["sum"] / max(1.0, mean["served_accuracy"]["count"]),
                "mean_batch": round(mean["batch_size"]["sum"] / max(1.0, mean["batch_size"]["count"]), 2)}

    return {**view(sorted(outcomes)), "by_model": {m: view([m]) for m in sorted(outcomes)}}


def sim_view(summary: Mapping) -> dict:
    return {k: summary[k] for k in ("slo_attainment", "mean_serving_accuracy", "met", "late", "dropped", "rejected")}


def default_trace(args: argparse.Namespace, tmp: Path, base_qps: float = 150.0, variant_qps: float = 250.0,
                  capacity_qps: float | None = None) -> Path:
    """``--trace``, or a bursty one (a steady ``base_qps`` and ``variant_qps`` at CV² 4) ``--duration-s`` long; at
    ``--load`` its mean rate is the load times ``capacity_qps``, in the same proportions."""
    if args.trace is not None:
        return args.trace
    if args.load is not None:
        scale = at_load(args, capacity_qps) / (base_qps + variant_qps)
        base_qps, variant_qps = scale * base_qps, scale * variant_qps
    path = tmp / "trace.txt"
    bursty(base_qps, variant_qps, cv2=4.0, duration_s=args.duration_s, seed=0).save(path)
    return path


def at_load(args: argparse.Namespace, capacity_qps: float | None) -> float:
    """The rate ``--load`` asks for: the load times the deployment's planned capacity (each system's own notion of
    it, which its run reports as ``capacity_qps``)."""
    if capacity_qps is None or not capacity_qps > 0:
        raise ConfigError(f"{args.system}: --load needs the deployment's planned capacity, which is "
                          f"{capacity_qps!r} here (no plan of its most accurate configuration meets the SLO)")
    return args.load * capacity_qps


def client_delay_ms(logs: list[RequestLog]) -> list[float]:
    """p50 and p99 of what the client's view adds to the sidecar's for the requests answered: the replay's send
    lag and both ways over gRPC (a request is the client's from its scheduled arrival)."""
    delay = np.concatenate([log.column("latency_ms") - log.column("queue_ms") - log.column("service_ms")
                            for log in logs])
    return p50_p99(delay[np.isfinite(delay)])


def p50_p99(ms) -> list[float]:
    """The p50 and p99 of ``ms``, to 0.1 ms; none of an empty sample."""
    return [round(float(np.percentile(ms, q)), 1) for q in (50, 99)] if len(ms) else []


def batch_ratios(log: RequestLog, profile: Profile) -> tuple[float, ...]:
    """Each batch the live run served: its service time over its variant's profiled p50 at its size on the profile's
    device kind (a batch's requests share worker, variant, size and service time, so it counts once)."""
    device = profile.device_kinds[0]
    variants = {v.id: v for v in profile.variants}
    batches = {(e.worker, e.variant, e.batch_size, e.service_ms) for e in log.entries if e.status == "ok"}
    return tuple(service_ms / variants[v].latency[device].p50_at(b) for _, v, b, service_ms in sorted(batches))
