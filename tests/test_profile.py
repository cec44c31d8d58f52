import json
from dataclasses import replace

import pytest

from scheduler_sidecar.core.profile import LatencyCurve, Profile, ProfileError, pareto_front
from tests.builders import make_profile


def test_round_trip(tmp_path):
    """A saved profile loads back equal, a measured load time included."""
    profile = make_profile(5)
    profile = replace(profile, variants=(replace(profile.variants[0], load_ms=850.5), *profile.variants[1:]))
    profile.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == profile
    assert Profile.load(tmp_path / "p.json").load_ms() == {"m0": 850.5}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.update(schema="other"), r"schema: 'other' is not"),
        (lambda r: r["variants"][1].update(accuracy=97.3), r"variants\[1\].accuracy: 97.3 is not a fraction"),
        (lambda r: r["variants"][0]["actuation"].update(kind="magic"), r"variants\[0\].actuation.kind"),
        (lambda r: r["variants"][2]["latency"]["cpu"].update(p50_ms=[1.0]), r"latency.cpu.p50_ms: has 1 values"),
        (lambda r: r["variants"][0]["latency"]["cpu"].update(batch_sizes=[4, 2, 1, 8, 16]), r"batch_sizes: must be"),
        (lambda r: r["variants"][3].pop("id"), r"variants\[3\].id: missing"),
        (lambda r: r["variants"][1].update(id="v0"), r"duplicate ids \['v0'\]"),
        (lambda r: r["variants"][1].update(load_ms=-1), r"variants\[1\].load_ms: -1 is not a time"),
    ],
)
def test_invalid_profiles_name_file_and_field(tmp_path, mutate, message):
    """Each schema violation is reported with the file and the field."""
    raw = json.loads(make_profile(4).to_json())
    mutate(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match=message) as info:
        Profile.load(path)
    assert str(path) in str(info.value)


def test_interpolated_curve_keeps_measured_sizes_and_is_linear_between():
    measured = LatencyCurve((1, 2, 4, 8), (1.0, 1.5, 2.5, 6.5), (2.0, 3.0, 5.0, 9.0))
    curve = measured.interpolated(range(1, 9))
    assert curve.batch_sizes == tuple(range(1, 9))
    assert curve.p50_ms == (1.0, 1.5, 2.0, 2.5, 3.5, 4.5, 5.5, 6.5)
    assert curve.p99_ms == (2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    with pytest.raises(ValueError, match="profiled range 1..8"):
        measured.interpolated([4, 16])


def test_pareto_front_drops_dominated_points():
    points = [(1.0, 0.80), (2.0, 0.79), (2.0, 0.85), (3.0, 0.85), (4.0, 0.90)]
    assert pareto_front(points) == [0, 2, 4]


def test_spread_is_uniform_in_accuracy():
    """spread(n) picks n distinct variants nearest to evenly spaced accuracies."""
    profile = make_profile(11)
    assert [v.id for v in profile.spread(3)] == ["v0", "v5", "v10"]
    assert len(profile.spread(20)) == 11


def test_dominated_variants_are_found():
    profile = make_profile(4)
    assert profile.dominated("cpu") == []
