"""Arrival traces: the file format, its validation, the seeded generators and `accscale trace`."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest import traces
from loadtest.traces import Trace, TraceError
from scheduler_sidecar.cli import main

GENERATORS = {
    "poisson": lambda seed: traces.poisson(500, 10, seed),
    "gamma": lambda seed: traces.gamma(500, 4, 10, seed),
    "bursty": lambda seed: traces.bursty(100, 400, 8, 10, seed),
    "time_varying": lambda seed: traces.time_varying(200, 800, 300, 2, 10, 3, seed),
    "compress": lambda seed: traces.compress(traces.load_series("twitter-ramsis"), 10, 10, 500, seed),
    "compress_uniform": lambda seed: traces.compress([1, 5, 2], 60, 10, 500, seed, within_bin="uniform"),
}


def _empirical_cv2(arrival_s: np.ndarray) -> float:
    gaps_s = np.diff(arrival_s)
    return float(gaps_s.var() / gaps_s.mean() ** 2)


def test_round_trip_keeps_columns_and_metadata(tmp_path):
    """save() then load() gives back every column, absent values, name, duration and comment."""
    trace = Trace.from_arrivals(np.array([0.0, 0.25, 0.25, 1.5]), 2.0,
                                slo_ms=np.array([36.0, np.nan, 12.5, np.nan]),
                                payload_index=np.array([3, 7, -1, -1]), name="tiny",
                                comment="generator: hand-made\nsecond line")
    path = tmp_path / "t.txt"
    trace.save(path)
    loaded = Trace.load(path)
    np.testing.assert_array_equal(loaded.arrival_s, trace.arrival_s)
    np.testing.assert_array_equal(loaded.slo_ms, trace.slo_ms)
    np.testing.assert_array_equal(loaded.payload_index, trace.payload_index)
    assert (loaded.name, loaded.duration_s, loaded.comment) == ("tiny", 2.0, trace.comment)
    assert "0.25,,7" in path.read_text() and path.read_text().splitlines()[-1] == "1.5"


def test_generated_trace_round_trips_exactly(tmp_path):
    """Generated arrivals (microsecond-rounded) read back bit for bit, and the header names the generator."""
    trace = traces.with_payloads(traces.with_slo(traces.bursty(100, 400, 8, 5, seed=3), 36), 10, seed=3)
    trace.save(tmp_path / "b.txt")
    loaded = Trace.load(tmp_path / "b.txt")
    np.testing.assert_array_equal(loaded.arrival_s, trace.arrival_s)
    np.testing.assert_array_equal(loaded.slo_ms, np.full(len(trace), 36.0))
    np.testing.assert_array_equal(loaded.payload_index, trace.payload_index)
    assert "bursty(base_qps=100, variant_qps=400, cv2=8, duration_s=5, seed=3)" in loaded.comment
    assert loaded.comment.endswith("with_slo(slo_ms=36)\nwith_payloads(n_payloads=10, seed=3)")


def test_comments_blank_lines_and_optional_fields_are_read():
    """Whole-line and trailing comments and blank lines are skipped; missing fields mean absent."""
    text = "# a hand-written trace\n\n0.5   # first\n  \n1.0,20\n# middle\n1.0,,4\n2,30,5 # last\n"
    trace = Trace.from_text(text, default_name="hand")
    np.testing.assert_array_equal(trace.arrival_s, [0.5, 1.0, 1.0, 2.0])
    np.testing.assert_array_equal(trace.slo_ms, [np.nan, 20.0, np.nan, 30.0])
    np.testing.assert_array_equal(trace.payload_index, [-1, -1, 4, 5])
    assert (trace.name, trace.comment, trace.duration_s) == ("hand", "a hand-written trace", 2.0)


def test_empty_trace_loads():
    """A file with only comments is an empty trace of zero duration."""
    trace = Trace.from_text("# nothing yet\n")
    assert len(trace) == 0 and trace.duration_s == 0.0 and trace.rate_per_bin(1.0).size == 0


@pytest.mark.parametrize(("body", "line", "message"), [
    ("0.1\n0.2,abc\n", 3, "slo_ms 'abc' is not a number"),
    ("0.1\nfast\n", 3, "arrival_s 'fast' is not a number"),
    ("0.1,36,2,9\n", 2, "4 fields"),
    ("0.5\n\n0.4\n", 4, "arrival_s 0.4 is before the previous line's 0.5"),
    ("-0.1\n", 2, "arrival_s -0.1 is negative"),
    ("0.1,-5\n", 2, "slo_ms -5.0 must be > 0"),
    ("0.1,36\n0.2,36,-1\n", 3, "payload_index -1 is negative"),
    ("0.1,36,1.5\n", 2, "payload_index '1.5' is not an integer"),
    ("0.1,inf\n", 2, "slo_ms inf is not finite"),
    (",36\n", 2, "arrival_s is missing"),
])
def test_validation_errors_name_file_and_line(tmp_path, body, line, message):
    """Each malformed line is reported as `file:line: what is wrong`."""
    path = tmp_path / "bad.txt"
    path.write_text("# header\n" + body)
    with pytest.raises(TraceError) as error:
        Trace.load(path)
    assert str(error.value).startswith(f"{path}:{line}: ")
    assert message in str(error.value)


def test_header_duration_before_last_arrival_is_an_error():
    """A header duration that ends before the last arrival is rejected."""
    with pytest.raises(TraceError, match="duration_s 1.0 is before the last arrival 2.0"):
        Trace.from_text("# duration_s: 1.0\n0.5\n2.0\n")


def test_rate_per_bin_counts_a_short_last_bin_by_its_width():
    """Rates are counts over bin widths; the last, partial bin is divided by its own width."""
    trace = Trace.from_arrivals(np.array([0.1, 0.2, 0.9, 1.1, 2.2]), 2.5)
    np.testing.assert_allclose(trace.rate_per_bin(1.0), [3.0, 1.0, 2.0])
    assert trace.mean_rate_qps == pytest.approx(2.0)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_generators_are_deterministic_under_a_seed(kind):
    """The same seed gives the same arrivals; another seed gives different ones."""
    make = GENERATORS[kind]
    first, again, other = make(1), make(1), make(2)
    np.testing.assert_array_equal(first.arrival_s, again.arrival_s)
    assert len(first) != len(other) or not np.array_equal(first.arrival_s, other.arrival_s)
    assert np.all(np.diff(first.arrival_s) >= 0) and first.arrival_s[-1] <= first.duration_s


def test_constant_spacing():
    """constant() puts rate x duration arrivals exactly 1/rate apart, starting at 0."""
    trace = traces.constant(10, 2)
    assert len(trace) == 20
    np.testing.assert_allclose(np.diff(trace.arrival_s), 0.1)


@pytest.mark.parametrize("cv2", [0.0, 1.0, 4.0])
def test_gamma_mean_rate_and_cv2_match_targets(cv2):
    """On a long trace the mean rate is within 2% and the gaps' CV² within 5% of the targets."""
    trace = traces.gamma(2000, cv2, 100, seed=7)
    assert trace.mean_rate_qps == pytest.approx(2000, rel=0.02)
    assert _empirical_cv2(trace.arrival_s) == pytest.approx(cv2, rel=0.05, abs=1e-3)


def test_bursty_mean_rate_is_the_sum_of_both_streams():
    """The bursty trace's mean rate is base + variant, and it is burstier than Poisson."""
    trace = traces.bursty(1500, 5500, 8, 60, seed=1)
    assert trace.mean_rate_qps == pytest.approx(7000, rel=0.03)
    assert _empirical_cv2(trace.arrival_s) > 1.5


@pytest.mark.parametrize(("rate1_qps", "rate2_qps"), [(1000, 3000), (3000, 1000)])
def test_time_varying_follows_the_ramp(rate1_qps, rate2_qps):
    """Per-second rates sit at λ1 before the ramp and λ2 after it, and move at τ q/s² in between."""
    trace = traces.time_varying(rate1_qps, rate2_qps, 200, 2, 40, 10, seed=3)  # ramp over [10 s, 20 s)
    rate_qps = trace.rate_per_bin(1.0)
    assert rate_qps[:10].mean() == pytest.approx(rate1_qps, rel=0.05)
    assert rate_qps[20:].mean() == pytest.approx(rate2_qps, rel=0.05)
    slope_qps2 = np.polyfit(np.arange(10, 20) + 0.5, rate_qps[10:20], 1)[0]
    assert slope_qps2 == pytest.approx(np.sign(rate2_qps - rate1_qps) * 200, rel=0.15)
    expected_qps = rate1_qps + (rate2_qps - rate1_qps) * (np.arange(10) + 0.5) / 10
    assert np.corrcoef(rate_qps[10:20], expected_qps)[0, 1] > 0.95


def _synthetic_series() -> np.ndarray:
    minutes = np.arange(240)
    return 100 + 60 * np.sin(minutes / 20) + 300 * ((minutes > 150) & (minutes < 160))


@pytest.mark.parametrize(("series", "bin_s_in", "duration_s", "mean_qps"), [
    (_synthetic_series(), 60.0, 24.0, 5000.0),
    (traces.load_series("twitter-ramsis"), traces.SERIES_BIN_S["twitter-ramsis"], 120.0, 6400.0),
    (traces.load_series("twitter-proteus"), traces.SERIES_BIN_S["twitter-proteus"], 60.0, 2000.0),
], ids=["synthetic", "twitter-ramsis", "twitter-proteus"])
def test_compress_preserves_shape_and_mean(series, bin_s_in, duration_s, mean_qps):
    """Per compressed bin, counts correlate > 0.95 with the input series, and the mean rate is the target."""
    trace = traces.compress(series, bin_s_in, duration_s, mean_qps, seed=5)
    rate_qps = trace.rate_per_bin(duration_s / series.size)
    assert rate_qps.size == series.size
    assert np.corrcoef(rate_qps, series)[0, 1] > 0.95
    assert trace.mean_rate_qps == pytest.approx(mean_qps, rel=0.02)


def test_compress_minmax_hits_min_and_max():
    """Loki's recipe: the smallest bin runs at min_rate_qps and the largest at max_rate_qps."""
    series = traces.load_series("twitter-proteus")
    trace = traces.compress(series, 1.0, None, None, seed=1, within_bin="uniform", scale="minmax",
                            min_rate_qps=50, max_rate_qps=425)
    rate_qps = trace.rate_per_bin(1.0)
    assert trace.duration_s == series.size
    assert abs(rate_qps[np.argmin(series)] - 50) <= 1 and abs(rate_qps[np.argmax(series)] - 425) <= 1
    assert 49 <= rate_qps.min() and rate_qps.max() <= 426


def test_compress_rejects_mixed_scaling_arguments():
    """scale='mean' with min/max rates (or minmax without them) is a clear error."""
    with pytest.raises(ValueError, match="scale='minmax' takes min_rate_qps and max_rate_qps"):
        traces.compress([1, 2, 3], 1.0, 3.0, 100.0, seed=0, scale="minmax")


def test_shipped_series_carry_their_source():
    """Each shipped data file names its source repository, commit and licence."""
    for name in traces.SERIES_BIN_S:
        header = (traces.DATA_DIR / f"{name}.csv").read_text()
        assert "# source: " in header and "@" in header and "# licence: " in header
    assert traces.load_series("twitter-ramsis").size == 27
    assert traces.load_series("twitter-proteus").sum() == 26753


def test_cli_gen_then_info(tmp_path, capsys):
    """`accscale trace gen bursty ... --out F` writes a trace that `accscale trace info F` summarises."""
    path = tmp_path / "trace.txt"
    assert main(["trace", "gen", "bursty", "--base-qps", "150", "--variant-qps", "555", "--cv2", "8",
                 "--duration-s", "20", "--seed", "1", "--slo-ms", "36", "--out", str(path)]) == 0
    assert "wrote bursty trace" in capsys.readouterr().err
    trace = Trace.load(path)
    assert np.all(trace.slo_ms == 36) and "seed=1" in trace.comment
    assert main(["trace", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"queries: {len(trace)}" in out and "duration_s: 20" in out and "peak_rate_qps" in out


def test_cli_compress_to_stdout(capsys):
    """`--out -` writes the trace to stdout and the summary to stderr."""
    assert main(["trace", "gen", "compress", "--series", "twitter-ramsis", "--duration-s", "12",
                 "--mean-qps", "640", "--payloads", "4", "--out", "-"]) == 0
    captured = capsys.readouterr()
    trace = Trace.from_text(captured.out)
    assert trace.mean_rate_qps == pytest.approx(640, rel=0.05)
    assert trace.payload_index.max() <= 3 and "series: twitter-ramsis" in trace.comment
    assert captured.err.startswith("wrote compress trace")


def test_cli_reports_bad_input_in_one_line(tmp_path, capsys):
    """A malformed file or parameter is a one-line error with exit status 2."""
    path = tmp_path / "bad.txt"
    path.write_text("1.0\n0.5\n")
    assert main(["trace", "info", str(path)]) == 2
    assert f"{path}:2: arrival_s 0.5 is before" in capsys.readouterr().err
    assert main(["trace", "gen", "gamma", "--rate-qps", "0", "--cv2", "1", "--duration-s", "1"]) == 2
    assert "rate_qps must be a finite number > 0" in capsys.readouterr().err
