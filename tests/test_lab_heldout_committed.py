"""The committed held-out warm start (data/runs/lab_warmstart_heldout): a checkpoint the main setting's
learning rate was not chosen on, and what chapter 4 and its README say it shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phantom.dynamics import run_dynamics
from phantom.lab.spec import ArmSpec
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs

ROOT = Path(__file__).resolve().parents[1] / "data" / "runs" / "lab_warmstart_heldout"


def _runs() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for run in iter_runs(ROOT):
        spec = run.manifest()["spec"]
        key = "drgrpo" if spec["estimator"] == "drgrpo" else spec["arm"]
        out.setdefault(key, []).append({"spec": spec, **run_dynamics(run.path)})
    return out


def test_the_runs_are_the_sweep_file_in_the_main_setting_on_sft_seed_3():
    want = sorted(c.name for c in expand(load_sweep(ROOT / "sweep.yaml"), "full"))
    assert sorted(r.name for r in iter_runs(ROOT)) == want and len(want) == 9
    main = ArmSpec()
    for runs in _runs().values():
        for r in runs:
            assert r["spec"]["sft_seed"] == 3 and r["spec"]["lr"] == main.lr
            assert r["spec"]["mini_batches"] == main.mini_batches and r["spec"]["steps"] == 40


def test_it_meets_fewer_criteria_than_the_warm_starts_the_rate_was_chosen_on():
    runs = _runs()
    none, out, dr = runs["none"], runs["outcome"], runs["drgrpo"]
    assert sum(r["acc_end"] <= 0.10 for r in none) == 2
    assert [r["order"] for r in none].count("length first") == 1
    assert np.mean([r["acc_end"] - r["acc0"] for r in out]) < 0.03
    assert all(r["acc_end"] >= r["acc0"] - 0.05 for r in out)
    assert sum(r["acc_end"] < r["acc0"] - 0.05 for r in dr) == 1 and all(r["acc_end"] > 0.10 for r in dr)
