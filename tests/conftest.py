"""Session fixtures: the fast-preset supernet build, its Triton repository and a real server."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from export.presets import DEFAULT_BUILD_DIR, get_preset

# pytest-xdist's workers share the machine's cores: one math thread each (set before torch is imported), or torch's
# and onnxruntime's thread pools spin against each other and training slows down many times over
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# the suite's property tests draw the same examples on every run, so that a run's outcome is the code's, not the
# draw's (a fault sequence found once by chance failed one CI run); HYPOTHESIS_PROFILE=explore draws new ones
settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

REPO_ROOT = Path(__file__).resolve().parent.parent
NUM_STATIC = 3  # static subnet models exported for the tests


@dataclass(frozen=True)
class FastBuild:
    """The fast preset, trained, searched and profiled once per session (cached in build/fast)."""

    act: object  # export.subnetact.SubNetAct
    calibration: object  # export.profiler.Calibration
    profile: object  # scheduler_sidecar.core.profile.Profile
    profile_path: Path
    repository: Path  # supernet with every searched subnet calibrated, plus NUM_STATIC static models
    static_ids: tuple[str, ...]


@pytest.fixture(scope="session")
def fast_build(tmp_path_factory: pytest.TempPathFactory) -> FastBuild:
    from export.artifacts import Artifacts
    from export.profiler import export_static, export_supernet, profile_supernet

    artifacts = Artifacts(get_preset("fast"), REPO_ROOT / DEFAULT_BUILD_DIR)
    act = artifacts.supernet()
    calibration = artifacts.calibration(act)
    profile, _ = profile_supernet(act, calibration, mode="onnxruntime", repeats=3, name="digits-fast",
                                  source="tests/conftest.py")
    profile_path = tmp_path_factory.mktemp("profile") / "profile.json"
    profile.save(profile_path)
    repository = tmp_path_factory.mktemp("model_repository")
    export_supernet(act, calibration.candidates, repository)
    static = random.Random(7).sample(list(calibration.candidates), NUM_STATIC)
    for candidate in static:
        export_static(act, candidate, repository)
    return FastBuild(act, calibration, profile, profile_path, repository, tuple(c.subnet_id for c in static))


@pytest.fixture(scope="session")
def triton(fast_build: FastBuild):
    """A real tritonserver on free loopback ports serving the fast build's repository."""
    from scheduler_sidecar.processes.triton_launcher import TritonServer

    with TritonServer(repository=fast_build.repository) as server:
        yield server


@pytest.fixture(scope="session")
def hybridserve_family():
    """HybridServe's family with its full recipe, trained and profiled once (cached in build/hybridserve)."""
    from export.cascade_models import build
    from scheduler_sidecar.systems.hybridserve.family import Family

    return Family.load(build(REPO_ROOT / DEFAULT_BUILD_DIR / "hybridserve"))


@pytest.fixture(scope="session")
def native_edge():
    """The native edge, built here (two minutes on 2 cores, the first time) before a sidecar on it starts: a sidecar
    that built it itself would outlast its start-up wait."""
    from scheduler_sidecar.native import edge

    return edge()


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_pytests_tree(tmp_path_factory: pytest.TempPathFactory):
    """What the suite's servers write to temporary files (a Triton's log, kept after it stops, as it explains a
    crash) goes under pytest's own temporary tree, which keeps its last three runs, not into /tmp for good."""
    import tempfile  # this fixture's only

    folder = tmp_path_factory.mktemp("tmp")
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    yield
    tempfile.tempdir = before[1]
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first: spread over pytest-xdist's workers, the long ones start early instead of ending the run on
    one worker while the others idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# --------------------------------------------------------------------------- every test that starts Triton says so
_running: list[pytest.Item] = []  # the test being set up or run (a session fixture starts inside its first user)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]


def pytest_configure(config: pytest.Config) -> None:
    """A test that starts tritonserver without the ``triton`` marker fails (``-m 'not triton'`` must mean it)."""
    from scheduler_sidecar.processes.triton_launcher import TritonServer

    start = TritonServer.start

    def checked(self) -> None:
        if _running and _running[0].get_closest_marker("triton") is None:
            pytest.fail(f"{_running[0].nodeid} starts tritonserver: mark it @pytest.mark.triton")
        start(self)

    TritonServer.start = checked
