"""The committed 60-step probe (data/runs/lab_horizon60): what its README states, checked on its logs.

Six warm-start cells re-run for 60 steps on another machine. The README claims that their first 40 steps
are the committed 40-step runs, that the straggling no-filter run collapses by step 50, that the outcome
arm on SFT seed 2 still gains less than +0.03 at step 60, and that Dr. GRPO's step-40 low was a dip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phantom.lab.rl import VAL_ACC
from phantom.runs import iter_runs, read_metrics

DATA = Path(__file__).resolve().parents[1] / "data" / "runs"


def _key(spec: dict) -> tuple[str, int, int]:
    arm = "drgrpo" if spec.get("estimator") == "drgrpo" else spec["arm"]
    return arm, spec.get("sft_seed") or 0, spec["seed"]


def _runs(folder: str) -> dict[tuple[str, int, int], object]:
    return {_key(r.manifest()["spec"]): read_metrics(r.path) for r in iter_runs(DATA / folder)}


@pytest.fixture(scope="module")
def long() -> dict:
    return _runs("lab_horizon60")


def _acc(df, step: int) -> float:
    return float(df.loc[step, VAL_ACC])


def test_six_finished_60_step_runs(long):
    assert sorted(long) == [("drgrpo", 0, 2), ("none", 1, 0), ("outcome", 0, 0),
                            ("outcome", 2, 0), ("outcome", 2, 1), ("outcome", 2, 2)]
    assert all(int(df.index.max()) == 60 for df in long.values())


def test_the_first_40_steps_are_the_committed_40_step_runs(long):
    short = _runs("lab_warmstarts")
    for key, df in long.items():
        ref = short[key]
        cols = [c for c in ref.columns if not c.startswith("timing_s/")]
        assert sorted(cols) == sorted(c for c in df.columns if not c.startswith("timing_s/")), key
        a, b = df.loc[: int(ref.index.max()), cols], ref[cols]
        assert a.index.equals(b.index), key
        assert a.equals(b), f"{key}: the 60-step run's first 40 steps differ from the committed run"


def test_the_straggling_no_filter_run_collapses_by_step_50(long):
    df = long["none", 1, 0]
    assert _acc(df, 40) > 0.10
    assert _acc(df, 50) <= 0.10 and _acc(df, 60) <= 0.10


def test_the_outcome_arm_on_sft_seed_2_still_gains_less_than_003(long):
    dfs = [long["outcome", 2, s] for s in (0, 1, 2)]
    start = _acc(dfs[0], 0)
    assert all(_acc(df, 0) == start for df in dfs)
    gain60 = sum(_acc(df, 60) for df in dfs) / 3 - start
    assert gain60 < 0.03
    evals = [float(v) for df in dfs for step, v in df[VAL_ACC].dropna().items() if step >= 5]
    assert min(evals) >= 0.54 and max(evals) <= 0.68  # the band the README gives, steps 5-60


def test_dr_grpo_recovers_from_its_step_40_low(long):
    df = long["drgrpo", 0, 2]
    start = _acc(df, 0)
    assert _acc(df, 40) < start - 0.10
    assert all(0.61 <= _acc(df, s) <= 0.64 for s in (45, 50, 55, 60))
