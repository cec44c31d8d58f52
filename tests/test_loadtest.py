"""Open-loop Locust replay, its per-request log, the report, the fidelity command and the demo, on real servers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadtest import report
from loadtest.loadtest_cli import loadtest
from loadtest.requestlog import Entry, RequestLog
from loadtest.traces import Trace, constant, with_slo
from scheduler_sidecar.cli import main
from scheduler_sidecar.experiments.bursts import capacity_qps
from scheduler_sidecar.processes.sidecar import SidecarServer
from scheduler_sidecar.processes.triton_launcher import TritonServer
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.triton, pytest.mark.slow]

HELD = 12  # requests in the trace; the server answers none of them before all have arrived
# Triton's dynamic batcher is the barrier: it holds requests until HELD are queued (the preferred batch size)
# or the oldest has waited a minute, and the model records the size of each batch it gets. A closed-loop
# client, which sends a request only after the previous answer, would wait on its first request until its
# timeout (SLO + grace) or the batcher's minute, and batches would hold one request each.
HOLDING_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.batches_file = json.loads(args["model_config"])["parameters"]["batches_file"]["string_value"]

    def execute(self, requests):
        with open(self.batches_file, "a") as f:
            f.write(f"{len(requests)}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("LOGITS", np.zeros((1, 10), np.float32))])
                for _ in requests]
'''
HOLDING_CONFIG = '''name: "slow"
backend: "python"
max_batch_size: %(held)d
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1, 16, 16 ] } ]
output [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ %(held)d ] max_queue_delay_microseconds: 60000000 }
parameters { key: "batches_file" value: { string_value: "%(batches_file)s" } }
'''


def test_replay_keeps_the_arrival_schedule_against_a_slow_server(tmp_path):
    """Open loop: every request of the trace leaves although no answer comes until the last has arrived."""
    (tmp_path / "repo" / "slow" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "slow" / "1" / "model.py").write_text(HOLDING_MODEL)
    batches_file = tmp_path / "batches.txt"
    (tmp_path / "repo" / "slow" / "config.pbtxt").write_text(
        HOLDING_CONFIG % {"held": HELD, "batches_file": batches_file})
    trace_path = tmp_path / "trace.txt"
    with_slo(constant(50.0, HELD / 50.0), 20_000.0).save(trace_path)  # HELD requests, 20 ms apart
    with TritonServer(repository=tmp_path / "repo") as triton:
        loadtest(trace_path, triton.grpc_url, tmp_path / "run", model="slow", progress_s=0)
    log = RequestLog.load(tmp_path / "run" / "requests.csv")
    assert [e.status for e in log.entries] == ["ok"] * HELD
    assert batches_file.read_text().split() == [str(HELD)]  # the server held them all, then answered at once
    sent = log.column("scheduled_s") + log.column("lag_ms") / 1e3
    answered = log.column("scheduled_s") + log.column("latency_ms") / 1e3
    # a closed-loop client would wait for each answer; open loop, every request leaves before the first answer
    assert sent.max() < answered.min()


@pytest.fixture(scope="module")
def recorded_run(fast_build, triton, tmp_path_factory) -> Path:
    """A replay through the sidecar in which every fourth request asks for an impossible SLO, and the others for one
    that no load on the machine makes them miss (10 s: at 500 ms, a suite loading both cores timed all 30 out)."""
    folder = tmp_path_factory.mktemp("runs")
    base = constant(40.0, 1.0)
    slo = np.where(np.arange(len(base)) % 4 == 0, 0.001, 10_000.0)
    Trace(base.arrival_s, slo, base.payload_index, base.duration_s, "mixed").save(folder / "trace.txt")
    with SidecarServer(workers=[triton.grpc_url], profile=fast_build.profile_path) as sidecar:
        loadtest(folder / "trace.txt", sidecar.grpc_url, folder / "slackfit", name="slackfit", progress_s=0)
    return folder / "slackfit"


def test_request_log_has_one_line_per_trace_entry_errors_included(recorded_run):
    log = RequestLog.load(recorded_run / "requests.csv")
    assert [e.index for e in log.entries] == list(range(40))
    impossible = [e for e in log.entries if e.index % 4 == 0]
    assert {e.status for e in impossible} == {"StatusCode.INVALID_ARGUMENT"}
    served = [e for e in log.entries if e.index % 4]
    assert all(e.status == "ok" and e.variant and e.batch_size >= 1 and e.correct in (0.0, 1.0) for e in served)
    run = json.loads((recorded_run / "run.json").read_text())
    assert run["summary"]["queries"] == 40 and run["summary"]["errors"] == {"StatusCode.INVALID_ARGUMENT": 10}
    assert (recorded_run / "locust_stats.csv").exists() and (recorded_run / "locust.html").exists()


def test_report_has_the_table_and_every_plot(recorded_run, tmp_path):
    runs = [report.Run.load(recorded_run)]
    page = report.write(runs, tmp_path / "report")
    text = page.read_text()
    assert "<table>" in text and "slackfit" in text and text.count("data:image/png;base64,") == 2
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "| run | queries | SLO attainment | in the sidecar |" in summary and "| slackfit | 40 | 0.7" in summary
    for png in ("timeline.png", "plane.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="not a run folder"):
        report.Run.load(tmp_path)


@pytest.mark.parametrize("system", ["superserve", "ramsis"])
def test_fidelity_command_compares_live_and_simulated(fast_build, tmp_path, capsys, system):
    """ramsis on a given trace; superserve at half its planned capacity on an emulated device 50x slower (the
    most accurate subnet's rate within SLO/2, from the profile the sidecar plans with)."""
    trace = tmp_path / "trace.txt"
    constant(30.0, 2.0).save(trace)
    load = ["--trace", str(trace)] if system == "ramsis" else ["--load", "0.5", "--slowdown", "50", "--duration-s", "2"]
    assert main(["bench", "fidelity", "--system", system, "--profile", str(fast_build.profile_path), "--repository",
                 str(fast_build.repository), "--slo-ms", "200", "--json", *load]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["system"] == system and result["policy"] == ("slackfit" if system == "superserve" else "ramsis")
    n = result["queries"]
    assert n == result["live_client"]["queries"] == result["live_sidecar"]["queries"]
    assert result["simulated"]["met"] + result["simulated"]["late"] + result["simulated"]["dropped"] == n
    if system == "ramsis":
        assert n == 60
    else:
        best = max(fast_build.profile.variants, key=lambda v: v.accuracy)
        capacity = capacity_qps(best.latency[fast_build.profile.device_kinds[0]].scaled(50), 200.0)
        assert result["capacity_qps"] == pytest.approx(capacity, abs=0.1) and result["slowdown"] == 50
        assert n == pytest.approx(0.5 * capacity * 2, rel=0.5)
    assert_gaps_of_both_sides(result)
    # beside it, the simulation whose batches took what the live ones did (each over its p50)
    measured = result["with_live_batch_times"]
    assert len(measured["batch_time_over_p50"]) == 3 and measured["batch_time_over_p50"][0] > 0
    assert_gaps_of_both_sides(measured)


def test_fidelity_proteus_takes_over_what_the_live_run_measured(capsys):
    """The Proteus demo's deployment, a 6-second trace per query type replayed at once: every side counts every
    query, per model too, the simulation plans as often as the sidecar logged, and the gaps are the two sides'."""
    assert main(["bench", "fidelity", "--system", "proteus", "--build-dir", str(REPO_ROOT / "build"),
                 "--duration-s", "6", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    n = result["queries"]
    assert result["live_client"]["queries"] == result["live_sidecar"]["queries"] == n > 0
    assert sum(result["simulated"][k] for k in ("met", "late", "dropped", "rejected")) == n
    assert set(result["by_model"]) == {"digits", "wine", "cancer"}
    for side in ("live_sidecar", "simulated"):
        assert sum(m[side]["queries"] for m in result["by_model"].values()) == n
    plans = result["deployment"]["plans"]
    assert plans["live"] == len(plans["live_solve_ms"]) >= 1 and plans["simulated"] >= plans["simulated_when_live"]
    assert set(result["deployment"]["workers"].values()) == {"slow", "slower"}
    assert_gaps_of_both_sides(result)


def test_fidelity_hybridserve_scores_the_same_samples_on_both_sides(capsys, hybridserve_family):
    """HybridServe's cascade served staged behind the sidecar, 4 seconds at 100 requests/s on 8 model instances
    (each a process to start; the demo's 16 change no shape asserted): accuracy is the answers' worth on both sides,
    the simulation runs the deployed cascade's models, and the gaps are the two sides'."""
    from scheduler_sidecar.experiments.hybridserve.demo import default_slowdown  # lazy: the family's own

    assert main(["bench", "fidelity", "--system", "hybridserve", "--build-dir", str(hybridserve_family.folder.parent),
                 "--duration-s", "4", "--rate-qps", "100", "--instances", "8", "--slowdown", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # --slowdown: the demo's emulated device, twice as slow; beside the cost model's capacity, the most the first
    # model's replicas serve, which every request reaches (which of the two is larger is the measured profile's)
    deployment = result["deployment"]
    assert deployment["slowdown"] == pytest.approx(2 * default_slowdown(hybridserve_family), abs=0.1)
    assert deployment["first_model_ceiling_qps"] > 0 and deployment["capacity_qps"] > 0
    assert result["accuracy_metric"] == "measured_accuracy" and result["deployment"]["serving"] == "staged"
    # each client request is counted once by the sidecar, at the model that answered it, escalations left out
    assert result["live_client"]["queries"] == result["live_sidecar"]["queries"] == result["queries"] > 0
    models = result["deployment"]["models"]
    assert set(models) <= set(result["deployment"]["replicas"]) == set(hybridserve_family.names)
    assert list(result["differences"]["per_model_simulated"]) == models
    assert list(result["differences"]["per_model_live"]) == models  # Triton ran the cascade's models, no BLS
    # the first model is the one clients call; an escalation is a query of the next model's logical model
    assert set(result["live_sidecar"]["by_model"]) <= {"digits-cascade", *models[1:]}
    # latency by the model that answered: the answer names it
    live, simulated = (result["differences"][f"latency_ms_by_model_{side}"] for side in ("live", "simulated"))
    assert models[0] in live and set(live) <= set(models) and list(simulated) == models
    assert all(p50 <= p99 for p50, p99 in live.values())
    assert_gaps_of_both_sides(result)
    assert 0 <= result["with_live_batch_times"]["simulated"]["slo_attainment"] <= 1


def assert_gaps_of_both_sides(result: dict) -> None:
    """Each gap is the live view's score less the simulated one's, in points (rounded to 0.01)."""
    for side in ("client", "sidecar"):
        for what, key in (("attainment", "slo_attainment"), ("accuracy", result["accuracy_metric"])):
            assert result[f"{what}_gap_pts"][side] == pytest.approx(
                100 * (result[f"live_{side}"][key] - result["simulated"][key]), abs=0.01)


def test_demo_in_reduced_form(tmp_path, capsys):
    """`make demo`, cut down: fast preset, a 4-second trace per policy, on a device emulated 20x slower (the fast
    build's own capacity would size a trace of thousands of requests a second)."""
    out = tmp_path / "demo"
    assert main(["demo", "--preset", "fast", "--build-dir", str(REPO_ROOT / "build"), "--repository",
                 str(tmp_path / "repository"), "--duration-s", "4", "--emulate-slowdown", "20", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out / 'report' / 'report.html'}" in printed
    summary = (out / "report" / "summary.md").read_text()
    for policy in ("slackfit", "clipper", "infaas"):
        assert f"| {policy} |" in summary
        assert RequestLog.load(out / policy / "requests.csv").summary()["queries"] == len(Trace.load(out / "trace.txt"))
        assert printed.count(f"| {policy} |") == 1  # its line in the simulated-against-live table
    # the trace was sized from the profile, its bursts shaded and summed apart, one line and three rows per policy
    assert "capacity within 720 ms" in printed and "In the bursts" in summary
    assert sum(line.startswith(("slackfit: gave up", "clipper: gave up", "infaas: gave up"))
               for line in printed.splitlines()) == 3


def test_attainment_in_the_sidecar_counts_its_own_queue_and_service_time():
    """Answered at the client after the SLO but within it in the sidecar: met there only; an error: met nowhere;
    the time outside the sidecar is the client's latency less the sidecar's; a log with no sidecar times (direct to
    Triton) has neither."""
    entries = [Entry(0, 0.0, 10.0, latency_ms=8.0, status="ok", queue_ms=2.0, service_ms=5.0, correct=1.0),
               Entry(1, 0.0, 10.0, latency_ms=14.0, status="ok", queue_ms=3.0, service_ms=6.0, correct=1.0),
               Entry(2, 0.0, 10.0, status="StatusCode.RESOURCE_EXHAUSTED")]
    summary = RequestLog(entries).summary()
    assert summary["slo_attainment"] == pytest.approx(1 / 3) and summary["server_attainment"] == pytest.approx(2 / 3)
    assert summary["unseen_p90_ms"] == pytest.approx(1.0 + 0.9 * (5.0 - 1.0))  # outside the sidecar: 1 and 5 ms
    direct = RequestLog([Entry(0, 0.0, 10.0, latency_ms=8.0, status="ok", correct=1.0)])
    assert direct.summary()["server_attainment"] is None and direct.summary()["unseen_p90_ms"] is None


def test_payoff_bench_replays_one_trace_against_plain_triton_and_the_sidecar(tmp_path, capsys):
    """`bench payoff`, cut down: fast preset, the emulated setting (20x: about 100 requests a second), a 4-second
    trace, a given allowance (the demo's test measures one). Every run replays the whole trace; the plain Triton
    runs go to Triton itself, which serves them with their one model."""
    out = tmp_path / "payoff"
    assert main(["bench", "payoff", "--preset", "fast", "--build-dir", str(REPO_ROOT / "build"), "--settings",
                 "emulated", "--slowdown", "20", "--duration-s", "4", "--overhead-us", "5000", "--out", str(out),
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["settings"]["emulated"]
    queries = len(Trace.load(out / "emulated" / "trace.txt"))
    runs = result["runs"]
    assert sorted(runs) == ["accscale-clipper", "accscale-infaas", "accscale-slackfit", "triton-most-accurate",
                            "triton-smallest"]
    assert {r["queries"] for r in runs.values()} == {queries}
    # the plain runs went to Triton itself (no answer carried the sidecar's times), the others through the sidecar
    for name in runs:
        log = RequestLog.load(out / "emulated" / name / "requests.csv")
        assert any(e.status == "ok" for e in log.entries)
        assert (runs[name]["server_attainment"] is None) == name.startswith("triton-")
    # Triton served each plain run with its one model: its own statistics count every request answered there (and
    # any the client gave up on before Triton answered)
    for name in ("triton-most-accurate", "triton-smallest"):
        answered = sum(e.status == "ok" for e in RequestLog.load(out / "emulated" / name / "requests.csv").entries)
        assert answered <= runs[name]["triton_successes"] <= queries
    assert result["overhead_us"] == 5000 and result["sizing"]["allowance_ms"] == 5.0
    assert (out / "emulated" / "timeline.png").stat().st_size > 0 and "## emulated" in (out / "summary.md").read_text()
