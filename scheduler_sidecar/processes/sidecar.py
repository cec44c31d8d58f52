"""``accscale serve`` in a subprocess on free loopback ports: what tests, demos and benches start."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from scheduler_sidecar.errors import AccscaleError
from scheduler_sidecar.processes import die_with_parent
from scheduler_sidecar.processes.triton_launcher import free_port, log_tail, wait_http_ready

log = logging.getLogger(__name__)

START_ATTEMPTS = 3  # starts on new ports, where another process took a picked one first


def port_taken(log_text: str) -> bool:
    """Whether a sidecar's log says it exited because a port it was given was already bound (Python says "address
    already in use", the C++ gRPC of the native edge and strerror "Address already in use")."""
    return "address already in use" in log_text.lower()


class SidecarStartError(AccscaleError, RuntimeError):
    """The sidecar exited, or was not ready in time; the message ends with its log's last lines."""


class SidecarServer:
    """``accscale serve`` in a subprocess on free loopback ports, ready once ``start()`` returns."""

    def __init__(self, *, workers: Sequence[str], profile: Path | None = None, config: Path | None = None,
                 extra_args: Sequence[str] = (), python_args: Sequence[str] = (),
                 ready_timeout_s: float = 60.0) -> None:
        self.host = "127.0.0.1"
        self._pick_ports()
        self._args = [*(a for w in workers for a in ("--triton", w)),
                      *(("--profile", str(profile)) if profile else ()),
                      *(("--config", str(config)) if config else ()), *extra_args]
        fd, name = tempfile.mkstemp(prefix="accscale-sidecar-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        self._python_args = list(python_args)  # e.g. ["-m", "cProfile", "-o", FILE]
        self._ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen | None = None

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _pick_ports(self) -> None:
        self.http_port = free_port()
        self.grpc_port = free_port()
        while self.grpc_port == self.http_port:
            self.grpc_port = free_port()

    def start(self) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            # a retry appends to the log: the collision it follows stays readable
            with open(self.log_path, "wb" if attempt == 1 else "ab") as out:
                self._proc = subprocess.Popen(die_with_parent.wrap([
                    sys.executable, *self._python_args, "-m", "scheduler_sidecar.cli", "serve", *self._args,
                    "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            failure = wait_http_ready(self._proc, self.http_url, self._ready_timeout_s)
            if not failure:
                return
            self.stop()
            # a port that was free when picked was taken before the sidecar bound it (another process on this
            # host picked it too): new ports, once more
            if attempt == START_ATTEMPTS or not port_taken(log_tail(self.log_path, 20)):
                raise SidecarStartError(f"the sidecar {failure}; last lines of {self.log_path}:\n{self.log_tail()}")
            log.warning("the sidecar's port %s was taken before it bound it; starting it on new ports (log %s)",
                        f"{self.http_port} or {self.grpc_port}", self.log_path)
            self._pick_ports()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def log_tail(self, n_lines: int = 40) -> str:
        return log_tail(self.log_path, n_lines)

    def __enter__(self) -> SidecarServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        if exc is None:
            self.log_path.unlink(missing_ok=True)
