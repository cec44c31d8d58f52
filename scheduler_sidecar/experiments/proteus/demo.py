"""``accscale demo proteus``: three query types from one pool of emulated heterogeneous devices, live.

Builds (or reuses) three model families (:mod:`export.families`: digits subnets, wine and breast-cancer
MLPs, three variants each), starts four Triton servers as four devices of two emulated kinds (``slow`` and
``slower``: 100 and 300 times this machine; each batch sleeps to that), and the sidecar with a
Proteus planner in front of them. It then sends each query type its own Poisson stream with
``tritonclient`` (gRPC, open loop) at ``--base-qps``, with a burst of ``--burst-qps`` on ``digits``
in the middle third, and prints per window and type what was sent, met, refused and the mean
accuracy served, with what each device held. Written to --out: ``windows.csv`` and ``summary.md``.

The device kinds are emulated (the padding sleeps), so latencies are this machine's times the factor:
the numbers show the mechanism (variants placed, moved and scaled with the load), not any real GPU's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from export.presets import DEFAULT_BUILD_DIR
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.experiments.deployment import Deployment, Device, Request, deploy, open_loop

KINDS = {"slow": 100.0, "slower": 300.0}  # emulated device kinds: how many times slower than this machine
DEVICES = ("slow", "slow", "slower", "slower")
WINDOW_S = 5.0


def register(demos: argparse._SubParsersAction) -> None:
    p = demos.add_parser("proteus", help="Proteus live: three query types, four emulated devices, a burst",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=60.0, help="how long to send (default: 60)")
    p.add_argument("--base-qps", type=float, default=20.0, help="each type's steady rate (default: 20)")
    p.add_argument("--burst-qps", type=float, default=250.0, help="digits' rate in the middle third (default: 250)")
    p.add_argument("--slo-ms", type=float, default=100.0, help="every request's SLO (default: 100)")
    p.add_argument("--period-s", type=float, default=10.0, help="the planner's period (default: 10)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where builds are cached (default: build)")
    p.add_argument("--out", type=Path, help="where the results go (default: runs/proteus-demo-<time>)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = args.out or Path("runs") / time.strftime("proteus-demo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    repository, paths = families(args.build_dir)
    profiles = {q: Profile.load(p) for q, p in paths.items()}
    for q, p in profiles.items():
        print(f"{q:<7} " + ", ".join(f"{v.id} {100 * v.accuracy:.1f}%" for v in p.variants))
    models = [v.actuation.model for p in profiles.values() for v in p.variants]
    with deployment(repository, paths, out, slo_ms=args.slo_ms, period_s=args.period_s) as d:
        print(f"sidecar at {d.sidecar.grpc_url}; devices " + ", ".join(
            f"{t.grpc_url} ({kind})" for t, kind in zip(d.tritons, DEVICES)))
        rows = asyncio.run(_drive(d.sidecar.grpc_url, d.tritons, profiles, models, args))
        (out / "sidecar.log").write_text(d.sidecar.log_path.read_text())
    _write(out, rows, args)
    return 0


def families(build_dir: Path) -> tuple[Path, dict[str, Path]]:
    """The three families, built unless up to date: (their Triton repository, query type -> its profile). Their
    profiles have the emulated KINDS, and this machine's own ``cpu`` (``accscale demo all`` serves them at its
    speed)."""
    from export.families import build  # lazy: onnx, torch

    folder = build_dir / "proteus-demo"
    return folder / "repository", build(folder, {**KINDS, "cpu": 1.0}, build_dir)


def deployment(repository: Path, paths: Mapping[str, Path], out: Path, *, slo_ms: float, period_s: float,
               burst_window: str = "sliding") -> contextlib.AbstractContextManager[Deployment]:
    """A Triton server per device of DEVICES, each started with every variant, and the sidecar with a Proteus
    planner in front of them (its config written to ``out/sidecar.toml``), each query type a logical model."""
    models = [v.actuation.model for p in paths.values() for v in Profile.load(p).variants]
    return deploy(repository, models, [Device(KINDS[kind], kind) for kind in DEVICES],
                  config=_config(paths, slo_ms, period_s, burst_window), config_path=out / "sidecar.toml")


def samples(query_type: str) -> tuple[np.ndarray, np.ndarray]:
    """A query type's held-out inputs and their labels: what its clients send."""
    from export import data  # lazy: torch
    from export.families import tabular  # lazy: onnx, torch

    if query_type == "digits":
        heldout = data.load(16)["heldout"]
        return heldout.images, heldout.labels
    _, _, x, y = tabular(query_type)
    return x, y


def _config(paths: Mapping[str, Path], slo_ms: float, period_s: float, burst_window: str = "sliding") -> str:
    models = "".join(f'[[models]]\nname = "{q}"\nprofile = "{p}"\npolicy = "proteus"\n'
                     f'default_slo_us = {round(slo_ms * 1000)}\nlatency_calibration = false\n'
                     for q, p in paths.items())
    return f'[planner]\nkind = "proteus"\nperiod_s = {period_s}\nburst_window = "{burst_window}"\n{models}'


def rate_qps(query_type: str, t_s: float, duration_s: float, base_qps: float, burst_qps: float) -> float:
    """The demo's load at ``t_s``: every type at ``base_qps``, digits at ``burst_qps`` in the middle third."""
    burst = query_type == "digits" and duration_s / 3 <= t_s < 2 * duration_s / 3
    return burst_qps if burst else base_qps


def schedule(profiles, args) -> tuple[list[float], list[str]]:
    """Each query type's Poisson stream at its rate (:func:`rate_qps`), merged: (times, query types)."""
    sent = []
    for seed, q in enumerate(profiles):
        rng, t = np.random.default_rng(seed), 0.0
        while True:
            t += rng.exponential(1 / rate_qps(q, t, args.duration_s, args.base_qps, args.burst_qps))
            if t >= args.duration_s:
                break
            sent.append((t, q))
    sent.sort()
    return [t for t, _ in sent], [q for _, q in sent]


async def _drive(url: str, tritons, profiles, models, args) -> list[dict]:
    inputs = {q: samples(q)[0] for q in profiles}
    accuracy = {v.id: v.accuracy for p in profiles.values() for v in p.variants}
    times, types = schedule(profiles, args)
    slo = {"slo_us": round(args.slo_ms * 1000)}

    def request(i: int) -> Request:
        x = inputs[types[i]]
        return Request(types[i], {"INPUT": x[i % len(x)][None].astype(np.float32)}, slo)

    answers, held = await asyncio.gather(open_loop(url, times, request), _watch(tritons, models, args.duration_s))
    stats: dict[tuple[int, str], dict] = defaultdict(lambda: {"sent": 0, "met": 0, "late": 0, "refused": 0,
                                                              "accuracy": 0.0})
    for a in answers:
        s = stats[int(a.sent_s // WINDOW_S), types[a.index]]
        s["sent"] += 1
        if a.result is None:
            s["refused"] += 1
        elif a.latency_s > args.slo_ms / 1000:
            s["late"] += 1
        else:
            s["met"] += 1
            s["accuracy"] += accuracy[a.result.get_response().parameters["variant"].string_param]
    rows = []
    for (window, q), s in sorted(stats.items()):
        rows.append({"window_s": window * WINDOW_S, "type": q, "sent": s["sent"], "met": s["met"], "late": s["late"],
                     "refused": s["refused"], "accuracy": round(100 * s["accuracy"] / s["met"], 2) if s["met"] else "",
                     "devices": held.get(window, "")})
    return rows


async def _watch(tritons, models, duration_s: float) -> dict[int, str]:
    """What each device holds, once per window."""
    import tritonclient.grpc.aio as aioclient  # gRPC: not for `accscale --help`

    held: dict[int, str] = {}
    for window in range(int(duration_s // WINDOW_S) + 1):
        names = []
        for t in tritons:
            async with aioclient.InferenceServerClient(t.grpc_url) as c:
                ready = [m for m in models if await c.is_model_ready(m)]
            names.append("+".join(ready) or "-")
        held[window] = " | ".join(names)
        await asyncio.sleep(WINDOW_S)
    return held


def _write(out: Path, rows: list[dict], args) -> None:
    with open(out / "windows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| window (s) | type | sent | met | late | refused | accuracy (%) | devices |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['window_s']:g} | {r['type']} | {r['sent']} | {r['met']} | {r['late']} | {r['refused']} | "
              f"{r['accuracy']} | {r['devices'] if r['type'] == 'cancer' else ''} |" for r in rows]
    total = {k: sum(r[k] for r in rows) for k in ("sent", "met", "late", "refused")}
    summary = (f"# Proteus live demo\n\n{args.base_qps:g} q/s per type, {args.burst_qps:g} q/s of digits in the "
               f"middle third, SLO {args.slo_ms:g} ms, {args.duration_s:g} s; devices {', '.join(DEVICES)}.\n\n"
               f"Sent {total['sent']}, met {total['met']}, late {total['late']}, refused {total['refused']}.\n\n"
               + "\n".join(lines) + "\n")
    (out / "summary.md").write_text(summary)
    print(summary)
