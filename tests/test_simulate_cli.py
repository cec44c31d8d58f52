"""`accscale simulate` end to end: a trace file, a profile file, one JSON object."""

import json
import subprocess
import sys

import pytest

from loadtest import traces
from scheduler_sidecar.cli import main
from tests.builders import make_profile
from tests.conftest import REPO_ROOT


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_prints_the_summary_and_writes_dynamics(tmp_path, capsys):
    profile, trace = tmp_path / "p.json", tmp_path / "t.txt"
    make_profile(5, tuple(range(1, 17))).save(profile)
    traces.bursty(200, 1500, cv2=4, duration_s=3, seed=2).save(trace)
    out = run_json(capsys, "simulate", "--policy", "slackfit", "--profile", str(profile), "--trace", str(trace),
                   "--workers", "2", "--slo-ms", "30", "--fail-at", "1.5", "--json",
                   "--dynamics-csv", str(tmp_path / "dyn.csv"))
    for key in ("queries", "slo_attainment", "mean_serving_accuracy", "late", "dropped", "sim_seconds"):
        assert key in out
    assert out["queries"] == len(traces.Trace.load(trace))
    rows = (tmp_path / "dyn.csv").read_text().splitlines()
    assert rows[0] == "time_s,ingest_qps,served_accuracy,mean_batch_size,slo_attainment" and len(rows) >= 4


def test_per_query_slos_in_the_trace_override_the_default(tmp_path, capsys):
    profile, trace = tmp_path / "p.json", tmp_path / "t.txt"
    make_profile(3, tuple(range(1, 17))).save(profile)
    traces.with_slo(traces.poisson(100, 2, seed=1), slo_ms=0.5).save(trace)  # below every variant's latency
    out = run_json(capsys, "simulate", "--profile", str(profile), "--trace", str(trace), "--slo-ms", "1000", "--json")
    assert out["rejected"] == out["queries"]  # refused on arrival, as the live sidecar refuses them


def test_clipper_subnet_option_and_bad_input(tmp_path, capsys):
    profile, trace = tmp_path / "p.json", tmp_path / "t.txt"
    make_profile(4, tuple(range(1, 17))).save(profile)
    traces.poisson(300, 2, seed=1).save(trace)
    out = run_json(capsys, "simulate", "--policy", "clipper", "--clipper-subnet", "v1", "--profile", str(profile),
                   "--trace", str(trace), "--json")
    assert abs(out["mean_serving_accuracy"] - 0.72) < 1e-9
    assert main(["simulate", "--policy", "clipper", "--clipper-subnet", "nope", "--profile", str(profile),
                 "--trace", str(trace)]) == 2
    assert "no variant 'nope'" in capsys.readouterr().err


def tiny_optimal_inputs(tmp_path) -> tuple[str, str]:
    profile, trace = tmp_path / "p.json", tmp_path / "t.txt"
    make_profile(4, (1, 2, 4, 8)).save(profile)
    traces.poisson(100, 0.1, seed=3).save(trace)  # about 10 queries
    return str(profile), str(trace)


def test_optimal_reports_the_upper_bound_by_default(tmp_path, capsys):
    profile, trace = tiny_optimal_inputs(tmp_path)
    common = ("simulate", "--policy", "optimal", "--profile", profile, "--trace", trace, "--slo-ms", "12",
              "--json")
    upper = run_json(capsys, *common)
    feasible = run_json(capsys, *common, "--bound", "feasible")
    assert set(upper) >= {"policy", "queries", "met", "late", "dropped", "slo_attainment",
                          "mean_serving_accuracy", "objective", "best_bound", "bound", "solver", "status",
                          "sim_seconds"}
    assert (upper["bound"], upper["status"], upper["late"]) == ("upper", "optimal", 0)
    assert upper["best_bound"] == upper["objective"]
    assert upper["met"] + upper["dropped"] == upper["queries"] == len(traces.Trace.load(trace)) >= 5
    assert feasible["bound"] == "feasible" and feasible["objective"] <= upper["objective"] + 1e-9
    last_arrival_s = float(traces.Trace.load(trace).arrival_s.max())
    assert last_arrival_s <= upper["sim_seconds"] <= last_arrival_s + 0.012


def test_optimal_json_is_all_that_reaches_stdout(tmp_path, capfd):
    """HiGHS prints a banner from C++ (fd 1, not sys.stdout) on the first solve of a process; --json must
    still be one JSON object. capfd sees what C writes; the banner comes only once per process, so a
    fresh interpreter runs the same command too."""
    profile, trace = tiny_optimal_inputs(tmp_path)
    argv = ["simulate", "--policy", "optimal", "--profile", profile, "--trace", trace, "--slo-ms", "12", "--json"]
    assert main(argv) == 0
    captured = capfd.readouterr()
    assert json.loads(captured.out)["status"] == "optimal"
    fresh = subprocess.run([sys.executable, "-m", "scheduler_sidecar.cli", *argv], check=False, capture_output=True,
                           text=True, cwd=REPO_ROOT, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout) == json.loads(captured.out)


@pytest.mark.parametrize("option", [("--fail-at", "0.05"), ("--late-queries", "serve"),
                                    ("--latency-noise", "tail"), ("--dynamics-csv", "dyn.csv")])
def test_optimal_rejects_options_it_would_ignore(tmp_path, capsys, option):
    profile, trace = tiny_optimal_inputs(tmp_path)
    assert main(["simulate", "--policy", "optimal", "--profile", profile, "--trace", trace, *option]) == 2
    assert f"--policy optimal does not support {option[0]}" in capsys.readouterr().err


def test_a_pipeline_run_honours_slo_ms_and_refuses_too_few_workers_in_one_line(tmp_path, capsys):
    """`simulate --pipeline`: the frames' SLO is --slo-ms when given (it was silently ignored), the pipeline's own
    otherwise; fewer workers than tasks is a one-line error, not a traceback."""
    traces.gamma(rate_qps=20, cv2=1, duration_s=2.0, seed=1).save(tmp_path / "frames.txt")
    base = ["simulate", "--pipeline", "traffic-analysis", "--trace", str(tmp_path / "frames.txt"), "--system", "loki",
            "--json"]
    slo = {}
    for extra in ([], ["--slo-ms", "400"]):
        capsys.readouterr()
        assert main([*base, "--workers", "6", *extra]) == 0
        slo[tuple(extra)] = json.loads(capsys.readouterr().out)["slo_ms"]
    assert slo == {(): 250.0, ("--slo-ms", "400"): 400.0}
    # the paper's reading, named: its budget and its check once a query has run
    assert main([*base, "--workers", "6", "--budget", "paper", "--dequeue", "none"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["budget"], summary["dequeue"]) == ("paper", "none")
    assert main([*base, "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("accscale simulate: error: loki: 2 workers cannot hold one replica of each of the pipeline's 3 "
                   "tasks: give it at least 3")
