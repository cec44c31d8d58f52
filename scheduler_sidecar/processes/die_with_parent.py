"""Run a command that dies with the process that started it: ``python -m ...die_with_parent PID CMD...``.

A server a test or a benchmark starts must not outlive it when it is killed from outside (a CI
timeout, ``kill -9``): it would hold its ports and memory, re-parented to init. On Linux this
sets the parent-death signal (``PR_SET_PDEATHSIG``, SIGKILL), which survives ``exec``, and then
becomes the command. Doing it in a small exec'ing wrapper rather than in ``preexec_fn`` keeps
Python code out of the fork of a multi-threaded parent. The signal follows the parent *thread*
that started the child: start servers from a thread that outlives them (the main thread, as
every command here does). Elsewhere the command simply runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def wrap(command: list[str]) -> list[str]:
    """``command``, run so that it dies with this process."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *command]


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the signal was armed
            sys.exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
