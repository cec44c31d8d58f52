"""Cached build artifacts: one builder at a time per cache folder under ``build/``, and stamps.

Two processes that find the same stale cache (two demos started together, or test workers in parallel) would
both train and write the same files. The first to take the folder's lock builds; the others wait for it and
then find the cache fresh.

Each artifact has a ``.stamp`` beside it, a hash of what it was built from; it is rebuilt when it is missing or its
stamp no longer matches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock


@contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s build lock (a ``.lock`` file beside what it guards) for the ``with`` block."""
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / ".lock"):
        yield


def hash_parts(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".stamp")


def fresh(path: Path, key: str) -> bool:
    """Whether ``path`` exists and was built from ``key``."""
    stamp_file = _stamp_path(path)
    return path.exists() and stamp_file.exists() and stamp_file.read_text().strip() == key


def stamp(path: Path, key: str) -> None:
    _stamp_path(path).write_text(key + "\n")
