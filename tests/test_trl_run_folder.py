"""A TRL run folder (tests/fixtures/trl_runs: three recorded runs of `phantom trl sweep`, trimmed to two steps)
reads through phantom.runs and `phantom trl table`, in the schema the TRL arm writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phantom.lab.rl import VAL_ACC, VAL_LEN
from phantom.runs import iter_runs, read_metrics

RUNS = Path(__file__).resolve().parent / "fixtures" / "trl_runs"


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


def test_runs_read_as_complete_trl_runs(runs):
    for arm, rs in runs.items():
        for m, df in rs:
            steps = m["spec"]["steps"]
            assert m["kind"] == "trl" and m["status"] == "done" and m["trl_versions"]["trl"] == "1.16.0"
            assert m["spec"]["model"] == "lab" and m["trl_config"]["max_steps"] == steps
            assert m["trl_config"]["scale_rewards"] == ("none" if arm == "drgrpo" else "group")
            assert m["gate"] == ("outcome" if arm == "outcome" else "none")
            # one row per step although each training step logs two lines (phantom's and TRL's)
            assert list(df.index) == list(range(steps + 1))
            assert df[VAL_ACC].dropna().index.tolist() == list(range(0, steps + 1, m["spec"]["eval_every"]))
            assert df.loc[1:, "phantom/groups/total"].eq(m["spec"]["prompts"]).all()
            assert {"trl/loss", "trl/frac_reward_zero_std"} <= set(df.columns)
            # the manifest's endpoints are the log's
            assert m["summary"]["final_acc"] == df[VAL_ACC].dropna().iloc[-1]
            assert m["summary"]["start_len"] == df[VAL_LEN].dropna().iloc[0]


def test_outcome_gate_zeroes_exactly_the_degenerate_groups(runs):
    for _m, df in runs["outcome"]:
        degenerate = df.loc[1:, "phantom/groups/all_fail"] + df.loc[1:, "phantom/groups/all_pass"]
        assert (df.loc[1:, "phantom/groups/zeroed"] == degenerate).all()
        assert (df.loc[1:, "trl/frac_reward_zero_std"] >= df.loc[1:, "phantom/frac/zeroed"] - 1e-9).all()
    for arm in ("none", "drgrpo"):
        for m, df in runs[arm]:
            assert df.loc[1:, "phantom/groups/zeroed"].eq(0).all(), m["name"]


def test_trl_counts_phantom_groups_as_live(runs):
    """Without the gate, TRL's frac_reward_zero_std (summed reward) misses the all-fail groups that the
    length term spreads: the degenerate fraction exceeds it."""
    for m, df in runs["none"]:
        steps = df.loc[1:]
        degenerate = steps["phantom/frac/all_fail"] + steps["phantom/frac/all_pass"]
        assert steps["phantom/groups/phantom"].sum() > 0
        assert (degenerate - steps["trl/frac_reward_zero_std"]).mean() > 0.1, m["name"]
        assert np.isfinite(steps["phantom/adv/abs_mean"]).all()


def test_trl_table_reads_a_runs_folder(capsys, monkeypatch, tmp_path):
    from phantom.trl.sweep import endpoints, main

    rows = endpoints(RUNS)
    assert sorted(r["arm"] for r in rows) == ["drgrpo", "none", "outcome"] and {r["seed"] for r in rows} == {0}
    assert main(["table", "--runs-dir", str(RUNS)]) == 0
    assert capsys.readouterr().out.count("arm=") == 3
    monkeypatch.setenv("PHANTOM_RUNS", str(RUNS))  # the default folder is $PHANTOM_RUNS, as for every command
    assert main(["table"]) == 0
    monkeypatch.setenv("PHANTOM_RUNS", str(tmp_path))
    assert main(["table"]) == 2
    assert "no finished TRL run under" in capsys.readouterr().err
