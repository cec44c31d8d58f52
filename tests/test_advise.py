"""`accscale advise`: every system that takes an operator's profile, simulated on their trace and ranked; the
winner's sidecar config loads as the sidecar reads it."""

from __future__ import annotations

import json

import pytest

from loadtest.traces import bursty, gamma
from scheduler_sidecar.cli import main
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.server import config
from scheduler_sidecar.server.service import model_policy

SIZES = (1, 2, 4, 8, 16)


def _family(path) -> None:
    """Three separate Triton models of one task, as `accscale profile triton` writes them."""
    variants = []
    for name, accuracy, ms in (("small", 0.70, 2.0), ("medium", 0.76, 5.0), ("large", 0.80, 12.0)):
        p50 = tuple(ms * (1 + 0.3 * (b - 1)) for b in SIZES)
        variants.append(Variant(name, accuracy, Actuation("model", name), {"gpu": LatencyCurve(SIZES, p50, tuple(
            1.2 * x for x in p50))}, load_ms=800.0))
    Profile("mine", "by hand", tuple(variants)).save(path)


def test_advise_ranks_the_systems_that_take_the_profile_and_writes_the_winners_config(tmp_path, capsys):
    profile, trace, out = tmp_path / "mine.json", tmp_path / "bursty.txt", tmp_path / "advice"
    _family(profile)
    gamma(250.0, 4.0, 20.0, seed=3).save(trace)
    assert main(["advise", "--profile", str(profile), "--trace", str(trace), "--slo-ms", "60", "--workers", "2",
                 "--seeds", "2", "--overhead-ms", "0", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    ranking = result["ranking"]
    policies = [r["policy"] for r in ranking]
    assert {"slackfit", "maxacc", "maxbatch", "clipper", "infaas", "ramsis", "jellyfish", "modelswitching",
            "proteus"} == set(policies)
    # Loki and HybridServe plan a pipeline and a cascade, which a family is not: named, with the reason
    assert set(result["not_applicable"]) == {"loki", "cascade"}
    assert "this profile is a family of separate models" in result["not_applicable"]["loki"]
    keys = [(-r["slo_attainment"], -r["accuracy"]) for r in ranking]
    assert keys == sorted(keys) and [r["rank"] for r in ranking] == list(range(1, len(ranking) + 1))
    for r in ranking:
        assert r["seeds"] == 2 and r["attainment_min"] <= r["slo_attainment"] <= r["attainment_max"]
    # the systems differ on this trace: the ranking is not a tie of everything
    assert ranking[0]["slo_attainment"] > ranking[-1]["slo_attainment"]
    # the figures are the simulator's, as the sidecar serves (admission, late queries dropped): SlackFit alone
    # through `accscale simulate`, seed by seed
    slackfit = next(r for r in ranking if r["policy"] == "slackfit")
    seeds = []
    for seed in (0, 1):
        assert main(["simulate", "--policy", "slackfit", "--profile", str(profile), "--trace", str(trace), "--slo-ms",
                     "60", "--workers", "2", "--latency-noise", "tail", "--seed", str(seed), "--admission",
                     "--late-queries", "drop", "--json"]) == 0
        seeds.append(json.loads(capsys.readouterr().out)["slo_attainment"])
    assert (slackfit["attainment_min"], slackfit["attainment_max"]) == (round(min(seeds), 4), round(max(seeds), 4))
    best = ranking[0]["policy"]
    advised = config.load(out / "advised.toml")
    assert [(m.name, m.policy) for m in advised.models] == [("mine", best)] and len(advised.workers) == 2
    assert [p.kind for p in advised.planners] == (["proteus"] if best == "proteus" else [])
    assert model_policy(advised.models[0], Profile.load(profile)).name == best  # the sidecar builds it as simulated
    assert (out / "attainment.png").stat().st_size > 0 and "Advised: **" in (out / "summary.md").read_text()



def test_advise_refuses_a_replay_it_cannot_run(tmp_path, capsys):
    profile, trace = tmp_path / "mine.json", tmp_path / "t.txt"
    _family(profile)
    gamma(50.0, 1.0, 1.0, seed=0).save(trace)
    common = ["advise", "--profile", str(profile), "--trace", str(trace), "--slo-ms", "60", "--out", str(tmp_path)]
    assert main([*common, "--replay", "1"]) == 2
    assert "--replay sends rows of --data" in capsys.readouterr().err
    assert main([*common, "--workers", "2", "--triton", "127.0.0.1:1"]) == 2
    assert "--workers is 2 but --triton names 1" in capsys.readouterr().err
    (tmp_path / "rows.npz").write_bytes(b"junk")
    assert main([*common, "--replay", "1", "--data", str(tmp_path / "rows.npz"), "--triton", "127.0.0.1:1"]) == 2
    assert "rows.npz: not an .npz" in capsys.readouterr().err


def test_advise_takes_a_trace_generators_settings(tmp_path, capsys):
    profile, out = tmp_path / "mine.json", tmp_path / "advice"
    _family(profile)
    settings = "bursty --base-qps 100 --variant-qps 150 --cv2 4 --duration-s 5 --seed 2"
    assert main(["advise", "--profile", str(profile), "--trace-gen", settings, "--slo-ms", "60", "--seeds", "1",
                 "--policies", "slackfit,maxacc", "--out", str(out), "--json"]) == 0
    assert {r["policy"] for r in json.loads(capsys.readouterr().out)["ranking"]} == {"slackfit", "maxacc"}
    written = (out / "trace.txt").read_text()
    assert written == bursty(100.0, 150.0, 4.0, 5.0, seed=2).to_text()  # as `accscale trace gen` writes it
    assert main(["advise", "--profile", str(profile), "--trace-gen", "bursty --base-qps 1", "--slo-ms", "60",
                 "--out", str(out)]) == 2
    assert "not a trace generator's settings: 'bursty --base-qps 1'" in capsys.readouterr().err


def test_the_plot_takes_seeds_that_agree_to_the_last_bit(tmp_path):
    """Three seeds that agree to the last bit: their float mean falls a rounding error below them, so the bar's
    naive upper error is negative, which matplotlib refuses; the plot's bars are clipped to none. Seeds that differ
    keep their spread."""
    from scheduler_sidecar.experiments.advise import Ranked, _plot, spread  # this test's only

    same = (0.9997, 0.9997, 0.9997)
    agree = Ranked("ramsis", "jellyfish", same, same, {})
    assert agree.mean_attainment != 0.9997 and max(same) - agree.mean_attainment != 0  # the rounding error
    differ = Ranked("slackfit", "superserve", (0.9, 0.95, 1.0), (0.8, 0.8, 0.8), {})
    below, above = spread([agree, differ])
    assert below[0] >= 0 and above[0] >= 0 and max(below[0], above[0]) < 1e-12
    assert below[1] == pytest.approx(0.05) and above[1] == pytest.approx(0.05)
    _plot(tmp_path / "a.png", [agree, differ])  # raised "yerr must not contain negative values" before the clip
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
