"""``accscale report RUN...``: compare replay runs in one table and two plots.

Each RUN is a folder written by ``accscale loadtest`` (``run.json`` + ``requests.csv``).
The report folder gets ``timeline.png`` (ingest rate, served accuracy, batch size and SLO
attainment over time, at the client and, dashed, as the sidecar counted it (its own queue and
service time within the SLO), every run overlaid: SuperServe Fig. 8c), ``plane.png`` (SLO
attainment against mean serving accuracy, one point per run: SuperServe Fig. 9),
``summary.md`` and ``report.html`` (self-contained: the PNGs are embedded). Given the trace's bursts (``--burst
START:END``, or the demo's own), the timeline shades them and the report adds, per run and burst, the accuracy it
gave up and the attainment it kept (:func:`trade`).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadtest.requestlog import RequestLog
from scheduler_sidecar.errors import ConfigError

COLUMNS = (("run", "run"), ("queries", "queries"), ("slo_attainment", "SLO attainment"),
           ("server_attainment", "in the sidecar"),
           ("mean_serving_accuracy", "serving acc. (profiled)"), ("measured_accuracy", "measured acc."),
           ("p50_latency_ms", "p50 ms"), ("p99_latency_ms", "p99 ms"), ("unseen_p90_ms", "unseen p90 ms"),
           ("errors", "errors"))
RECOVERED_POINTS = 0.5  # back after a burst once a second's served accuracy is this close to the quiet spell's before
Burst = tuple[float, float]  # [start, end) in seconds of the trace


@dataclass
class Run:
    name: str
    meta: dict
    log: RequestLog

    @classmethod
    def load(cls, folder: Path) -> Run:
        meta_path, log_path = folder / "run.json", folder / "requests.csv"
        if not meta_path.exists() or not log_path.exists():
            raise ConfigError(f"{folder} is not a run folder (run.json and requests.csv, written by accscale loadtest)")
        meta = json.loads(meta_path.read_text())
        return cls(meta.get("name", folder.name), meta, RequestLog.load(log_path))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="table and plots (HTML + Markdown) comparing replay runs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders from accscale loadtest")
    p.add_argument("--out", type=Path, help="report folder (default: report/ beside the first run)")
    p.add_argument("--bin-s", type=float, default=1.0, help="time bin of the timeline (default: 1 s)")
    p.add_argument("--burst", action="append", default=[], metavar="START:END", type=_burst,
                   help="a burst of the trace, in seconds (repeatable): shaded, and summed apart")
    p.set_defaults(func=run)


def rows(runs: list[Run]) -> list[list[str]]:
    def cell(key: str, value: object) -> str:
        if key == "errors":
            return ", ".join(f"{k}: {v}" for k, v in sorted(value.items())) or "0"
        if key in ("slo_attainment", "server_attainment"):
            return "-" if value is None else f"{value:.4f}"
        if key.endswith("accuracy"):
            return f"{100 * value:.2f}%"
        if key.endswith("_ms"):
            return "-" if value is None else f"{value:.1f}"
        return str(value)

    out = []
    for r in runs:
        summary = {"run": r.name, **r.log.summary()}
        out.append([cell(key, summary[key]) for key, _ in COLUMNS])
    return out


def _burst(text: str) -> Burst:
    start, _, end = text.partition(":")
    try:
        burst = float(start), float(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a burst is START:END in seconds, got {text!r}") from None
    if not 0 <= burst[0] < burst[1]:
        raise argparse.ArgumentTypeError(f"a burst needs 0 <= START < END, got {text!r}")
    return burst


def plot_timeline(runs: list[Run], path: Path, bin_s: float, bursts: Sequence[Burst] = ()) -> None:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    panels = (("ingest_qps", "ingest (q/s)", 1.0), ("served_accuracy", "served accuracy (%)", 100.0),
              ("mean_batch_size", "batch size", 1.0), ("slo_attainment", "SLO attainment\n(dashed: in sidecar)", 1.0))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 8.5), sharex=True)
    for i, r in enumerate(runs):
        t = r.log.timeline(bin_s)
        for ax, (key, _, scale) in zip(axes, panels):
            if key == "ingest_qps" and i:
                continue  # one trace: the ingest curve is the same for every run
            ax.plot(t["time_s"], t[key] * scale, label=r.name, drawstyle="steps-post",
                    color="0.3" if key == "ingest_qps" else f"C{i}")
        if r.log.summary()["server_attainment"] is not None:  # dashed: the same, as the sidecar counted it
            axes[-1].plot(t["time_s"], t["server_attainment"], drawstyle="steps-post", color=f"C{i}",
                          linestyle="--", linewidth=0.8)
    for ax, (_, label, _) in zip(axes, panels):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for k, (start, end) in enumerate(bursts):
            ax.axvspan(start, end, color="C3", alpha=0.12, linewidth=0, label="burst" if k == 0 else None)
    axes[1].legend(fontsize=8)
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_plane(runs: list[Run], path: Path) -> None:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in runs:
        s = r.log.summary()
        ax.scatter(100 * s["mean_serving_accuracy"], s["slo_attainment"], s=50)
        ax.annotate(r.name, (100 * s["mean_serving_accuracy"], s["slo_attainment"]), textcoords="offset points",
                    xytext=(5, 5), fontsize=9)
    ax.set_xlabel("mean serving accuracy (%)")
    ax.set_ylabel("SLO attainment")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(runs: list[Run], out: Path, bin_s: float = 1.0, bursts: Sequence[Burst] = (), note: str = "",
          extra: str = "") -> Path:
    """Write the report folder; returns the HTML page's path. ``note``: a paragraph on how the trace was made;
    ``extra``: Markdown after the tables (in the HTML page, as preformatted text)."""
    out.mkdir(parents=True, exist_ok=True)
    plot_timeline(runs, out / "timeline.png", bin_s, bursts)
    plot_plane(runs, out / "plane.png")
    table = rows(runs)
    headers = [h for _, h in COLUMNS]
    # a run's trace: each model's (accscale loadtest), or the run's own (older run folders)
    traces = sorted({m.get("trace", "?") for r in runs for m in r.meta.get("models", {}).values()}
                    | {r.meta["trace"] for r in runs if "trace" in r.meta}) or ["?"]
    md = ["# accscale replay report", "", f"Trace: {', '.join(traces)}", "",
          "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join(row) + " |" for row in table]
    traded = trade(runs, bursts) if bursts else []
    if note:
        md += ["", note]
    if traded:
        md += ["", "In the bursts (shaded in the timeline):", ""] + [f"- {line}" for line in trade_lines(traded)]
        md += ["", "| " + " | ".join(h for _, h in TRADE_COLUMNS) + " |", "|" + "---|" * len(TRADE_COLUMNS)]
        md += ["| " + " | ".join(_trade_cell(k, r[k]) for k, _ in TRADE_COLUMNS) + " |" for r in traded]
    if extra:
        md += ["", extra]
    md += ["", "![timeline](timeline.png)", "", "![attainment vs accuracy](plane.png)", ""]
    (out / "summary.md").write_text("\n".join(md))

    def img(name: str) -> str:
        data = base64.b64encode((out / name).read_bytes()).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    body = "".join(f"<tr>{''.join(f'<td>{html.escape(c)}</td>' for c in row)}</tr>" for row in table)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>accscale replay report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}img{{max-width:100%}}</style></head><body>
<h1>accscale replay report</h1><p>Trace: {html.escape(', '.join(traces))}</p>
<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in headers)}</tr>{body}</table>
{f"<p>{html.escape(note)}</p>" if note else ""}{_trade_html(traded)}
{f"<pre>{html.escape(extra)}</pre>" if extra else ""}
<h2>Over time</h2>{img('timeline.png')}<h2>SLO attainment against serving accuracy</h2>{img('plane.png')}
</body></html>"""
    (out / "report.html").write_text(page)
    return out / "report.html"


TRADE_COLUMNS = (("run", "run"), ("burst", "burst"), ("window_s", "seconds"), ("attainment", "attainment"),
                 ("server_attainment", "in the sidecar"), ("worst_second", "worst second"),
                 ("accuracy_before", "acc. before"), ("accuracy", "acc. in burst"), ("given_up", "given up (pts)"),
                 ("below_best", "before: below the best (pts)"),
                 ("recovered_s", f"back within {RECOVERED_POINTS:g} pts of before (s)"))


def trade(runs: Sequence[Run], bursts: Sequence[Burst]) -> list[dict]:
    """Per run and burst, from the run's own log: attainment in the burst at the client and in the sidecar (None
    for a run the sidecar did not serve), its worst second (counted from the burst's start), the served accuracy
    in the quiet spell before it and in it (points given up: their difference), how far the quiet spell's was
    below the most accurate any run served, and how many seconds after the burst's end the served accuracy was
    back within ``RECOVERED_POINTS`` of the quiet spell's before it (None: not before the next burst or the end).
    ``bursts`` must be in order and not overlap."""
    best = max((float(np.nanmax(r.log.column("accuracy"))) for r in runs
                if np.isfinite(r.log.column("accuracy")).any()), default=float("nan"))
    rows = []
    for r in runs:
        t, met, accuracy = r.log.column("scheduled_s"), r.log.met, r.log.column("accuracy")
        in_sidecar = r.log.met_in_server if r.log.unseen_ms().size else None  # None: not served by the sidecar
        for k, (start, end) in enumerate(bursts):
            inside = (start <= t) & (t < end)
            before = ((bursts[k - 1][1] if k else 0.0) <= t) & (t < start)
            acc_in, acc_before = _mean(accuracy[inside & met]), _mean(accuracy[before & met])
            second = np.floor(t[inside] - start).astype(np.int64)
            sent = np.bincount(second)
            worst = float(np.min(np.bincount(second, met[inside])[sent > 0] / sent[sent > 0])) if second.size else None
            follow = bursts[k + 1][0] if k + 1 < len(bursts) else np.inf
            after = (end <= t) & (t < follow) & met
            back = None
            if acc_before is not None and after.any():
                later = np.floor(t[after] - end).astype(np.int64)
                sums, counts = np.bincount(later, accuracy[after]), np.bincount(later)
                close = [s for s in range(counts.size)
                         if counts[s] and 100 * (acc_before - sums[s] / counts[s]) <= RECOVERED_POINTS]
                back = float(close[0]) + 1.0 if close else None
            rows.append({"run": r.name, "burst": k + 1, "window_s": (start, end),
                         "attainment": _mean(met[inside]),
                         "server_attainment": _mean(in_sidecar[inside]) if in_sidecar is not None else None,
                         "worst_second": worst, "accuracy_before": acc_before, "accuracy": acc_in,
                         "given_up": 100 * (acc_before - acc_in) if acc_in is not None and acc_before is not None
                         else None,
                         "below_best": 100 * (best - acc_before) if acc_before is not None else None,
                         "recovered_s": back})
    return rows


def trade_lines(rows: Sequence[dict]) -> list[str]:
    """One line per run: the accuracy it gave up in the bursts and the attainment it kept ("-": no answer)."""
    def span(values: list, digits: int) -> str:
        values = [round(v, digits) + 0.0 for v in values if v is not None]  # + 0.0: "0.00", not "-0.00"
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}" if values else "-"

    lines = []
    for name in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == name]
        worst = [r["worst_second"] for r in mine if r["worst_second"] is not None]
        back = [r["recovered_s"] for r in mine]
        lines.append(f"{name}: gave up {span([r['given_up'] for r in mine], 2)} points of served accuracy in its "
                     f"{len(mine)} bursts and kept {span([r['attainment'] for r in mine], 3)} of its SLOs there "
                     f"(worst second {f'{min(worst):.3f}' if worst else '-'}); "
                     + (f"back within {RECOVERED_POINTS:g} points of its accuracy before each within {max(back):g} s"
                        if all(b is not None for b in back) else
                        f"not back within {RECOVERED_POINTS:g} points of its accuracy before "
                        f"{sum(b is None for b in back)} of them")
                     + f"; between bursts {span([r['below_best'] for r in mine], 2)} points below the most "
                     "accurate served")
    return lines


def _mean(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _trade_cell(key: str, value: object) -> str:
    if value is None:
        return "-"
    if key == "window_s":
        return f"{value[0]:g}-{value[1]:g}"
    if key in ("accuracy", "accuracy_before"):
        return f"{100 * value:.2f}%"
    if key in ("given_up", "below_best"):
        return f"{round(value, 2) + 0.0:.2f}"  # + 0.0: no "-0.00" for a run that gave up nothing
    if isinstance(value, float):
        return f"{value:.3f}" if key != "recovered_s" else f"{value:g}"
    return str(value)


def _trade_html(rows: list[dict]) -> str:
    if not rows:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in trade_lines(rows))
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in TRADE_COLUMNS)
    body = "".join(f"<tr>{''.join(f'<td>{html.escape(_trade_cell(k, r[k]))}</td>' for k, _ in TRADE_COLUMNS)}</tr>"
                   for r in rows)
    return f"<h2>In the bursts</h2><ul>{items}</ul><table><tr>{head}</tr>{body}</table>"


def summary_table(runs: list[Run]) -> str:
    """The table as aligned text, for a terminal."""
    table = [[h for _, h in COLUMNS], *rows(runs)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in table)


def run(args: argparse.Namespace) -> int:
    runs = [Run.load(folder) for folder in args.runs]
    bursts = sorted(args.burst)
    if any(a[1] > b[0] for a, b in zip(bursts, bursts[1:])):
        raise ConfigError(f"--burst windows overlap: {bursts}")
    page = write(runs, args.out or args.runs[0].parent / "report", args.bin_s, bursts)
    print(summary_table(runs))
    if bursts:
        print("\n" + "\n".join(trade_lines(trade(runs, bursts))))
    print(f"\nreport: {page}")
    return 0
