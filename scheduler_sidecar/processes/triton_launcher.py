"""Start and stop a local tritonserver: the one on PATH, or the CPU build bundled in nvidia-pytriton.

`TritonServer` is the one way accscale launches Triton, from the `accscale triton` command and from test
fixtures alike. The bundled build is prepared as pytriton itself does it (`pytriton/triton.py`,
`_prepare_triton_inference_server`); see docs section 2.8 of the Triton reference.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import http.client
import importlib.metadata
import importlib.util
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from python_backend.emulation import SLOWDOWN_ENV
from scheduler_sidecar.errors import AccscaleError
from scheduler_sidecar.processes import die_with_parent

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11

log = logging.getLogger(__name__)

# where copies of the bundled build are kept, one per wheel and interpreter version
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "accscale"
# how long Triton waits for in-flight requests on SIGTERM before it exits anyway
EXIT_TIMEOUT_S = 5
SHM_DIR = "/dev/shm"  # where the python backend's regions are (POSIX shared memory on Linux)
READY_POLL_INTERVAL_S = 0.2

INSTALL_HINT = (
    "install the CPU build bundled in nvidia-pytriton (`pip install nvidia-pytriton==0.7.0`, "
    "Python 3.8-3.13, Linux x86_64), or run inside the NGC image nvcr.io/nvidia/tritonserver:24.10-py3"
)

# Loopback health checks must not go through an http_proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class TritonLaunchError(AccscaleError, RuntimeError):
    """Base of the launcher's errors."""


class TritonNotFound(TritonLaunchError):
    """Neither a tritonserver on PATH nor a usable nvidia-pytriton install."""


class TritonStartError(TritonLaunchError):
    """tritonserver exited or did not become ready; the message ends with its log tail."""


@dataclass(frozen=True)
class TritonInstall:
    """A tritonserver and how to run it."""

    binary: Path  # the tritonserver executable
    backend_dir: Path  # passed as --backend-directory; holds python/
    env: dict[str, str] = field(repr=False)  # the complete environment to run `binary` with


# A python-backend stub that cannot take a timed shared-memory lock while the server loads it (a machine too busy
# to schedule it in time) aborts the whole server (boost::interprocess::lock_exception, a known Triton race). A
# start that a signal ends before the server is ready is tried once more; an exit with a status (a broken model)
# is not.
START_ATTEMPTS = 2


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def find_tritonserver(scratch_dir: Path | None = None) -> TritonInstall:
    """The tritonserver on PATH if there is one, else the build bundled in nvidia-pytriton.

    The bundled build is copied once into `scratch_dir` (default `DEFAULT_CACHE_DIR`) and reused.
    Raises `TritonNotFound` when neither exists.
    """
    on_path = shutil.which("tritonserver")
    if on_path is not None:
        binary = Path(on_path).resolve()
        for backend_dir in (binary.parent.parent / "backends", Path("/opt/tritonserver/backends")):
            if backend_dir.is_dir():
                return TritonInstall(binary, backend_dir, dict(os.environ))
        raise TritonNotFound(f"{binary} has no backends directory next to it or in /opt/tritonserver")
    return _bundled_install(scratch_dir or DEFAULT_CACHE_DIR)


def _bundled_install(scratch_dir: Path) -> TritonInstall:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise TritonNotFound(f"no tritonserver on PATH and nvidia-pytriton is not installed; {INSTALL_HINT}")
    dist = Path(spec.origin).parent / "tritonserver"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonNotFound(
            f"nvidia-pytriton has no python backend stub for Python {python_version}; {INSTALL_HINT}"
        )

    key = f"{dist}|{importlib.metadata.version('nvidia-pytriton')}|{python_version}"
    root = scratch_dir / f"tritonserver-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if not root.is_dir():
        _copy_bundle(dist, stub, root)

    # The copy loses the binaries' relative RPATH to the wheel's libraries, and the stub needs the
    # libpython of this interpreter (a system libpython of the same minor version may differ).
    libs = [str(dist.parent.parent / "nvidia_pytriton.libs"), str(sysconfig.get_config_var("LIBDIR"))]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    # The stub's embedded interpreter finds its prefix, hence numpy and our packages, through `python3` on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    return TritonInstall(root / "bin" / "tritonserver", root / "backends", env)


def _copy_bundle(dist: Path, stub: Path, root: Path) -> None:
    """Copy `dist` with `stub` in place to `root`; a rename publishes it, so no process sees half a copy."""
    log.info("copying the tritonserver bundled in nvidia-pytriton to %s", root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{root.name}.tmp-", dir=root.parent))
    try:
        shutil.copytree(
            dist,
            tmp,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"),
        )
        shutil.copy2(stub, tmp / "backends" / "python" / "triton_python_backend_stub")
        try:
            tmp.rename(root)
        except OSError:
            if not root.is_dir():  # otherwise a concurrent process published its copy first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class TritonServer:
    """A tritonserver process in explicit model-control mode, ready once `start()` returns.

    Ports given as 0 are picked when the object is made, so the URLs are known before `start()`.
    The server runs in its own process group with its python backend stubs; `stop()` ends them all.
    """

    def __init__(
        self,
        *,
        repository: Path | Sequence[Path],
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        models: Sequence[str] = ("*",),
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = 120.0,
        emulate_slowdown: float = 1.0,
    ) -> None:
        # several repositories: one server serving the models of each (a deployment of several systems)
        paths = [repository] if isinstance(repository, (str, Path)) else list(repository)
        self._repositories = tuple(Path(r).absolute() for r in paths)
        self._host = host
        ports: list[int] = []
        for port in (http_port, grpc_port, metrics_port):
            while port == 0 or port in ports:
                port = free_port(host)
            ports.append(port)
        self._http_port, self._grpc_port, self._metrics_port = ports
        self._models = tuple(models)
        if log_path is None:
            # kept after stop(): it is what explains a crash
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self._log_path = Path(log_path)
        self._extra_args = tuple(extra_args)
        # the python backend's shared-memory regions under a name of this server's own, so that stop() can remove
        # what stubs it had to kill leave in /dev/shm (a killed stub never unlinks its region: 1 MB each, for good)
        self._shm_prefix = None if any("shm-region-prefix-name" in a for a in self._extra_args) else \
            f"accscale_{os.getpid()}_{secrets.token_hex(4)}_"
        self._ready_timeout_s = ready_timeout_s
        if not emulate_slowdown >= 1:
            raise ValueError(f"emulate_slowdown must be >= 1, got {emulate_slowdown}")
        self._slowdown = emulate_slowdown  # python-backend models sleep to run this many times slower
        self._proc: subprocess.Popen[bytes] | None = None
        self._returncode: int | None = None

    @property
    def http_url(self) -> str:
        """`host:port`, the form `tritonclient.http.InferenceServerClient(url=...)` takes."""
        return f"{self._host}:{self._http_port}"

    @property
    def grpc_url(self) -> str:
        """`host:port`, the form `tritonclient.grpc.InferenceServerClient(url=...)` takes."""
        return f"{self._host}:{self._grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint, `http://host:port/metrics`."""
        return f"http://{self._host}:{self._metrics_port}/metrics"

    @property
    def log_path(self) -> Path:
        """Where Triton's stdout and stderr go; kept after `stop()`."""
        return self._log_path

    @property
    def pid(self) -> int | None:
        """The tritonserver process id; None before `start()` and after `stop()`."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit status once the server has exited, on its own or through `stop()`; None while it runs."""
        return self._proc.poll() if self._proc is not None else self._returncode

    def _command(self, install: TritonInstall) -> list[str]:
        cmd = [
            str(install.binary),
            *(f"--model-repository={r}" for r in self._repositories),
            f"--backend-directory={install.backend_dir}",
            f"--http-address={self._host}",
            f"--http-port={self._http_port}",
            f"--grpc-address={self._host}",
            f"--grpc-port={self._grpc_port}",
            f"--metrics-address={self._host}",
            f"--metrics-port={self._metrics_port}",
            "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in self._models),
            "--strict-readiness=true",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
            "--log-verbose=0",
            *([f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}"] if self._shm_prefix else []),
        ]
        caches = install.backend_dir.parent / "caches"
        if caches.is_dir():  # the default, /opt/tritonserver/caches, does not exist for the bundled build
            cmd.append(f"--cache-directory={caches}")
        return cmd + list(self._extra_args)

    def start(self) -> None:
        """Launch tritonserver and return once `/v2/health/ready` answers 200 (every loaded model is ready).

        Raises `TritonStartError` (with the log tail) if it exits first or is not ready within
        `ready_timeout_s`, and `TritonNotFound` if there is no tritonserver; nothing is left running then.
        """
        if self._proc is not None:
            raise RuntimeError(f"tritonserver already started (pid {self._proc.pid})")
        for repository in self._repositories:
            if not repository.is_dir():
                raise TritonStartError(f"model repository {repository} is not a directory")
        # Triton binds its ports only after loading the models; until then a server already on the
        # HTTP port would answer our readiness checks in its place.
        for port in (self._http_port, self._grpc_port, self._metrics_port):
            if not _port_is_free(self._host, port):
                raise TritonStartError(f"port {port} on {self._host} is already in use")
        install = find_tritonserver()
        log.info(
            "starting tritonserver on %s (repository %s, log %s)",
            self.http_url,
            ", ".join(map(str, self._repositories)),
            self._log_path,
        )
        for attempt in range(1, START_ATTEMPTS + 1):
            # a retry appends to the log: the abort it follows stays readable
            with open(self._log_path, "wb" if attempt == 1 else "ab") as log_file:
                # Its own session: a Ctrl-C in our terminal does not reach it (stop() decides), and one
                # signal to the group reaches the server and the stubs it forks.
                self._proc = subprocess.Popen(
                    die_with_parent.wrap(self._command(install)),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env={**install.env, SLOWDOWN_ENV: repr(self._slowdown)},
                    start_new_session=True,
                )
            self._returncode = None
            try:
                self._wait_ready(self._proc)
            except TritonStartError:
                aborted = self._proc.poll() is not None and self._proc.returncode < 0
                hung = self._proc.poll() is None and loaded_every_model(log_tail(self._log_path, 100_000))
                self.stop()
                if not (aborted or hung) or attempt == START_ATTEMPTS:
                    raise
                if hung:
                    log.warning("tritonserver loaded its models but never served within %g s; starting it again "
                                "(log %s)", self._ready_timeout_s, self._log_path)
                else:
                    log.warning("tritonserver was killed by signal %d while loading its models; starting it again "
                                "(log %s)", -self._returncode, self._log_path)
                continue
            except BaseException:
                self.stop()
                raise
            break
        log.info("tritonserver ready at %s (pid %d)", self.http_url, self._proc.pid)

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        failure = wait_http_ready(proc, self.http_url, self._ready_timeout_s)
        if failure:
            raise TritonStartError(f"tritonserver {failure}; last lines of {self._log_path}:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `timeout_s`; safe to call twice.

        Returns once the server has exited; whatever is left of its group (stubs) gets SIGKILL.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            log.info("stopping tritonserver at %s (pid %d)", self.http_url, proc.pid)
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "tritonserver (pid %d) still running after %.0f s; killing it", proc.pid, timeout_s
                )
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # Stubs can outlive a server that crashed or was killed; they would hold CPU and shared memory.
        _signal_group(proc.pid, signal.SIGKILL)
        if self._shm_prefix is not None:
            for region in Path(SHM_DIR).glob(f"{self._shm_prefix}*"):
                region.unlink(missing_ok=True)
        self._returncode = proc.returncode
        self._proc = None
        log.info("tritonserver at %s stopped%s", self.http_url, self._how_it_stopped(proc.returncode))

    def _how_it_stopped(self, status: int) -> str:
        """Nothing for a clean exit; why, for the status a stop commonly ends in (Triton exits 1 when models still
        unloading outlive its exit timeout: python-backend stubs of several repositories take seconds to finalise);
        the status and the log otherwise."""
        if status == 0:
            return ""
        if status == 1 and "Exit timeout expired" in self.log_tail(20):
            return (f" (some models were still unloading when its {EXIT_TIMEOUT_S} s exit timeout expired; their "
                    "processes were ended)")
        if status < 0:
            return f" (ended by signal {-status})"
        return f" (exit status {status}; log {self._log_path})"

    def log_tail(self, n_lines: int = 60) -> str:
        """The last `n_lines` lines Triton wrote (stdout and stderr), or "" before it wrote any."""
        return log_tail(self._log_path, n_lines)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def log_tail(path: Path, n_lines: int) -> str:
    """The last `n_lines` lines of a server's log file, or "" if it has none yet."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(collections.deque(f, maxlen=n_lines))
    except FileNotFoundError:
        return ""


def loaded_every_model(log_text: str) -> bool:
    """True if a tritonserver log shows every model it began loading loaded (and at least one): a server still not
    ready then is stuck past its models (seen once in a fresh clone's suite on 2 busy cores), not slow to load them."""
    loading = log_text.count('"loading: ')
    return loading > 0 and log_text.count("successfully loaded '") >= loading


def wait_http_ready(proc: subprocess.Popen[bytes], http_url: str, timeout_s: float) -> str | None:
    """Poll :func:`http_ready` until the server ``proc`` started answers; None, or why it never did."""
    deadline = time.monotonic() + timeout_s
    while not http_ready(http_url):
        if proc.poll() is not None:
            return f"exited with status {proc.returncode} before it was ready"
        if time.monotonic() > deadline:
            return f"was not ready after {timeout_s:g} s"
        time.sleep(READY_POLL_INTERVAL_S)
    return None


def http_ready(http_url: str) -> bool:
    """True if a KServe v2 server at ``host:port`` answers ``/v2/health/ready`` with 200."""
    try:
        with _DIRECT.open(f"http://{http_url}/v2/health/ready", timeout=1.0):
            return True  # urllib raises HTTPError for anything but 2xx
    except urllib.error.HTTPError as exc:  # 400 while models load
        exc.close()
        return False
    except OSError:  # not listening yet
        return False
    except http.client.HTTPException:  # something that is not an HTTP server answers there: not this Triton
        return False


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as a server binds: a port left in TIME_WAIT by an earlier run counts as free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is already empty
        pass


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `accscale triton`: run tritonserver on a model repository until Ctrl-C or SIGTERM."""
    parser = subparsers.add_parser(
        "triton",
        help="run tritonserver on a model repository",
        description="Run tritonserver (the one on PATH, else the CPU build bundled in nvidia-pytriton) "
        "in explicit model-control mode until Ctrl-C or SIGTERM.",
    )
    parser.add_argument(
        "--repository",
        type=Path,
        action="append",
        metavar="DIR",
        help="model repository; repeat to serve the models of several (default: model_repository)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address all three endpoints bind to (default: %(default)s)"
    )
    parser.add_argument(
        "--http-port",
        type=int,
        metavar="PORT",
        default=8000,
        help="KServe v2 HTTP port (default: %(default)s)",
    )
    parser.add_argument(
        "--grpc-port",
        type=int,
        metavar="PORT",
        default=8001,
        help="KServe v2 gRPC port (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        default=8002,
        help="Prometheus metrics port (default: %(default)s)",
    )
    parser.add_argument(
        "--free-ports", action="store_true", help="pick free ports instead of the three port options"
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="load this model at startup; repeat for several (default: every model in the repository)",
    )
    parser.add_argument(
        "--log", type=Path, metavar="PATH", help="file for Triton's output (default: a new temporary file)"
    )
    parser.add_argument(
        "--emulate-slowdown",
        type=float,
        default=1.0,
        metavar="F",
        help="emulate a device F times slower: each batch, once computed, sleeps until it has taken F times its "
        "profiled latency (a model's latency.json), or else F times its fastest compute of that batch size (of "
        "the same subnets, in a supernet) (default: 1, none)",
    )
    parser.set_defaults(func=_run_triton)


def _run_triton(args: argparse.Namespace) -> int:
    server = TritonServer(
        repository=args.repository or [Path("model_repository")],
        host=args.host,
        http_port=0 if args.free_ports else args.http_port,
        grpc_port=0 if args.free_ports else args.grpc_port,
        metrics_port=0 if args.free_ports else args.metrics_port,
        models=args.model or ("*",),
        log_path=args.log,
        emulate_slowdown=args.emulate_slowdown,
    )
    stop_requested = threading.Event()
    previous_handlers: dict[signal.Signals, Any] = {}
    try:
        server.start()
        # Only once it is ready: a Ctrl-C during startup interrupts start(), which cleans up.
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous_handlers[sig] = signal.signal(sig, lambda *_: stop_requested.set())
        print(
            f"http     {server.http_url}\ngrpc     {server.grpc_url}\n"
            f"metrics  {server.metrics_url}\nlog      {server.log_path}",
            flush=True,
        )
        while server.returncode is None:
            if stop_requested.wait(0.5):
                return 0
        print(
            f"tritonserver exited by itself with status {server.returncode}; "
            f"last lines of {server.log_path}:\n{server.log_tail()}",
            file=sys.stderr,
        )
        return 1
    except TritonLaunchError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        server.stop()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
