"""The committed learning-rate probes (data/runs/lab_lr_probe): what data/runs/lab_lr_probe/README.md and
chapter 4 say of the two learning rates the main setting did not take."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phantom.dynamics import run_dynamics
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs

ROOT = Path(__file__).resolve().parents[1] / "data" / "runs" / "lab_lr_probe"


def _ends(folder: str) -> dict[tuple[str, int], list[tuple[float, float]]]:
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for run in iter_runs(ROOT / folder):
        spec = run.manifest()["spec"]
        d = run_dynamics(run.path)
        out.setdefault((spec["arm"], spec.get("sft_seed") or 0), []).append((d["acc0"], d["acc_end"]))
    return out


@pytest.mark.parametrize("folder, lr", [("lr_3.5e-3", 3.5e-3), ("lr_2e-3", 2e-3)])
def test_each_probe_is_its_sweep_file_run_to_the_end(folder, lr):
    want = sorted(c.name for c in expand(load_sweep(ROOT / folder / "sweep.yaml"), "full"))
    runs = list(iter_runs(ROOT / folder))
    assert sorted(r.name for r in runs) == want and len(runs) == 18
    for r in runs:
        spec = r.manifest()["spec"]
        assert spec["lr"] == lr and spec["mini_batches"] == 2 and spec["steps"] == 40


def test_at_35e3_the_outcome_arm_loses_accuracy():
    ends = _ends("lr_3.5e-3")
    assert all(e <= 0.10 for sft in (0, 1, 2) for _, e in ends["none", sft])
    worst = min(e - s for sft in (0, 1, 2) for s, e in ends["outcome", sft])
    assert worst < -0.05, worst
    assert np.mean([e - s for s, e in ends["outcome", 2]]) < 0


def test_at_2e3_three_unsafe_runs_of_nine_have_not_collapsed():
    ends = _ends("lr_2e-3")
    unsafe = [e for sft in (0, 1, 2) for _, e in ends["none", sft]]
    assert sum(e > 0.10 for e in unsafe) == 3, unsafe
    assert all(np.mean([e - s for s, e in ends["outcome", sft]]) >= 0.03 for sft in (0, 1, 2))
