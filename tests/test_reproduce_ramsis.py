"""`accscale reproduce ramsis`, short: the claims it computes, held."""

from __future__ import annotations

import json

import pytest

from scheduler_sidecar.cli import main

# What this short run says of each claim (a change either way fails here until the list is updated): two worker
# counts, the Twitter trace at 0.25 s a rate, a policy grid of 800 q/s and 5 s of ModelSwitching profiling.
CLAIMS = {
    # at 50 workers every method violates more than 5%, at 70 none does: one count where all are compared leaves no
    # saving to measure (a full run's grid of 30-100 workers measures one)
    "saving_max.jellyfish": False, "saving_max.modelswitching": False,
    # 4.13 and 1.73 points over Jellyfish+ and ModelSwitching at 70 workers: RAMSIS is more accurate, by less than
    # the paper's largest gains (and than the artifact simulator's mean at 60-80 workers)
    "gain_max.jellyfish": False, "gain_max.modelswitching": False,
    "sim_gain_mean.jellyfish": False, "sim_gain_mean.modelswitching": False,
    "more_accurate_everywhere.jellyfish": True, "more_accurate_everywhere.modelswitching": True,
    # none of the three violates at 70 workers: a tie shows no ordering
    "fewest_violations": False,
}


@pytest.mark.slow
def test_reproduce_ramsis_holds_its_claims(tmp_path, capsys):
    assert main(["reproduce", "ramsis", "--workers", "50,70", "--bin-s", "0.25", "--load-step", "800",
                 "--ms-profile-s", "5", "--jobs", "2", "--json", "--out", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {c["id"]: c["holds"] for c in result["claims"]} == CLAIMS
    causes = {c["id"]: c["cause"].split(":")[0] for c in result["claims"] if not c["holds"]}
    # computed: no method keeps violations < 5% on fewer than 70 workers here, so no saving is possible; the largest
    # gains are the prototype's, but in this short run ours (70 workers only) is short of the authors' simulator too
    assert {k: v for k, v in causes.items() if k.startswith(("saving_max", "gain_max"))} == {
        **{f"saving_max.{b}": "inputs" for b in ("jellyfish", "modelswitching")},
        **{f"gain_max.{b}": "unclassified" for b in ("jellyfish", "modelswitching")}}
    summary = (tmp_path / "summary.md").read_text()
    assert all(c["statement"] in summary for c in result["claims"])
