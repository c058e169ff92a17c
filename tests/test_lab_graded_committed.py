"""The committed `graded` sweep (data/runs/lab_graded): complete, in the setting it names, in the graded
answer style, and what chapter 4 and the folder's README say it shows.

Eight SFT checkpoints (seeds 0-7) of `lab_graded` x three RL seeds x four arms (no filter, shaped-score
filter, outcome filter, Dr. GRPO without a filter), the main setting (40 steps at lr 2.5e-3). The criteria
are computed here on their own (not with phantom.lab.acceptance, which the chapter uses), so the two
readings check each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _warmstart_runs import meets, runs_by_arm

from phantom.book.results import same_curves
from phantom.lab.rl import VAL_ACC
from phantom.lab.spec import ArmSpec
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs" / "lab_graded"
SFT_SEEDS, RL_SEEDS, ARMS = tuple(range(8)), (0, 1, 2), ("drgrpo", "none", "outcome", "score")


@pytest.fixture(scope="module")
def cells() -> dict[tuple[str, int], list[dict]]:
    return runs_by_arm(RUNS)


def test_the_runs_are_the_sweep_file_in_the_main_setting(cells):
    want = sorted(c.name for c in expand(load_sweep(RUNS / "sweep.yaml"), "full"))
    assert sorted(r.name for r in iter_runs(RUNS)) == want and len(want) == 96
    assert sorted(cells) == sorted((a, s) for a in ARMS for s in SFT_SEEDS)
    main = ArmSpec()
    for (arm, sft), runs in cells.items():
        assert [r["seed"] for r in runs] == list(RL_SEEDS), (arm, sft)
        for r in runs:
            spec = r["spec"]
            assert spec["model"] == "lab_graded" and spec["steps"] == main.steps == 40 and spec["lam"] == 0.3
            assert spec["lr"] == main.lr and spec["mini_batches"] == main.mini_batches
            assert spec["warmup_steps"] == main.warmup_steps
            assert spec["eval_every"] == (1 if arm in ("none", "score") else 5), (arm, sft)
            assert list(r["df"][VAL_ACC].dropna().index)[-1] == 40


def test_eight_distinct_warm_starts_answer_in_the_graded_style(cells):
    starts = {sft: {(round(r["acc0"], 6), round(r["len0"], 4)) for a in ARMS for r in cells[a, sft]}
              for sft in SFT_SEEDS}
    assert all(len(v) == 1 for v in starts.values()) and len({min(v) for v in starts.values()}) == 8, starts
    for sft in SFT_SEEDS:
        first = cells["none", sft][0]["df"]["phantom/sample"].dropna().iloc[0]
        assert ", so we have" in first and first.rstrip().splitlines()[-1].startswith("#### "), (sft, first)
        assert not any(w in first for w in ("Next, ", "which makes", "running total of")), first  # one wording


def test_the_shaped_score_arm_is_the_no_filter_arm_bit_for_bit(cells):
    for sft in SFT_SEEDS:
        for a, b in zip(cells["score", sft], cells["none", sft]):
            assert same_curves(a["df"], b["df"]), (sft, a["seed"])


def test_length_leads_in_23_of_24_no_filter_runs(cells):
    orders = {sft: [r["order"] for r in cells["none", sft]] for sft in SFT_SEEDS}
    assert all(o.count("length first") >= 2 for o in orders.values()), orders
    assert [(s, i) for s, o in orders.items() for i, x in enumerate(o) if x != "length first"] == [(3, 1)]
    assert orders[3][1] == "accuracy first"


def test_one_no_filter_run_escapes_in_the_terse_style(cells):
    runs = [(sft, r) for sft in SFT_SEEDS for r in cells["none", sft]]
    assert sum(r["acc_end"] == 0.0 for _, r in runs) == 23
    up = [(sft, r["seed"], round(r["acc_end"], 3)) for sft, r in runs if r["acc_end"] > 0.10]
    assert up == [(4, 2, 0.570)], up
    r = cells["none", 4][2]
    assert r["len_end"] < r["len0"] / 3


def test_the_outcome_arm_gains_and_dr_grpo_holds(cells):
    gains = {sft: [r["acc_end"] - r["acc0"] for r in cells["outcome", sft]] for sft in SFT_SEEDS}
    assert all(min(g) >= -0.05 and np.mean(g) > 0 for g in gains.values()), gains
    assert [s for s, g in gains.items() if np.mean(g) < 0.03] == [6] and round(np.mean(gains[6]), 3) == 0.023
    dr = [r["acc_end"] for sft in SFT_SEEDS for r in cells["drgrpo", sft]]
    assert len(dr) == 24 and round(min(dr), 3) == 0.555


def test_every_criterion_holds_on_six_of_eight_warm_starts(cells):
    assert [s for s in SFT_SEEDS if meets(cells, s)] == [0, 1, 2, 3, 5, 7]


def test_phantom_lab_criteria_agrees_and_reads_the_score_arm(capsys):
    from phantom.lab.cli import main

    assert main(["criteria", str(RUNS / "sweep.yaml"), "--runs-dir", str(RUNS)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "unsafe arms read: none, score" and "score_length_first" in out[1]
    assert out[-1] == "every criterion holds on 6 of 8 warm starts (SFT seeds [0, 1, 2, 3, 5, 7])"
