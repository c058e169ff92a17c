"""The committed `graded_2e-3` sweep (data/runs/lab_graded_2e-3): the `graded` sweep's design at lr 2e-3,
complete, in the setting it names, and what chapter 4 and the folder's README say it shows.

Eight SFT checkpoints (seeds 0-7) of `lab_graded` x three RL seeds x four arms (no filter, shaped-score
filter, outcome filter, Dr. GRPO without a filter), 40 steps at lr 2e-3. The criteria are computed here on
their own (not with phantom.lab.acceptance, which the chapter uses), so the two readings check each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _warmstart_runs import cell, meets, readme_table, runs_by_arm

from phantom.book.results import same_curves
from phantom.lab.rl import VAL_ACC
from phantom.lab.spec import ArmSpec
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs

DATA = Path(__file__).resolve().parents[1] / "data" / "runs"
RUNS = DATA / "lab_graded_2e-3"
SFT_SEEDS, RL_SEEDS, ARMS = tuple(range(8)), (0, 1, 2), ("drgrpo", "none", "outcome", "score")
PROBED = [("none", 3), ("none", 4), ("outcome", 3), ("outcome", 6)]  # the cells the rate was chosen on


@pytest.fixture(scope="module")
def cells() -> dict[tuple[str, int], list[dict]]:
    return runs_by_arm(RUNS)


def test_the_runs_are_the_sweep_file_at_2e3(cells):
    want = sorted(c.name for c in expand(load_sweep(RUNS / "sweep.yaml"), "full"))
    assert sorted(r.name for r in iter_runs(RUNS)) == want and len(want) == 96
    assert sorted(cells) == sorted((a, s) for a in ARMS for s in SFT_SEEDS)
    main = ArmSpec()
    for (arm, sft), runs in cells.items():
        assert [r["seed"] for r in runs] == list(RL_SEEDS), (arm, sft)
        for r in runs:
            spec = r["spec"]
            assert spec["model"] == "lab_graded" and spec["steps"] == main.steps == 40 and spec["lam"] == 0.3
            assert spec["lr"] == 2e-3 != main.lr and spec["mini_batches"] == main.mini_batches
            assert spec["warmup_steps"] == main.warmup_steps
            assert spec["eval_every"] == (1 if arm in ("none", "score") else 5), (arm, sft)
            assert list(r["df"][VAL_ACC].dropna().index)[-1] == 40


def test_it_is_the_graded_sweep_but_for_the_rate(cells):
    """Same warm starts (start accuracy and length) and the same spec in every field but lr."""
    graded = runs_by_arm(DATA / "lab_graded")
    assert sorted(graded) == sorted(cells)
    for key, runs in cells.items():
        for a, b in zip(runs, graded[key]):
            assert cell({**a["spec"], "lr": None}) == cell({**b["spec"], "lr": None}), key
            assert (a["acc0"], a["len0"]) == (b["acc0"], b["len0"]), key


def test_twelve_runs_are_the_probes_and_the_rest_ran_after(cells):
    """The twelve probe runs were launched under the probe's working name; every other run under this sweep's."""
    names = {}
    for run in iter_runs(RUNS):
        m = run.manifest()
        s = m["spec"]
        names[("drgrpo" if s["estimator"] == "drgrpo" else s["arm"], s.get("sft_seed") or 0, s["seed"])] = \
            m["sweep"]["name"]
    probed = {k for k, v in names.items() if v == "probe2e3"}
    assert probed == {(a, s, r) for a, s in PROBED for r in RL_SEEDS}
    assert set(names.values()) == {"probe2e3", "graded_2e-3"}


def test_the_shaped_score_arm_is_the_no_filter_arm_bit_for_bit(cells):
    for sft in SFT_SEEDS:
        for a, b in zip(cells["score", sft], cells["none", sft]):
            assert same_curves(a["df"], b["df"]), (sft, a["seed"])


def test_every_no_filter_run_collapses_and_23_of_24_lose_length_first(cells):
    runs = [(sft, r) for sft in SFT_SEEDS for r in cells["none", sft]]
    assert [r["acc_end"] for _, r in runs] == [0.0] * 24
    orders = {sft: [r["order"] for r in cells["none", sft]] for sft in SFT_SEEDS}
    assert [(s, i, x) for s, o in orders.items() for i, x in enumerate(o) if x != "length first"] == \
        [(7, 2, "same step")]
    lf = [r for _, r in runs if r["order"] == "length first"]
    assert (min(r["len_step"] for r in lf), max(r["len_step"] for r in lf)) == (8, 11)
    assert (min(r["acc_step"] for r in lf), max(r["acc_step"] for r in lf)) == (11, 31)


def test_the_probed_cells_mend_at_2e3(cells):
    """The four cells the rate was chosen on: every no-filter run down and length first, the outcome arm over +0.03."""
    for sft in (3, 4):
        assert [(r["acc_end"], r["order"]) for r in cells["none", sft]] == [(0.0, "length first")] * 3, sft
    gains = {sft: [r["acc_end"] - r["acc0"] for r in cells["outcome", sft]] for sft in (3, 6)}
    assert {s: (round(float(np.mean(g)), 3), round(min(g), 3)) for s, g in gains.items()} == \
        {3: (0.066, 0.055), 6: (0.044, 0.027)}


def test_the_outcome_arm_gains_on_every_warm_start_and_dr_grpo_holds(cells):
    gains = {sft: [r["acc_end"] - r["acc0"] for r in cells["outcome", sft]] for sft in SFT_SEEDS}
    means = [round(float(np.mean(g)), 3) for g in gains.values()]
    assert min(means) == 0.044 and max(means) == 0.286, means
    assert round(min(min(g) for g in gains.values()), 3) == 0.027
    dr = [r["acc_end"] for sft in SFT_SEEDS for r in cells["drgrpo", sft]]
    assert len(dr) == 24 and round(min(dr), 3) == 0.609


def test_every_criterion_holds_on_all_eight_warm_starts(cells):
    assert [s for s in SFT_SEEDS if meets(cells, s)] == list(SFT_SEEDS)
    graded = runs_by_arm(DATA / "lab_graded")  # the same reading of the 2.5e-3 sweep: six of eight
    assert [s for s in SFT_SEEDS if meets(graded, s)] == [0, 1, 2, 3, 5, 7]


def test_phantom_lab_criteria_agrees(capsys):
    from phantom.lab.cli import main

    assert main(["criteria", str(RUNS / "sweep.yaml"), "--runs-dir", str(RUNS)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "unsafe arms read: none, score" and "score_length_first" in out[1]
    assert out[-1] == "every criterion holds on 8 of 8 warm starts (SFT seeds [0, 1, 2, 3, 4, 5, 6, 7])"


def test_the_readme_table_is_the_runs(cells):
    """Every row of the folder README's table, recomputed from the run logs."""
    rows = readme_table(cells, RUNS / "README.md")
    assert [int(got[0]) for got, _ in rows] == list(SFT_SEEDS)
    for got, want in rows:
        assert got == want
