"""The committed TRL CPU-lab runs (data/runs/trl_cpu_lab): readable by phantom.runs, and what they show."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phantom.lab.rl import VAL_ACC, VAL_LEN
from phantom.runs import iter_runs, read_metrics

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs" / "trl_cpu_lab"


def _runs():
    out = {}
    for run in iter_runs(RUNS):
        m = run.manifest()
        out.setdefault(m["spec"]["arm"], []).append((m, read_metrics(run.path)))
    return out


@pytest.fixture(scope="module")
def runs():
    r = _runs()
    assert set(r) == {"none", "drgrpo", "outcome"}, sorted(r)
    return r


def test_runs_are_complete_trl_runs(runs):
    seeds = {arm: sorted(m["spec"]["seed"] for m, _ in rs) for arm, rs in runs.items()}
    assert len({tuple(s) for s in seeds.values()}) == 1, seeds  # every arm has the same seeds
    for arm, rs in runs.items():
        for m, df in rs:
            assert m["kind"] == "trl" and m["status"] == "done" and m["trl_versions"]["trl"] == "1.16.0"
            assert m["spec"]["model"] == "lab" and m["spec"]["steps"] == 40
            assert m["trl_config"]["scale_rewards"] == ("none" if arm == "drgrpo" else "group")
            assert m["gate"] == ("outcome" if arm == "outcome" else "none")
            assert list(df.index) == list(range(41))
            assert df[VAL_ACC].notna().sum() == 9  # steps 0, 5, ..., 40
            assert df.loc[1:, "phantom/groups/total"].eq(32).all()
            # the manifest's endpoints are the log's
            assert m["summary"]["final_acc"] == df[VAL_ACC].dropna().iloc[-1]
            assert m["summary"]["start_len"] == df[VAL_LEN].dropna().iloc[0]


def test_no_filter_collapses_and_the_outcome_gate_holds(runs):
    for m, df in runs["none"]:
        acc, ln = df[VAL_ACC].dropna(), df[VAL_LEN].dropna()
        assert acc.iloc[0] > 0.3 and acc.iloc[-1] < min(0.1, acc.iloc[0] / 3), (m["name"], acc.tolist())
        assert ln.iloc[-1] < 0.2 * ln.iloc[0], (m["name"], ln.tolist())
    for m, df in runs["outcome"]:
        acc, ln = df[VAL_ACC].dropna(), df[VAL_LEN].dropna()
        assert acc.iloc[-1] >= acc.iloc[0] - 0.1, (m["name"], acc.tolist())
        # worked answers keep their steps; the length term inside live groups trims prose (as in the lab)
        assert ln.iloc[-1] > ln.iloc[0] / 3, (m["name"], ln.tolist())
        # the gate zeroed exactly the outcome-degenerate groups, and TRL saw them flat
        degenerate = df.loc[1:, "phantom/groups/all_fail"] + df.loc[1:, "phantom/groups/all_pass"]
        assert (df.loc[1:, "phantom/groups/zeroed"] == degenerate).all()
        assert (df.loc[1:, "trl/frac_reward_zero_std"] >= df.loc[1:, "phantom/frac/zeroed"] - 1e-9).all()


def test_trl_counts_phantom_groups_as_live(runs):
    """Without the gate, TRL's frac_reward_zero_std (summed reward) misses the all-fail groups that the
    length term spreads: over the first 10 steps the degenerate fraction exceeds it."""
    for m, df in runs["none"]:
        early = df.loc[1:10]
        degenerate = early["phantom/frac/all_fail"] + early["phantom/frac/all_pass"]
        assert early["phantom/groups/phantom"].sum() > 0
        assert (degenerate - early["trl/frac_reward_zero_std"]).mean() > 0.1, m["name"]
        assert np.isfinite(early["phantom/adv/abs_mean"]).all()
