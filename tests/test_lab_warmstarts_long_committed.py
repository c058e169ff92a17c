"""The committed 100-step warm-start sweep (data/runs/lab_warmstarts_long): complete, a continuation of
the 40-step cells, and what chapter 4 and the folder's README say it shows.

Six SFT checkpoints (seeds 0-5) x three RL seeds x the no-filter and outcome arms and Dr. GRPO's
no-filter arm, 100 steps each. The assertions are issue "Lab v2"'s acceptance criteria for the main
setting, read at step 100; a re-run whose data stops supporting one fails here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _warmstart_runs import cell, runs_by_arm

from phantom.book.results import same_prefix
from phantom.dynamics import dynamics, up_to, validated_every
from phantom.lab.rl import VAL_ACC
from phantom.lab.spec import ArmSpec
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs, read_metrics

DATA = Path(__file__).resolve().parents[1] / "data" / "runs"
RUNS = DATA / "lab_warmstarts_long"
SFT_SEEDS, RL_SEEDS, STEPS = (0, 1, 2, 3, 4, 5), (0, 1, 2), 100
#: the committed 40-step cells of the same warm starts (this sweep continues them)
SHORT = {0: "lab_warmstarts", 1: "lab_warmstarts", 2: "lab_warmstarts", 3: "lab_warmstart_heldout"}


@pytest.fixture(scope="module")
def cells() -> dict[tuple[str, int], list[dict]]:
    return runs_by_arm(RUNS)


def test_the_runs_are_the_sweep_file_in_the_main_setting(cells):
    want = sorted(c.name for c in expand(load_sweep(RUNS / "sweep.yaml"), "full"))
    assert sorted(r.name for r in iter_runs(RUNS)) == want and len(want) == 54
    assert sorted(cells) == sorted((a, s) for a in ("drgrpo", "none", "outcome") for s in SFT_SEEDS)
    main = ArmSpec()
    for (arm, sft), runs in cells.items():
        assert [r["seed"] for r in runs] == list(RL_SEEDS), (arm, sft)
        for r in runs:
            assert r["spec"]["lr"] == main.lr and r["spec"]["mini_batches"] == main.mini_batches
            assert r["spec"]["steps"] == STEPS and r["spec"]["lam"] == 0.3 and r["spec"]["model"] == "lab"
            assert list(r["df"][VAL_ACC].dropna().index)[-1] == STEPS
            assert r["spec"]["eval_every"] == (1 if arm == "none" else 5), (arm, sft)


def test_the_six_warm_starts_differ(cells):
    starts = {sft: {round(r["acc0"], 6) for a in ("none", "outcome", "drgrpo") for r in cells[a, sft]}
              for sft in SFT_SEEDS}
    assert all(len(v) == 1 for v in starts.values()), starts
    assert len({next(iter(v)) for v in starts.values()}) == len(SFT_SEEDS), starts


@pytest.mark.parametrize("sft", sorted(SHORT))
def test_the_first_40_steps_are_the_committed_40_step_cells(cells, sft):
    """Nothing in a run depends on its length (the lr is constant after warm-up): the first 40 steps of a
    100-step run log what its 40-step cell logs, timings aside. So the book's 40-step results are the
    first part of these runs, not another experiment."""
    short = {cell(run.manifest()["spec"]): read_metrics(run.path) for run in iter_runs(DATA / SHORT[sft])
             if (run.manifest()["spec"].get("sft_seed") or 0) == sft}
    checked = 0
    for arm in ("none", "outcome", "drgrpo"):
        for r in cells[arm, sft]:
            # a no-filter run validates at every step, its 40-step cell every fifth: what both logged is compared
            assert same_prefix(r["df"], short[cell(r["spec"])]), (arm, sft, r["seed"])
            checked += 1
    assert checked == 9


def test_no_filter_collapses_in_every_run(cells):
    ends = {sft: [r["acc_end"] for r in cells["none", sft]] for sft in SFT_SEEDS}
    assert all(v <= 0.10 for e in ends.values() for v in e), ends


def test_length_leads_in_most_no_filter_runs_on_five_of_six_warm_starts(cells):
    """Issue "Lab v2" asks for length first in 2 of 3 runs per warm start. Read at every step it holds on
    five of six; on SFT seed 5 two runs lose length and accuracy at the same step. No run loses accuracy
    first. Read every fifth step (the paper's validation), fewer warm starts meet it."""
    orders = {sft: [r["order"] for r in cells["none", sft]] for sft in SFT_SEEDS}
    assert [s for s, o in orders.items() if o.count("length first") < 2] == [5], orders
    assert all(set(o) <= {"length first", "same step"} for o in orders.values()), orders
    coarse = {sft: [dynamics(validated_every(r["df"], 5))["order"] for r in cells["none", sft]] for sft in SFT_SEEDS}
    ok = [s for s in SFT_SEEDS if orders[s].count("length first") >= 2]
    ok5 = [s for s in SFT_SEEDS if coarse[s].count("length first") >= 2]
    assert set(ok5) < set(ok), coarse


def test_the_outcome_arm_gains_on_five_of_six_warm_starts(cells):
    """Mean gain +0.03 or more on five warm starts; SFT seed 2 ends at +0.029 (it had +0.053 at step 40).
    No outcome run ends more than 0.05 below its start."""
    gains = {sft: [r["acc_end"] - r["acc0"] for r in cells["outcome", sft]] for sft in SFT_SEEDS}
    assert [s for s, g in gains.items() if np.mean(g) < 0.03] == [2], gains
    assert np.mean(gains[2]) > 0.02
    assert all(v >= -0.05 for g in gains.values() for v in g), gains


def test_dr_grpo_without_a_filter_does_not_collapse(cells):
    runs = [r for sft in SFT_SEEDS for r in cells["drgrpo", sft]]
    assert len(runs) == 18
    assert all(r["acc_end"] > 0.10 for r in runs), [(r["spec"]["sft_seed"], r["seed"], r["acc_end"]) for r in runs]
    lost = [(r["spec"]["sft_seed"], r["seed"]) for r in runs if r["acc_end"] < r["acc0"] - 0.05]
    assert lost == [(3, 0)], lost


def _meets_all(cells, sft: int, horizon: int) -> bool:
    """Issue "Lab v2"'s criteria for one warm start, its runs read up to ``horizon`` steps."""
    d = {arm: [dynamics(up_to(r["df"], horizon)) for r in cells[arm, sft]] for arm in ("none", "outcome", "drgrpo")}
    return (all(x["acc_end"] <= 0.10 for x in d["none"])
            and [x["order"] for x in d["none"]].count("length first") >= 2
            and np.mean([x["acc_end"] - x["acc0"] for x in d["outcome"]]) >= 0.03
            and all(x["acc_end"] >= x["acc0"] - 0.05 for x in d["outcome"])
            and all(x["acc_end"] > 0.10 for x in d["drgrpo"]))


def test_every_criterion_holds_on_four_warm_starts_at_either_horizon_not_the_same_four(cells):
    at = {h: [s for s in SFT_SEEDS if _meets_all(cells, s, h)] for h in (40, STEPS)}
    assert at == {40: [0, 1, 2, 4], STEPS: [0, 1, 3, 4]}, at


def test_phantom_lab_criteria_prints_the_passing_warm_starts(capsys):
    """The CLI a reproducer runs on their own sweep: the same verdict as the table above, at both horizons."""
    from phantom.lab.cli import main

    args = ["criteria", str(RUNS / "sweep.yaml"), "--runs-dir", str(RUNS)]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "every criterion holds on 4 of 6 warm starts (SFT seeds [0, 1, 3, 4])"
    assert main([*args, "--step", "40"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "every criterion holds on 4 of 6 warm starts (SFT seeds [0, 1, 2, 4])"
    assert main([*args, "--step", "0"]) == 2 and "argument --step: '0' is out of range; allowed: an integer >= 1" in capsys.readouterr().err
