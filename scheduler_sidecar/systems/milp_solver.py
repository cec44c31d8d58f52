"""The MILP solver the paper systems share: HiGHS through PuLP, PuLP's bundled CBC as the fallback."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

_banner_printed = False  # HiGHS prints its banner once per process, when its first model is built


def pick_solver(time_limit_s: float, **gaps: float) -> tuple[Any, str]:
    """(PuLP solver, its name); ``gaps`` are PuLP's ``gapRel``/``gapAbs`` (the solver's defaults if absent)."""
    # imported where used: it costs about 0.2 s, and the serving path never needs it
    import pulp  # type: ignore[import-untyped, unused-ignore]

    highs = pulp.HiGHS(msg=False, timeLimit=time_limit_s, **gaps)
    if highs.available():
        return highs, "HiGHS"
    with warnings.catch_warnings():
        # PuLP 3.3 deprecates its bundled CBC for 4.0; it is only the fallback here
        warnings.filterwarnings("ignore", message="PULP_CBC_CMD is deprecated", category=DeprecationWarning)
        cbc = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, **({"gapRel": gaps["gapRel"]}
                                                                        if "gapRel" in gaps else {}))
    if not cbc.available():
        raise RuntimeError("neither HiGHS (pip install highspy) nor PuLP's bundled CBC is available")
    return cbc, "PULP_CBC_CMD"


def variable(problem: Any, name: str, low: float, up: float | None, cat: str = "Continuous") -> Any:
    """A new PuLP variable; PuLP >= 3.3 deprecates ``LpVariable(...)`` in favour of ``problem.add_variable``."""
    import pulp  # type: ignore[import-untyped, unused-ignore]

    if hasattr(problem, "add_variable"):
        return problem.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat)


def solve(problem: Any, solver: Any) -> None:
    """``problem.solve(solver)``, keeping HiGHS's banner off stdout (it would land in front of ``--json`` output)."""
    global _banner_printed
    if _banner_printed:
        problem.solve(solver)
        return
    with _c_stdout_silenced():  # msg=False silences HiGHS's log, not the banner it prints from C++
        problem.solve(solver)
    _banner_printed = True


@contextlib.contextmanager
def _c_stdout_silenced() -> Iterator[None]:
    """Point file descriptor 1 at the null device for the block, so that C and C++ code cannot print on stdout.

    HiGHS prints its banner from C++ when the first ``Highs`` object of a process is built, before PuLP can
    set ``output_flag`` off (``msg=False``). Python's ``sys.stdout`` is flushed before the switch, and C's
    stdio buffers before fd 1 comes back. The switch is process-wide, so it is made for the first solve only:
    another thread's stdout writes during that solve are lost (the sidecar logs to stderr).
    """
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all: nothing can reach stdout
        yield
        return
    if sys.stdout is not None:
        sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _flush_c_stdio() -> None:
    """fflush(NULL): what C code left in stdio buffers goes where fd 1 points now."""
    import ctypes  # lazy: ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library handle (Windows): nothing to flush
        pass
