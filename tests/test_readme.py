"""The README runs as written: its configs are the files in ``examples/`` and load as sidecar configs, every
``accscale`` command in it parses against the CLI, and the quick ones run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from scheduler_sidecar.cli import build_parser, main
from scheduler_sidecar.errors import ConfigError
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
def test_each_example_loads_as_written_or_names_the_command_that_builds_what_it_reads(path, tmp_path, monkeypatch):
    """Each example, read as a user reads it before building anything (from a folder without build/): it loads, and
    serves the models, policies and planners its TOML names; or its planner reads a file only a demo builds, and the
    error names that demo."""
    raw = config.tomllib.loads(path.read_text())
    monkeypatch.chdir(tmp_path)
    try:
        loaded = config.load(path)
    except ConfigError as exc:
        kinds = [p["kind"] for p in raw.get("planners", [raw["planner"]] if "planner" in raw else [])]
        assert {"loki", "hybridserve"} & set(kinds), exc  # only these read built files when the config is read
        assert re.search(r"`accscale (demo|reproduce) (loki|hybridserve)`", str(exc)), exc
        return
    assert [(m.name, m.policy) for m in loaded.models] == [(m["name"], m["policy"]) for m in raw["models"]]
    assert list(loaded.workers) == raw.get("workers", [])
    planners = raw.get("planners", [raw["planner"]] if "planner" in raw else [])
    assert [p.kind for p in loaded.planners] == [p["kind"] for p in planners]


def test_the_examples_name_the_files_the_demos_build():
    from export.presets import DEFAULT_BUILD_DIR

    loki = config.tomllib.loads((REPO_ROOT / "examples" / "loki.toml").read_text())["planner"]
    hybridserve = config.tomllib.loads((REPO_ROOT / "examples" / "hybridserve.toml").read_text())["planner"]
    assert Path(loki["pipeline"]) == DEFAULT_BUILD_DIR / "loki-demo" / "loki.json"  # demo loki's --recipe full
    assert Path(hybridserve["family"]) == DEFAULT_BUILD_DIR / "hybridserve" / "cascade.json"


@pytest.mark.parametrize("command", commands())
def test_each_readme_command_parses(command):
    build_parser().parse_args(shlex.split(command)[1:])


def _fields(out: str) -> dict[str, str]:
    """``key: value`` lines (`accscale trace info`, `accscale simulate` without --json)."""
    return dict(line.strip().split(": ", 1) for line in out.splitlines() if ": " in line)


@pytest.mark.slow
def test_the_quick_readme_commands_run(tmp_path, monkeypatch, capsys):
    """Traces, their summary and the simulations on them, as written, in a folder of their own beside the shipped
    profiles; each says what its trace holds: as many queries (frames) as the trace it read, and ratios that are
    ratios."""
    (tmp_path / "profiles").symlink_to(REPO_ROOT / "profiles")
    monkeypatch.chdir(tmp_path)
    # every trace and simulation but RAMSIS's on a policy set (`accscale ramsis generate` takes minutes)
    quick = [c for c in commands() if c.startswith(("accscale trace ", "accscale simulate "))
             and "--ramsis-policies" not in c]
    assert len(quick) >= 8
    lines: dict[str, int] = {}  # trace file -> its queries
    for command in quick:
        argv = shlex.split(command)[1:]
        capsys.readouterr()
        assert main(argv) == 0, command
        captured = capsys.readouterr()
        out = captured.out
        if argv[:2] == ["trace", "gen"]:  # it says what it wrote on stderr, beside the file
            path = argv[argv.index("--out") + 1]
            lines[path] = sum(not line.startswith("#") for line in (tmp_path / path).read_text().splitlines())
            said = captured.err.rstrip()
            assert f": {lines[path]} queries over " in said and said.endswith(f"to {path}"), (command, said)
            continue
        trace = argv[argv.index("--trace") + 1] if "--trace" in argv else argv[-1]
        summary = json.loads(out) if "--json" in argv else _fields(out)
        if argv[:2] == ["trace", "info"]:
            assert int(summary["queries"]) == lines[trace], (command, out)
        elif "--pipeline" in argv:
            assert int(summary["frames"]) == lines[trace] and 0 <= float(summary["violation_ratio"]) <= 1, out
        else:
            assert int(summary["queries"]) == lines[trace], (command, out)
            assert 0 <= float(summary["slo_attainment"]) <= 1 and int(summary["met"]) > 0, (command, out)
