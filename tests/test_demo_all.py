"""The five systems at once on one deployment: `accscale demo all` briefly, on one real Triton that SlackFit, RAMSIS,
Proteus's, Loki's and HybridServe's planners share through one sidecar and its engine."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from scheduler_sidecar.cli import main
from scheduler_sidecar.experiments.demo_all import SYSTEMS
from scheduler_sidecar.server.config import tomllib
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def test_the_five_systems_serve_their_models_at_once_on_one_triton(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "all", "--tritons", "1", "--duration-s", "12", "--base-qps", "3", "--burst-qps", "20",
                 "--out", str(out)]) == 0
    config = tomllib.loads((out / "sidecar.toml").read_text())
    assert [p["kind"] for p in config["planners"]] == ["proteus", "loki", "hybridserve"]
    assert [m["policy"] for m in config["models"]] == ["slackfit", "ramsis", "proteus", "loki", "cascade"]
    # examples/all.toml is this deployment, its files where the demo builds them
    example = tomllib.loads((REPO_ROOT / "examples" / "all.toml").read_text())

    def relative(value):
        return str(Path(value).relative_to(REPO_ROOT)) if isinstance(value, str) and value.startswith("/") else value

    for served, shown in zip(config["planners"] + config["models"], example["planners"] + example["models"]):
        assert {k: relative(v) for k, v in served.items()} == {k: v for k, v in shown.items()
                                                               if k not in ("models", "workers")}
    log = (out / "sidecar.log").read_text()
    assert "Traceback" not in log, log
    # one worker: the unplanned models' slot, Proteus's device, and the instances of the two BLS models
    placed = re.search(r"first plan placed: (\{.*\})", log)
    assert placed, log
    summary = (out / "summary.md").read_text()
    with open(out / "windows.csv") as f:
        assert {r["model"] for r in csv.DictReader(f)} == set(SYSTEMS)
    for name, system in SYSTEMS.items():
        line = next(x for x in summary.splitlines() if x.startswith(f"| {name} | {system} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        sent, met = int(cells[3]), int(cells[4])
        # every system served its own model beside the others; the 2-core machine runs all of them and the client
        assert sent > 0 and met / sent > 0.5, line
