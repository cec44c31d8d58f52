"""`accscale simulate` end to end: a trace file, a profile file, one JSON object."""

import json

from loadtest import traces
from scheduler_sidecar.cli import main
from tests.builders import make_profile


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
    assert out["dropped"] == out["queries"]


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
