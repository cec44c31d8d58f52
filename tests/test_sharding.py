"""`accscale bench sharding`: K independent engines over the K parts of one trace, against one engine over all."""

from __future__ import annotations

import json

import numpy as np

from scheduler_sidecar.cli import main
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.experiments.superserve.reproduce import PAPER_PROFILE
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.systems.superserve.slackfit import SlackFit


def test_one_shard_is_the_plain_simulation_and_every_k_serves_every_query(capsys):
    from loadtest.traces import bursty

    assert main(["bench", "sharding", "--system", "superserve", "--duration-s", "2", "--shards", "1,2,8",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {r["shards"]: r for r in result["rows"]}
    assert set(rows) == {1, 2, 8} and {r["queries"] for r in rows.values()} == {result["queries"]}
    trace = bursty(1500.0, 5550.0, 8.0, 2.0, seed=0)
    arrival = np.round(trace.arrival_s * 1e6).astype(np.int64)
    whole = Simulator(SlackFit(Profile.load(PAPER_PROFILE)), SimConfig(workers=8)).run(arrival, arrival + 36_000)
    assert rows[1]["slo_attainment"] == round(whole.summary()["slo_attainment"], 4)
    assert rows[1]["attainment_lost_points"] == 0.0
    # eight one-worker shards cannot pool a burst: they lose attainment, or accuracy, against one engine
    assert rows[8]["attainment_lost_points"] > 0 or rows[8]["accuracy_lost_points"] > 0


def test_more_shards_than_workers_are_refused(capsys):
    assert main(["bench", "sharding", "--system", "superserve", "--shards", "16", "--duration-s", "1"]) == 2
    assert "superserve has 8 workers: at most that many shards" in capsys.readouterr().err
