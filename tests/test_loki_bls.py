"""Loki's BLS pipeline model on a real Triton server, with the pipeline trained here (a small recipe): routing by
the plan's tables, and the shared rule of python_backend.loki_routing for each crop: rerouting exactly when the
detector hop (the frame's wait in the sidecar, then the BLS's own time) overran and a backup with allowance
fits, counting the crops already sent to it, dropping otherwise; stage models run at the plan's batch sizes;
every frame answered; served frames carry what the offline pipeline computes."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from export import repository
from export.loki_models import RECIPES, build, copy_stage_models
from export.presets import DEFAULT_BUILD_DIR
from export.scenes import generate
from python_backend.pipeline import components, crops, decode, read_answers
from python_backend.runners import MODEL_FILE, make_session
from scheduler_sidecar.live.workers import INSTANCES_PARAMETER, TritonWorker
from scheduler_sidecar.processes.triton_launcher import TritonServer
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.triton]
BLS = "loki_pipeline"
MODELS = ["loki_detect_cc", "loki_detect_fcn_s", "loki_detect_fcn_l", "loki_digits_w16", "loki_digits_w8",
          "loki_digits_w4", "loki_shapes_cnn", "loki_shapes_linear"]
PLAN = {
    "version": 1, "drop": "rerouting",
    "tables": {"frontend": {"detect": [["loki_detect_cc", 1.0]]},
               "loki_detect_cc": {"digits": [["loki_digits_w16", 1.0]], "shapes": [["loki_shapes_cnn", 1.0]]}},
    "budget_ms": {"loki_detect_cc": 50.0},
    # the routed classifiers take 100 ms, the backups 5: a hop over its budget by up to 95 ms (the scripted overrun
    # and the BLS's own time, which a loaded machine stretches) fits a backup
    "exec_ms": {"loki_digits_w16": 100.0, "loki_digits_w4": 5.0, "loki_shapes_cnn": 100.0, "loki_shapes_linear": 5.0},
    "batch": {"loki_detect_cc": 32, "loki_digits_w16": 32, "loki_digits_w4": 32, "loki_shapes_cnn": 32,
              "loki_shapes_linear": 32},
    "instances": {"loki_detect_cc": 1, "loki_digits_w16": 1, "loki_digits_w4": 1, "loki_shapes_cnn": 1,
                  "loki_shapes_linear": 1},
    "backups": {"digits": [["loki_digits_w4", 100.0]], "shapes": [["loki_shapes_linear", 100.0]]},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    trained = REPO_ROOT / DEFAULT_BUILD_DIR / "loki-demo-small"  # where `demo loki --recipe small` trains it
    build(trained, RECIPES["small"])
    repo = tmp_path_factory.mktemp("loki") / "repository"
    copy_stage_models(trained, repo)
    shutil.copy(trained / "loki.json", repo.parent)
    repository.write_loki_pipeline(repo, BLS, PLAN, MODELS, scripted_delays=True)
    with TritonServer(repository=repo) as triton:
        # the BLS's first calls of each stage model are slow (its stub maps their memory): the tests time hops
        _send((triton, repo), generate(8, "heldout", seed=1).frames, loki_plan={**PLAN, "drop": "none"})
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
    result = client.infer(BLS, [x], parameters={k: json.dumps(v) if isinstance(v, (dict, list)) else v
                                                for k, v in params.items()})
    return read_answers(result.as_numpy("OBJECTS"), result.as_numpy("STATUS"), MODELS, result.as_numpy("STAGE_MS"))


def _kinds(frame: np.ndarray) -> Counter:
    """The detections of ``frame`` by the plan's detector (the classical one), by kind: 0 digits, 1 shapes."""
    return Counter(int(k) for k in decode(components(frame[None])[0])[:, 2])


def _outcomes(answer: dict, kind: int) -> Counter:
    return Counter((o["outcome"], o["model"]) for o in answer["objects"] if o["kind"] == kind)


@pytest.mark.parametrize("delay_ms, expected", [(0, "table"), (70, "rerouted"), (160, "dropped")])
def test_a_hop_is_rerouted_exactly_when_it_overran_and_a_backup_fits(server, frames, delay_ms, expected):
    """Budget 50 ms at the detector; the routed classifier takes 100 ms, the backup 5: an overrun x of 20 ms and the
    BLS's own time (under 75 ms however loaded the machine) leaves room the backup fits; 110 ms or more leaves
    nothing. With 40 ms routed, the BLS's own time had to stay under 15 ms: a loaded run once dropped instead."""
    answers = []
    for frame in frames[:6]:  # one frame per request: each hop's delay is that frame's own
        answers += _send(server, frame[None], loki_plan=PLAN, detect_delay_ms=delay_ms)
    assert len(answers) == 6
    for a in answers:
        assert a["detector"] == "loki_detect_cc" and a["plan"] == 1 and a["instances"] == 5
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


@pytest.mark.parametrize("detectors, second", [(1, "dropped"), (2, "served")])
def test_detector_batches_run_at_once_up_to_the_planned_instances(server, frames, detectors, second):
    """Two frames, a detector batch each, each batch 600 ms long (scripted), a budget of 900 ms: with one instance
    planned, the second batch starts after the first and its frame overruns (per-task drops it); with two, both
    run at once and both frames are within budget. The margins, 300 ms each way, are the BLS's own time."""
    plan = {**PLAN, "drop": "per-task", "budget_ms": {"loki_detect_cc": 900.0},
            "batch": {**PLAN["batch"], "loki_detect_cc": 1},
            "instances": {**PLAN["instances"], "loki_detect_cc": detectors}}
    answers = _send(server, frames[:2], loki_plan=plan, detect_delay_ms=600)
    assert sorted(a["status"] for a in answers) == sorted(["served", second])
    # each frame says when its detector batch came back: the second batch's after both batches' 600 ms with one
    # instance, after its own with two
    first, last = sorted(a["detected_ms"] for a in answers)
    assert first >= 600 and last >= 600 * (3 - detectors)
    assert all(a["detected_ms"] <= a["done_ms"] for a in answers)


def test_the_stage_models_form_no_batches_of_their_own(server):
    """The BLS forms each stage's batches at the plan's sizes: Triton's batcher, which would merge those in
    flight together beyond them, is off for every stage model."""
    _, repo = server
    for model in MODELS:
        assert "dynamic_batching" not in (repo / model / "config.pbtxt").read_text(), model
    assert "dynamic_batching" in (repo / BLS / "config.pbtxt").read_text()


def test_a_frame_that_waited_in_the_sidecar_is_over_budget_though_the_bls_was_quick(server, frames):
    """The hop is measured from each frame's arrival at the sidecar: of two frames in one batch, the one that had
    waited 70 ms (20 over the detector's budget) is rerouted, the other goes where the table says."""
    fresh, waited = _send(server, frames[:2], loki_plan=PLAN, waited_ms=[0.0, 70.0])
    assert {o["outcome"] for o in fresh["objects"]} == {"table"}
    assert {o["outcome"] for o in waited["objects"]} == {"rerouted"}
    # its stage times count from its arrival at the sidecar too: its detector's result came at least 70 ms after it,
    # and its last label after that
    assert waited["sent_ms"] == 70.0 and fresh["sent_ms"] == 0.0
    assert waited["detected_ms"] >= 70.0 and waited["done_ms"] >= waited["detected_ms"]
    assert 0 < fresh["detected_ms"] < waited["detected_ms"] and fresh["done_ms"] >= fresh["detected_ms"]


def test_a_backup_without_allowance_is_not_used(server, frames):
    """The more accurate backup fits but has no spare capacity: the crops go to the next one."""
    plan = {**PLAN, "exec_ms": {**PLAN["exec_ms"], "loki_digits_w8": 5.0},
            "batch": {**PLAN["batch"], "loki_digits_w8": 32},
            "backups": {**PLAN["backups"], "digits": [["loki_digits_w8", 0.0], ["loki_digits_w4", 100.0]]}}
    frame = next(f for f in frames if _kinds(f)[0])
    (answer,) = _send(server, frame[None], loki_plan=plan, waited_ms=[70.0])
    assert set(_outcomes(answer, 0)) == {("rerouted", "loki_digits_w4")}


def test_a_backup_counts_the_crops_already_sent_to_it(server, frames):
    """Over budget by 10 ms (and the BLS's own few), a crop fits where the routed classifier's 100 ms less the
    overrun does: the backup's first batch of 2 (50 ms), not its second (100 ms), so of a frame's digits two are
    rerouted and the rest dropped, as the simulator counts a worker's queue."""
    plan = {**PLAN, "exec_ms": {**PLAN["exec_ms"], "loki_digits_w16": 100.0, "loki_digits_w4": 50.0},
            "batch": {**PLAN["batch"], "loki_digits_w4": 2}}
    frame = next(f for f in frames if _kinds(f)[0] >= 3)
    (answer,) = _send(server, frame[None], loki_plan=plan, waited_ms=[60.0])
    assert _outcomes(answer, 0) == {("rerouted", "loki_digits_w4"): 2, ("dropped", None): _kinds(frame)[0] - 2}


def test_last_task_drops_the_crops_of_a_frame_without_the_time_left(server, frames):
    plan = {**PLAN, "drop": "last-task"}
    ample, short = _send(server, frames[:2], loki_plan=plan, left_ms=[1000.0, 10.0], waited_ms=[70.0, 0.0])
    assert ample["status"] == "served" and {o["outcome"] for o in ample["objects"]} == {"table"}
    assert short["status"] == "dropped" and {o["outcome"] for o in short["objects"]} == {"dropped"}


def test_the_hopeless_check_drops_a_frame_before_its_detector_and_a_crop_before_its_classifier(server, frames):
    """The simulator's check before a batch (``dequeue`` "hopeless"), made by the BLS when an instance is free for the
    batch: a frame whose time left is below its detector's 50 ms and the 100 ms fastest rest after it is dropped
    before the detector runs (no objects, no detector time); one with 300 ms passes the detector, which is scripted to
    take 250 ms, and its crops, then with under 100 ms left (the classifier's time, a leaf's rest 0), are dropped
    before their classifier; one with 2 s is served. The margins (150 ms before the detector, 50 after it) are the
    BLS's own time. A plan that asks for a check the BLS cannot make, or lacks a rest, is refused."""
    plan = {**PLAN, "dequeue": "hopeless", "budget_ms": {"loki_detect_cc": 5000.0},  # no rerouting: the table's
            "exec_ms": {**PLAN["exec_ms"], "loki_detect_cc": 50.0},
            "rest_ms": {"loki_detect_cc": 100.0, **dict.fromkeys(PLAN["exec_ms"], 0.0)}}
    served, crops_dropped, frame_dropped = _send(server, frames[:3], loki_plan=plan, left_ms=[2000.0, 300.0, 100.0],
                                                 detect_delay_ms=250)
    assert served["status"] == "served" and {o["outcome"] for o in served["objects"]} == {"table"}
    assert crops_dropped["status"] == "dropped" and crops_dropped["detected_ms"] >= 250
    assert crops_dropped["objects"] and {o["outcome"] for o in crops_dropped["objects"]} == {"dropped"}
    assert frame_dropped["status"] == "dropped" and frame_dropped["objects"] == []
    assert frame_dropped["detector"] is None and frame_dropped["detected_ms"] == 0.0  # no detector ran
    assert served["detector"] == crops_dropped["detector"] == "loki_detect_cc"
    for bad in ({**plan, "dequeue": "artifact"}, {**plan, "rest_ms": {}}):
        with pytest.raises(grpcclient.InferenceServerException, match="dequeue|rest_ms"):
            _send(server, frames[:1], loki_plan=bad)


def _batches(client: grpcclient.InferenceServerClient, model: str) -> Counter:
    """How many batches of each size ``model`` has run."""
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return Counter({int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", ())})


def test_stage_models_run_at_the_planned_batch_sizes(server, frames):
    triton, _ = server
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    batch = {"loki_detect_cc": 2, "loki_digits_w16": 3, "loki_shapes_cnn": 4}
    sent = frames[:5]
    counts = {"loki_detect_cc": len(sent), "loki_digits_w16": sum(_kinds(f)[0] for f in sent),
              "loki_shapes_cnn": sum(_kinds(f)[1] for f in sent)}
    before = {m: _batches(client, m) for m in batch}
    _send(server, sent, loki_plan={**PLAN, "batch": {**PLAN["batch"], **batch}})
    for model, size in batch.items():
        expected = Counter({size: counts[model] // size})
        if counts[model] % size:
            expected[counts[model] % size] += 1
        assert _batches(client, model) - before[model] == expected, model


def test_a_model_loaded_again_runs_the_instances_last_set_for_it(server):
    """Hardware scaling unloads a variant and may load it again: it comes back with the count the plan set, not
    the repository's. A stage model has no batcher of Triton's, whose in-place change of its instances waits for an
    empty queue: the count goes in a config parameter too, so that Triton loads it anew."""
    triton, _ = server
    model = "loki_detect_fcn_s"  # no other test calls it
    client = grpcclient.InferenceServerClient(triton.grpc_url)

    async def scale() -> list[str]:
        worker = TritonWorker(triton.grpc_url)
        await worker.unload(model)
        done = [await worker.set_instances(model, 2)]  # not loaded: kept for when it is
        await worker.load(model)
        done += [await worker.set_instances(model, 3), await worker.set_instances(model, 3)]
        await worker.close()
        return done

    assert asyncio.run(scale()) == ["deferred", "reloaded", "unchanged"]
    config = client.get_model_config(model).config
    assert sum(g.count for g in config.instance_group) == 3
    assert config.parameters[INSTANCES_PARAMETER].string_value == "3"


def test_served_frames_match_the_offline_pipeline_and_a_bad_plan_is_refused(server, frames):
    triton, repo = server
    # one request, the whole batch; no early dropping: under the suite's load the detector batch can overrun its
    # 50 ms budget and reroute or drop a crop, and this test is about what serving computes (the rules have theirs)
    answers = _send(server, frames, loki_plan={**PLAN, "drop": "none"})
    detector = make_session(repo / "loki_detect_cc" / "1" / MODEL_FILE, 1) \
        if (repo / "loki_detect_cc" / "1" / MODEL_FILE).exists() else None
    assert detector is None  # the classical detector has no network
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
    with pytest.raises(Exception, match="exec_ms has no valid number"):
        _send(server, frames[:1], loki_plan={**PLAN, "exec_ms": {}})
    with pytest.raises(Exception, match="batch has no valid number"):
        _send(server, frames[:1], loki_plan={**PLAN, "batch": {**PLAN["batch"], "loki_digits_w4": 0}})
    with pytest.raises(Exception, match="spare capacity"):
        _send(server, frames[:1], loki_plan={**PLAN, "backups": {"digits": [["loki_digits_w4", -1.0]]}})
    with pytest.raises(Exception, match="waited_ms must be a JSON list of numbers"):
        _send(server, frames[:1], loki_plan=PLAN, waited_ms='["late"]')
    with pytest.raises(Exception, match="has 1 numbers for 2 frames"):
        _send(server, frames[:2], loki_plan=PLAN, waited_ms=[0.0])
    # more numbers than frames: the sidecar's batch less some rows; each frame counts the longest wait
    assert {o["outcome"] for o in _send(server, frames[:1], loki_plan=PLAN, waited_ms=[0.0, 70.0])[0]["objects"]} \
        == {"rerouted"}
    assert _send(server, frames[:1])[0]["plan"] == 1  # the deployed plan.json is the default
