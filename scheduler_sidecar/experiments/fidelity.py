"""``accscale bench fidelity``: each system live (the sidecar in front of real Tritons) against the simulator on the
same trace, profile, policy, planner and workers (DESIGN 3).

The trace is replayed open loop through the sidecar (Locust) and simulated with the profiles' p50 latencies. The
live side is scored in the sidecar (its /metrics, from arrival at the sidecar, which is what the simulator models)
and at the client too (from each request's scheduled arrival, the client's own delays included). SLO attainments
and accuracies are printed side by side with their gaps in points (live minus simulated).

- ``superserve``: the supernet built here (``accscale profile``), SlackFit (``--policy`` picks another of its
  policies); accuracy: the mean profiled accuracy of the variants that served the requests met.
- ``ramsis``: the same supernet, its Pareto subnets as RAMSIS' models, MDP policies generated for this SLO,
  the worker count and two loads around the trace's.
- ``proteus``: the Proteus demo's deployment (:mod:`.proteus_demo`): its three families, one Triton per device of
  its two emulated kinds, the sidecar with the Proteus planner, a logical model per query type. Each type has its
  own trace (the demo's load: ``--base-qps`` each, digits at ``--burst-qps`` in the middle third), replayed
  together as one schedule. Simulated: the same planner (ProteusPlanner with the sidecar config's ProteusConfig
  and no initial demand, as the sidecar builds it), the same policies (built from the same config), the same
  device kinds, every worker holding every variant at the start (as each Triton starts), and what the live run
  measured, from the sidecar's log and the request logs: its clock (the simulation's is the sidecar's monotonic
  one less whole seconds, so that it starts when the first plan was asked for, each query arrives when the
  replay sent it, and periods and the planner's one-second counts fall as they did live); each plan's solve
  time (a plan asked for when the sidecar asked for one comes into force as late); each model's load time (its mean
  'loaded MODEL on WORKER in N ms', the mean of all for a model only the simulation loads); and what a batch
  takes beyond its profiled p50, added to every simulated batch: the RPC and Triton's own time (service time
  over p50 on the worker's kind, mean over batches) and the sidecar's turnaround between one batch's answer and
  the next batch's start on a worker (the median gap before full batches that were already queued). Scored
  over every query: live from the sidecar's /metrics summed over the models, simulated from the SimResult;
  accuracy as superserve's. Not simulated: the sidecar's warm-up (a request per worker and model after the
  first plan, seconds before the replay, counted in the planner's demand) and the spread of the per-batch
  overhead (a constant in the simulation). The planner decides on a burst at a second's first arrival, from
  whole-second counts against a threshold and at most once per 2 s cooldown, so a count one query apart or a
  cooldown passed by a few ms (the sidecar takes a query in a few ms after it was sent) can move a plan by a
  second, and the two runs part from there: ``plans`` says how many of the simulated plans were asked for when
  the sidecar asked for one. The client's view adds the replay's send lag and gRPC both ways
  (``client_delay_ms``, p50 and p99).
- ``hybridserve``: the HybridServe demo's family and cascade BLS (:mod:`.hybridserve_demo`) on one Triton whose
  models run its emulated slowdown, the sidecar with ``[planner] kind = "hybridserve"`` (``--mode``,
  ``--instances``, ``--rounding``, ``--no-prune``), and a gamma trace (CV² 4) at ``--rate-qps`` whose payload
  indices are samples of the family's test split. Simulated by :mod:`~scheduler_sidecar.systems.hybridserve.
  simulation` with the same cascade, replicas, slowdown and SLO, on the same samples. Attainment: the sidecar's
  /metrics, the client's request log, the simulated requests met. Accuracy is what the answers were worth: the
  share of met requests answered right, live from the request log (the answer's LABEL against the sample's
  label) over the requests the sidecar met (its queue and service time within the SLO) or the client did, and
  simulated from the answering model's cached prediction over the requests met. Inherent to the live system,
  and reported measured: a BLS instance holds its batch through every model and answers all of its requests
  once the last model ran, where the simulator answers each request when its model does (``latency_ms``, p50
  and p99 of both); a BLS batch costs more than its models' waits and runs (the Python backend's calls between
  the BLS and the models, on cores its instances share with everything else: the BLS's mean batch time against
  its models', ``per_model_live``), and the instances, each busy for its batch's whole cascade, cap the
  throughput where the simulator's per-model queues do not; and Triton merges the instances' calls to a model
  as they queue, where the simulator batches each model's queue by its slack (Clipper+) and drops what can no
  longer make it (each model's mean batch, wait and batch time on both sides, live from Triton's statistics
  over the replay). On this 2-core machine the sidecar shares its cores with them too: ``client_delay_ms``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from export.presets import DEFAULT_BUILD_DIR
from scheduler_sidecar.systems.hybridserve.placement import BALANCED, NEAREST
from scheduler_sidecar.systems.hybridserve.planner import MODES

if TYPE_CHECKING:
    from loadtest.requestlog import RequestLog
    from loadtest.traces import Trace
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.server.config import SidecarConfig
    from scheduler_sidecar.server.serve import SidecarServer
    from scheduler_sidecar.sim.results import SimResult

SYSTEMS = ("superserve", "ramsis", "proteus", "hybridserve")
MODEL = "digits"  # the logical model clients call (superserve, ramsis)
SLO_MS = {"superserve": 30.0, "ramsis": 30.0, "proteus": 100.0, "hybridserve": 4000.0}  # --slo-ms's defaults
# the sidecar's log lines the simulations take their actuation from
PLANNED = re.compile(r"plan asked for at ([\d.]+) s, ready at ([\d.]+) s")
LOADED = re.compile(r"loaded (\S+) on (\S+) in (\d+) ms")
RELOADED = re.compile(r"(\S+) runs (\d+) instance\(s\) on \S+ \(reloaded in (\d+) ms\)")
PLAN_MATCH_S = 0.1  # a simulated plan asked for this close to a live one is the same plan
PLAN_WAIT_S = 300.0  # how long the cascade's instance counts may take to be in place

Progress = Callable[[str], None]


def register_bench(kinds: argparse._SubParsersAction) -> None:
    f = kinds.add_parser("fidelity", help="each system live (sidecar + Triton) against the simulator, one trace",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--system", choices=SYSTEMS, default="superserve", help="which system (default: superserve)")
    f.add_argument("--profile", type=Path, default=Path("build/full/profile.json"),
                   help="superserve, ramsis: profile measured through Triton (default: build/full/profile.json, "
                        "`accscale profile`)")
    f.add_argument("--repository", type=Path, default=Path("model_repository"),
                   help="superserve, ramsis: Triton repository exported with that profile (default: model_repository)")
    f.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR,
                   help="proteus, hybridserve: where their families are built (default: build)")
    f.add_argument("--trace", type=Path,
                   help="superserve, ramsis, hybridserve: trace to replay (default: generated, --duration-s long; "
                        "hybridserve draws payloads for a trace without them)")
    f.add_argument("--duration-s", type=float, default=30.0, help="length of a generated trace (default: 30)")
    f.add_argument("--policy", default="slackfit", help="superserve: the policy of both drivers (default: slackfit)")
    f.add_argument("--workers", type=int, default=1, help="superserve, ramsis: Triton servers, one worker each "
                                                          "(default: 1)")
    f.add_argument("--slo-ms", type=float, help="SLO of trace lines without one (default: " + ", ".join(
        f"{s} {ms:g}" for s, ms in SLO_MS.items()) + ")")
    f.add_argument("--base-qps", type=float, default=20.0, help="proteus: each query type's rate (default: 20)")
    f.add_argument("--burst-qps", type=float, default=250.0,
                   help="proteus: digits' rate in the middle third (default: 250)")
    f.add_argument("--period-s", type=float, default=10.0, help="proteus: the planner's period (default: 10)")
    f.add_argument("--rate-qps", type=float, default=300.0, help="hybridserve: the trace's mean rate (default: 300)")
    f.add_argument("--mode", choices=MODES, default="ap", help="hybridserve: the planner's mode (default: ap)")
    f.add_argument("--no-prune", dest="prune", action="store_false",
                   help="hybridserve: the whole family's cascade, not Algorithm 2's")
    f.add_argument("--instances", type=int, default=16,
                   help="hybridserve: the model instances the replicas share (default: 16)")
    f.add_argument("--rounding", choices=(NEAREST, BALANCED), default=NEAREST,
                   help="hybridserve: how the replicas are rounded (default: nearest)")
    f.add_argument("--out", type=Path, help="keep the run's files here: traces, configs, request logs, the sidecar's "
                                            "log (default: a temporary folder)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    args.slo_ms = args.slo_ms or SLO_MS[args.system]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(args.out) if args.out else tempfile.TemporaryDirectory() as tmp:
        result = _SYSTEMS[args.system](args, Path(tmp), progress)
    if args.json:
        print(json.dumps(result))
        return 0
    accuracy = result["accuracy_metric"]
    views = [(f"live, {side}", result[f"live_{side}"]) for side in ("client", "sidecar") if f"live_{side}" in result]
    print(f"{args.system}: {result['queries']} queries; accuracy: {accuracy}")
    print(f"{'':<26} {'attainment':>10} {'accuracy':>9}")
    for name, r in (*views, ("simulated", result["simulated"])):
        print(f"{name:<26} {r['slo_attainment']:>10.4f} {100 * r[accuracy]:>8.2f}%")
    for side, gap in result["attainment_gap_pts"].items():
        print(f"gap (points), {side:<12} {gap:>10.2f} {result['accuracy_gap_pts'][side]:>9.2f}")
    for model, by in result.get("by_model", {}).items():
        for name, r in (("live, sidecar", by["live_sidecar"]), ("simulated", by["simulated"])):
            print(f"{model + ', ' + name:<26} {r['slo_attainment']:>10.4f} {100 * r[accuracy]:>8.2f}%")
    for key in ("deployment", "differences"):
        for name, value in result.get(key, {}).items():
            print(f"{name}: {json.dumps(value)}")
    return 0


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
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

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
        mean = {name: sum((by_model[m] for m in models), Counter()) for name, by_model in sums.items()}
        total = sum(counts.values())
        return {"queries": int(total), "outcomes": dict(counts),
                "slo_attainment": counts["met"] / total if total else 0.0,
                "mean_serving_accuracy": mean["served_accuracy"]["sum"] / max(1.0, mean["served_accuracy"]["count"]),
                "mean_batch": round(mean["batch_size"]["sum"] / max(1.0, mean["batch_size"]["count"]), 2)}

    return {**view(sorted(outcomes)), "by_model": {m: view([m]) for m in sorted(outcomes)}}


def _trace(args: argparse.Namespace, tmp: Path) -> Path:
    from loadtest.traces import bursty

    if args.trace is not None:
        return args.trace
    path = tmp / "trace.txt"
    bursty(150.0, 250.0, cv2=4.0, duration_s=args.duration_s, seed=0).save(path)
    return path


def _single_model(args: argparse.Namespace, tmp: Path, progress: Progress, policy: str, options: dict) -> dict:
    """One logical model on the supernet: live with ``policy`` and ``options`` in the sidecar's config, and
    simulated with the same policy object's options."""
    from loadtest.loadtest_cli import loadtest
    from loadtest.traces import Trace
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.experiments.simulate import load_queries
    from scheduler_sidecar.live.triton_launcher import TritonServer
    from scheduler_sidecar.server.config import ModelSpec
    from scheduler_sidecar.server.serve import SidecarServer
    from scheduler_sidecar.server.service import model_policy
    from scheduler_sidecar.sim.simulator import SimConfig, Simulator

    profile = Profile.load(args.profile)
    trace_path = _trace(args, tmp)
    trace = Trace.load(trace_path)
    spec = ModelSpec(MODEL, args.profile, policy, options, default_slo_us=round(args.slo_ms * 1000))
    config = tmp / "sidecar.toml"
    config.write_text(f'[[models]]\nname = "{MODEL}"\nprofile = "{args.profile}"\npolicy = "{policy}"\n'
                      f"default_slo_us = {spec.default_slo_us}\n[models.policy_options]\n"
                      + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items()))
    models = sorted({v.actuation.model for v in profile.variants})
    with contextlib.ExitStack() as stack:
        tritons = [stack.enter_context(TritonServer(repository=args.repository, models=models))
                   for _ in range(args.workers)]
        sidecar = stack.enter_context(SidecarServer(workers=[t.grpc_url for t in tritons], config=config))
        progress(f"replaying {len(trace)} queries ({trace.mean_rate_qps:.0f} q/s) through the sidecar ({policy})")
        client = loadtest(trace_path, sidecar.grpc_url, tmp / "run", model=MODEL, slo_ms=args.slo_ms,
                          progress_s=0 if args.json else 5.0)["summary"]
        server = sidecar_view(sidecar.http_url)
    arrival_us, deadline_us = load_queries(trace_path, args.slo_ms)
    sim = Simulator(model_policy(spec, profile), SimConfig(workers=args.workers)).run(arrival_us, deadline_us)
    return gaps({"system": args.system, "policy": policy, "queries": len(trace), "workers": args.workers,
                 "live_client": client, "live_sidecar": server, "simulated": _sim_view(sim.summary())})


def _sim_view(summary: Mapping) -> dict:
    return {k: summary[k] for k in ("slo_attainment", "mean_serving_accuracy", "met", "late", "dropped", "rejected")}


def superserve(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    return _single_model(args, tmp, progress, args.policy, {})


def ramsis(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    """RAMSIS' offline phase for this deployment: MDP policies for K = the worker slots and the trace's SLO, at
    loads around the trace's mean rate; then the same policy set live and simulated."""
    from loadtest.traces import Trace
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.systems.ramsis.generate import generate_set
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec
    from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, from_profile
    from scheduler_sidecar.systems.ramsis.policy import SLACK_STEPS

    profile = Profile.load(args.profile)
    rate = Trace.load(_trace(args, tmp)).mean_rate_qps
    policy_dir = tmp / "ramsis"
    progress(f"generating RAMSIS' policies for {args.workers} worker(s), SLO {args.slo_ms:g} ms")
    largest = profile.variants[0].latency[profile.device_kinds[0]].batch_sizes[-1]
    table = from_profile(profile, profile.device_kinds[0], "p99_ms", max(MAX_QUEUE, largest)).pareto()
    spec = MdpSpec(args.slo_ms, args.workers, 1.0, SLACK_STEPS, min(MAX_QUEUE, largest))  # as Ramsis builds it
    generate_set(table, spec, [round(rate / 2, 1), round(rate, 1), round(2 * rate, 1)], policy_dir, refine=False)
    return _single_model(args, tmp, progress, "ramsis", {"policy_dir": str(policy_dir)})


def proteus(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    """See the module notes."""
    from loadtest.loadtest_cli import Replay, replay
    from loadtest.requestlog import RequestLog
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.experiments import proteus_demo as demo
    from scheduler_sidecar.server.config import load

    repository, paths = demo.families(args.build_dir)
    traces = {q: _demo_trace(q, args, tmp / f"trace-{q}.txt", seed) for seed, q in enumerate(paths)}
    replays = [Replay(q, traces[q], _payloads(tmp / f"payloads-{q}.npz", *demo.samples(q))) for q in paths]
    with contextlib.ExitStack() as stack:
        tritons, sidecar = demo.deploy(stack, repository, paths, tmp, slo_ms=args.slo_ms, period_s=args.period_s)
        progress(f"replaying {', '.join(paths)} through the sidecar, the Proteus planner and {len(tritons)} Tritons")
        client = replay(replays, sidecar.grpc_url, tmp / "run", slo_ms=args.slo_ms, progress_s=0 if args.json else 5.0)
        server = sidecar_view(sidecar.http_url)
        log = sidecar.log_path.read_text()
    (tmp / "sidecar.log").write_text(log)
    config = load(tmp / "sidecar.toml", workers=tuple(t.grpc_url for t in tritons))
    profiles = {m.name: Profile.load(m.profile) for m in config.models}
    logs = {q: RequestLog.load(tmp / "run" / m["request_log"]) for q, m in client["models"].items()}
    measured = _measured(log, client["replay_start_monotonic_s"], list(logs.values()), profiles,
                         config.worker_devices)
    sim, names, plans = _simulate_proteus(config, profiles, logs, measured)
    return gaps({
        "system": "proteus", "queries": client["summary"]["queries"],
        "live_client": client["summary"], "live_sidecar": server, "simulated": _sim_view(sim.summary()),
        "by_model": {q: {"live_sidecar": server["by_model"].get(q, {}), "simulated": _scores(sim, names == q)}
                     for q in paths},
        "deployment": {"workers": dict(config.worker_devices),
                       "models": {q: [v.id for v in p.variants] for q, p in profiles.items()},
                       "slo_ms": args.slo_ms, "period_s": args.period_s,
                       "replay_after_first_plan_s": round(measured.replay_start_s - measured.plans[0][0], 3),
                       "plans": plans, "loads_live": measured.loads, "load_ms_simulated": measured.load_ms,
                       "service_overhead_ms": round(measured.service_overhead_ms, 2),
                       "turnaround_ms": round(measured.turnaround_ms, 2)},
        "differences": {"client_delay_ms": _client_delay_ms(list(logs.values()))},
    })


@dataclass(frozen=True)
class Measured:
    """What the live run measured that the simulated world takes over."""

    plans: list[tuple[float, float]]  # the sidecar's: when each was asked for and ready, on the monotonic clock
    replay_start_s: float  # when the replay began, on the same clock
    loads: list[dict]  # the models loaded live: model, worker, ms
    load_ms: dict[str, float] | None  # model -> its load time in the simulation (None: the profiles')
    service_overhead_ms: float  # a batch's service time beyond its profiled latency: the RPC, Triton's own time
    turnaround_ms: float  # from a batch's answer to the next batch's start on its worker: the sidecar's own time

    @property
    def batch_overhead_ms(self) -> float:
        """What a batch takes, from its dispatch to its answer, beyond its profiled latency."""
        return self.service_overhead_ms + self.turnaround_ms


@dataclass(frozen=True)
class _Batch:
    """A batch a worker ran live, as the request log shows it (times in ms from the replay's start)."""

    worker: str
    variant: str
    size: int
    service_ms: float
    start_ms: float  # its requests' send time plus their queueing (the median: the send times are the client's)
    first_sent_ms: float


def _measured(log: str, replay_start_s: float, logs: list[RequestLog], profiles: Mapping[str, Profile],
              devices: Mapping[str, str]) -> Measured:
    """From the sidecar's log: its plans and loads (each model's mean load time, the mean of all for a model not
    loaded live). From the request logs: the mean over batches of their service time beyond the profiled p50 on
    their worker's device kind; and the median gap from a batch's end to the next batch's start on its worker,
    over next batches that were full and whose requests had all been sent before the first batch ended (so that
    only the sidecar held them back: its event loop, between the answer and the next dispatch)."""
    plans = [(float(asked), float(ready)) for asked, ready in PLANNED.findall(log)]
    if not plans:
        raise RuntimeError("the sidecar logged no plan")
    loads = [{"model": m, "worker": w, "ms": int(ms)} for m, w, ms in LOADED.findall(log)]
    load_ms = None
    if loads:
        by_model: dict[str, list[int]] = defaultdict(list)
        for load in loads:
            by_model[load["model"]].append(load["ms"])
        overall = float(np.mean([load["ms"] for load in loads]))
        load_ms = {v.actuation.model: float(np.mean(by_model[v.actuation.model])) if v.actuation.model in by_model
                   else overall for p in profiles.values() for v in p.variants}
    variants = {v.id: v for p in profiles.values() for v in p.variants}
    batches = _batches(logs)
    service = [b.service_ms - variants[b.variant].latency[devices[b.worker]].p50_at(b.size) for b in batches]
    largest: dict[tuple[str, str], int] = defaultdict(int)
    for b in batches:
        largest[b.worker, b.variant] = max(largest[b.worker, b.variant], b.size)
    gaps = [b.start_ms - (a.start_ms + a.service_ms) for a, b in zip(batches, batches[1:])
            if a.worker == b.worker and b.first_sent_ms < a.start_ms + a.service_ms
            and b.size == largest[b.worker, b.variant]]
    return Measured(plans, replay_start_s, loads, load_ms, max(0.0, float(np.mean(service))) if service else 0.0,
                    max(0.0, float(np.median(gaps))) if gaps else 0.0)


def _batches(logs: list[RequestLog]) -> list[_Batch]:
    """The batches the answered requests were served in, by worker and start; a batch's requests share its worker,
    variant, size and service time."""
    requests: dict[tuple[str, str, int, float], list[tuple[float, float]]] = defaultdict(list)
    for log in logs:
        for e in log.entries:
            if e.status == "ok":
                sent_ms = 1000 * e.scheduled_s + e.lag_ms
                requests[e.worker, e.variant, e.batch_size, e.service_ms].append((sent_ms, sent_ms + e.queue_ms))
    batches = [_Batch(*key, float(np.median([s for _, s in times])), min(t for t, _ in times))
               for key, times in requests.items()]
    return sorted(batches, key=lambda b: (b.worker, b.start_ms))


def _demo_trace(query_type: str, args: argparse.Namespace, path: Path, seed: int) -> Path:
    """The Proteus demo's load of one query type, its rate in each third of the trace, Poisson within each."""
    from loadtest.traces import compress
    from scheduler_sidecar.experiments.proteus_demo import rate_qps

    thirds = np.array([rate_qps(query_type, (k + 0.5) * args.duration_s / 3, args.duration_s, args.base_qps,
                                args.burst_qps) for k in range(3)])
    compress(thirds, 1.0, args.duration_s, float(thirds.mean()), seed=seed).save(path)
    return path


def _payloads(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    np.savez(path, images=images, labels=labels)
    return path


def _simulate_proteus(config: SidecarConfig, profiles: Mapping[str, Profile], logs: Mapping[str, RequestLog],
                      measured: Measured) -> tuple[SimResult, np.ndarray, dict]:
    """The sidecar's planner, policies and workers (``config``) in a world of what was ``measured``, over the
    queries the replay sent (``logs``: model -> its request log) as one trace: (its result, each query's type, its
    plans beside the sidecar's).

    The simulation's clock is the sidecar's less whole seconds: it starts when the first plan was asked for, the
    queries arrive when the replay sent them, and a plan asked for when the sidecar asked for one (within
    PLAN_MATCH_S) comes into force as late as the sidecar's did (the median of them otherwise), so that plans,
    periods and the planner's one-second counts fall as they did live."""
    from scheduler_sidecar.server.service import model_policy
    from scheduler_sidecar.sim.simulator import Simulator
    from scheduler_sidecar.sim.world import SimWorker, World
    from scheduler_sidecar.systems.proteus.planner import ProteusPlanner

    assert config.planner is not None
    kinds = [config.worker_devices[url] for url in config.workers]  # the sidecar's worker ids follow this order
    planner = ProteusPlanner(profiles, list(enumerate(kinds)), {m.name: m.default_slo_us / 1000 for m in config.models},
                             config.planner.proteus_config())
    every = frozenset(v.actuation.model for p in profiles.values() for v in p.variants)
    world = World(tuple(SimWorker(kind, resident=every) for kind in kinds), load_ms=measured.load_ms,
                  batch_overhead_ms=measured.batch_overhead_ms)
    asked, ready = np.array(measured.plans).T
    delays = ready - asked
    origin_s = float(np.floor(asked[0]))
    matched: list[bool] = []

    def plan_delay_us(now_us: int) -> int:
        gap = np.abs(asked - origin_s - now_us / 1e6)
        matched.append(bool(gap.min() <= PLAN_MATCH_S))
        return round(1e6 * (delays[int(np.argmin(gap))] if matched[-1] else np.median(delays)))

    names = np.concatenate([np.full(len(log.entries), q) for q, log in logs.items()])
    # when each query was sent (its schedule and the client's lag; a trace's query near a second's end may have
    # been sent in the next one, and the planner counts it there)
    sent_s = np.concatenate([log.column("scheduled_s") + log.column("lag_ms") / 1000 for log in logs.values()])
    slo_ms = np.concatenate([log.column("slo_ms") for log in logs.values()])
    arrival = np.round((measured.replay_start_s - origin_s + sent_s) * 1e6).astype(np.int64)
    deadline = arrival + np.round(slo_ms * 1000).astype(np.int64)
    order = np.argsort(arrival, kind="stable")
    policies = {m.name: model_policy(m, profiles[m.name]) for m in config.models}
    result = Simulator(policies, world, planner=planner, plan_delay_us=plan_delay_us).run(
        arrival[order], deadline[order], names[order].tolist(), start_us=round((asked[0] - origin_s) * 1e6))
    plans = {"live": len(asked), "simulated": planner.plans, "simulated_when_live": sum(matched),
             "live_solve_ms": [round(1000 * d) for d in delays]}
    return result, names[order], plans


def _scores(result: SimResult, mask: np.ndarray) -> dict:
    """SLO attainment and mean serving accuracy of the simulated queries ``mask`` selects."""
    from scheduler_sidecar.core.records import Outcome
    from scheduler_sidecar.sim.results import OUTCOME_CODES

    met = result.outcome[mask] == OUTCOME_CODES[Outcome.MET]
    return {"queries": int(mask.sum()), "slo_attainment": float(met.mean()) if met.size else 0.0,
            "mean_serving_accuracy": float(result.accuracy[mask][met].mean()) if met.any() else 0.0}


def hybridserve(args: argparse.Namespace, tmp: Path, progress: Progress) -> dict:
    """See the module notes."""
    from export.cascade_models import build
    from loadtest.loadtest_cli import Replay, replay
    from loadtest.requestlog import RequestLog
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.experiments import hybridserve_demo as demo
    from scheduler_sidecar.live.triton_launcher import TritonServer
    from scheduler_sidecar.server.serve import SidecarServer
    from scheduler_sidecar.systems.hybridserve.family import Family
    from scheduler_sidecar.systems.hybridserve.live import HybridServeConfig, HybridServePlanner
    from scheduler_sidecar.systems.hybridserve.simulation import simulate

    stamp = build(args.build_dir / "hybridserve")
    family = Family.load(stamp)
    config = HybridServeConfig(args.instances, args.rounding, demo.default_slowdown(family))
    progress(f"searching {args.mode}'s cascade (Algorithm 1{', 2' if args.prune else ''})")
    # the sidecar's planner makes the same search from the same options
    planner = HybridServePlanner.from_family(stamp, args.mode, demo.BLS, config, prune=args.prune)
    cascade = planner.point.cascade
    images, labels = family.images("test")
    trace, sample = _cascade_trace(args, tmp / "trace.txt", len(labels))
    profile = demo.cascade_profile(tmp / "profile.json", family, planner.point, config.slowdown)
    # the Triton model the sidecar calls (the BLS, or the largest model alone), then the cascade's
    served = tuple(dict.fromkeys((Profile.load(profile).variants[0].actuation.model, *cascade.models)))
    sidecar_config = tmp / "sidecar.toml"
    sidecar_config.write_text(demo.sidecar_config(stamp, profile, args.mode, args.prune, config, args.slo_ms))
    with TritonServer(repository=demo.write_bls(family, planner.bls_plan), models=[*family.names, demo.BLS],
                      emulate_slowdown=config.slowdown) as triton, \
            SidecarServer(workers=[triton.grpc_url], config=sidecar_config) as sidecar:
        reloads = _logged(sidecar, RELOADED, len(planner.instances))  # the plan's instance counts are in place
        progress(f"replaying {len(sample)} requests through the sidecar and the {' -> '.join(cascade.models)} cascade")
        before = _triton_stats(triton.grpc_url, served)
        client = replay([Replay(demo.MODEL, tmp / "trace.txt", _payloads(tmp / "payloads.npz", images, labels))],
                        sidecar.grpc_url, tmp / "run", slo_ms=args.slo_ms, progress_s=0 if args.json else 5.0)
        after = _triton_stats(triton.grpc_url, served)
        server = sidecar_view(sidecar.http_url)
        (tmp / "sidecar.log").write_text(sidecar.log_path.read_text())
    log = RequestLog.load(tmp / "run" / "requests.csv")
    answers = _sidecar_answers(log)
    server["measured_accuracy"] = answers["measured_accuracy"]
    index = [family.names.index(m) for m in cascade.models]
    replicas = [planner.replicas[m] for m in cascade.models]
    arrival_us = np.round(trace.arrival_s * 1e6).astype(np.int64)
    sim = simulate(family, cascade, replicas, family.predictions("test").subset(index), arrival_us, args.slo_ms,
                   slowdown=config.slowdown, sample=sample)
    return gaps({
        "system": "hybridserve", "queries": len(sample), "live_client": client["summary"], "live_sidecar": server,
        "simulated": {"slo_attainment": 1 - sim.violation_ratio, "measured_accuracy": sim.met_accuracy,
                      "answered": dict(zip(cascade.models, sim.answered)), "answered_early": sim.answered_early},
        "deployment": {"mode": args.mode, "prune": args.prune, "models": list(cascade.models),
                       "thresholds": list(cascade.thresholds), "skip": cascade.skip, "replicas": planner.instances,
                       "bls_instances": demo.BLS_INSTANCES, "slowdown": round(config.slowdown, 1),
                       "slo_ms": args.slo_ms, "rate_qps": round(trace.mean_rate_qps, 1),
                       "reload_ms_live": {m: int(ms) for m, _, ms in reloads}},
        "differences": {
            "client_delay_ms": _client_delay_ms([log]),
            "latency_ms_live": answers["latency_ms"], "latency_ms_simulated": [round(x, 1) for x in sim.latency_ms],
            "sidecar_batch_live": server["mean_batch"],
            "per_model_live": {m: _per_model(before[m], after[m]) for m in served},
            "per_model_simulated": {m: {"mean_batch": round(b, 2), "mean_wait_ms": round(w, 1),
                                        "mean_service_ms": round(t, 1)}
                                    for m, b, w, t in zip(cascade.models, sim.mean_batch, sim.mean_wait_ms,
                                                          sim.mean_service_ms)}},
    }, accuracy="measured_accuracy")


def _cascade_trace(args: argparse.Namespace, path: Path, samples: int) -> tuple[Trace, np.ndarray]:
    """The trace replayed (``--trace``, or gamma at ``--rate-qps``, CV² 4), every request with ``--slo-ms`` and a
    test sample (its payload index, drawn where it has none), saved to ``path``; and each request's sample, as
    the replay resolves it."""
    from loadtest.traces import Trace, gamma, with_payloads, with_slo

    trace = Trace.load(args.trace) if args.trace else gamma(args.rate_qps, 4.0, args.duration_s, seed=0)
    if (trace.payload_index < 0).all():
        trace = with_payloads(trace, samples, seed=1)
    trace = with_slo(trace, args.slo_ms)  # the simulation gives every request one SLO
    trace.save(path)
    return trace, np.where(trace.payload_index >= 0, trace.payload_index, np.arange(len(trace))) % samples


def _logged(sidecar: SidecarServer, pattern: re.Pattern, count: int) -> list[tuple[str, ...]]:
    """Wait until the sidecar has logged ``count`` lines matching ``pattern``; their groups."""
    deadline = time.monotonic() + PLAN_WAIT_S
    while len(found := pattern.findall(sidecar.log_path.read_text())) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sidecar logged {len(found)} of {count} lines like {pattern.pattern!r} in "
                               f"{PLAN_WAIT_S:g} s; last lines:\n{sidecar.log_tail()}")
        time.sleep(0.2)
    return found


def _triton_stats(url: str, models: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each model's Triton statistics so far: requests, batches, the requests' time queued and the batches' time
    running, in ns."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(as_json=True)["model_stats"]
    return {s["name"]: np.array([int(s.get("inference_count", 0)), int(s.get("execution_count", 0)),
                                 int(s["inference_stats"].get("queue", {}).get("ns", 0)),
                                 sum(int(b.get("compute_infer", {}).get("ns", 0)) for b in s.get("batch_stats", []))])
            for s in stats if s["name"] in models}


def _per_model(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """A model's mean batch, a request's mean wait in its queue and a batch's mean time, between two statistics."""
    requests, batches, queue_ns, compute_ns = after - before
    return {"mean_batch": round(requests / max(1, batches), 2),
            "mean_wait_ms": round(queue_ns / max(1, requests) / 1e6, 1),
            "mean_service_ms": round(compute_ns / max(1, batches) / 1e6, 1)}


def _client_delay_ms(logs: list[RequestLog]) -> list[float]:
    """p50 and p99 of what the client's view adds to the sidecar's for the requests answered: the replay's send
    lag and both ways over gRPC (a request is the client's from its scheduled arrival)."""
    delay = np.concatenate([log.column("latency_ms") - log.column("queue_ms") - log.column("service_ms")
                            for log in logs])
    delay = delay[np.isfinite(delay)]
    return [round(float(np.percentile(delay, q)), 1) for q in (50, 99)] if len(delay) else []


def _sidecar_answers(log: RequestLog) -> dict:
    """In the sidecar's view (each answer's queue and service time): the share of the requests it met answered
    right, and the p50 and p99 latency of those answered."""
    latency = log.column("queue_ms") + log.column("service_ms")  # NaN for errors
    met = latency <= log.column("slo_ms")
    answered = latency[np.isfinite(latency)]
    return {"measured_accuracy": float(log.column("correct")[met].mean()) if met.any() else 0.0,
            "latency_ms": [round(float(np.percentile(answered, q)), 1) for q in (50, 99)] if len(answered) else []}


_SYSTEMS: dict[str, Callable[[argparse.Namespace, Path, Progress], dict]] = {
    "superserve": superserve, "ramsis": ramsis, "proteus": proteus, "hybridserve": hybridserve}
