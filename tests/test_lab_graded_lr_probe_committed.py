"""The committed 3e-3 probe in the graded style (data/runs/lab_graded_lr_probe): the twelve runs of the
`graded` sweep's four weakest cells re-run at a higher rate, and what its README and chapter 4 say of them:
every no-filter run collapses, length first, while the outcome arm of SFT seed 6 loses on average."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _warmstart_runs import cell, runs_by_arm

from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs

DATA = Path(__file__).resolve().parents[1] / "data" / "runs"
RUNS = DATA / "lab_graded_lr_probe"
CELLS = [("none", 3), ("none", 4), ("outcome", 3), ("outcome", 6)]


@pytest.fixture(scope="module")
def probe() -> dict[tuple[str, int], list[dict]]:
    return runs_by_arm(RUNS)


@pytest.fixture(scope="module")
def main_rate() -> dict[tuple[str, int], list[dict]]:
    return runs_by_arm(DATA / "lab_graded")


def test_the_runs_are_the_sweep_file_at_3e3(probe):
    want = sorted(c.name for c in expand(load_sweep(RUNS / "sweep.yaml"), "full"))
    runs = list(iter_runs(RUNS))
    assert sorted(r.name for r in runs) == want and len(want) == 12
    assert sorted(probe) == sorted(CELLS)
    for r in runs:
        m = r.manifest()
        assert m["status"] == "done" and m["sweep"]["name"] == load_sweep(RUNS / "sweep.yaml")["name"] == "probe3e3"
        assert m["spec"]["lr"] == 3e-3 and m["spec"]["steps"] == 40 and m["spec"]["model"] == "lab_graded"


def test_each_cell_is_the_graded_sweeps_cell_but_for_the_rate(probe, main_rate):
    for key in CELLS:
        assert [r["seed"] for r in probe[key]] == [0, 1, 2]
        for a, b in zip(probe[key], main_rate[key]):
            assert cell({**a["spec"], "lr": None}) == cell({**b["spec"], "lr": None}), key
            assert a["acc0"] == b["acc0"] and a["len0"] == b["len0"], key  # the same warm start


def test_every_no_filter_run_collapses_length_first(probe, main_rate):
    runs = probe["none", 3] + probe["none", 4]
    assert all(r["acc_end"] == 0.0 and r["order"] == "length first" for r in runs)
    assert max(r["acc_end"] for r in main_rate["none", 4]) > 0.5  # the escape at 2.5e-3 that this mends


def test_the_outcome_arm_of_sft_seed_6_loses_on_average(probe):
    gains = {s: [r["acc_end"] - r["acc0"] for r in probe["outcome", s]] for s in (3, 6)}
    assert round(float(np.mean(gains[6])), 3) == -0.009 and round(min(gains[6]), 3) == -0.039
    assert round(float(np.mean(gains[3])), 3) == 0.030 and float(np.mean(gains[3])) < 0.03  # just under the bar
