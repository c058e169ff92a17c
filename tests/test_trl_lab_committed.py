"""The committed TRL runs (data/runs/trl_lab, chapter 5's three-trainer table): TRL 1.16's GRPOTrainer on the lab's
setting from the shipped warm start, the three arms of `phantom trl sweep` x RL seeds 0-2, each run complete, in the
sweep's full profile, and its summary what its own log says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phantom.lab.rl import VAL_ACC, VAL_LEN
from phantom.runs import read_metrics
from phantom.trl.lab import ARMS
from phantom.trl.sweep import expand

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "runs" / "trl_lab"
NAMES = sorted(p.name for p in RUNS.iterdir() if (p / "manifest.json").is_file())
SHIPPED = json.loads((ROOT / "data" / "warmstart" / "manifest.json").read_text())


def manifest(name: str) -> dict:
    return json.loads((RUNS / name / "manifest.json").read_text())


def test_the_folder_is_the_full_sweep():
    """Every cell of `phantom trl sweep --profile full` (3 arms x seeds 0-2) has its folder here, and nothing else."""
    want = {spec.run_name() for spec in expand("full")}
    assert set(NAMES) == want and len(want) == len(ARMS) * 3


@pytest.mark.parametrize("name", NAMES)
def test_a_run_is_done_small_and_from_the_shipped_warm_start(name):
    m = manifest(name)
    assert m["kind"] == "trl" and m["status"] == "done" and m["trl_versions"]["trl"] == "1.16.0"
    assert {p.name for p in (RUNS / name).iterdir()} == {"manifest.json", "metrics.jsonl"}
    ckpt = Path(m["checkpoint"]).name
    assert ckpt in SHIPPED and SHIPPED[ckpt]["profile"] == m["spec"]["model"] == "lab_graded"
    assert m["trl_config"]["scale_rewards"] == ARMS[m["spec"]["arm"]][1]
    assert m["gate"] == ARMS[m["spec"]["arm"]][0]


@pytest.mark.parametrize("name", NAMES)
def test_forty_steps_validated_every_five_and_the_summary_is_the_log(name):
    m = manifest(name)
    df = read_metrics(RUNS / name)
    acc, length = df[VAL_ACC].dropna(), df[VAL_LEN].dropna()
    assert m["spec"]["steps"] == 40 and m["summary"]["steps"] == 40 and int(df.index.max()) == 40
    assert acc.index.tolist() == list(range(0, 41, 5))
    # the run starts where the warm start's own greedy evaluation put it (the same 256 held-out problems)
    ws = SHIPPED[Path(m["checkpoint"]).name]
    assert acc.iloc[0] == pytest.approx(ws["val_greedy_acc"]) and length.iloc[0] == pytest.approx(ws["val_greedy_len_chars"])
    s = m["summary"]
    assert s["start_acc"] == pytest.approx(acc.iloc[0]) and s["final_acc"] == pytest.approx(acc.iloc[-1])
    assert s["final_len"] == pytest.approx(length.iloc[-1]) and s["min_acc"] == pytest.approx(acc.min())
    assert np.isfinite(df.loc[1:, "phantom/groups/total"]).all()


def test_the_readme_table_is_what_the_logs_say():
    from phantom.trl.sweep import endpoints

    def row(r: dict) -> str:
        first = r["first_step_acc_below_0.1"]
        return (f"| {r['arm']} | {r['seed']} | {r['start_acc']:.3f} -> {r['final_acc']:.3f} | {r['min_acc']:.3f} | "
                f"{r['start_len']:.0f} -> {r['final_len']:.0f} | {'never' if first is None else f'step {first}'} | "
                f"{r['phantom_groups_total']:.0f} | {r['wall_seconds'] / 60:.1f} |")

    lines = [x for x in (RUNS / "README.md").read_text().splitlines() if x.startswith(tuple(f"| {a} |" for a in ARMS))]
    assert lines == [row(r) for r in endpoints(RUNS)]
