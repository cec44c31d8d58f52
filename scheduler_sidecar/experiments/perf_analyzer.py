"""perf_analyzer, Triton's load generator, set up without root from the packages that ship it.

The binary comes in the ``tritonclient==2.51.0`` wheel (2.52's build needs glibc 2.38). It
links ``libb64.so.0d`` (Debian's ``libb64-0d``, unpacked from the .deb, not installed) and
``libcudart.so.12`` (the copy nvidia-pytriton already ships; nothing uses a GPU on CPU).
:func:`ensure` puts all three in a cache folder once and returns a wrapper script that sets
``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from scheduler_sidecar.processes.triton_launcher import DEFAULT_CACHE_DIR

log = logging.getLogger(__name__)

WHEEL = "tritonclient==2.51.0"
WHEEL_BINARY = "tritonclient-2.51.0.data/data/bin/perf_analyzer"
LIBB64_PACKAGE = "libb64-0d"


def ensure(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Path of a runnable ``perf_analyzer`` wrapper, fetching its parts the first time."""
    root = cache_dir / "perf_analyzer-2.51.0"
    wrapper = root / "perf_analyzer"
    if wrapper.exists() and _works(wrapper):
        return wrapper
    (root / "lib").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log.info("fetching perf_analyzer from the %s wheel", WHEEL)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", tmp, WHEEL], check=True)
        with zipfile.ZipFile(next(Path(tmp).glob("tritonclient-*.whl"))) as wheel:
            (root / "perf_analyzer.bin").write_bytes(wheel.read(WHEEL_BINARY))
        (root / "perf_analyzer.bin").chmod(0o755)
        _unpack_libb64(Path(tmp), root / "lib")
    cudart = sorted(glob.glob(os.path.join(_site_packages(), "nvidia_pytriton.libs", "libcudart-*.so.12*")))
    if not cudart:
        raise OSError("libcudart.so.12 not found in nvidia_pytriton.libs; is nvidia-pytriton installed?")
    link = root / "lib" / "libcudart.so.12"
    link.unlink(missing_ok=True)
    link.symlink_to(cudart[0])
    wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH="{root / "lib"}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
                       f'exec "{root / "perf_analyzer.bin"}" "$@"\n')
    wrapper.chmod(0o755)
    if not _works(wrapper):
        raise OSError(f"{wrapper} does not run; try `{wrapper} --version` to see why")
    return wrapper


def _works(wrapper: Path) -> bool:
    result = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True)
    return result.returncode == 0 and "Perf Analyzer" in result.stdout + result.stderr


def _unpack_libb64(tmp: Path, lib_dir: Path) -> None:
    """Unpack libb64.so.0d from Debian's package (``apt-get download`` needs no root; its lists may)."""
    download = ["apt-get", "download", LIBB64_PACKAGE]
    if subprocess.run(download, cwd=tmp, capture_output=True).returncode != 0:
        if os.geteuid() != 0:
            raise OSError(f"`apt-get download {LIBB64_PACKAGE}` failed; run `apt-get update` as root once")
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        subprocess.run(download, cwd=tmp, check=True, capture_output=True)
    deb = next(tmp.glob(f"{LIBB64_PACKAGE}_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "deb")], check=True)
    for so in (tmp / "deb").rglob("libb64.so.0d*"):
        shutil.copy2(so, lib_dir / so.name, follow_symlinks=True)


def _site_packages() -> str:
    import pytriton  # only to find where the nvidia-pytriton wheel put its shared libraries

    return str(Path(pytriton.__file__).resolve().parent.parent)
