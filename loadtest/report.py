"""``accscale report RUN...``: compare replay runs in one table and two plots.

Each RUN is a folder written by ``accscale loadtest`` (``run.json`` + ``requests.csv``).
The report folder gets ``timeline.png`` (ingest rate, served accuracy, batch size and SLO
attainment over time, at the client and, dashed, as the sidecar counted it (its own queue and
service time within the SLO), every run overlaid: SuperServe Fig. 8c), ``plane.png`` (SLO
attainment against mean serving accuracy, one point per run: SuperServe Fig. 9),
``summary.md`` and ``report.html`` (self-contained: the PNGs are embedded).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

from loadtest.requestlog import RequestLog
from scheduler_sidecar.errors import ConfigError

COLUMNS = (("run", "run"), ("queries", "queries"), ("slo_attainment", "SLO attainment"),
           ("server_attainment", "in the sidecar"),
           ("mean_serving_accuracy", "serving acc. (profiled)"), ("measured_accuracy", "measured acc."),
           ("p50_latency_ms", "p50 ms"), ("p99_latency_ms", "p99 ms"), ("unseen_p90_ms", "unseen p90 ms"),
           ("errors", "errors"))


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


def plot_timeline(runs: list[Run], path: Path, bin_s: float) -> None:
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


def write(runs: list[Run], out: Path, bin_s: float = 1.0) -> Path:
    """Write the report folder; returns the HTML page's path."""
    out.mkdir(parents=True, exist_ok=True)
    plot_timeline(runs, out / "timeline.png", bin_s)
    plot_plane(runs, out / "plane.png")
    table = rows(runs)
    headers = [h for _, h in COLUMNS]
    traces = sorted({r.meta.get("trace", "?") for r in runs})
    md = ["# accscale replay report", "", f"Trace: {', '.join(traces)}", "",
          "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join(row) + " |" for row in table]
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
<h2>Over time</h2>{img('timeline.png')}<h2>SLO attainment against serving accuracy</h2>{img('plane.png')}
</body></html>"""
    (out / "report.html").write_text(page)
    return out / "report.html"


def summary_table(runs: list[Run]) -> str:
    """The table as aligned text, for a terminal."""
    table = [[h for _, h in COLUMNS], *rows(runs)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in table)


def run(args: argparse.Namespace) -> int:
    runs = [Run.load(folder) for folder in args.runs]
    page = write(runs, args.out or args.runs[0].parent / "report", args.bin_s)
    print(summary_table(runs))
    print(f"\nreport: {page}")
    return 0
