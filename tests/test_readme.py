"""The README runs as written: its configs are the files in ``examples/`` and load as sidecar configs, every
``accscale`` command in it parses against the CLI, and the quick ones run."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from scheduler_sidecar import systems
from scheduler_sidecar.cli import build_parser, main
from scheduler_sidecar.server import config
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.toml"))


def blocks(language: str) -> list[str]:
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", README, re.S) if lang == language]


def commands() -> list[str]:
    """Every ``accscale`` command of the README's shell blocks, continuation lines joined, comments and a trailing
    ``&`` left out; a line with ``...`` or ``|`` stands for several and is left out too."""
    found = []
    for body in blocks(""):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip().removesuffix("&").strip()
            if line.startswith("accscale ") and "..." not in line and "|" not in line:
                found.append(line)
    return found


def test_each_toml_block_of_the_readme_is_an_example_file():
    texts = {p.read_text() for p in EXAMPLES}
    assert blocks("toml") and all(block in texts for block in blocks("toml"))


def test_the_serve_help_shows_the_sidecar_example():
    example = (REPO_ROOT / "examples" / "sidecar.toml").read_text()
    body = [line for line in example.splitlines() if line and not line.startswith("# ")]
    shown = [line.removeprefix("    ") for line in config.__doc__.splitlines()]
    assert all(line in shown for line in body)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_loads_as_a_sidecar_config(path, monkeypatch):
    # a planner that reads a built file (Loki's pipeline, HybridServe's family) is checked for its keys here; the
    # files are the ones the demos build (the next test)
    real = systems.planner
    monkeypatch.setattr(systems, "planner", lambda kind: dataclasses.replace(real(kind), check=dict))
    loaded = config.load(path)
    assert loaded.models and loaded.workers


def test_the_examples_name_the_files_the_demos_build():
    from export.presets import DEFAULT_BUILD_DIR

    loki = config.tomllib.loads((REPO_ROOT / "examples" / "loki.toml").read_text())["planner"]
    hybridserve = config.tomllib.loads((REPO_ROOT / "examples" / "hybridserve.toml").read_text())["planner"]
    assert Path(loki["pipeline"]) == DEFAULT_BUILD_DIR / "loki-demo" / "loki.json"  # demo loki's --recipe full
    assert Path(hybridserve["family"]) == DEFAULT_BUILD_DIR / "hybridserve" / "cascade.json"


@pytest.mark.parametrize("command", commands())
def test_each_readme_command_parses(command):
    build_parser().parse_args(shlex.split(command)[1:])


def test_the_quick_readme_commands_run(tmp_path, monkeypatch, capsys):
    """Traces, their summary and the simulations on them, in a folder of their own beside the shipped profiles."""
    (tmp_path / "profiles").symlink_to(REPO_ROOT / "profiles")
    monkeypatch.chdir(tmp_path)
    # every trace and simulation but RAMSIS's on a policy set (`accscale ramsis generate` takes minutes)
    quick = [c for c in commands() if c.startswith(("accscale trace ", "accscale simulate "))
             and "--ramsis-policies" not in c]
    assert len(quick) >= 8
    for command in quick:
        assert main(shlex.split(command)[1:]) == 0, command
    capsys.readouterr()
