"""The sidecar's TOML config reader on Python 3.11+ (stdlib tomllib) and on 3.10 (the tomli package)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from scheduler_sidecar.server import config

GOOD = 'workers = ["h:1"]\n[[models]]\nname = "d"\nprofile = "p.json"\n'


def load_config_module_as_on_python_310(monkeypatch: pytest.MonkeyPatch, tomli: types.ModuleType):
    """A fresh copy of server/config.py executed as if on Python 3.10, with ``tomli`` importable."""
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    monkeypatch.setitem(sys.modules, "tomllib", None)  # `import tomllib` fails, as on 3.10
    monkeypatch.setitem(sys.modules, "tomli", tomli)
    spec = importlib.util.spec_from_file_location("config_as_on_py310", config.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_python_310_reads_the_config_with_tomli_and_reports_its_decode_errors(monkeypatch, tmp_path):
    real = config.tomllib  # this interpreter's parser (tomllib, or tomli on 3.10), wrapped below

    class TomliDecodeError(ValueError):
        """tomli's own exception class: a distinct type from tomllib's."""

    calls = []

    def loads(text: str) -> dict:
        calls.append(text)
        try:
            return real.loads(text)
        except real.TOMLDecodeError as exc:
            raise TomliDecodeError(str(exc)) from None

    tomli = types.ModuleType("tomli")
    tomli.loads, tomli.TOMLDecodeError = loads, TomliDecodeError
    py310 = load_config_module_as_on_python_310(monkeypatch, tomli)
    assert py310.tomllib is tomli

    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    assert py310.load(path).workers == ("h:1",) and calls == [GOOD]
    path.write_text("workers = [")
    with pytest.raises(ValueError, match=r"c\.toml: ") as err:
        py310.load(path)
    assert not isinstance(err.value, TomliDecodeError)  # turned into the config's own message, not leaked


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is in the standard library from 3.11")
def test_python_311_uses_the_standard_library(tmp_path):
    import tomllib

    assert config.tomllib is tomllib
    path = tmp_path / "c.toml"
    path.write_text("workers = [")
    with pytest.raises(ValueError, match=r"c\.toml: ") as err:
        config.load(path)
    assert not isinstance(err.value, tomllib.TOMLDecodeError)


def test_limits_come_from_the_file_and_the_flags_override_them(tmp_path):
    from scheduler_sidecar.cli import build_parser
    from scheduler_sidecar.server.serve import config_from_args

    path = tmp_path / "sidecar.toml"
    path.write_text("max_slo_us = 1000000\nread_timeout_s = 2.5\n" + GOOD)
    args = build_parser().parse_args(["serve", "--config", str(path), "--max-request-bytes", "4096"])
    loaded = config_from_args(args)
    assert (loaded.limits.max_request_bytes, loaded.limits.max_slo_us) == (4096, 1_000_000)
    assert (loaded.read_timeout_s, loaded.idle_timeout_s) == (2.5, 60.0)
    for bad, message in (("read_timeout_s = 0", "read_timeout_s must be > 0"),
                         ("max_slo_us = 100", "default_slo_us 50000 is above max_slo_us")):
        path.write_text(GOOD.replace("[[models]]", bad + "\n[[models]]"))
        with pytest.raises(ValueError, match=message):
            config.load(path)


def _model(name: str, policy: str) -> str:
    return f'[[models]]\nname = "{name}"\nprofile = "{name}.json"\npolicy = "{policy}"\n'


def test_several_planners_each_plan_their_models_on_their_workers_beside_unplanned_models(tmp_path):
    path = tmp_path / "all.toml"
    path.write_text('workers = ["h:1", "h:2"]\n'
                    '[[planners]]\nkind = "proteus"\nmodels = ["p1"]\nworkers = ["h:1"]\nperiod_s = 5.0\n'
                    '[[planners]]\nkind = "proteus"\nmodels = ["p2"]\n'
                    + _model("s", "slackfit") + _model("p1", "proteus") + _model("p2", "proteus")
                    + _model("r", "jellyfish"))
    loaded = config.load(path)
    first, second = loaded.planners
    assert (first.models, first.workers, first.options, first.settings.period_s) == (("p1",), ("h:1",), {"period_s": 5.0}, 5.0)
    # the second names no worker: it owns every one, one added while serving too
    assert [[p.owns(url) for url in ("h:1", "h:2", "h:3")] for p in loaded.planners] == [[True, False, False],
                                                                                         [True, True, True]]
    assert [m.name for m in loaded.unplanned] == ["s", "r"]
    assert loaded.planner_of("p2") is second and loaded.planner_of("s") is None
    # one [planner] is the same as one [[planners]] entry over every model of its policy
    path.write_text('workers = ["h:1"]\n[planner]\nkind = "proteus"\n' + _model("p1", "proteus") + _model("s", "slackfit"))
    (only,) = config.load(path).planners
    assert config.load(path).planned_models(only) == ("p1",)


@pytest.mark.parametrize("planners, models, message", [
    ("", _model("p", "proteus"), "policy 'proteus' routes for a planner; add one"),
    ('[[planners]]\nkind = "proteus"\nmodels = ["p"]\n', _model("p", "proteus") + _model("q", "proteus"),
     r"'q': policy 'proteus' routes for a planner; add one .* that plans it"),
    ('[[planners]]\nkind = "proteus"\n[[planners]]\nkind = "proteus"\n', _model("p", "proteus"),
     "'p' is planned by two planners"),
    ('[[planners]]\nkind = "proteus"\nmodels = ["s"]\n', _model("s", "slackfit"), "'s' is served by 'slackfit'"),
    ('[[planners]]\nkind = "proteus"\nmodels = ["x"]\n', _model("p", "proteus"), "'x' is not a model"),
    ('[[planners]]\nkind = "proteus"\nworkers = ["h:9"]\n', _model("p", "proteus"), r"not in workers: \['h:9'\]"),
    ('[[planners]]\nkind = "proteus"\nmodels = "p"\n', _model("p", "proteus"), "lists of names"),
    ('[planner]\nkind = "proteus"\n[[planners]]\nkind = "proteus"\n', _model("p", "proteus"), "not both"),
])
def test_planners_that_leave_a_model_unplanned_or_claim_what_is_not_theirs_are_refused(tmp_path, planners, models,
                                                                                        message):
    path = tmp_path / "bad.toml"
    path.write_text('workers = ["h:1"]\n' + planners + models)
    with pytest.raises(ValueError, match=message):
        config.load(path)
