"""Loki's BLS pipeline model on a real Triton server, with the pipeline trained here (a small recipe): routing by
the plan's tables, rerouting exactly when the detector hop overran and a backup fits, dropping otherwise, and
every frame answered; served frames carry what the offline pipeline computes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from export import repository
from export.loki_models import RECIPES, build
from export.scenes import generate
from python_backend.pipeline import crops, decode, read_answers
from python_backend.runners import MODEL_FILE, make_session
from scheduler_sidecar.live.triton_launcher import TritonServer

pytestmark = pytest.mark.slow
BLS = "loki_pipeline"
MODELS = ["loki_detect_cc", "loki_detect_fcn_s", "loki_detect_fcn_l", "loki_digits_w16", "loki_digits_w8",
          "loki_digits_w4", "loki_shapes_cnn", "loki_shapes_linear"]
PLAN = {
    "version": 1, "drop": "rerouting",
    "tables": {"frontend": {"detect": [["loki_detect_cc", 1.0]]},
               "loki_detect_cc": {"digits": [["loki_digits_w16", 1.0]], "shapes": [["loki_shapes_cnn", 1.0]]}},
    "budget_ms": {"loki_detect_cc": 50.0},
    "exec_ms": {"loki_digits_w16": 40.0, "loki_digits_w4": 5.0, "loki_shapes_cnn": 40.0, "loki_shapes_linear": 5.0},
    "backups": {"digits": [["loki_digits_w4", 100.0]], "shapes": [["loki_shapes_linear", 100.0]]},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loki")
    build(folder, RECIPES["small"])
    repo = folder / "repository"
    repository.write_loki_pipeline(repo, BLS, PLAN, MODELS, scripted_delays=True)
    with TritonServer(repository=repo) as triton:
        yield triton, repo


def test_the_trained_pipeline_is_measured_and_plans(server, tmp_path, capsys):
    """loki.json: accuracies, fan-outs and paths measured on held-out scenes; the MILP and the simulator take it."""
    from scheduler_sidecar.cli import main
    from scheduler_sidecar.systems.loki import milp
    from scheduler_sidecar.systems.loki.data import load_pipeline

    _, repo = server
    pipeline = load_pipeline(str(repo.parent / "loki.json"))
    assert [t.name for t in pipeline.tasks] == ["detect", "digits", "shapes"]
    assert len(pipeline.path_accuracy) == 3 * 3 + 3 * 2
    assert all(0 <= a <= 1 for a in pipeline.path_accuracy.values())
    for v in pipeline.root.variants:  # each detector's crops per frame, per branch
        assert set(v.fanout) == {"digits", "shapes"} and all(f >= 0 for f in v.fanout.values())
        assert (repo / v.id / "1" / "latency.json").exists()
    assert milp.plan(pipeline, 200.0, 4).workers <= 4
    trace = tmp_path / "trace.txt"
    trace.write_text("".join(f"{i / 100}\n" for i in range(100)))
    assert main(["simulate", "--pipeline", str(repo.parent / "loki.json"), "--trace", str(trace),
                 "--workers", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["frames"] == 100 and out["system"] == "loki"


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    scenes = generate(40, "heldout", seed=9)
    return scenes.frames[[i for i, o in enumerate(scenes.objects) if len(o) >= 2]]


def _send(server, frames: np.ndarray, **params) -> list[dict]:
    triton, _ = server
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    x = grpcclient.InferInput("FRAME", list(frames.shape), "FP32")
    x.set_data_from_numpy(frames)
    result = client.infer(BLS, [x], parameters={k: json.dumps(v) if isinstance(v, dict) else v
                                                for k, v in params.items()})
    return read_answers(result.as_numpy("OBJECTS"), result.as_numpy("STATUS"), MODELS)


@pytest.mark.parametrize("delay_ms, expected", [(0, "table"), (70, "rerouted"), (110, "dropped")])
def test_a_hop_is_rerouted_exactly_when_it_overran_and_a_backup_fits(server, frames, delay_ms, expected):
    """Budget 50 ms at the detector; the routed classifier takes 40 ms, the backup 5: an overrun x of 20-30 ms
    leaves 10-20 ms, which the backup fits; 60 ms or more leaves nothing."""
    answers = []
    for frame in frames[:6]:  # one frame per request: each hop's delay is that frame's own
        answers += _send(server, frame[None], loki_plan=PLAN, detect_delay_ms=delay_ms)
    assert len(answers) == 6
    for a in answers:
        assert a["detector"] == "loki_detect_cc" and a["plan"] == 1
        assert a["objects"] and {o["outcome"] for o in a["objects"]} == {expected}
        assert (a["status"] == "dropped") is (expected == "dropped")
        if expected == "dropped":  # explicitly: where the object was, and no label
            assert all(o["label"] == -1 and o["model"] is None for o in a["objects"])
        else:
            assert {o["model"] for o in a["objects"]} <= ({"loki_digits_w4", "loki_shapes_linear"}
                                                          if expected == "rerouted"
                                                          else {"loki_digits_w16", "loki_shapes_cnn"})


@pytest.mark.parametrize("mode, served", [("per-task", False), ("none", True)])
def test_per_task_drops_an_overrun_and_none_serves_it(server, frames, mode, served):
    plan = {**PLAN, "drop": mode}
    (answer,) = _send(server, frames[:1], loki_plan=plan, detect_delay_ms=70)
    assert (answer["status"] == "served") is served
    assert any(o["outcome"] == "dropped" for o in answer["objects"]) is not served


def test_served_frames_match_the_offline_pipeline_and_a_bad_plan_is_refused(server, frames):
    triton, repo = server
    answers = _send(server, frames, loki_plan=PLAN)  # one request, the whole batch
    detector = make_session(repo / "loki_detect_cc" / "1" / MODEL_FILE, 1) \
        if (repo / "loki_detect_cc" / "1" / MODEL_FILE).exists() else None
    assert detector is None  # the classical detector has no network
    from python_backend.pipeline import components

    digits = make_session(repo / "loki_digits_w16" / "1" / MODEL_FILE, 1)
    shapes = make_session(repo / "loki_shapes_cnn" / "1" / MODEL_FILE, 1)
    for frame, answer, heat in zip(frames, answers, components(frames)):
        found = decode(heat)
        assert answer["status"] == "served" and len(answer["objects"]) == len(found)
        expected = {}
        for det in found:
            session = digits if det[2] == 0 else shapes
            expected[int(det[0]), int(det[1])] = int(session.run(["LOGITS"], {"INPUT": crops(frame, det[None, :2])})[0]
                                                     .argmax())
        assert {(o["row"], o["col"]): o["label"] for o in answer["objects"]} == expected
    with pytest.raises(Exception, match="JSONDecodeError"):
        _send(server, frames[:1], loki_plan="{not json")
    hostile = {**PLAN, "tables": {**PLAN["tables"], "frontend": {"detect": [["loki_pipeline", 1.0]]}}}
    with pytest.raises(Exception, match="not this pipeline's"):  # a plan cannot make the BLS call any model
        _send(server, frames[:1], loki_plan=hostile)
    with pytest.raises(Exception, match="exec_ms has no number"):
        _send(server, frames[:1], loki_plan={**PLAN, "exec_ms": {}})
    assert _send(server, frames[:1])[0]["plan"] == 1  # the deployed plan.json is the default
