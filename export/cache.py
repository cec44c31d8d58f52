"""One builder at a time per cache folder under ``build/``.

Two processes that find the same stale cache (two demos started together, or test workers in parallel) would
both train and write the same files. The first to take the folder's lock builds; the others wait for it and
then find the cache fresh.
"""

from __future__ import annotations

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
