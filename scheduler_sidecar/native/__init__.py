"""The project's native programs (``native/``): found where built, built on first use where the tools are present.

The build is CMake over Debian's gRPC and protobuf; its output lives in ``build/native`` beside the other cached
builds. Without the tools, :func:`program` says which packages to install and the Python paths stay in use.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)
SOURCE = Path(__file__).resolve().parents[2] / "native"
# another build of the same sources (make fuzz-native's sanitized one) where ACCSCALE_NATIVE_BUILD names it
BUILD = Path(os.environ.get("ACCSCALE_NATIVE_BUILD", SOURCE.parent / "build" / "native")).resolve()
NEEDS = "cmake, g++, pkg-config and Debian's libgrpc++-dev, libprotobuf-dev, protobuf-compiler-grpc and rapidjson-dev"


class NativeUnavailable(RuntimeError):
    """The native build cannot run here: a tool or library is missing."""


def program(name: str, build: Path = BUILD) -> Path:
    """The path of native program ``name``, building it first if it is not built (a minute on 2 cores)."""
    return _built(name, build / name, build)


def edge(build: Path = BUILD) -> ModuleType:
    """The native edge's extension module (native/edge.cc): the one ``pip install`` built into the package where the
    sources are not here (an installed package), else built first if it is not built (two minutes)."""
    name = f"_edge{sysconfig.get_config_var('EXT_SUFFIX')}"
    packaged = Path(__file__).with_name(name)
    path = packaged if packaged.exists() and not SOURCE.exists() else _built("_edge", build / name, build)
    spec = importlib.util.spec_from_file_location("_edge", path)
    try:
        module = importlib.util.module_from_spec(spec)  # the library is loaded here
        spec.loader.exec_module(module)
    except ImportError as exc:  # a run-time library is missing (gRPC's or protobuf's, as Debian installs them)
        raise NativeUnavailable(f"the native edge at {path} cannot be loaded ({exc}): it needs the run-time "
                                f"libraries of {NEEDS}") from exc
    return module


def built_edge(build: Path = BUILD) -> tuple[ModuleType | None, str]:
    """The native edge where it is built (installed with the package, or built in this checkout, which is brought up
    to date), else None; and why, in words for the log. Never starts a first build: ``accscale serve``'s default
    edge must not make a sidecar's start wait two minutes."""
    name = f"_edge{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not (Path(__file__).with_name(name).exists() and not SOURCE.exists()) and not (build / name).exists():
        return None, f"the native edge is not built ({'make native builds it' if SOURCE.exists() else NEEDS})"
    try:
        return edge(build), "the native edge is built"
    except NativeUnavailable as exc:
        return None, str(exc)


def _built(name: str, path: Path, build: Path) -> Path:
    """``path`` after an incremental build of target ``name`` (a no-op when the sources have not changed), one
    build at a time (test workers share the folder); the last build where the tools are missing."""
    if not SOURCE.exists():
        raise NativeUnavailable(f"{name} is not built and its sources are not here: this package was installed where "
                                f"its build tools were missing; install {NEEDS} and install it again")
    missing = [tool for tool in ("cmake", "g++", "pkg-config", "protoc", "grpc_cpp_plugin") if not shutil.which(tool)]
    if missing:
        if path.exists():
            return path
        raise NativeUnavailable(f"{name} is not built and {', '.join(missing)} is missing: install {NEEDS} "
                                "(make does where apt is present and it runs as root)")
    build.mkdir(parents=True, exist_ok=True)
    configure = ["cmake", "-S", str(SOURCE), "-B", str(build), f"-DPYTHON={sys.executable}"]
    make = ["cmake", "--build", str(build), "--target", name, "-j2"]
    with open(build / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (build / "CMakeCache.txt").exists():
            log.info("building the native programs into %s (the first time: about two minutes)", build)
            _run(name, configure)
        # a folder configured before what the target needs was there (pybind11) lacks the target: configure again
        if subprocess.run(make, capture_output=True).returncode:
            _run(name, configure)
            _run(name, make)
    return path


def _run(name: str, step: list[str]) -> None:
    done = subprocess.run(step, capture_output=True, text=True)
    if done.returncode:
        raise NativeUnavailable(f"building {name} failed ({' '.join(step[:2])}):\n{done.stdout[-2000:]}"
                                f"{done.stderr[-2000:]}")
