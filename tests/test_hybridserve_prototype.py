"""The HybridServe authors' prototype dump (``profiles/hybridserve/``): our cascade cost and energy benefit
reproduce its numbers, and its ViT cascade is the one the paper's Table III reports."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler_sidecar.experiments.hybridserve.prototype import Family, families, load

# every (family, mode) whose dumped cost follows from its per-model costs; gpt-5 does not (test below)
CONSISTENT = [(f, m) for f in ("vit-4", "t5-3", "t5-4") for m in ("ap", "eo")]
# Table III, ViT: the share of requests each model answers (q_i, %), small to large
TABLE_III_VIT = {"ap": (59.6, 5.1, 18.2, 17.1), "eo": (59.6, 31.0, 4.5, 4.9)}
# upstream tests/kernel_duration/energy.json, gpt-j-6B at batch "64" (gpt-5.json dumps 0.32834320853960814)
GPT_J_ENERGY_JSON = 0.08234320853960814


def test_families_and_order() -> None:
    assert families() == ["vit-4", "t5-3", "t5-4", "gpt-5"]
    for name in families():
        fam = load(name)
        assert set(fam.modes) == {"ap", "eo"}
        assert np.all(np.diff(fam.costs) > 0)  # small to large
    with pytest.raises(KeyError):
        load("bert-3")


def test_vit4_costs() -> None:
    vit = load("vit-4")
    for mode, dumped in (("ap", 0.389), ("eo", 0.200)):
        assert vit.modes[mode].cost == pytest.approx(dumped, abs=1e-3)
        assert vit.cost(mode) == pytest.approx(vit.modes[mode].cost, abs=1e-3)
    assert vit.relative_cost("ap") == pytest.approx(0.4485, abs=1e-4)  # 2.2x cheaper than ViT-L alone
    assert vit.relative_cost("eo") == pytest.approx(0.2306, abs=1e-4)  # 4.3x


@pytest.mark.parametrize(("family", "mode"), CONSISTENT)
def test_cost_reproduces_dump(family: str, mode: str) -> None:
    fam = load(family)
    assert fam.cost(mode) == pytest.approx(fam.modes[mode].cost, abs=1e-3)


def test_gpt5_cost_uses_an_older_gpt_j_cost() -> None:
    """gpt-5.json's gpt-j-6B cost is not the one its decisions were computed with: ours come out 73% and 42%
    higher; with the upstream energy.json value both match."""
    gpt = load("gpt-5")
    assert gpt.cost("ap") > gpt.modes["ap"].cost + 0.2 and gpt.cost("eo") > gpt.modes["eo"].cost + 0.04
    older = Family(gpt.name, gpt.models[:-1] + (replace(gpt.models[-1], cost=GPT_J_ENERGY_JSON),), gpt.modes)
    for mode in ("ap", "eo"):
        assert older.cost(mode) == pytest.approx(gpt.modes[mode].cost, abs=1e-9)


def test_vit4_energy_benefit_signs() -> None:
    vit = load("vit-4")
    assert np.sign(vit.energy_benefit("ap")).tolist() == [1, -1, 1]  # Alg. 2 would prune ViT-S in AP
    assert np.sign(vit.energy_benefit("eo")).tolist() == [1, 1, 1]


@pytest.mark.parametrize(("mode", "tol_pp"), [("eo", 0.1), ("ap", 0.2)])
def test_vit4_reach_is_table_iii(mode: str, tol_pp: float) -> None:
    """ρ_i = Σ_{j≥i} q_j. EO agrees within 0.07 pp; AP's last two differ by 0.11 and 0.17 pp (dump 35.41 and
    17.27 %, paper 35.3 and 17.1 %), so AP is held to 0.2 pp."""
    reach = np.array(load("vit-4").modes[mode].reach) * 100
    paper = np.cumsum(TABLE_III_VIT[mode][::-1])[::-1]
    np.testing.assert_allclose(reach, paper, atol=tol_pp)
