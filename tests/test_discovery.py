"""Workers that come and go: the engine's and the driver's removal (a drained worker finishes its batch and loses no
query), discovery's rounds, its DNS resolver and config, and a sidecar following "pods" on loopback (real Tritons)
behind a resolver the test controls."""

from __future__ import annotations

import asyncio

import pytest

from scheduler_sidecar.errors import ConfigError, InvalidRequest, Unavailable
from scheduler_sidecar.server import config as sidecar_config
from scheduler_sidecar.server.discovery import Discovery, dns_resolver
from tests.test_live import logits, make_driver, row, settle, worker


def test_a_removed_worker_finishes_its_batch_takes_no_new_one_and_is_forgotten():
    async def main():
        a, b = worker("a"), worker("b", gated=False)
        driver, (model,) = make_driver(a, b)
        b.gate = asyncio.Event()  # b, too, holds its batch until the test lets it go
        first = [asyncio.ensure_future(model.infer(row(i, 0), 1_000_000)) for i in range(2)]
        await settle()
        assert len(a.calls) == len(b.calls) == 1  # one batch on each
        ids = driver.remove_worker(a)
        assert ids == [0] and driver.engine.has_worker(0)  # leaving, but its batch runs on
        b.gate.set()
        later = [asyncio.ensure_future(model.infer(row(10 + i, 0), 1_000_000)) for i in range(3)]
        await settle()
        assert len(a.calls) == 1  # nothing new went to a
        drained = asyncio.ensure_future(driver.drained(ids, poll_s=0))
        await settle()
        assert not drained.done()
        a.gate.set()
        answers = await asyncio.gather(*first, *later)
        await drained
        assert sorted(logits(x)[0] for x in answers) == [0, 1, 10, 11, 12]  # every query answered
        assert [x.worker for x in answers[2:]] == ["b"] * 3
        assert not driver.engine.has_worker(0) and [w.id for w in driver.engine.workers] == [1]
        driver.remove_worker(b)  # the last worker goes: a request now gets an explicit error, not a hang
        assert set(driver.slots) == set()
        with pytest.raises(Unavailable, match="no healthy worker"):
            await model.infer(row(0, 0), 1_000_000)

    asyncio.run(main())


def test_a_leaving_worker_that_dies_has_its_batch_retried_and_never_comes_back():
    async def main():
        a, b = worker("a"), worker("b")
        driver, (model,) = make_driver(a, b)
        running = [asyncio.ensure_future(model.infer(row(i, 0), 1_000_000)) for i in range(2)]
        await settle()
        driver.remove_worker(a)
        driver.worker_health(a, False)  # it died while draining: its batch goes back to the queue
        driver.worker_health(a, True)  # a late health check does not bring a leaving worker back
        assert [w.id for w in driver.engine.workers] == [1]
        b.gate.set()
        answers = await asyncio.gather(*running)
        assert {x.worker for x in answers} == {"b"}

    asyncio.run(main())


class Pods:
    """A resolver the test controls, and the admit/drain calls discovery made."""

    def __init__(self, *urls: str) -> None:
        self.urls = frozenset(urls)
        self.workers: set[str] = set()
        self.ready: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.fail = False

    async def resolve(self) -> frozenset[str]:
        if self.fail:
            raise OSError("Name or service not known")
        return self.urls

    async def admit(self, url: str) -> None:
        self.calls.append(("admit", url))
        if url not in self.ready:
            raise InvalidRequest(f"Triton at {url} is not ready")
        self.workers.add(url)

    async def drain(self, url: str) -> None:
        self.calls.append(("drain", url))
        self.workers.discard(url)


def test_discovery_admits_ready_pods_retries_the_rest_and_drains_the_gone():
    async def main():
        pods = Pods("p1:8001", "p2:8001")
        pods.ready = {"p1:8001"}
        discovery = Discovery(pods.resolve, lambda: frozenset(pods.workers), pods.admit, pods.drain, interval_s=1)
        await discovery.sync()
        assert pods.workers == {"p1:8001"}  # p2 is not ready yet
        pods.ready.add("p2:8001")
        await discovery.sync()
        assert pods.workers == {"p1:8001", "p2:8001"}
        pods.fail = True  # a lookup that fails changes nothing
        await discovery.sync()
        assert pods.workers == {"p1:8001", "p2:8001"}
        pods.fail, pods.urls = False, frozenset({"p2:8001"})
        await discovery.sync()
        assert pods.workers == {"p2:8001"}
        assert pods.calls == [("admit", "p1:8001"), ("admit", "p2:8001"), ("admit", "p2:8001"), ("drain", "p1:8001")]

    asyncio.run(main())


def test_the_dns_resolver_gives_every_address_at_the_port():
    found = asyncio.run(dns_resolver("localhost", 8001)())
    assert "127.0.0.1:8001" in found and all(url.endswith(":8001") for url in found)


def test_discovery_config(tmp_path):
    path = tmp_path / "sidecar.toml"
    model = '[[models]]\nname = "m"\nprofile = "m.json"\n'
    path.write_text('[discovery]\nservice = "triton.ns.svc"\ndevice = "gpu"\n' + model)
    loaded = sidecar_config.load(path)
    assert loaded.workers == () and loaded.discovery == sidecar_config.DiscoverySpec("triton.ns.svc", 8001, 5.0, "gpu")
    assert loaded.device_of("10.0.0.7:8001") == "gpu"
    for text, message in [
        (model, "at least one Triton worker"),
        ('[discovery]\nport = 8001\n' + model, "needs 'service'"),
        ('[discovery]\nservice = "t"\nport = 0\n' + model, "port in 1-65535"),
        ('[discovery]\nservice = "t"\n[[planners]]\nkind = "proteus"\nworkers = ["h:1"]\n'
         '[[models]]\nname = "p"\nprofile = "p.json"\npolicy = "proteus"\n', "names workers that are not in"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            sidecar_config.load(path)


@pytest.mark.triton
@pytest.mark.slow
def test_a_sidecar_follows_the_pods_a_name_resolves_to(fast_build, triton, tmp_path):
    """Loopback "pods": the sidecar starts with the one of the two the name has that is ready, admits the second
    once its Triton is, and drains the first when the name drops it, under 16 clients' load (real tritonclient), losing no request."""
    import tritonclient.grpc.aio as grpcaio
    from tritonclient.utils import InferenceServerException

    from export import data
    from scheduler_sidecar.processes.triton_launcher import TritonServer
    from scheduler_sidecar.server import grpc_frontend
    from scheduler_sidecar.server.service import Sidecar
    from tests.test_sidecar import grpc_input

    images = data.load(fast_build.act.spec.image_size)["heldout"].images[:16]
    second = TritonServer(repository=fast_build.repository)  # its ports are known before it starts
    pods = Pods(triton.grpc_url, second.grpc_url)  # in the name from the start, but no Triton answers there yet
    config = sidecar_config.SidecarConfig(
        models=(sidecar_config.ModelSpec("digits", fast_build.profile_path),), workers=(),
        discovery=sidecar_config.DiscoverySpec("pods.test", interval_s=3600.0))  # the test runs every round

    async def main() -> None:
        sidecar = Sidecar(config)
        await sidecar.start(resolve=pods.resolve)
        server, port = await grpc_frontend.start(sidecar, "127.0.0.1", 0)
        try:
            assert sidecar.discovery is not None and [w["url"] for w in sidecar.workers()] == [triton.grpc_url]
            await sidecar.discovery.sync()  # still not ready: not admitted
            assert [w["url"] for w in sidecar.workers()] == [triton.grpc_url]
            await asyncio.to_thread(second.start)
            await sidecar.discovery.sync()
            assert sorted(w["url"] for w in sidecar.workers()) == sorted([triton.grpc_url, second.grpc_url])
            async with grpcaio.InferenceServerClient(f"127.0.0.1:{port}") as client:
                async def one(i: int) -> str:
                    try:
                        result = await client.infer("digits", [grpc_input(images[i % len(images)][None])],
                                                    parameters={"slo_us": 2_000_000})
                        return result.get_response().parameters["worker"].string_param
                    except InferenceServerException as exc:
                        return str(exc.status())

                before = await asyncio.gather(*(one(i) for i in range(64)))
                pods.urls = frozenset({second.grpc_url})  # the first pod leaves the Service
                draining = asyncio.ensure_future(sidecar.discovery.sync())
                during = await asyncio.gather(*(one(i) for i in range(64)))
                await draining
                after = await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            await server.stop(grace=None)
            await sidecar.close()
        assert set(before) == {triton.grpc_url, second.grpc_url}
        assert set(during) <= {triton.grpc_url, second.grpc_url}, set(during)  # every request answered
        assert set(after) == {second.grpc_url}
        assert [w["url"] for w in sidecar.workers()] == [second.grpc_url]
        assert len(sidecar.pool.workers) == 1 and {sidecar.membership.worker(s).url for s in sidecar.driver.slots} == {
            second.grpc_url}

    try:
        asyncio.run(main())
    finally:
        second.stop()
