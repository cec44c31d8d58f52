"""Build caches: while one process builds into a folder, another waits instead of writing the same files."""

from __future__ import annotations

import subprocess
import sys

from export.cache import exclusive

# another process tries the folder's lock without waiting: exit 3 when someone holds it
TRY_LOCK = """
import sys
from filelock import FileLock, Timeout
try:
    FileLock(sys.argv[1]).acquire(timeout=0)
except Timeout:
    sys.exit(3)
"""


def _other_process_can_build(folder) -> bool:
    done = subprocess.run([sys.executable, "-c", TRY_LOCK, str(folder / ".lock")], timeout=60)
    assert done.returncode in (0, 3)
    return done.returncode == 0


def test_a_second_builder_waits_for_the_first(tmp_path):
    folder = tmp_path / "family"
    with exclusive(folder):
        assert folder.is_dir() and not _other_process_can_build(folder)
    assert _other_process_can_build(folder)
