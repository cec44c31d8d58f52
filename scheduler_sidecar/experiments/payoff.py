"""``accscale bench payoff``: accscale against plain Triton, one bursty trace, the same machine and Triton build.

The trace is sized from the supernet's profile as ``accscale demo``'s is (:mod:`.bursts`): quiet spells at 0.6x what
the most accurate subnet serves within the SLO, three bursts at 1.5, 2 and 2.5x that. Locust replays it against:

- ``triton-most-accurate``: what an operator runs today. Clients call Triton directly; the most accurate Pareto
  subnet is exported as its own model, behind Triton's dynamic batcher with a batch size and queue delay chosen
  for the SLO (``batcher``);
- ``triton-smallest``: the same with the smallest subnet;
- ``accscale-slackfit``: clients call the sidecar, which serves the supernet's subnets under SlackFit;
- ``accscale-clipper`` and ``accscale-infaas``: the same under Clipper+ (the most accurate subnet) and INFaaS.

Each in two settings: ``cpu``, the models computing on this machine's cores beside the sidecar and the client; and
``emulated``, every model padded to ``--slowdown`` times its compute with the extra time asleep, so that most of a
batch's time is the emulated device's, as on a GPU host, where the model's compute does not compete with the
sidecar for cores; the SLO is ``--slowdown`` times longer there too, so the trace asks of the slower device what it
asks of this machine's cores, with 1/slowdown of the requests per second. The two bound what a user will see.
Reported per run: goodput (requests answered within their SLO per second) over the run and in the bursts, SLO
attainment, served (profiled) and measured accuracy, and a timeline of the three with the bursts shaded; then
accscale's goodput in the bursts over plain Triton's, and the accuracy it gave up there and over the run.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export.presets import DEFAULT_BUILD_DIR
from loadtest.loadtest_cli import Replay, replay, save_payloads
from loadtest.report import Run
from loadtest.requestlog import RequestLog
from scheduler_sidecar.core.profile import LatencyCurve
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments import allowance, bursts, demo
from scheduler_sidecar.experiments.deployment import Device, deploy, switch_policy
from scheduler_sidecar.sim.results import markdown_table

SETTINGS = ("cpu", "emulated")
SLOWDOWN = 4.0  # the emulated setting: three quarters of a batch's time is the device's, asleep
POLICIES = ("slackfit", "clipper", "infaas")
# goals of issue 42, on the burst seconds: accscale's goodput over plain Triton's (most accurate), and the most
# served accuracy it may give up for it
GOAL_GOODPUT_RATIO, GOAL_ACCURACY_LOSS_PTS = 1.5, 2.0


@dataclass(frozen=True)
class Batcher:
    """Plain Triton's dynamic batcher for one model, chosen for the SLO: the largest profiled batch ``b`` whose p50
    fits half the SLO (a request may wait for the batch ahead of it, then run in its own), and the queue delay the
    rest of the SLO leaves, ``SLO - 2 * p50(b)``."""

    max_batch_size: int
    queue_delay_us: int

    @classmethod
    def for_slo(cls, curve: LatencyCurve, slo_ms: float) -> Batcher:
        fits = [(b, p50) for b, p50 in zip(curve.batch_sizes, curve.p50_ms) if p50 <= slo_ms / 2]
        if not fits:
            raise ConfigError(f"no batch fits half of the {slo_ms:g} ms SLO; give a larger --slo-ms")
        b, p50 = fits[-1]
        return cls(b, round(1000 * (slo_ms - 2 * p50)))


def register_bench(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("payoff", help="accscale against plain Triton (most accurate and smallest model) on one "
                         "bursty trace, with real and with emulated device compute", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="full", help="the supernet's preset (default: full, the demo's)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where builds are cached (default: "
                   "build)")
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS),
                   help="cpu: real compute; emulated: --slowdown times the compute, asleep (default: both)")
    p.add_argument("--slowdown", type=float, default=SLOWDOWN, help=f"the emulated device's factor (default: "
                   f"{SLOWDOWN:g})")
    p.add_argument("--slo-ms", type=float, default=demo.SLO_MS["cnn"], help="every request's SLO on this machine's "
                   f"compute, --slowdown times it on the emulated device (default: {demo.SLO_MS['cnn']:g})")
    p.add_argument("--duration-s", type=float, default=bursts.SHAPE_S, help="the trace's length per run "
                   f"(default: {bursts.SHAPE_S})")
    p.add_argument("--overhead-us", type=int, help="the allowance every sidecar policy takes off each slack for the "
                   "time outside its view (default: measured before the runs, as the demo does)")
    p.add_argument("--out", type=Path, help="where the runs and the report go (default: runs/payoff-<time>)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.duration_s > 0 or not args.slowdown >= 1 or (args.overhead_us or 0) < 0:
        raise ConfigError("--duration-s must be > 0, --slowdown >= 1 and --overhead-us >= 0")
    out = args.out or Path("runs") / time.strftime("payoff-%Y%m%d-%H%M%S")
    result = payoff(args, out, progress=(lambda msg: None) if args.json else print)
    (out / "payoff.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print("\n" + (out / "summary.md").read_text() + f"\nreport: {out / 'summary.md'}")
    return 0


def payoff(args: argparse.Namespace, out: Path, progress=print) -> dict:
    """Every setting's five runs into ``out``; the result (per setting: the sizing, the batchers, each run's
    figures, the ratios), also written as ``summary.md`` with a timeline per setting."""
    from export.supernets import build  # lazy: onnx, torch

    built = build("cnn", args.preset, args.build_dir)
    best, smallest = built.profile.variants[-1], min(built.profile.variants,
                                                    key=lambda v: next(iter(v.latency.values())).mean_p50_ms)
    out.mkdir(parents=True, exist_ok=True)
    payloads = save_payloads(out / "payloads.npz", built.samples, built.labels)
    settings = {}
    for setting in args.settings:
        slowdown = args.slowdown if setting == "emulated" else 1.0
        settings[setting] = _setting(built, (best, smallest), setting, slowdown, args, out / setting, payloads,
                                     progress)
    write(out, settings)
    return {"slo_ms": args.slo_ms, "settings": settings}


def _setting(built, variants, setting: str, slowdown: float, args: argparse.Namespace, out: Path, payloads: Path,
             progress) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    slo_ms = args.slo_ms * slowdown
    # the emulated device's profile: every latency `slowdown` times this machine's (the models pad to that)
    profile = built.profile.scaled(slowdown)
    profile_path = out / "profile.json"
    profile.save(profile_path)
    repository = out / "repository"
    built.export_supernet(built.pareto, repository)
    plain = {}
    for label, variant in zip(("most-accurate", "smallest"), variants):
        batcher = Batcher.for_slo(profile.variant(variant.id).latency[profile.device_kinds[0]], slo_ms)
        candidate = next(c for c in built.pareto if c.subnet_id == variant.id)
        folder = built.export_static(candidate, repository, max_batch_size=batcher.max_batch_size,
                                     queue_delay_us=batcher.queue_delay_us)
        plain[f"triton-{label}"] = (folder.name, variant, batcher)
    token, runs, counted = secrets.token_hex(8), {}, {}
    models = [built.model_name, *(name for name, _, _ in plain.values())]
    with deploy(repository, models, [Device(slowdown)], profile=profile_path,
                sidecar_args=["--admin-token", token, "--model-name", built.logical_name]) as d:
        (triton,), sidecar = d.tritons, d.sidecar
        # the allowance first (it warms the deployment up too), then the trace sized within the SLO less it
        overhead_us = args.overhead_us
        if overhead_us is None:
            overhead_us = allowance.measure(sidecar, token, built.logical_name,
                                            bursts.size(profile, slo_ms, duration_s=args.duration_s), payloads,
                                            out / "calibration", args.duration_s, progress)
        sizing = bursts.size(profile, slo_ms, duration_s=args.duration_s, allowance_ms=overhead_us / 1000)
        progress(f"\n== {setting}{f' (device {slowdown:g}x this machine)' if slowdown > 1 else ''}: "
                 f"{sizing.describe()}; {bursts.needed_line(profile, sizing)}")
        trace_path = out / "trace.txt"
        bursts.trace(sizing).save(trace_path)
        for name, (model, variant, batcher) in plain.items():
            progress(f"{name}: clients direct to Triton, model {model} (max batch {batcher.max_batch_size}, "
                     f"queue delay {batcher.queue_delay_us / 1000:g} ms)")
            before = _successes(triton.grpc_url, model)
            replay([Replay(model, trace_path, payloads)], triton.grpc_url, out / name, name=name, slo_ms=slo_ms,
                   progress_s=0)
            counted[name] = _successes(triton.grpc_url, model) - before
            _served_by(out / name, variant)
            runs[name] = Run.load(out / name)
        for policy in POLICIES:
            name = f"accscale-{policy}"
            progress(f"{name}: clients through the sidecar, the supernet under {policy}")
            switch_policy(sidecar.http_url, token, built.logical_name, policy, {"overhead_us": overhead_us})
            replay([Replay(built.logical_name, trace_path, payloads)], sidecar.grpc_url, out / name, name=name,
                   slo_ms=slo_ms, progress_s=0)
            runs[name] = Run.load(out / name)
    figures = {name: measure(r.log, sizing) for name, r in runs.items()}
    for name, n in counted.items():
        figures[name]["triton_successes"] = n  # what Triton's statistics counted for the run's model
    plot(runs, sizing, out / "timeline.png", setting)
    base, ours = figures["triton-most-accurate"], figures["accscale-slackfit"]
    ratio = ours["burst_goodput_qps"] / base["burst_goodput_qps"] if base["burst_goodput_qps"] else None
    # accuracy given up against the most accurate subnet, which plain Triton serves: in the bursts (the goal's), and
    # over the run; None where SlackFit met nothing there
    top = variants[0].accuracy
    burst_loss = 100 * (top - ours["burst_served_accuracy"]) if ours["burst_served_accuracy"] is not None else None
    loss = 100 * (top - ours["served_accuracy"])
    return {"slowdown": slowdown, "slo_ms": slo_ms, "sizing": sizing.to_json(),
            "needed": bursts.needed_line(profile, sizing),
            "overhead_us": overhead_us,
            "batchers": {name: vars(b) for name, (_, _, b) in plain.items()}, "runs": figures,
            "burst_goodput_ratio": ratio, "burst_accuracy_loss_pts": burst_loss, "accuracy_loss_pts": loss,
            "goals_met": ratio is not None and ratio >= GOAL_GOODPUT_RATIO and burst_loss is not None
            and burst_loss <= GOAL_ACCURACY_LOSS_PTS}


def _successes(url: str, model: str) -> int:
    """Requests ``model`` has answered successfully, by the Triton at ``url``'s own statistics."""
    import tritonclient.grpc as grpcclient  # lazy: gRPC

    with grpcclient.InferenceServerClient(url) as client:
        (stats,) = client.get_inference_statistics(model).model_stats
        return int(stats.inference_stats.success.count)


def _served_by(folder: Path, variant) -> None:
    """A direct replay's log names no variant (Triton says nothing of one): every answer came from ``variant``."""
    path = folder / "requests.csv"
    log = RequestLog.load(path)
    for e in log.entries:
        if e.status == "ok":
            e.variant, e.accuracy = variant.id, variant.accuracy
    log.save(path)


def measure(log: RequestLog, sizing: bursts.Sizing) -> dict:
    """A run's figures: goodput over the run and in the bursts, attainment (at the client; in the sidecar where
    it counted), served and measured accuracy of what met its SLO."""
    t, met = log.column("scheduled_s"), log.met
    inside = sizing.in_burst(t)
    burst_s = sum(b - a for a, b in sizing.bursts_s)
    summary = log.summary()
    accuracy = log.column("accuracy")
    return {"queries": len(log.entries), "goodput_qps": float(met.sum() / sizing.duration_s),
            "burst_goodput_qps": float((met & inside).sum() / burst_s) if burst_s else 0.0,
            "attainment": summary["slo_attainment"], "burst_attainment": float(met[inside].mean()) if inside.any()
            else None, "server_attainment": summary["server_attainment"],
            "served_accuracy": summary["mean_serving_accuracy"], "measured_accuracy": summary["measured_accuracy"],
            "burst_served_accuracy": float(np.nanmean(accuracy[met & inside])) if (met & inside).any() else None,
            "p99_latency_ms": summary["p99_latency_ms"]}


def plot(runs: dict[str, Run], sizing: bursts.Sizing, path: Path, title: str) -> None:
    """Goodput, attainment and served accuracy per second, every run overlaid, the bursts shaded."""
    from scheduler_sidecar.experiments.plots import pyplot  # lazy: matplotlib

    plt = pyplot()
    panels = (("goodput (met/s)", "goodput"), ("SLO attainment", "slo_attainment"),
              ("served accuracy (%)", "served_accuracy"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 7), sharex=True)
    for i, (name, r) in enumerate(runs.items()):
        line = r.log.timeline(1.0)
        met = np.bincount(np.minimum((r.log.column("scheduled_s")).astype(int), len(line["time_s"]) - 1),
                          r.log.met, len(line["time_s"]))
        series = {"goodput": met, "slo_attainment": line["slo_attainment"],
                  "served_accuracy": 100 * line["served_accuracy"]}
        for ax, (_, key) in zip(axes, panels):
            ax.plot(line["time_s"], series[key], drawstyle="steps-post", label=name, color=f"C{i}",
                    linestyle="-" if name.startswith("accscale") else "--")
    for ax, (label, _) in zip(axes, panels):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for a, b in sizing.bursts_s:
            ax.axvspan(a, b, color="C3", alpha=0.12, linewidth=0)
    axes[0].set_title(f"bench payoff, {title}: bursts shaded")
    axes[-1].legend(fontsize=8)
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, settings: dict) -> None:
    text = ["# accscale bench payoff", ""]
    for setting, r in settings.items():
        sizing = r["sizing"]
        text += [f"## {setting}" + (f" (device {r['slowdown']:g}x this machine's compute)" if r["slowdown"] > 1
                                    else ""), "",
                 f"Trace: quiet {sizing['quiet_qps']:g} q/s, bursts of "
                 + ", ".join(f"{q:g} q/s in {a:g}-{b:g} s"
                             for q, (a, b) in zip(sizing["burst_qps"], sizing["bursts_s"]))
                 + f"; capacity within {sizing['slo_ms']:g} ms less the allowance: most accurate "
                 f"{sizing['most_accurate_qps']:g} q/s, smallest {sizing['smallest_qps']:g} q/s. The sidecar took "
                 f"{r['overhead_us'] / 1000:g} ms off each slack. Plain Triton's batchers, for the whole "
                 "SLO: "
                 + "; ".join(f"{n} max batch {b['max_batch_size']}, delay {b['queue_delay_us'] / 1000:g} ms"
                             for n, b in r["batchers"].items()) + ".", ""]
        keys = list(dict.fromkeys(k for f in r["runs"].values() for k in f))
        rows = [{"run": name, **{k: _cell(k, f.get(k)) for k in keys}} for name, f in r["runs"].items()]
        text += [markdown_table(rows, ["run", *keys]), ""]
        ratio = r["burst_goodput_ratio"]
        loss = r["burst_accuracy_loss_pts"]
        text += [f"In the bursts accscale (SlackFit) met {'-' if ratio is None else f'{ratio:.2f}'}x plain Triton's "
                 f"goodput (most accurate model), {'-' if loss is None else f'{loss:.2f}'} points of served accuracy "
                 f"below it ({r['accuracy_loss_pts']:.2f} over the run): goal {GOAL_GOODPUT_RATIO:g}x at <= "
                 f"{GOAL_ACCURACY_LOSS_PTS:g} points {'met' if r['goals_met'] else 'not met'}.", "",
                 f"![timeline]({setting}/timeline.png)", ""]
    (out / "summary.md").write_text("\n".join(text))


def _cell(key: str, value: object) -> object:
    if value is None:
        return "-"
    if "accuracy" in key:
        return f"{100 * value:.2f}%"
    if isinstance(value, float):
        return f"{value:.1f}" if key.endswith(("_qps", "_ms")) else f"{value:.4f}"
    return value
