"""The compose stack (deploy/compose) end to end: the images `make image` builds, two Triton containers and the
sidecar's, called with real tritonclient (gRPC and HTTP), perf_analyzer and a Locust replay; then one Triton
container is stopped under load and no request is lost.

Opt-in (`make test-deploy`, which builds the images first; CI runs it where a docker daemon is): marked ``deploy``,
which the default run leaves out.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from export import data
from loadtest.loadtest_cli import loadtest
from loadtest.requestlog import RequestLog
from loadtest.traces import constant, with_slo
from scheduler_sidecar.processes.triton_launcher import free_port
from tests.test_sidecar import grpc_input

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

COMPOSE_DIR = Path(__file__).resolve().parent.parent / "deploy" / "compose"
IMAGE = "accscale"
READY_TIMEOUT_S = 180.0  # two Tritons loading the supernet, then the sidecar's warm-up
SLO = {"slo_us": 2_000_000}


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) where the CLI has it, else v1 (`docker-compose`, Debian's package)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise OSError("neither `docker compose` nor `docker-compose` is installed")


class Stack:
    """The stack under a project name of its own, on free ports, with the fast build's models."""

    def __init__(self, repository: Path, profile: Path, folder: Path) -> None:
        self.folder = folder
        self.ports = {key: free_port() for key in (
            "TRITON_A_HTTP_PORT", "TRITON_A_GRPC_PORT", "TRITON_A_METRICS_PORT", "TRITON_B_HTTP_PORT",
            "TRITON_B_GRPC_PORT", "TRITON_B_METRICS_PORT", "SIDECAR_HTTP_PORT", "SIDECAR_GRPC_PORT")}
        # the containers run as an unprivileged user: what they mount must be readable by all
        shutil.copytree(repository, folder / "models")
        shutil.copy(profile, folder / "profile.json")
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        env = {"IMAGE": IMAGE, "MODEL_REPOSITORY": folder / "models", "PROFILE": folder / "profile.json",
               "SIDECAR_CONFIG": COMPOSE_DIR / "sidecar.toml", "HOST": "127.0.0.1", "TRITON_SHM": "256m",
               **self.ports}
        (folder / "stack.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        self.command = [*compose_command(), "--project-name", f"accscale-test-{folder.name.lower()}",
                        "--project-directory", str(COMPOSE_DIR), "--file", str(COMPOSE_DIR / "compose.yaml"),
                        "--env-file", str(folder / "stack.env")]

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.command, *args], capture_output=True, text=True, timeout=300)
        if check and result.returncode:
            raise AssertionError(f"{' '.join(args)}: {result.stdout[-2000:]}{result.stderr[-2000:]}")
        return result

    def url(self, who: str, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[f'{who}_{protocol}_PORT']}"

    def container(self, service: str) -> str:
        return self("ps", "-q", service).stdout.strip()

    def wait_ready(self) -> None:
        """Until the sidecar answers ready (it starts once both Tritons' health checks pass). Containers start on
        the wall clock, outside the test's control, so this polls them once a second, as the Triton launcher polls
        its server; no assertion rests on how long it takes."""
        give_up = time.monotonic() + READY_TIMEOUT_S
        with httpclient.InferenceServerClient(self.url("SIDECAR", "HTTP")) as client:
            while time.monotonic() < give_up:
                try:
                    if client.is_server_ready():
                        return
                except (InferenceServerException, ConnectionError, OSError):
                    pass
                time.sleep(1.0)
        raise AssertionError(f"the stack was not ready in {READY_TIMEOUT_S:g} s:\n{self('logs', '--tail', '30').stdout}")


@pytest.fixture(scope="module")
def stack(fast_build):
    for image in (f"{IMAGE}-sidecar", f"{IMAGE}-triton"):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode:
            raise AssertionError(f"image {image} is missing: `make image` builds it (`make test-deploy` does both)")
    folder = Path(tempfile.mkdtemp(prefix="accscale-deploy-"))
    stack = Stack(fast_build.repository, fast_build.profile_path, folder)
    try:
        stack("up", "--detach")
        stack.wait_ready()
        yield stack
    finally:
        stack("down", "--volumes", "--timeout", "10", check=False)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def images(fast_build) -> np.ndarray:
    return data.load(fast_build.act.spec.image_size)["heldout"].images[:24]


def healthy(stack: Stack, url: str) -> float:
    with urllib.request.urlopen(f"http://{stack.url('SIDECAR', 'HTTP')}/metrics") as response:
        text = response.read().decode()
    match = re.search(rf'^accscale_worker_healthy{{endpoint="{re.escape(url)}"}} (\S+)$', text, re.M)
    assert match, f"no accscale_worker_healthy for {url}"
    return float(match.group(1))


def test_every_container_is_healthy_and_runs_as_an_unprivileged_user(stack):
    for service in ("triton-a", "triton-b", "sidecar"):
        container = stack.container(service)
        inspect = subprocess.run(["docker", "inspect", "--format", "{{.Config.User}} {{.State.Health.Status}}",
                                  container], capture_output=True, text=True, check=True).stdout.split()
        assert inspect[0] == "10001:10001", service  # numeric: Kubernetes checks runAsNonRoot by it
        uid = subprocess.run(["docker", "exec", container, "id", "-u"], capture_output=True, text=True, check=True)
        assert uid.stdout.strip() == "10001", service


def test_grpc_and_http_clients_are_answered_through_the_sidecar(stack, images):
    x = images[:3]
    with grpcclient.InferenceServerClient(stack.url("SIDECAR", "GRPC")) as client:
        assert client.is_model_ready("digits")
        result = client.infer("digits", [grpc_input(x)], parameters=SLO)
        assert result.as_numpy("LOGITS").shape == (3, 10)
        worker = result.get_response().parameters["worker"].string_param
        assert worker in {stack.url("TRITON_A", "GRPC"), stack.url("TRITON_B", "GRPC")}
    with httpclient.InferenceServerClient(stack.url("SIDECAR", "HTTP")) as client:
        tensor = httpclient.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        assert client.infer("digits", [tensor], parameters=SLO).as_numpy("LOGITS").shape == (3, 10)


def test_perf_analyzer_runs_against_the_stack(stack):
    from scheduler_sidecar.experiments.perf_analyzer import ensure  # lazy: fetches perf_analyzer once

    result = subprocess.run([str(ensure()), "-m", "digits", "-u", stack.url("SIDECAR", "GRPC"), "-i", "grpc",
                             "--request-parameter", "slo_us:2000000:int", "--concurrency-range", "2",
                             "--measurement-mode", "count_windows", "--measurement-request-count", "50",
                             "--max-trials", "10", "-s", "100"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert re.search(r"Concurrency: 2, throughput: [0-9.]+ infer/sec", result.stdout)


def test_a_locust_replay_through_the_stack_is_answered(stack, tmp_path):
    trace = tmp_path / "trace.txt"
    with_slo(constant(40.0, 2.0), 500.0).save(trace)  # 80 requests over 2 s, each with an SLO of 500 ms
    loadtest(trace, stack.url("SIDECAR", "GRPC"), tmp_path / "run", progress_s=0)
    log = RequestLog.load(tmp_path / "run" / "requests.csv")
    assert len(log.entries) == 80 and {e.status for e in log.entries} == {"ok"}


def test_a_stopped_triton_container_loses_no_request(stack, images):
    """`docker stop` one Triton under load (16 clients at once): every request is answered, and once the container
    has stopped the survivor serves everything."""
    a, b = stack.url("TRITON_A", "GRPC"), stack.url("TRITON_B", "GRPC")

    async def load() -> tuple[list[str], list[tuple[bool, str]]]:
        async with grpcaio.InferenceServerClient(stack.url("SIDECAR", "GRPC")) as client:
            async def one(i: int) -> str:
                try:
                    result = await client.infer("digits", [grpc_input(images[i % len(images)][None])],
                                                parameters=SLO)
                    return result.get_response().parameters["worker"].string_param
                except InferenceServerException as exc:
                    return str(exc.status())

            before = await asyncio.gather(*(one(i) for i in range(64)))
            # SIGTERM: Triton finishes what it runs and refuses the rest; `stop` returns once the container has exited
            stopping = asyncio.ensure_future(asyncio.to_thread(stack, "stop", "--timeout", "30", "triton-b"))
            during: list[tuple[bool, str]] = []  # (sent after the container had stopped, who answered)

            async def client_loop(k: int) -> None:
                sent_after = 0
                while sent_after < 10:
                    stopped = stopping.done()
                    during.append((stopped, await one(k)))
                    sent_after += stopped

            await asyncio.gather(*(client_loop(k) for k in range(16)))
            await stopping
            return before, during

    before, during = asyncio.run(load())
    assert set(before) == {a, b}  # both served before the stop
    assert {who for _, who in during} <= {a, b}, sorted({who for _, who in during})  # no request lost
    assert {who for stopped, who in during if stopped} == {a} and sum(stopped for stopped, _ in during) == 160
    assert healthy(stack, b) == 0 and healthy(stack, a) == 1
    stack("start", "triton-b")  # the module's other tests, in any order, find the stack whole
