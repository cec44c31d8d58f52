"""HybridServe staged (systems/hybridserve/stages.py): the follow-up rule that escalates a cascade model's answer to
the next model's logical model, and the checks on its plan."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from python_backend.cascade import ANSWER, answered_early, route
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.server import config as config_module
from scheduler_sidecar.systems.hybridserve.stages import StagedCascade

SERVED = {"xs": "digits-cascade", "m": "stage-m", "l": "stage-l"}
PLAN = {"models": ["xs", "m", "l"], "thresholds": [0.5, 0.5], "temperatures": {"xs": 1.0, "m": 1.0, "l": 1.0},
        "exec_ms": {"xs": 10.0, "m": 30.0, "l": 90.0}}
ROW = {"INPUT": b"\0" * 4}


def answer(*logits: float) -> dict[str, bytes]:
    return {"LOGITS": np.asarray(logits, np.float32).tobytes()}


SURE, UNSURE = answer(20, 0, 0, 0), answer(0, 0, 0, 0)  # confidence about 1, and 0.25 ** 2


def test_a_confident_answer_is_final_and_an_unsure_one_goes_to_the_next_model_s_logical_model():
    hooks = StagedCascade.from_plan(PLAN, SERVED).follow_ups()
    assert set(hooks) == {"digits-cascade", "stage-m"}  # the last model answers everything
    assert hooks["digits-cascade"](ROW, SURE, 1_000_000) is None
    assert hooks["digits-cascade"](ROW, UNSURE, 1_000_000) == ("stage-m", ROW)
    assert hooks["stage-m"](ROW, UNSURE, 1_000_000) == ("stage-l", ROW)


def test_an_unsure_answer_without_the_time_the_next_model_takes_is_answered_where_it_is():
    hook = StagedCascade.from_plan(PLAN, SERVED).follow_ups()["digits-cascade"]
    assert hook(ROW, UNSURE, 30_000) == ("stage-m", ROW)  # exactly m's batch-1 time left: it goes on
    assert hook(ROW, UNSURE, 29_999) is None


def test_skip_connections_send_the_least_confident_to_the_largest_model():
    hook = StagedCascade.from_plan({**PLAN, "skip": True}, SERVED).follow_ups()["digits-cascade"]
    assert hook(ROW, UNSURE, 1_000_000) == ("stage-l", ROW)  # 0.0625: the bottom of [0, 0.5)'s two bins
    assert hook(ROW, answer(1.6, 0, 0, 0), 1_000_000) == ("stage-m", ROW)  # about 0.3: the top bin


def test_the_rule_is_the_one_the_bls_model_and_the_simulator_applied():
    """Against the rule as the BLS model and the simulator wrote it before it was one function: below the threshold
    a sample goes on (skip bins: the top half of [0, 0.5) to m, the bottom to l), unless the time left is below the
    next model's batch-1 time."""
    rng = np.random.default_rng(0)
    # four classes: a confidence is at least 0.25 ** 2
    conf, left = rng.uniform(1 / 16, 1, 500), rng.uniform(0, 120_000, 500)
    hook = StagedCascade.from_plan({**PLAN, "skip": True}, SERVED).follow_ups()["digits-cascade"]
    cost_us = {"stage-m": 30_000, "stage-l": 90_000}
    for c, us in zip(conf, left):
        z = np.log([np.sqrt(c), *[(1 - np.sqrt(c)) / 3] * 3])  # logits whose softmax's max is sqrt(c)
        got = hook(ROW, answer(*z), int(us))
        nxt = None if c >= 0.5 else "stage-m" if c >= 0.25 else "stage-l"
        want = None if nxt is None or cost_us[nxt] > int(us) else (nxt, ROW)
        # confidences within float error of a bin's edge may fall either side
        assert got == want or min(abs(c - 0.5), abs(c - 0.25)) < 1e-6
    onward = route(0, np.array([0.9, 0.4, 0.1]), np.asarray(0.5), 2, True)
    assert onward.tolist() == [ANSWER, 1, 2]
    assert answered_early(onward, np.array([0, 29_999, 90_000]), [10_000, 30_000, 90_000]).tolist() == [
        False, True, False]


@pytest.mark.parametrize("plan, message", [
    ({**PLAN, "models": ["xs", "m", "xl"]}, r"no logical model serves \['xl'\]"),
    ({**PLAN, "thresholds": [0.5]}, "2 thresholds"),
    ({**PLAN, "thresholds": [0.5, 1.5]}, "2 thresholds"),
    ({**PLAN, "temperatures": {"xs": 1.0}}, "temperature"),
    ({**PLAN, "exec_ms": {"xs": -1}}, "exec_ms"),
    ({**PLAN, "skip": "yes"}, "skip"),
    ({**PLAN, "models": ["xs", "xs"]}, "distinct"),
    ({**PLAN, "models": ["xs", "m", "l"], "output": 3}, "output a name"),
    ([], "JSON object"),
])
def test_a_bad_plan_is_a_configuration_error_that_names_the_problem(plan, message):
    with pytest.raises(ConfigError, match=message):
        StagedCascade.from_plan(plan, SERVED)


def test_an_unreadable_plan_file_says_which(tmp_path):
    (tmp_path / "plan.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot read the plan"):
        StagedCascade.load(tmp_path / "plan.json", SERVED)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    assert StagedCascade.load(tmp_path / "plan.json", SERVED).served == SERVED


def test_the_config_reads_a_cascade_and_per_model_slots(tmp_path):
    path = tmp_path / "sidecar.toml"
    path.write_text('workers = ["127.0.0.1:1"]\nslots = "per_model"\n[[models]]\nname = "a"\nprofile = "p.json"\n'
                    'policy = "clipper"\ncascade = "plan.json"\n')
    config = config_module.load(path)
    assert config.slots == "per_model" and str(config.models[0].cascade) == "plan.json"
    path.write_text('workers = ["127.0.0.1:1"]\nslots = "each"\n[[models]]\nname = "a"\nprofile = "p.json"\n')
    with pytest.raises(ConfigError, match="slots must be one of"):
        config_module.load(path)


def test_one_logical_model_for_two_cascade_models_is_refused():
    with pytest.raises(ConfigError, match="logical model of its own"):
        StagedCascade.from_plan(PLAN, {**SERVED, "l": "stage-m"})


def spec(name, datatype="FP32", dims=(4,)):
    return SimpleNamespace(name=name, datatype=datatype, dims=dims)


def test_the_models_tensors_are_checked_before_serving():
    cascade = StagedCascade.from_plan(PLAN, SERVED)
    inputs = {"INPUT": spec("INPUT", dims=(1, 16, 16))}
    good = {name: (inputs, {"LOGITS": spec("LOGITS")}) for name in SERVED.values()}
    cascade.check_tensors(good)
    with pytest.raises(ConfigError, match="takes other inputs"):
        cascade.check_tensors({**good, "stage-l": ({"IMAGE": spec("IMAGE", dims=(1, 16, 16))}, {})})
    with pytest.raises(ConfigError, match="no FP32 output 'LOGITS'"):
        cascade.check_tensors({**good, "stage-m": (inputs, {"LOGITS": spec("LOGITS", "FP16")})})
    cascade.check_tensors({**good, "stage-l": (inputs, {})})  # the last model answers: it routes nothing


def test_a_cascade_that_is_not_a_path_is_a_configuration_error(tmp_path):
    path = tmp_path / "sidecar.toml"
    path.write_text('workers = ["127.0.0.1:1"]\n[[models]]\nname = "a"\nprofile = "p.json"\ncascade = true\n')
    with pytest.raises(ConfigError, match="cascade must be the path of a plan file"):
        config_module.load(path)
