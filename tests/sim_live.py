"""One engine, two clocks: a trace through the live driver on virtual time, in the simulator's world.

:func:`run_live` mirrors ``Simulator(policy, world, planners=...).run(arrival_us, deadline_us, query_types)``
and returns each query's engine record in arrival order (query id = index, as in ``SimResult``). Give it
fresh policy objects (a policy keeps state). Each worker of the world is one fake worker slot of its
device kind holding its resident models, whose batches take exactly what the simulator's
``BatchLatency`` samples (in the same order, so latency noise matches too) and whose loads take the
world's load time. Latency calibration is off and no queue limit can refuse. Arrivals are issued at
their exact virtual times, after every other event due at the same microsecond and what follows from
it, as the simulator processes completions, loads and wakeups before arrivals.

Where the live driver differs from the simulator by design, so a comparison must allow for it:

- a plan asked for during an event is solved in a task: the engine steps once under the old plan
  before the new one applies, where the simulator applies it inline (the first plan, asked for before
  any arrival, is not affected);
- completions, loads and wakeups due at the same microsecond run in the order they were scheduled,
  not the simulator's completions, loads, then wakeups;
- a load a policy starts itself is expected to take ``DEFAULT_LOAD_US`` until one has been measured
  (the simulator expects the world's load time).

Not supported yet: follow-up queries (a ``result_model``) and worker failures (``fail_at_s``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from scheduler_sidecar.core.engine import SIMULATED
from scheduler_sidecar.core.plan import Planner
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.records import QueryRecord
from scheduler_sidecar.errors import AccscaleError
from scheduler_sidecar.live.driver import CONTROL_INPUT, LiveDriver, LiveModel, ModelOptions
from scheduler_sidecar.live.tensors import TensorSpec
from scheduler_sidecar.live.workers import FakeWorker, InferCall
from scheduler_sidecar.server.metrics import Metrics, ModelMetrics
from scheduler_sidecar.sim.simulator import SimConfig
from scheduler_sidecar.sim.world import BatchLatency, World
from tests.virtual_clock import VirtualLoop, run

INPUT = TensorSpec("INPUT", "FP32", (1,))  # a call needs one input to count its rows
ROW = {"INPUT": bytes(4)}
ARRIVAL_RANK = 1  # after the timers asyncio schedules (rank 0) due at the same microsecond


def run_live(policy: Policy | Mapping[str, Policy], config: SimConfig | World,
             arrival_us: Sequence[int] | np.ndarray, deadline_us: Sequence[int] | np.ndarray,
             query_types: Sequence[str] | None = None, *, planners: Sequence[Planner] = ()) -> list[QueryRecord]:
    """Each query's record, in arrival order (see the module docstring)."""
    policies = {"": policy} if isinstance(policy, Policy) else dict(policy)
    world = config.world(next(iter(policies.values())).device) if isinstance(config, SimConfig) else config
    if world.fail_at_s:
        raise ValueError("run_live does not fail workers (fail_at_s) yet")
    arrivals = np.asarray(arrival_us, dtype=np.int64).tolist()
    deadlines = np.asarray(deadline_us, dtype=np.int64).tolist()
    n = len(arrivals)
    types = list(query_types) if query_types is not None else [next(iter(policies))] * n
    metrics = Metrics()
    # the simulator's limits: no queue limit, no admission, attempts without limit
    options = {name: ModelOptions(name, limits=SIMULATED, latency_calibration=False) for name in policies}
    models = {name: LiveModel(options[name], p.profile, (INPUT,), (), ModelMetrics(metrics, name))
              for name, p in policies.items()}
    latency = BatchLatency(world, [p.profile for p in policies.values()])
    variant_of = _variant_ids(models.values())
    loop = VirtualLoop()
    ended: list[QueryRecord] = []

    def worker(i: int) -> FakeWorker:
        return FakeWorker(f"sim-{i}", compute=lambda call: [{} for _ in range(call.rows)],
                          delay_s=lambda call: latency.sample_us(variant_of[_call_key(call)], call.rows, i) / 1e6,
                          load_delay_s=lambda model: world.load_us(model) / 1e6)

    async def main() -> None:  # the driver is built on the running loop: a wakeup asked for then needs it
        driver = LiveDriver(((models[name], p) for name, p in policies.items()), clock=loop.clock)
        client_end = driver.engine.on_end

        def on_end(record: QueryRecord, output: object, error: AccscaleError | None) -> None:
            ended.append(record)
            client_end(record, output, error)

        driver.engine.on_end = on_end
        for i, w in enumerate(world.workers):  # slot i, as the driver numbers them: the world's worker i
            driver.add_worker(worker(i), 1, device=w.device, resident=w.resident)
        for planner in planners:
            driver.use_planner(planner)
        clients: list[asyncio.Task] = []
        issued = loop.create_future()

        def arrive(i: int) -> None:
            clients.append(loop.create_task(models[types[i]].infer(ROW, deadlines[i] - arrivals[i])))
            if len(clients) == n:
                issued.set_result(None)

        for i, t in enumerate(arrivals):
            loop.call_at(t / 1e6, arrive, i, rank=ARRIVAL_RANK)
        if n:
            await issued
        await asyncio.gather(*clients, return_exceptions=True)  # every client has its answer or its error
        await driver.close()

    run(main(), loop)
    records = sorted(ended, key=lambda r: r.query_id)
    # the driver numbers queries in the order they arrive, as the simulator does
    if [(r.query_id, r.arrival_us, r.query_type) for r in records] != list(zip(range(n), arrivals, types)):
        raise RuntimeError("every query must end exactly once, numbered in arrival order")
    return records


def _call_key(call: InferCall) -> tuple[str, str, bytes]:
    """What names a variant in a worker call: its Triton model, version and control row (supernets)."""
    control = next((rows[0] for spec, rows in call.inputs if spec.name == CONTROL_INPUT), b"")
    return call.model, call.version, control


def _variant_ids(models: Iterable[LiveModel]) -> dict[tuple[str, str, bytes], str]:
    out: dict[tuple[str, str, bytes], str] = {}
    for model in models:
        for v in model.profile.variants:
            key = _call_key(model.call(v, [ROW]))
            if out.setdefault(key, v.id) != v.id:
                raise ValueError(f"variants {out[key]!r} and {v.id!r} make the same worker call")
    return out
