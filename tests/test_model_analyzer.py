"""`accscale profile import`: Model Analyzer's inference results, with the column headers of its result tables
(model_analyzer/result/result_table_manager.py and its record types), become a profile the sidecar reads."""

from __future__ import annotations

import csv
import json

import pytest

from scheduler_sidecar.cli import main
from scheduler_sidecar.core.profile import Profile

HEADERS = ["Model", "Batch", "Concurrency", "Model Config Path", "Instance Group", "Max Batch Size",
           "Satisfies Constraints", "Throughput (infer/sec)", "p99 Latency (ms)", "Avg Latency (ms)"]


def _results(path, rows, headers=HEADERS) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(headers)
        writer.writerows([[r[h] for h in headers] for r in rows])


def _read(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _row(model, config, batch, concurrency, avg, p99):
    return {"Model": model, "Batch": batch, "Concurrency": concurrency, "Model Config Path": config,
            "Instance Group": "1:GPU", "Max Batch Size": 32, "Satisfies Constraints": "Yes",
            "Throughput (infer/sec)": round(1000 * batch / avg, 1), "p99 Latency (ms)": p99, "Avg Latency (ms)": avg}


@pytest.fixture
def files(tmp_path):
    rows = [_row("resnet18", "resnet18_config_default", b, 1, 1.0 + b / 8, 1.5 + b / 8) for b in (1, 8, 32)]
    rows += [_row("resnet18", "resnet18_config_default", 8, 4, 9.0, 12.0)]  # concurrency 4: left out
    rows += [_row("resnet50", "resnet50_config_1", b, 1, 2.0 + b / 4, 3.0 + b / 4) for b in (1, 8, 32)]
    _results(tmp_path / "metrics-model-inference.csv", rows)
    (tmp_path / "accuracy.csv").write_text("model,version,accuracy,metric,dataset\nresnet18,,0.697,top-1,imagenet\n"
                                           "resnet50,1,0.761,top-1,imagenet\n")
    return tmp_path


def test_model_analyzers_results_at_concurrency_1_become_a_profile(files, capsys):
    out = files / "mine.json"
    assert main(["profile", "import", str(files / "metrics-model-inference.csv"), "--accuracy",
                 str(files / "accuracy.csv"), "--device-kind", "a100", "--out", str(out)]) == 0
    profile = Profile.load(out)
    assert [(v.id, v.accuracy, v.actuation.model) for v in profile.variants] == [("resnet18", 0.697, "resnet18"),
                                                                                 ("resnet50", 0.761, "resnet50")]
    small = profile.variants[0].latency["a100"]
    assert small.batch_sizes == (1, 8, 32) and small.p50_ms == (1.125, 2.0, 5.0) and small.p99_ms == (1.625, 2.5, 5.5)
    provenance = json.loads(out.read_text())["metadata"]["provenance"]
    assert "p50 is its average latency" in provenance["latency"] and "profile import" in provenance["command"]


def test_without_an_average_the_tail_is_planned_with(files):
    rows = _read(files / "metrics-model-inference.csv")
    _results(files / "p99-only.csv", rows, HEADERS[:-1])
    out = files / "p99.json"
    assert main(["profile", "import", str(files / "p99-only.csv"), "--accuracy", str(files / "accuracy.csv"),
                 "--out", str(out)]) == 0
    curve = Profile.load(out).variants[1].latency["cpu"]
    assert curve.p50_ms == curve.p99_ms == (3.25, 5.0, 11.0)


def test_what_cannot_be_imported_is_refused_with_the_reason(files, capsys):
    results, accuracy = str(files / "metrics-model-inference.csv"), str(files / "accuracy.csv")
    common = ["--out", str(files / "x.json")]
    rows = _read(results)
    rows += [_row("resnet50", "resnet50_config_2", b, 1, 1.0, 2.0) for b in (1, 8)]  # a second configuration
    _results(files / "two.csv", rows)
    assert main(["profile", "import", str(files / "two.csv"), "--accuracy", accuracy, *common]) == 2
    assert "resnet50 has several configurations at concurrency 1" in capsys.readouterr().err
    assert main(["profile", "import", str(files / "two.csv"), "--accuracy", accuracy, "--model-config",
                 "resnet50_config_2", *common]) == 0
    # the batch sizes both models were measured at
    assert Profile.load(files / "x.json").variants[1].latency["cpu"].batch_sizes == (1, 8)
    (files / "short.csv").write_text("model,version,accuracy,metric,dataset\nresnet18,,0.697,top-1,imagenet\n")
    assert main(["profile", "import", results, "--accuracy", str(files / "short.csv"), *common]) == 2
    assert "no accuracy for resnet50" in capsys.readouterr().err
    (files / "other.csv").write_text("a,b\n1,2\n")
    assert main(["profile", "import", str(files / "other.csv"), "--accuracy", accuracy, *common]) == 2
    assert "not Model Analyzer's inference results: no column 'Model'" in capsys.readouterr().err
