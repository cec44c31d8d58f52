"""How the demos, benches and fidelity runs stand a deployment up and load it.

:func:`deploy` starts N Tritons on one repository, each emulating its device, then the sidecar in front of them
with a config, all on free loopback ports, and stops everything on exit. :func:`open_loop` sends requests at
their times whatever the answers do (an open loop), and hands back every answer with its latency at the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler_sidecar.processes.sidecar import SidecarServer
from scheduler_sidecar.processes.triton_launcher import TritonServer

LOADED = re.compile(r"loaded (\S+) on (\S+) in (\d+) ms")  # the sidecar's log line for a model it loaded
# the sidecar's line for a model's instance count set (reloaded, unchanged, or deferred to its next load)
RELOADED = re.compile(r"(\S+) runs (\d+) instance\(s\) on \S+ \((\w+) in (\d+) ms\)")
# the sidecar's line that says when its clock's zero was (its start), on the machine's monotonic clock: a simulation
# that starts there sees its planner's periods and one-second counts fall as they did live
ORIGIN = re.compile(r"plan times below count from the start: monotonic clock ([\d.]+) s")


def since_start_s(log: str, monotonic_s: float) -> float:
    """How long after the start of the sidecar whose ``log`` this is ``monotonic_s`` (``time.monotonic()``) came."""
    origin = ORIGIN.search(log)
    if origin is None:
        raise RuntimeError("the sidecar did not log its clock's start")
    return monotonic_s - float(origin.group(1))


def instances_set(log: str, urls: Sequence[str]) -> dict[str, dict[str, int]]:
    """The instance count the sidecar last set for each model on each of the Tritons at ``urls``, from its log."""
    counts: dict[str, dict[str, int]] = {url: {} for url in urls}
    for line in log.splitlines():
        if (m := RELOADED.search(line)) is not None:
            counts[next(u for u in urls if f" on {u}#" in line)][m.group(1)] = int(m.group(2))
    return counts


@dataclass(frozen=True)
class Device:
    """One Triton server of a deployment: how many times slower than this machine it runs its models, and the
    device kind the sidecar knows it by (its profiles' kind; None: the profile's first)."""

    slowdown: float = 1.0
    kind: str | None = None


@dataclass(frozen=True)
class Deployment:
    tritons: list[TritonServer]
    sidecar: SidecarServer


@contextlib.contextmanager
def deploy(repository: Path | Sequence[Path], models: Sequence[str], devices: Sequence[Device] = (Device(),), *,
           config: str | None = None, profile: Path | None = None, config_path: Path | None = None,
           before_sidecar: Callable[[list[TritonServer]], None] | None = None, sidecar_args: Sequence[str] = (),
           python_args: Sequence[str] = ()) -> Iterator[Deployment]:
    """A Triton per device, each started with ``models`` of ``repository`` (or of several), then the sidecar: on ``config`` (a
    TOML text without its workers, which are these Tritons; written to ``config_path``, else a temporary file)
    or on ``profile``. ``before_sidecar`` runs on the Tritons first (a bench profiles its model there)."""
    with contextlib.ExitStack() as stack:
        tritons = [stack.enter_context(TritonServer(repository=repository, models=list(models),
                                                    emulate_slowdown=d.slowdown)) for d in devices]
        if before_sidecar is not None:
            before_sidecar(tritons)
        path = None
        if config is not None:
            path = config_path or Path(stack.enter_context(tempfile.TemporaryDirectory())) / "sidecar.toml"
            kinds = ", ".join(f'"{t.grpc_url}" = "{d.kind}"' for t, d in zip(tritons, devices) if d.kind)
            path.write_text((f"worker_devices = {{ {kinds} }}\n" if kinds else "") + config)
        sidecar = stack.enter_context(SidecarServer(workers=[t.grpc_url for t in tritons], config=path,
                                                    profile=profile, extra_args=sidecar_args,
                                                    python_args=python_args))
        yield Deployment(tritons, sidecar)


@dataclass(frozen=True)
class Request:
    """What one scheduled request sends: the logical model, its input tensors (name -> array, the batch
    dimension first) and its request parameters."""

    model: str
    inputs: dict[str, Any]
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """What came back for the ``index``-th request of a schedule."""

    index: int
    sent_s: float  # its time in the schedule, from the start
    latency_s: float  # request to answer (or refusal), at the client
    result: Any  # the tritonclient InferResult; None: refused
    error: str = ""  # why it was refused


async def open_loop(url: str, arrivals_s: Sequence[float], request: Callable[[int], Request],
                    started: Callable[[float], None] | None = None) -> list[Answer]:
    """Send ``request(i)`` to the KServe v2 gRPC server at ``url`` at ``arrivals_s[i]`` seconds from now, open
    loop; every answer, in order. ``started`` is told the replay's zero (``time.monotonic()``), from which the
    arrivals count. (A watcher of what the servers hold runs beside it: ``asyncio.gather``.)"""
    # tritonclient is imported here: ``accscale --help`` must not pay for gRPC
    import tritonclient.grpc.aio as aioclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # lazy: tritonclient

    async with aioclient.InferenceServerClient(url) as client:
        async def one(i: int, at_s: float) -> Answer:
            r = request(i)
            tensors = []
            for name, array in r.inputs.items():
                tensors.append(aioclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
                tensors[-1].set_data_from_numpy(array)
            start = time.monotonic()
            try:
                result = await client.infer(r.model, tensors, parameters=r.parameters or None)
            except InferenceServerException as exc:
                return Answer(i, at_s, time.monotonic() - start, None, exc.message() or str(exc))
            return Answer(i, at_s, time.monotonic() - start, result)

        begin, sent = time.monotonic(), []
        if started is not None:
            started(begin)
        for i, at_s in enumerate(arrivals_s):
            await asyncio.sleep(max(0.0, begin + at_s - time.monotonic()))
            sent.append(asyncio.ensure_future(one(i, float(at_s))))
        return list(await asyncio.gather(*sent))


def switch_policy(http_url: str, token: str, model: str, policy: str, options: dict | None = None) -> None:
    """Switch ``model``'s policy through the sidecar's admin endpoint, with ``options`` (the policy's own)."""
    body = {"model": model, "policy": policy, **({"options": options} if options else {})}
    request = urllib.request.Request(f"http://{http_url}/v2/admin/policy", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request) as response:
        response.read()
