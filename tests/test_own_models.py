"""Models no one here designed, brought the way an operator brings them: scikit-learn classifiers of different
cost, trained on the digits scikit-learn ships and converted by skl2onnx, added to a Triton repository with
`accscale add-model`, served by the generic ONNX runner on a real Triton, and profiled by `accscale profile
triton` with their accuracy measured through Triton; then advised, served and replayed as the README walks it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from skl2onnx import to_onnx
from sklearn.datasets import load_digits
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

from loadtest.traces import Trace, bursty
from scheduler_sidecar.cli import main
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.processes.triton_launcher import TritonServer
from scheduler_sidecar.server import config

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sklearn_family.py"


def _family() -> dict:
    return {"logreg": LogisticRegression(max_iter=300),
            "forest": RandomForestClassifier(n_estimators=40, max_depth=12, random_state=0),
            "mlp": MLPClassifier(hidden_layer_sizes=(64,), max_iter=1000, random_state=0)}


@pytest.mark.triton
@pytest.mark.slow
def test_an_operators_own_family_is_served_and_profiled(tmp_path, capsys):
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.data.astype(np.float32) / 16, digits.target,
                                                        test_size=0.3, random_state=0, stratify=digits.target)
    repository, family = tmp_path / "repository", _family()
    for name, estimator in family.items():
        estimator.fit(x_train, y_train)
        onnx_model = to_onnx(estimator, x_train[:1], options={id(estimator): {"zipmap": False}}, target_opset=17)
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(onnx_model.SerializeToString())
        assert main(["add-model", str(path), "--repository", str(repository), "--max-batch-size", "64"]) == 0
    np.savez(tmp_path / "digits-test.npz", X=x_test, labels=y_test)
    out = tmp_path / "sklearn-digits.json"
    with TritonServer(repository=repository) as triton:
        with grpcclient.InferenceServerClient(triton.grpc_url) as client:
            meta = client.get_model_metadata("forest", as_json=True)
            assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [("X", ["-1", "64"])]
            assert {t["name"] for t in meta["outputs"]} == {"label", "probabilities"}
            x = grpcclient.InferInput("X", [5, 64], "FP32")
            x.set_data_from_numpy(x_test[:5])
            label = client.infer("mlp", [x]).as_numpy("label")
            assert label.ravel().tolist() == family["mlp"].predict(x_test[:5]).tolist()  # served as dims [1]
        assert main(["profile", "triton", "--url", triton.grpc_url, "--models", "logreg,forest,mlp",
                     "--batch-sizes", "1,8,64", "--repeats", "5", "--warmup", "1", "--load-repeats", "1",
                     "--data", str(tmp_path / "digits-test.npz"), "--output", "label", "--out", str(out)]) == 0
    assert "forest: batch 64: p50" in capsys.readouterr().err
    profile = Profile.load(out)
    assert [v.accuracy for v in profile.variants] == sorted(v.accuracy for v in profile.variants)
    for v in profile.variants:
        # the float32 graph may flip a near-tie of the float64 estimator: a row or two of 540
        expected = float((family[v.id].predict(x_test) == y_test).mean())
        assert abs(v.accuracy - expected) <= 2 / len(y_test), v.id
        assert v.latency["cpu"].batch_sizes == (1, 8, 64) and v.load_ms > 0
    provenance = json.loads(out.read_text())["metadata"]["provenance"]
    assert provenance["device_kind"] == "cpu" and "profile triton" in provenance["command"]


def test_add_model_refuses_what_it_cannot_serve(tmp_path, capsys):
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert main(["add-model", str(tmp_path / "junk.onnx"), "--repository", str(tmp_path / "r")]) == 2
    assert "junk.onnx: not an ONNX model" in capsys.readouterr().err
    estimator = LogisticRegression(max_iter=50).fit(np.eye(4, dtype=np.float32), [0, 1, 0, 1])
    fixed = to_onnx(estimator, np.eye(4, dtype=np.float32)[:1], options={id(estimator): {"zipmap": False}},
                    target_opset=17)
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # a graph exported with batch 1 fixed
    (tmp_path / "fixed.onnx").write_bytes(fixed.SerializeToString())
    assert main(["add-model", str(tmp_path / "fixed.onnx"), "--repository", str(tmp_path / "r")]) == 2
    assert "first dimension is not a variable batch" in capsys.readouterr().err
    assert main(["add-model", str(tmp_path / "fixed.onnx"), "--repository", str(tmp_path / "r"),
                 "--max-batch-size", "0"]) == 0
    assert "max_batch_size: 0" in (tmp_path / "r" / "fixed" / "config.pbtxt").read_text()


@pytest.mark.triton
@pytest.mark.slow
def test_the_walkthrough_serves_what_advise_predicted(tmp_path, capsys):
    """The README's walkthrough end to end on the example family (examples/sklearn_family.py): added, served by a
    Triton emulating a device 200 times slower than this machine (so a batch takes tens of milliseconds, as a
    GPU's larger model would, and the sidecar's own time is small beside it), profiled there, advised on a bursty
    trace, and the top two systems served live with the trace replayed by Locust."""
    subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, check=True, capture_output=True)
    repository, models = tmp_path / "repository", ("logreg", "mlp", "svc")
    for name in models:
        assert main(["add-model", str(tmp_path / f"{name}.onnx"), "--repository", str(repository)]) == 0
    profile, trace, out = tmp_path / "mine.json", tmp_path / "bursty.txt", tmp_path / "advice"
    bursty(20.0, 40.0, 8.0, 8.0, seed=1).save(trace)
    with TritonServer(repository=repository, emulate_slowdown=200) as triton:
        assert main(["profile", "triton", "--url", triton.grpc_url, "--models", ",".join(models), "--batch-sizes",
                     "1,4,16", "--repeats", "5", "--warmup", "2", "--device-kind", "cpu-x200", "--data",
                     str(tmp_path / "digits-test.npz"), "--output", "label", "--out", str(profile)]) == 0
        capsys.readouterr()
        assert main(["advise", "--profile", str(profile), "--trace", str(trace), "--slo-ms", "150", "--seeds", "1",
                     "--overhead-ms", "3", "--triton", triton.grpc_url, "--replay", "2", "--data",
                     str(tmp_path / "digits-test.npz"), "--out", str(out), "--json"]) == 0
    ranking = json.loads(capsys.readouterr().out)["ranking"]
    queries = len(Trace.load(trace))
    for row in ranking[:2]:
        run = json.loads((out / "live" / row["policy"] / "run.json").read_text())["summary"]
        assert run["queries"] == queries and run["answered"] + sum(run["errors"].values()) == queries
        # the family's own answers, scored by Locust from its `label` output: the accuracy served is measured
        assert run["measured_accuracy"] > 0.9
        # the prediction holds live, to a bound that catches a wrong simulation, not noise: the live side shares 2
        # cores with the client and, in the suite, with other tests' servers (13.67 points off in one fresh clone's
        # run where every other run was within 10); `bench fidelity` measures the gap itself
        assert abs(row["live_minus_simulated_points"]) <= 20, row
    assert all(row["live_attainment"] == "" for row in ranking[2:])
    advised, runner_up = config.load(out / "advised.toml"), config.load(out / "rank-2.toml")
    assert [m.policy for m in (*advised.models, *runner_up.models)] == [r["policy"] for r in ranking[:2]]
    assert advised.workers == (triton.grpc_url,) and advised.models[0].overhead_us == 3000
