"""The project's native programs (``native/``): found where built, built on first use where the tools are present.

The build is CMake over Debian's gRPC and protobuf; its output lives in ``build/native`` beside the other cached
builds. Without the tools, :func:`program` says which packages to install and the Python paths stay in use.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "native"
BUILD = SOURCE.parent / "build" / "native"
NEEDS = "cmake, g++, pkg-config and Debian's libgrpc++-dev and protobuf-compiler-grpc"


class NativeUnavailable(RuntimeError):
    """The native build cannot run here: a tool or library is missing."""


def program(name: str, build: Path = BUILD) -> Path:
    """The path of native program ``name``, building it first if it is not built (a minute on 2 cores)."""
    path = build / name
    if path.exists():
        return path
    missing = [tool for tool in ("cmake", "g++", "pkg-config", "protoc", "grpc_cpp_plugin") if not shutil.which(tool)]
    if missing:
        raise NativeUnavailable(f"{name} is not built and {', '.join(missing)} is missing: install {NEEDS} "
                                "(make does where apt is present and it runs as root)")
    for step in (["cmake", "-S", str(SOURCE), "-B", str(build), f"-DPYTHON={sys.executable}"],
                 ["cmake", "--build", str(build), "--target", name, "-j2"]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            raise NativeUnavailable(f"building {name} failed ({' '.join(step[:2])}):\n{done.stdout[-2000:]}"
                                    f"{done.stderr[-2000:]}")
    return path
