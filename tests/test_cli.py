"""The `accscale` command line: help for every command, and export into a fresh repository."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from export.presets import DEFAULT_BUILD_DIR
from scheduler_sidecar.cli import build_parser, main
from tests.conftest import REPO_ROOT

COMMANDS = [["triton"], ["profile"], ["export"], ["demo"], ["bench", "subnetact"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_explains_its_options(command, capsys):
    """`--help` works for every subcommand and documents each option."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: accscale" in text
    options = [tok for tok in text.split() if tok.startswith("--") and tok != "--help"]
    assert options, "no options documented"


# what the `full` and `cpu` extras add to the base install (pyproject.toml); the sidecar's image has none of them
EXTRAS_MODULES = ("torch", "onnxruntime", "onnx", "sklearn", "matplotlib", "psutil", "yaml", "filelock", "locust",
                  "pytriton")


def test_console_script_starts_fast_without_heavy_imports():
    """`accscale --help` imports no extra's package: it starts fast, and works in the sidecar's image."""
    code = "import sys; from scheduler_sidecar.cli import build_parser; build_parser(); " \
           f"print(sorted(m for m in {EXTRAS_MODULES} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_export_writes_supernet_and_static_models(fast_build, tmp_path, capsys):
    """`accscale export` writes the supernet (calibrated for the profile) and requested static subnets."""
    static_id = fast_build.profile.variants[0].id
    code = main(["export", "--preset", "fast", "--build-dir", str(REPO_ROOT / DEFAULT_BUILD_DIR),
                 "--profile", str(fast_build.profile_path), "--repository", str(tmp_path),
                 "--static", static_id, "--static-spread", "2"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"({len(fast_build.profile.variants)} calibrated subnets)" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "digits_supernet" in names and len(names) >= 3
    for name in names:
        assert (tmp_path / name / "config.pbtxt").exists() and (tmp_path / name / "1" / "model.onnx").exists()


def test_export_rejects_an_unknown_subnet_clearly(fast_build, tmp_path, capsys):
    """A subnet id that was never calibrated is a one-line error, not a traceback."""
    code = main(["export", "--preset", "fast", "--build-dir", str(REPO_ROOT / DEFAULT_BUILD_DIR), "--subnets", "all",
                 "--repository", str(tmp_path), "--static", "d999-w0.0.0"])
    assert code == 2
    assert "no calibrated statistics for ['d999-w0.0.0']" in capsys.readouterr().err


def test_a_command_ended_by_sigterm_stops_what_it_started():
    """SIGTERM exits through the command's ``with`` blocks, as Ctrl-C does: the child it started is stopped, where
    Python's default would leave it running (a `demo` so ended left Locust and a Triton stub behind)."""
    script = ("import signal, subprocess, sys\n"
              "from scheduler_sidecar import cli\n"
              "sys.argv = ['accscale', 'trace', 'gen', '--help']\n"
              "try:\n"
              "    cli.main()  # the console script's way in: it installs the handler, then prints its help\n"
              "except SystemExit:\n"
              "    pass\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])  # a server's stand-in\n"
              "try:\n"
              "    print('child', child.pid, flush=True)\n"
              "    child.wait()\n"
              "finally:\n"
              "    child.kill()\n"
              "    child.wait()\n")
    command = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    child = None
    try:
        child = int(next(line for line in command.stdout if line.startswith("child")).split()[1])
        command.send_signal(signal.SIGTERM)
        assert command.wait(timeout=60) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)  # killed and reaped by the command on its way out
    finally:
        command.kill()
        command.wait()
        command.stdout.close()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
