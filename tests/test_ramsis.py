"""RAMSIS offline phase: the MDP of §4, its solution, policy files, refinement and the baselines."""

from __future__ import annotations

import csv
import itertools
import json
import math

import numpy as np
import pytest

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.systems.ramsis import LATENCY_CSV, MODELSWITCHING_CSV, TWITTER_CURVE
from scheduler_sidecar.systems.ramsis.baselines import (
    _feasible_batches,
    jellyfish_plus_choice,
    modelswitching_choice,
)
from scheduler_sidecar.systems.ramsis.generate import (
    generate_policy,
    generate_set,
    load_set,
    max_gap_points,
    pick_policy,
    refine_loads,
)
from scheduler_sidecar.systems.ramsis.load_curve import load_curve
from scheduler_sidecar.systems.ramsis.mdp import (
    MdpSpec,
    arrivals_given_phase,
    build_mdp,
    next_state_given_phase,
    num_states,
    slack_grid,
)
from scheduler_sidecar.systems.ramsis.model_table import load_summary_csv
from scheduler_sidecar.systems.ramsis.policy_file import RamsisPolicy
from scheduler_sidecar.systems.ramsis.solve import solve

PARETO_9 = ("shufflenet_v2_x0_5", "mobilenet_v3_large", "efficientnet_b0", "efficientnet_b2", "efficientnet_b3",
            "efficientnet_b4", "efficientnet_v2_s", "efficientnet_v2_m", "efficientnet_v2_l")


@pytest.fixture(scope="module")
def image_table():
    return load_summary_csv(LATENCY_CSV, "image_cloud_cpu")


@pytest.fixture(scope="module")
def paper_mdp(image_table):
    """D = 100, N_w = 32, the 9 Pareto models, SLO 150 ms, K = 3 workers at 60 qps."""
    return build_mdp(image_table.pareto(), MdpSpec(slo_ms=150.0, workers=3, load_qps=60.0))


def tiny_profile(tmp_path):
    sizes = (1, 2, 4, 8)
    variants = [Variant(f"v{i}", acc, Actuation("model", f"v{i}"),
                        {"cpu": LatencyCurve(sizes, tuple(base * b ** 0.8 for b in sizes),
                                             tuple(1.2 * base * b ** 0.8 for b in sizes))})
                for i, (acc, base) in enumerate([(0.70, 5.0), (0.78, 12.0), (0.84, 25.0)])]
    path = tmp_path / "tiny.json"
    Profile("tiny", "tests/test_ramsis.py", tuple(variants)).save(path)
    return path


def test_state_count_rows_and_arrival_action(paper_mdp):
    """|S| = (N_w + 1)(D + 1) + 1 = 3334; every row sums to 1; (0, T_j) -> (1, SLO) with probability 1."""
    D, N = 100, 32
    assert paper_mdp.num_states == (N + 1) * (D + 1) + 1 == 3334 == num_states(paper_mdp.spec, D + 1)
    sums = np.asarray(paper_mdp.transitions.sum(axis=1)).ravel()
    np.testing.assert_allclose(sums, 1.0, atol=1e-9)
    assert paper_mdp.transitions.min() >= 0
    target = paper_mdp.state(1, D)  # (1, SLO)
    for j in range(D + 1):
        rows = np.flatnonzero(paper_mdp.row_state == paper_mdp.state(0, j))
        assert len(rows) == 1 and paper_mdp.row_model[rows[0]] == -1 and paper_mdp.reward[rows[0]] == 0
        row = paper_mdp.transitions[rows[0]].toarray().ravel()
        assert row[target] == 1.0 and row.sum() == 1.0
    full = np.flatnonzero(paper_mdp.row_state == paper_mdp.full_state)
    assert len(full) == 1 and not paper_mdp.row_satisfied[full[0]]


def test_actions_obey_latency_constraint(paper_mdp, image_table):
    """A valid action meets the slack (reward = accuracy); otherwise only the fastest model on the whole queue."""
    table = image_table.pareto()
    m = paper_mdp
    serving = m.row_model >= 0
    lat = table.latency_ms[m.row_model[serving], m.row_batch[serving] - 1]
    slack = m.grid_ms[m.row_state[serving] % len(m.grid_ms)]
    sat = m.row_satisfied[serving]
    assert np.all(lat[sat] <= slack[sat])
    np.testing.assert_allclose(m.reward[serving][sat], table.accuracy[m.row_model[serving][sat]])
    assert np.all(m.reward[serving][~sat] == 0)
    late_states = m.row_state[serving][~sat]
    assert len(np.unique(late_states)) == len(late_states)  # the fallback is a state's only action


def _literal_eq2(lat, grid, spec, n, j, n2, j2):
    """Eq. 2 as printed: the quadruple sum over k_A, k_B, k_C, k_D, divided by the sum over k_A."""
    K, lam, slo = spec.workers, spec.load_qps / 1000, spec.slo_ms

    def pf(k, t):
        return math.exp(-lam * t) * (lam * t) ** k / math.factorial(k) if t > 0 else float(k == 0)

    hi = grid[j2 + 1] if j2 + 1 < len(grid) else slo
    tb = 0.0 if j2 == 0 else max(0.0, lat + grid[j2] - slo)
    tc = max(0.0, lat + hi - slo - tb)
    td = lat - tb - tc
    ta = slo - grid[j]
    num = den = 0.0
    for ka in range((n - 1) * K, n * K):
        den += pf(ka, ta)
        r = ka % K
        for kb in range(K - r):
            for kc in range(K - r - kb, (n2 + 1) * K - r - kb):
                for kd in range(max(0, n2 * K - r - kb - kc), (n2 + 1) * K - r - kb - kc):
                    num += pf(ka, ta) * pf(kb, tb) * pf(kc, tc) * pf(kd, td)
    return num / den


def test_transitions_match_the_literal_equation():
    """The closed form equals Eq. 2's quadruple sum (K = 3, a coarse grid)."""
    from scheduler_sidecar.systems.ramsis.mdp import phase_weights

    spec = MdpSpec(slo_ms=100.0, workers=3, load_qps=90.0, slack_steps=5, max_queue=4)
    grid = spec.slo_ms * np.arange(6) / 5
    weights = phase_weights(grid, spec)
    J = len(grid)
    for lat, n, j in [(30.0, 1, 5), (55.0, 2, 3), (80.0, 3, 1), (120.0, 2, 0)]:
        dist = weights[n, j] @ next_state_given_phase(lat, grid, spec)
        for n2, j2 in itertools.product(range(1, 5), range(J)):
            assert dist[n2 * J + j2] == pytest.approx(_literal_eq2(lat, grid, spec, n, j, n2, j2), abs=1e-12)


def test_round_robin_gives_erlang_arrivals():
    """Summed over the new head's slack, n' matches K-thinned Poisson counts (every K-th central arrival)."""
    spec = MdpSpec(slo_ms=150.0, workers=4, load_qps=200.0, max_queue=8)
    grid = slack_grid(None, spec)  # FLD needs no table
    J = len(grid)
    lat = 70.0
    per_phase = next_state_given_phase(lat, grid, spec)  # [r, s']
    counts = arrivals_given_phase(lat, spec)  # [r, a]
    for n2 in range(spec.max_queue + 1):
        np.testing.assert_allclose(per_phase[:, n2 * J:(n2 + 1) * J].sum(axis=1), counts[:, n2], atol=1e-12)
    mu = spec.load_qps / 1000 * lat  # phase 0: n' = floor(X / K) with X ~ Poisson(mu)
    p1 = sum(math.exp(-mu) * mu ** k / math.factorial(k) for k in range(4, 8))
    assert counts[0, 1] == pytest.approx(p1)


def test_pareto_pruning_keeps_the_front(image_table):
    """Of the 26 image models exactly the 9 on the batch-1 accuracy-latency front remain (§4.3.3)."""
    assert len(image_table.model_ids) == 26
    pruned = image_table.pareto()
    assert pruned.model_ids == PARETO_9
    lat, acc = image_table.latency_ms[:, 0], image_table.accuracy
    dominated = {image_table.model_ids[i] for i in range(26) for k in range(26)
                 if lat[k] <= lat[i] and acc[k] >= acc[i] and (lat[k] < lat[i] or acc[k] > acc[i])}
    assert set(PARETO_9) == set(image_table.model_ids) - dominated


def test_latency_fill_matches_the_artifact(image_table):
    """Unprofiled batches: regression line beyond the largest, then non-increasing backwards (digest Z.3)."""
    t = image_table.select(["efficientnet_b4", "efficientnet_v2_l", "shufflenet_v2_x0_5"])
    assert t.latency(0, 24) == pytest.approx(2395.6, abs=0.05) and t.latency(0, 32) == pytest.approx(3221.6, abs=0.05)
    assert t.latency(0, 22) == pytest.approx(2395.6, abs=0.05)  # lowered by the monotone fix
    assert t.latency(1, 32) == pytest.approx(8702.1, abs=0.05)
    assert t.latency(2, 14) == pytest.approx(195.1, abs=0.05)
    text = load_summary_csv(LATENCY_CSV, "text_cloud_cpu").select(["bert_mini"])
    assert text.latency(0, 1) == pytest.approx(23.7, abs=0.05)  # the 122.6 ms outlier


def test_modelswitching_matches_the_artifact(image_table):
    """MS's static choice per load and K equals the artifact's, except at loads where that choice runs at
    >= 97 % of its capacity, where a 1 % miss rate is a coin toss between seeds."""
    table = image_table.pareto()
    with open(MODELSWITCHING_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 60
    mismatches = []
    for r in rows:
        load, k = float(r["load_qps"]), int(r["workers"])
        choice = modelswitching_choice(table, load, k, 150.0, duration_s=30.0)
        if choice.model_id != r["chosen_model"]:
            m = table.model_ids.index(r["chosen_model"])
            b = np.arange(1, choice.max_batch + 1)
            capacity = k * 1000 * (b / table.latency_ms[m, : choice.max_batch]).max()
            assert load / capacity >= 0.97, (r, choice)
            mismatches.append((k, load))
    assert len(mismatches) <= 3, mismatches


def test_jellyfish_plus_choice(image_table):
    """JF+: most accurate model with a batch <= SLO/2 whose throughput over K workers reaches the load."""
    table = image_table.pareto()
    low = jellyfish_plus_choice(table, 200, 60, 150)
    assert (low.model_id, low.max_batch) == ("efficientnet_b2", 1)  # 68.3 ms <= 75 ms; b3 takes 81.3
    mid = jellyfish_plus_choice(table, 2000, 60, 150)
    assert mid.model_id == "mobilenet_v3_large" and mid.max_batch == 3
    assert set(_feasible_batches(table, 2000, 60, 150, 1.0)) == {0, 1}
    over = jellyfish_plus_choice(table, 10_000, 60, 150)
    assert (over.model_id, over.max_batch) == ("shufflenet_v2_x0_5", 32)


def test_policy_file_round_trip(tmp_path, image_table):
    """A saved policy loads back equal; its lookup follows the slack grid; bad files say what is wrong."""
    table = image_table.pareto().select(["shufflenet_v2_x0_5", "mobilenet_v3_large", "efficientnet_b0"])
    policy = generate_policy(table, MdpSpec(slo_ms=150.0, workers=2, load_qps=30.0, slack_steps=20, max_queue=8))
    path = tmp_path / "p.npz"
    policy.save(path)
    back = RamsisPolicy.load(path)
    assert back.meta == policy.meta and back.model_ids == policy.model_ids
    for name in ("accuracy", "latency_ms", "slack_grid_ms", "action_model", "action_batch"):
        np.testing.assert_array_equal(getattr(back, name), getattr(policy, name))
    assert (back.full_model, back.full_batch) == (policy.full_model, policy.full_batch)
    assert back.meta["profile"].endswith("image_cloud_cpu") and back.meta["slack_steps"] == 20
    assert back.action(0, 150.0) is None
    model, batch = back.action(1, 150.0)
    assert batch == 1 and table.latency(table.model_ids.index(model), 1) <= 150.0
    assert back.action(1, 150.0)[0] == "efficientnet_b0"  # an idle worker serves the most accurate model
    assert back.action(99, 0.0) == (back.model_ids[back.full_model], back.full_batch)
    with pytest.raises(ValueError, match="no such policy file"):
        RamsisPolicy.load(tmp_path / "missing.npz")
    np.savez(tmp_path / "bad.npz", meta=np.array(json.dumps({"schema": "other"})))
    with pytest.raises(ValueError, match="missing array"):
        RamsisPolicy.load(tmp_path / "bad.npz")


def test_generate_command_on_a_tiny_profile(tmp_path):
    """`accscale ramsis generate` on a project profile writes a refined set with adjacent gaps < 1 point."""
    from scheduler_sidecar.cli import main

    out = tmp_path / "policies"
    assert main(["ramsis", "generate", "--profile", str(tiny_profile(tmp_path)), "--slo-ms", "60", "--workers", "2",
                 "--loads", "20,400", "--slack-steps", "20", "--max-queue", "8", "--out", str(out), "--json"]) == 0
    policies = load_set(out)
    index = json.loads((out / "index.json").read_text())
    assert len(policies) > 2 and index["unresolved"] == []
    assert max_gap_points(policies) < 1.0 and index["max_adjacent_gap_points"] < 1.0
    loads = [p.load_qps for p in policies]
    assert loads == sorted(loads) and loads[0] == 20 and loads[-1] == 400
    assert policies[0].meta["profile"] == "tiny" and policies[0].meta["workers"] == 2
    assert policies[0].expected_accuracy > policies[-1].expected_accuracy
    assert pick_policy(policies, 20.0) == (policies[0], True)
    assert pick_policy(policies, 21.0) == (policies[1], True)  # the lowest load >= the estimate
    assert pick_policy(policies, 10_000.0) == (policies[-1], False)


def test_generate_accepts_the_raw_csv(tmp_path):
    """The authors' CSV format is read directly (here the trimmed copy, same columns)."""
    table = load_summary_csv(LATENCY_CSV, "image_cloud_cpu").pareto().subset([0, 1])
    policies, refinement = generate_set(table, MdpSpec(150.0, 2, 10.0, slack_steps=10, max_queue=8), [10.0, 40.0],
                                        refine=False)
    assert [p.load_qps for p in policies] == [10.0, 40.0] and refinement.unresolved == ()


def test_refinement_bisects_until_gaps_are_small():
    """Bisection stops when adjacent values differ by < 1 point; a jump is reported, not looped on."""
    smooth = refine_loads(lambda x: 0.9 - x / 10_000, [100.0, 1000.0])
    acc = np.array(smooth.accuracy)
    assert np.all(np.abs(np.diff(acc)) * 100 < 1.0) and smooth.unresolved == ()
    step = refine_loads(lambda x: 0.8 if x < 500 else 0.7, [100.0, 1000.0], min_step_qps=5.0)
    assert len(step.unresolved) == 1 and step.unresolved[0][0] < 500 <= step.unresolved[0][1]


def test_model_based_discretization_and_variable_batching(image_table):
    """MD's grid holds 0, SLO and every latency <= SLO; variable batching can only do better than maximal."""
    table = image_table.pareto().subset([0, 1, 2])
    spec = MdpSpec(slo_ms=150.0, workers=2, load_qps=40.0, max_queue=10, discretization="md")
    grid = slack_grid(table, spec)
    lat = table.latency_ms[:, :10]
    assert grid[0] == 0 and grid[-1] == 150 and set(lat[lat <= 150]) <= set(grid)
    maximal = build_mdp(table, spec)
    variable = build_mdp(table, MdpSpec(150.0, 2, 40.0, max_queue=10, discretization="md", batching="variable"))
    np.testing.assert_allclose(np.asarray(variable.transitions.sum(axis=1)).ravel(), 1.0, atol=1e-9)
    assert solve(variable)[0].gain >= solve(maximal)[0].gain - 1e-6


def test_expectations_are_sane(paper_mdp):
    """Light load: low violation, accuracy within the models' range; the solver converges."""
    solution, expected, _ = solve(paper_mdp)
    assert solution.converged
    assert 0.57 < expected.accuracy <= 0.86 and 0 <= expected.violation_rate < 0.05
    assert expected.stationary.sum() == pytest.approx(1.0)


def test_inputs_are_validated(tmp_path):
    """Bad CSVs name the file and the problem; the Twitter curve loads."""
    bad = tmp_path / "bad.csv"
    bad.write_text("profile_set,model,batch_size\nx,m,1\n")
    with pytest.raises(ValueError, match="bad.csv: missing column"):
        load_summary_csv(bad)
    with pytest.raises(ValueError, match="choose one"):
        load_summary_csv(LATENCY_CSV)
    with pytest.raises(ValueError, match="invalid MDP spec"):
        MdpSpec(slo_ms=0, workers=1, load_qps=1)
    curve = load_curve(TWITTER_CURVE)
    assert len(curve.qps) == 27 and curve.qps.min() == 1617 and curve.qps.max() == 3905 and curve.at(15) == 1617
