"""`pip install .` builds the sidecar's native edge (native/edge.cc) into the package where its tools are: cmake, g++,
pkg-config and Debian's libgrpc++-dev, protobuf-compiler-grpc and rapidjson-dev (scripts/install_native_deps.sh installs
them).
Without them the package installs without it (`pip install -v .` shows why): the sidecar's Python edge serves (the
default, `--edge auto`, says so in its log), and `--edge native` fails naming what to install. An
editable install (`make`'s) builds nothing here: a source checkout builds the edge on first use into build/native."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent / "native"


class BuildWithEdge(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        name = f"_edge{sysconfig.get_config_var('EXT_SUFFIX')}"
        target = Path(self.build_lib) / "scheduler_sidecar" / "native" / name
        target.unlink(missing_ok=True)  # an earlier build's, left in setuptools' build folder
        with tempfile.TemporaryDirectory() as build:
            steps = (["cmake", "-S", str(SOURCE), "-B", build, f"-DPYTHON={sys.executable}"],
                     ["cmake", "--build", build, "--target", "_edge", "-j2"])
            print("accscale: building the native edge (about two minutes on 2 cores)", file=sys.stderr)
            for step in steps:
                try:
                    done = subprocess.run(step, capture_output=True, text=True)
                except OSError as exc:  # no cmake
                    done = subprocess.CompletedProcess(step, 1, "", str(exc))
                if done.returncode:
                    print(f"accscale: the native edge is not built, --edge native will not start "
                          f"({' '.join(step[:2])} failed: {(done.stderr or done.stdout).strip()[-600:]})",
                          file=sys.stderr)
                    return
            self.copy_file(str(Path(build) / name), str(target))


class WithEdge(Distribution):
    def has_ext_modules(self) -> bool:
        return True  # the wheel is built to hold a compiled module: tagged for this Python and platform


setup(cmdclass={"build_py": BuildWithEdge}, distclass=WithEdge)
