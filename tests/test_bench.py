"""`accscale bench simulator`, `optimal-gap`, `overload-rules`, `overload` and `goodput`, cut down to a few seconds,
and the sidecar bench's accounting of sampled stacks."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from scheduler_sidecar.cli import main
from scheduler_sidecar.experiments import bench, overload_bench
from scheduler_sidecar.systems.superserve import optimal


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_simulator_bench_simulates_exactly_the_queries_asked_for(capsys):
    # a bursty trace of the mean length holds 4911 of these 5000 queries
    out = run_json(capsys, "bench", "simulator", "--queries", "5000", "--json")
    assert out["queries"] == 5000 and 0 < out["trace_seconds"] < 1


def test_optimal_gap_instances_differ_in_shape_rate_and_slo():
    drawn = [bench.gap_instance(0, i, 24, 2) for i in range(6)]
    assert {info["shape"] for _, _, info in drawn} == set(bench.GAP_SHAPES)
    assert len({info["slo_ms"] for _, _, info in drawn}) > 1 and len({info["rate_qps"] for _, _, info in drawn}) == 6
    for arrival, deadline, info in drawn:
        assert len(arrival) == 24 and np.all(np.diff(arrival) >= 0) and np.all(arrival % 1000 == 0)
        assert np.all(deadline - arrival == info["slo_ms"] * 1000)
    assert bench.gap_instance(1, 0, 24, 2)[2] != drawn[0][2]  # the seed changes the instances


def test_optimal_gap_leaves_solves_that_are_not_optimal_out_of_the_ratios(monkeypatch, capsys):
    """A time-limited solve's objective is no optimum: listed and counted, never averaged."""
    solve = optimal.solve_optimal
    calls = []

    def second_one_time_limited(*args, **kwargs):
        result = solve(*args, **kwargs)
        calls.append(result)
        # as HiGHS reports a time limit hit: a worse incumbent, optimality not proven
        return replace(result, status="feasible", objective=result.objective / 2) if len(calls) == 2 else result

    monkeypatch.setattr(optimal, "solve_optimal", second_one_time_limited)
    out = run_json(capsys, "bench", "optimal-gap", "--traces", "3", "--queries", "6", "--workers", "1", "--json")
    assert len(calls) == 3 and all(r.status == "optimal" for r in calls)
    assert out["optimal_instances"] == 2
    assert [x["instance"] for x in out["not_optimal"]] == [1] and out["not_optimal"][0]["status"] == "feasible"
    assert [x["status"] for x in out["instances"]] == ["optimal", "feasible", "optimal"]
    for policy, ratio in out["objective_over_optimum"].items():
        assert 0 < ratio["min"] <= ratio["mean"] <= 1 + 1e-9, policy  # nothing beats a proven optimum


def test_optimal_gap_with_no_optimal_solve_reports_no_ratio(monkeypatch, capsys):
    solve = optimal.solve_optimal
    monkeypatch.setattr(optimal, "solve_optimal",
                        lambda *a, **k: replace(solve(*a, **k), status="no_solution", objective=0.0, batches=()))
    out = run_json(capsys, "bench", "optimal-gap", "--traces", "2", "--queries", "4", "--workers", "1", "--json")
    assert out["optimal_instances"] == 0 and len(out["not_optimal"]) == 2
    assert all(x["objective"] is None for x in out["instances"])
    assert set(out["objective_over_optimum"].values()) == {None}


def test_a_triton_that_ended_is_reported_with_the_line_that_says_why():
    class Ended:
        returncode = -6
        tail = ("I1128 grpc_server.cc] Started GRPCInferenceService\nterminate called after throwing an instance of "
                "'boost::interprocess::lock_exception'\n  what():  boost::interprocess::lock_exception\n"
                "Signal (6) received.\n")

        def log_tail(self, n_lines: int) -> str:
            return self.tail

    assert overload_bench.exit_cause(Ended()) == \
        "signal 6: terminate called after throwing an instance of 'boost::interprocess::lock_exception'"
    earlier = Ended()  # an error logged before the abort does not hide it
    earlier.tail = "E1128 model.cc] error: a request failed\n" + Ended.tail
    assert overload_bench.exit_cause(earlier) == overload_bench.exit_cause(Ended())
    quiet = Ended()
    quiet.returncode, quiet.tail = 1, "I1128 stopped\n"
    assert overload_bench.exit_cause(quiet) == "exit status 1"


@pytest.mark.triton
@pytest.mark.slow
def test_overload_bench_accounts_for_every_request_and_loses_none(capsys):
    out = run_json(capsys, "bench", "overload", "--concurrency", "16", "--capacity-s", "1", "--overload-s", "2",
                   "--recovery-s", "3", "--confirm-s", "1", "--json")
    assert out["capacity_qps"] == out["measured_capacity_qps"] > 0
    for phase in ("overload", "recovery"):
        r = out[phase]
        assert r["sent"] == r["met"] + r["late"] + sum(r["refused"].values()) + r["lost"] > 0
        assert r["lost"] == sum(r["lost_by_cause"].values())
        # explicit ones only; on failure, each code's example message and the Tritons that ended say where it came from
        assert set(r["refused"]) <= {"DEADLINE_EXCEEDED", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}, \
            (r["details"], out.get("triton_exits"))
        assert set(r["details"]) == set(r["refused"]) | {f"lost:{c}" for c in r["lost_by_cause"]}
    # the client overloaded the sidecar, and then kept up with the recovery's half load (a busy machine's client
    # once sent 2.1x capacity of the 3x asked for: still an overload)
    assert out["overload"]["sent_qps"] > 1.5 * out["capacity_qps"]
    assert out["recovery"]["sent_qps"] > 0.8 * out["recovery"]["target_qps"]
    assert out["overload"]["target_qps"] == pytest.approx(3 * out["capacity_qps"], rel=0.01)
    assert out["recovery"]["target_qps"] == pytest.approx(out["capacity_qps"] / 2, rel=0.01)
    # the sidecar counted every request the client got an answer to
    assert sum(out["sidecar_outcomes"].values()) >= out["overload"]["sent"] + out["recovery"]["sent"] - out["lost"]
    # a Triton that aborted under the load (the python backend's one-second stub health check, on a starved machine:
    # seen once in a fresh clone's suite) is down for real and named in triton_exits; no worker that still ran was
    # marked down
    assert out["lost"] == 0 and out["false_worker_down"] == 0 and out["worker_down_samples"] == 0
    assert all(re.match(r"(signal|exit status) -?\d+", cause) for cause in out["triton_exits"].values())
    assert out["peak_rss_mb"] >= out["rss_start_mb"] > 0 and out["queue_samples"] > 0


@pytest.mark.triton
@pytest.mark.slow
def test_goodput_bench_sheds_what_it_cannot_serve_and_accounts_for_every_request(capsys, tmp_path):
    out = run_json(capsys, "bench", "goodput", "--concurrency", "16", "--capacity-s", "1", "--factors", "0.5", "3",
                   "--phase-s", "2", "--plot", str(tmp_path / "g.png"), "--json")
    low, high = out["points"]
    for p in (low, high):
        assert p["sent"] == p["met"] + p["late"] + sum(p["refused"].values()) + p["lost"] > 0 and p["lost"] == 0
        assert p["goodput_over_capacity"] == pytest.approx(p["goodput_qps"] / out["capacity_qps"], abs=1e-3)
    # at 3x the queue ahead soon takes more than the SLO: arrivals are refused at admission, by name
    assert high["refused"].get("RESOURCE_EXHAUSTED", 0) > 0 and high["factor"] == 3
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sampled_stacks_are_shared_among_parts_by_their_innermost_named_frame(tmp_path):
    """py-spy's collapsed stacks: a numpy call inside the driver is the driver's, gRPC's poller thread is gRPC's,
    a callback on the loop with nothing else named is asyncio's; shares add up to 1."""
    from scheduler_sidecar.experiments.sidecar_bench import parts

    stacks = tmp_path / "stacks.txt"
    stacks.write_text(
        "_run_once (asyncio/base_events.py:1936);_run (asyncio/events.py:80);_run (/x/scheduler_sidecar/live/driver.py:3);"
        "percentile (numpy/lib/function_base.py:4) 6\n"
        "_bootstrap (threading.py:1002);run (threading.py:982) 3\n"
        "_run_once (asyncio/base_events.py:1936);_run (asyncio/events.py:80) 1\n")
    assert parts(stacks) == {"driver": 0.6, "grpc (poller thread, calls)": 0.3,
                             "asyncio (with grpc.aio's C callbacks)": 0.1}


def test_the_cpu_of_each_thread_is_read_by_its_name_and_the_main_thread_is_named_main():
    """`bench sidecar`'s split of the sidecar's CPU by thread: work on this thread counts as ``main``'s, and a process
    that is gone has no threads."""
    import os
    import subprocess
    import sys

    from scheduler_sidecar.experiments.sidecar_bench import thread_seconds

    def main_thread() -> tuple[str, float]:
        (found,) = [v for (tid, _), v in thread_seconds(os.getpid()).items() if tid == os.getpid()]
        return found

    name, before = main_thread()
    assert name == "main"
    sum(i * i for i in range(2_000_000))  # some 100 ms of CPU on this thread: ticks of 10 ms count it
    assert main_thread()[1] > before
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert thread_seconds(int(gone.stdout)) == {}


def test_overload_rules_bench_compares_both_rules_with_admission_off_and_on(capsys):
    rows = run_json(capsys, "bench", "overload-rules", "--duration-s", "0.5", "--json")
    assert [(r["rule"], r["admission"]) for r in rows[:4]] == [("serve", False), ("serve", True), ("yield", False),
                                                              ("yield", True)]
    for r in rows:
        assert r["met"] + r["late"] + r["dropped"] + r["rejected"] == r["queries"] > 0
        assert (r["rejected"] > 0) == r["admission"]  # overload: admission refuses some, and only it does
