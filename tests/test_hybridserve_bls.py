"""HybridServe's cascade BLS model on a real Triton server, with the family trained here: the
answers equal the offline cascade's at batch sizes 1, 7 and 32, a request's time budget ends the cascade early, and
a malformed plan is refused for its request alone."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from export import repository
from python_backend.cascade import CONFIDENT, EARLY, LAST
from scheduler_sidecar.processes.triton_launcher import TritonServer
from scheduler_sidecar.systems.hybridserve.cascade import Cascade, answered_by
from scheduler_sidecar.systems.hybridserve.search import search

pytestmark = [pytest.mark.slow, pytest.mark.triton]
BLS = "cascade"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, hybridserve_family):
    family = hybridserve_family
    repo = tmp_path_factory.mktemp("hybridserve") / "repository"
    shutil.copytree(family.folder / "repository", repo)
    ap = search(family.predictions("search"), family.costs).ap
    cascade = Cascade(tuple(family.names), ap.thresholds)
    temperatures = {m.name: m.temperature for m in family.models}
    plan = cascade.plan(temperatures, {m.name: m.latency.p50_ms[0] for m in family.models})
    repository.write_cascade(repo, BLS, plan, family.names)
    with TritonServer(repository=repo) as triton:
        yield triton, family, cascade, plan


def _infer(triton, x: np.ndarray, **params) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    tensor = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(BLS, [tensor], parameters=params)
    return {k: result.as_numpy(k)[:, 0] for k in ("LABEL", "MODEL", "CONFIDENCE", "REASON")}


@pytest.mark.parametrize("batch", [1, 7, 32])
def test_the_bls_cascade_equals_the_offline_cascade(deployed, batch):
    triton, family, cascade, _ = deployed
    images = np.concatenate([family.images(s)[0] for s in ("search", "test")])
    preds = [family.predictions(s) for s in ("search", "test")]
    labels, conf = np.concatenate([p.labels for p in preds], 1), np.concatenate([p.conf for p in preds], 1)
    by = np.concatenate([answered_by(p, np.array([cascade.thresholds]))[0] for p in preds])
    n = min(len(images), 2100)
    assert n >= 2000
    got = {k: [] for k in ("LABEL", "MODEL", "CONFIDENCE", "REASON")}
    for start in range(0, n, batch):
        for k, v in _infer(triton, images[start:min(n, start + batch)]).items():
            got[k].append(v)
    got = {k: np.concatenate(v) for k, v in got.items()}
    rows = np.arange(n)
    # a confidence within 1e-6 of a threshold may fall either way (onnxruntime at another batch size)
    thresholds = np.array([*cascade.thresholds, 0.0])
    near = np.zeros(n, bool)
    for i in range(len(thresholds) - 1):
        near |= np.abs(conf[i, :n] - thresholds[i]) < 1e-6
    same = ~near
    assert same.mean() > 0.99
    np.testing.assert_array_equal(got["MODEL"][same], by[:n][same])
    np.testing.assert_array_equal(got["LABEL"][same], labels[by[:n], rows][same])
    np.testing.assert_allclose(got["CONFIDENCE"][same], conf[by[:n], rows][same], atol=1e-5)
    last = len(family.names) - 1
    np.testing.assert_array_equal(got["REASON"][same], np.where(by[:n] == last, LAST, CONFIDENT)[same])
    assert len(set(got["MODEL"].tolist())) > 1  # the cascade did escalate some samples and not others


def test_no_time_left_answers_with_the_model_at_hand(deployed):
    triton, family, _, plan = deployed
    x = family.images("test")[0][:64]
    out = _infer(triton, x, budget_ms=0.0)
    assert set(out["MODEL"].tolist()) == {0}  # nothing could pay for the next model
    assert set(out["REASON"].tolist()) <= {CONFIDENT, EARLY} and EARLY in out["REASON"]
    # a plan sent with the request wins over the deployed one: thresholds 0 answer everything at once
    zero = {**plan, "thresholds": [0.0] * len(plan["thresholds"])}
    out = _infer(triton, x, cascade_plan=json.dumps(zero))
    assert set(out["MODEL"].tolist()) == {0} and set(out["REASON"].tolist()) == {CONFIDENT}


@pytest.mark.parametrize("bad", [
    {"models": ["not_a_model"], "thresholds": []},
    {"models": ["cascade_xs", "cascade_l"], "thresholds": [1.5], "temperatures": {"cascade_xs": 1, "cascade_l": 1}},
    {"models": ["cascade_xs", "cascade_l"], "thresholds": [0.5], "temperatures": {"cascade_xs": -1, "cascade_l": 1}},
    "not json",
])
def test_a_malformed_plan_is_refused_and_the_server_serves_on(deployed, bad):
    triton, family, _, _ = deployed
    x = family.images("test")[0][:4]
    with pytest.raises(InferenceServerException, match="plan|JSON|Expecting"):
        _infer(triton, x, cascade_plan=bad if isinstance(bad, str) else json.dumps(bad))
    assert len(_infer(triton, x)["LABEL"]) == 4


def test_a_plan_of_two_models_without_skip_or_times_is_served(deployed):
    triton, family, _, plan = deployed
    first, last = family.names[0], family.names[-1]
    two = {"models": [first, last], "thresholds": [0.5], "temperatures": {m: plan["temperatures"][m] for m in (first, last)}}
    out = _infer(triton, family.images("test")[0][:32], cascade_plan=json.dumps(two))
    assert set(out["MODEL"].tolist()) <= {0, len(family.names) - 1}
