"""The committed `graded_2e-3_heldout` sweep (data/runs/lab_graded_2e-3_heldout): the `graded_2e-3` design on
four warm starts (SFT seeds 8-11) that did not take part in choosing the rate, and what its README and
chapter 4 say of them: every criterion holds on three of four; one no-filter run of SFT seed 11 is still
falling at step 40."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _warmstart_runs import cell, meets, readme_table, runs_by_arm

from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs

DATA = Path(__file__).resolve().parents[1] / "data" / "runs"
RUNS = DATA / "lab_graded_2e-3_heldout"
SFT_SEEDS, RL_SEEDS, ARMS = (8, 9, 10, 11), (0, 1, 2), ("drgrpo", "none", "outcome", "score")


@pytest.fixture(scope="module")
def cells() -> dict[tuple[str, int], list[dict]]:
    return runs_by_arm(RUNS)


def test_the_runs_are_the_sweep_file_and_the_2e3_design_on_new_seeds(cells):
    want = sorted(c.name for c in expand(load_sweep(RUNS / "sweep.yaml"), "full"))
    assert sorted(r.name for r in iter_runs(RUNS)) == want and len(want) == 48
    assert {r.manifest()["sweep"]["name"] for r in iter_runs(RUNS)} == {"graded_2e-3_heldout"}
    assert sorted(cells) == sorted((a, s) for a in ARMS for s in SFT_SEEDS)
    tuned = runs_by_arm(DATA / "lab_graded_2e-3")
    for (arm, sft), runs in cells.items():
        assert [r["seed"] for r in runs] == list(RL_SEEDS), (arm, sft)
        for r, t in zip(runs, tuned[arm, 0]):  # every field as in the tuned sweep's SFT seed 0 but the seed
            assert cell({**r["spec"], "sft_seed": 0}) == cell(t["spec"]), (arm, sft)
    for other in DATA.glob("*/**/manifest.json"):  # no other committed run trained these warm starts
        if RUNS not in other.parents:
            assert '"sft_seed": 8' not in other.read_text() and '"sft_seed": 11' not in other.read_text(), other


def test_length_first_in_every_no_filter_run_and_one_still_falling(cells):
    runs = [(sft, r) for sft in SFT_SEEDS for r in cells["none", sft]]
    assert [r["order"] for _, r in runs] == ["length first"] * 12
    assert ([min(r["len_step"] for _, r in runs), max(r["len_step"] for _, r in runs)],
            [min(r["acc_step"] for _, r in runs), max(r["acc_step"] for _, r in runs)]) == ([8, 11], [11, 30])
    up = [(sft, r["seed"], round(r["acc_end"], 3)) for sft, r in runs if r["acc_end"] > 0.10]
    assert up == [(11, 1, 0.203)], up
    assert max(r["acc_end"] for sft, r in runs if (sft, r["seed"]) != (11, 1)) <= 0.004
    acc = cells["none", 11][1]["df"]["phantom/val/acc_true"]
    ln = cells["none", 11][1]["df"]["val-aux/phantom_lab/len_chars/mean@1"]
    assert round(ln[14]) == 46 and round(acc[16], 3) == 0.586 and round(acc[30], 3) == 0.465
    for a, b in zip(cells["score", 11], cells["none", 11]):
        assert a["acc_end"] == b["acc_end"] and a["order"] == b["order"]


def test_the_outcome_arm_gains_and_dr_grpo_holds(cells):
    gains = {sft: [r["acc_end"] - r["acc0"] for r in cells["outcome", sft]] for sft in SFT_SEEDS}
    assert [round(float(np.mean(g)), 3) for g in gains.values()] == [0.083, 0.073, 0.113, 0.091]
    assert round(min(min(g) for g in gains.values()), 3) == 0.070
    assert round(min(r["acc_end"] for sft in SFT_SEEDS for r in cells["drgrpo", sft]), 3) == 0.609


def test_every_criterion_holds_on_three_of_four(cells, capsys):
    assert [s for s in SFT_SEEDS if meets(cells, s)] == [8, 9, 10]
    from phantom.lab.cli import main

    assert main(["criteria", str(RUNS / "sweep.yaml"), "--runs-dir", str(RUNS)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "every criterion holds on 3 of 4 warm starts (SFT seeds [8, 9, 10])"


def test_the_readme_table_is_the_runs(cells):
    """Every row of the folder README's table, recomputed from the run logs."""
    rows = readme_table(cells, RUNS / "README.md")
    assert [int(got[0]) for got, _ in rows] == list(SFT_SEEDS)
    for got, want in rows:
        assert got == want
