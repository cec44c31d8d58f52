"""The launcher against a real tritonserver (the CPU build bundled in nvidia-pytriton) on loopback."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from scheduler_sidecar.processes import triton_launcher
from scheduler_sidecar.processes.triton_launcher import (
    SHM_DIR,
    TritonServer,
    TritonStartError,
    find_tritonserver,
)

pytestmark = pytest.mark.triton

ADD_ONE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""

ADD_ONE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1)]))
        return responses
"""

BROKEN_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("add_one is deliberately broken")

    def execute(self, requests):
        return []
"""


def make_repository(root: Path, model_py: str = ADD_ONE_MODEL) -> Path:
    """A repository with one python-backend model, `add_one`, whose code is `model_py`."""
    model_dir = root / "add_one"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(ADD_ONE_CONFIG)
    (model_dir / "1" / "model.py").write_text(model_py)
    return root


def infer_add_one(url: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url=url)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("add_one", [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return make_repository(tmp_path / "repo")


def test_serves_inference_on_free_ports(repository: Path, tmp_path: Path) -> None:
    """Started on free ports, the server is ready when start() returns and answers an inference."""
    with TritonServer(repository=repository, log_path=tmp_path / "triton.log") as server:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(infer_add_one(server.http_url, x), x + 1)
        assert server.returncode is None


def test_stop_leaves_no_processes(repository: Path, tmp_path: Path) -> None:
    """stop() ends tritonserver and its python backend stubs, and a second stop() is a no-op."""
    server = TritonServer(repository=repository, log_path=tmp_path / "triton.log")
    server.start()
    try:
        assert server.pid is not None
        parent = psutil.Process(server.pid)
        procs = [parent, *parent.children(recursive=True)]
        assert any("triton_python_backend_stub" in " ".join(p.cmdline()) for p in procs)
    finally:
        server.stop()
    server.stop()

    _, alive = psutil.wait_procs(procs, timeout=5)
    # a container init that does not reap leaves zombies behind; they are dead all the same
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    assert server.pid is None
    assert server.returncode == 0


def test_stop_removes_the_shared_memory_of_a_stub_that_was_killed(repository: Path, tmp_path: Path) -> None:
    """A python-backend stub killed (as stop() kills what outlives the exit timeout) never unlinks its shared-memory
    region; stop() removes the regions of its own server, whose names it chose, and no other's."""
    other = Path(SHM_DIR) / "accscale_test_someone_elses_region"
    other.write_bytes(b"")
    server = TritonServer(repository=repository, log_path=tmp_path / "triton.log")
    server.start()
    try:
        regions = sorted(Path(SHM_DIR).glob(f"{server._shm_prefix}*"))
        assert regions  # the stub's, under this server's own name
        stubs = [p for p in psutil.Process(server.pid).children(recursive=True)
                 if "triton_python_backend_stub" in " ".join(p.cmdline())]
        for stub in stubs:
            stub.send_signal(signal.SIGKILL)
        psutil.wait_procs(stubs, timeout=5)
        assert all(r.exists() for r in regions)  # left behind by the killed stub
    finally:
        server.stop()
    try:
        assert not any(r.exists() for r in regions) and other.exists()
    finally:
        other.unlink()


PARENT = """
import sys, time
from pathlib import Path
from scheduler_sidecar.processes.triton_launcher import TritonServer
server = TritonServer(repository=Path(sys.argv[1]))
server.start()
print(server.pid, flush=True)
time.sleep(600)
"""


def test_a_server_dies_with_a_parent_killed_from_outside(repository: Path) -> None:
    """A parent killed with SIGKILL (a CI timeout) leaves no tritonserver or stub behind, re-parented to init."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(repository)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)
    try:
        server = psutil.Process(int(parent.stdout.readline()))
        procs = [server, *server.children(recursive=True)]
        assert any("triton_python_backend_stub" in " ".join(p.cmdline()) for p in procs)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    _, alive = psutil.wait_procs(procs, timeout=30)
    orphans = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in orphans:  # stop what this test started, even when it fails
        p.kill()
    assert orphans == []


def test_broken_model_fails_start_with_triton_log(tmp_path: Path) -> None:
    """A model that raises in initialize() makes start() fail with Triton's reason in the message."""
    server = TritonServer(
        repository=make_repository(tmp_path / "repo", BROKEN_MODEL), log_path=tmp_path / "t.log"
    )
    with pytest.raises(TritonStartError, match="add_one is deliberately broken"):
        server.start()
    assert server.pid is None


def test_a_start_killed_by_a_signal_is_tried_once_more(repository: Path, tmp_path: Path, monkeypatch) -> None:
    """A server that a signal ends while it loads (a stub losing its lock race on a busy machine) is started once
    more; the log keeps the abort."""
    real = find_tritonserver()
    marker, script = tmp_path / "aborted-once", tmp_path / "tritonserver"
    script.write_text(f'#!/bin/sh\nif [ ! -e "{marker}" ]; then touch "{marker}"; echo "aborting once"; kill -ABRT $$; fi\n'
                      f'exec "{real.binary}" "$@"\n')
    script.chmod(0o755)
    monkeypatch.setattr(triton_launcher, "find_tritonserver", lambda *a, **k: dataclasses.replace(real, binary=script))
    with TritonServer(repository=repository, log_path=tmp_path / "t.log") as server:
        x = np.ones((1, 4), dtype=np.float32)
        np.testing.assert_array_equal(infer_add_one(server.http_url, x), x + 1)
    assert marker.exists() and "aborting once" in (tmp_path / "t.log").read_text()


def test_a_server_stuck_after_loading_every_model_counts_as_hung() -> None:
    """The start is tried once more only when the log shows every model it began loading loaded (a server stuck past
    its models), not while one still loads (a slow load) or before any load began."""
    loading = 'I1 model_lifecycle.cc:472] "loading: a:1"\nI1 model_lifecycle.cc:472] "loading: b:1"\n'
    one = "I1 model_lifecycle.cc:839] \"successfully loaded 'a'\"\n"
    two = one + "I1 model_lifecycle.cc:839] \"successfully loaded 'b'\"\n"
    assert triton_launcher.loaded_every_model(loading + two)
    assert not triton_launcher.loaded_every_model(loading + one)
    assert not triton_launcher.loaded_every_model("")


def test_two_servers_run_at_once(repository: Path, tmp_path: Path) -> None:
    """Two servers on the same repository get distinct free ports and both serve."""
    with (
        TritonServer(repository=repository, log_path=tmp_path / "a.log") as a,
        TritonServer(repository=repository, log_path=tmp_path / "b.log") as b,
    ):
        assert {a.http_url, a.grpc_url, a.metrics_url}.isdisjoint({b.http_url, b.grpc_url, b.metrics_url})
        x = np.ones((1, 4), dtype=np.float32)
        for server in (a, b):
            np.testing.assert_array_equal(infer_add_one(server.http_url, x), x + 1)


@pytest.mark.skipif(shutil.which("tritonserver") is not None, reason="a tritonserver on PATH is used as is")
def test_concurrent_finds_share_one_complete_copy(tmp_path: Path) -> None:
    """Concurrent callers preparing the bundled build all get the same complete copy, and no leftovers."""
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        installs = list(pool.map(lambda _: find_tritonserver(tmp_path), range(3)))
    assert len({i.binary for i in installs}) == 1
    assert installs[0].binary.is_file()
    assert (installs[0].backend_dir / "python" / "triton_python_backend_stub").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [installs[0].binary.parent.parent.name]
