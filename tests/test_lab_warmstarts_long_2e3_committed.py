"""The committed 100-step sweep at learning rate 2e-3 (data/runs/lab_warmstarts_long_2e-3): complete, in the
setting it names, a continuation of the committed 40-step probe at the same rate, and what chapter 4 and
the folder's README say it shows.

Eight SFT checkpoints (seeds 0-7) x three RL seeds x the no-filter and outcome arms and Dr. GRPO's
no-filter arm, 100 steps at lr 2e-3. The criteria are issue "Lab v2"'s, computed here on their own (not
with phantom.lab.acceptance, which the chapter uses), so the two readings check each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _warmstart_runs import runs_by_arm

from phantom.lab.rl import VAL_ACC
from phantom.lab.spec import ArmSpec
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs

DATA = Path(__file__).resolve().parents[1] / "data" / "runs"
RUNS = DATA / "lab_warmstarts_long_2e-3"
SFT_SEEDS, RL_SEEDS, STEPS, LR = tuple(range(8)), (0, 1, 2), 100, 2e-3


@pytest.fixture(scope="module")
def cells() -> dict[tuple[str, int], list[dict]]:
    return runs_by_arm(RUNS)


def test_the_runs_are_the_sweep_file_at_the_lower_rate(cells):
    want = sorted(c.name for c in expand(load_sweep(RUNS / "sweep.yaml"), "full"))
    assert sorted(r.name for r in iter_runs(RUNS)) == want and len(want) == 72
    assert sorted(cells) == sorted((a, s) for a in ("drgrpo", "none", "outcome") for s in SFT_SEEDS)
    main = ArmSpec()
    for (arm, sft), runs in cells.items():
        assert [r["seed"] for r in runs] == list(RL_SEEDS), (arm, sft)
        for r in runs:
            assert r["spec"]["lr"] == LR != main.lr and r["spec"]["mini_batches"] == main.mini_batches
            assert r["spec"]["warmup_steps"] == main.warmup_steps and r["spec"]["lam"] == 0.3
            assert r["spec"]["steps"] == STEPS and r["spec"]["model"] == "lab"
            assert list(r["df"][VAL_ACC].dropna().index)[-1] == STEPS
            assert r["spec"]["eval_every"] == (1 if arm == "none" else 5), (arm, sft)


def test_eight_warm_starts_six_of_them_those_of_the_2_5e_3_sweep(cells):
    starts = {sft: {round(r["acc0"], 6) for a in ("none", "outcome", "drgrpo") for r in cells[a, sft]}
              for sft in SFT_SEEDS}
    assert all(len(v) == 1 for v in starts.values()), starts
    assert len({next(iter(v)) for v in starts.values()}) == len(SFT_SEEDS), starts


def test_length_leads_on_every_warm_start_and_never_loses_to_accuracy(cells):
    """What the lower rate was chosen for: SFT seed 5 now has two length-first runs of three (one same step)."""
    orders = {sft: [r["order"] for r in cells["none", sft]] for sft in SFT_SEEDS}
    assert all(o.count("length first") >= 2 for o in orders.values()), orders
    assert [s for s, o in orders.items() if o.count("length first") < 3] == [5], orders
    assert orders[5].count("same step") == 1


def test_two_no_filter_runs_escape_the_collapse_in_the_short_style(cells):
    """22 of 24 end at 0.000; SFT seed 4 / RL seed 2 and SFT seed 7 / RL seed 2 end at or above their start,
    with answers under a third of their starting length."""
    runs = [(sft, r) for sft in SFT_SEEDS for r in cells["none", sft]]
    assert sum(r["acc_end"] == 0.0 for _, r in runs) == 22
    up = [(sft, r["seed"]) for sft, r in runs if r["acc_end"] > 0.10]
    assert up == [(4, 2), (7, 2)], up
    for sft, r in runs:
        if r["acc_end"] > 0.10:
            assert r["acc_end"] >= r["acc0"] and r["len_end"] < r["len0"] / 3, (sft, r["acc_end"], r["len_end"])
    ends = {(4, 2): 0.836, (7, 2): 0.605}
    assert all(round(r["acc_end"], 3) == ends[sft, r["seed"]] for sft, r in runs if r["acc_end"] > 0.10)


def test_the_outcome_arm_gains_and_dr_grpo_holds_on_every_warm_start(cells):
    gains = {sft: [r["acc_end"] - r["acc0"] for r in cells["outcome", sft]] for sft in SFT_SEEDS}
    assert all(np.mean(g) >= 0.03 for g in gains.values()), gains
    assert all(v >= 0 for g in gains.values() for v in g), gains
    assert round(min(np.mean(g) for g in gains.values()), 3) == 0.039  # SFT seed 2
    dr = [r["acc_end"] for sft in SFT_SEEDS for r in cells["drgrpo", sft]]
    assert len(dr) == 24 and min(dr) > 0.10 and round(min(dr), 3) == 0.457


def test_every_criterion_holds_on_six_of_eight_warm_starts(cells):
    def meets(sft: int) -> bool:
        n, o, d = (cells[a, sft] for a in ("none", "outcome", "drgrpo"))
        return (all(x["acc_end"] <= 0.10 for x in n) and [x["order"] for x in n].count("length first") >= 2
                and np.mean([x["acc_end"] - x["acc0"] for x in o]) >= 0.03
                and all(x["acc_end"] >= x["acc0"] - 0.05 for x in o) and all(x["acc_end"] > 0.10 for x in d))

    assert [s for s in SFT_SEEDS if meets(s)] == [0, 1, 2, 3, 5, 6]


def test_phantom_lab_criteria_agrees(capsys):
    from phantom.lab.cli import main

    assert main(["criteria", str(RUNS / "sweep.yaml"), "--runs-dir", str(RUNS)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        "every criterion holds on 6 of 8 warm starts (SFT seeds [0, 1, 2, 3, 5, 6])"
