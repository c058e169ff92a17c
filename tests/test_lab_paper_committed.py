"""The committed `paper` sweep (data/runs/lab_paper): what chapters 4 and 6-8 read.

It must be the packaged sweep, complete (every cell, three RL seeds), every run started from the shipped
warm start, and its README's table must be what the run logs say. The chapters' claims on it are checked
by the book build itself (they read this folder in every profile).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from phantom.lab.sweep import expand, load_sweep, sweep_file
from phantom.runs import iter_runs, read_metrics

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "runs" / "lab_paper"
VAL_ACC = "val-core/phantom_lab/acc/mean@1"


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict]:
    return {r.name: r.manifest() for r in iter_runs(RUNS, status=None)}


def test_the_folder_is_the_packaged_sweep_complete(manifests):
    assert yaml.safe_load((RUNS / "sweep.yaml").read_text()) == yaml.safe_load(sweep_file("paper").read_text())
    cells = expand(load_sweep(RUNS / "sweep.yaml"), "full")
    assert sorted(manifests) == sorted(c.name for c in cells) and len(cells) == 90
    assert all(m["status"] == "done" for m in manifests.values())
    seeds: dict[str, set] = {}
    for c in cells:
        seeds.setdefault(json.dumps({**c.spec.to_dict(), "seed": None}, sort_keys=True), set()).add(c.spec.seed)
    assert set(map(frozenset, seeds.values())) == {frozenset({0, 1, 2})}  # three RL seeds in every cell


def test_every_run_starts_from_the_shipped_warm_start(manifests):
    shipped = json.loads((ROOT / "data" / "warmstart" / "manifest.json").read_text())
    (name,) = [n for n, e in shipped.items() if e["profile"] == load_sweep("paper")["base"]["model"]]
    task = shipped[name]["config"]["task"]
    for run, m in manifests.items():
        assert m["sft"]["key"] == shipped[name]["key"], run
        assert m["sft"]["val_greedy_acc"] == shipped[name]["val_greedy_acc"], run
        if m["spec"]["task"]["terms"] != task["terms"] or m["spec"]["noise_p"] > 0:
            continue  # another held-out task, or a noisy verifier: another step-0 accuracy
        df = read_metrics(RUNS / run / "metrics.jsonl")
        assert df[VAL_ACC].dropna().iloc[0] == pytest.approx(shipped[name]["val_greedy_acc"]), run


SKIP = {"seed", "arm", "profile", "dapo_metric"}


def cell_label(spec: dict, ref: dict) -> str:
    """A cell's name in the README: its arm, then every spec field that differs from the core cells'."""
    diff = []
    for k in sorted(spec):
        if k in SKIP or spec[k] == ref.get(k):
            continue
        if isinstance(spec[k], dict):  # the task: only the fields that differ
            diff += [f"{k}.{f}={v}" for f, v in sorted(spec[k].items()) if v != (ref.get(k) or {}).get(f)]
        else:
            diff.append(f"{k}={spec[k]}")
    return ", ".join([spec["arm"], *diff])


def readme_table(manifests: dict[str, dict]) -> list[list[str]]:
    """The README's table computed from the logs: group, cell, final held-out accuracy of seeds 0-2, mean."""
    ref = next(m["spec"] for m in manifests.values() if "core" in m["sweep"]["groups"])
    cells: dict[tuple[str, str], dict[int, float]] = {}
    for run, m in manifests.items():
        df = read_metrics(RUNS / run / "metrics.jsonl")
        key = (",".join(m["sweep"]["groups"]), cell_label(m["spec"], ref))
        cells.setdefault(key, {})[m["spec"]["seed"]] = float(df[VAL_ACC].dropna().iloc[-1])
    order = list(load_sweep("paper")["groups"])
    rows = []
    for (group, label), ends in sorted(cells.items(), key=lambda kv: (order.index(kv[0][0].split(",")[0]), kv[0][1])):
        vals = [ends[s] for s in (0, 1, 2)]
        rows.append([group, label, *(f"{v:.3f}" for v in vals), f"{sum(vals) / 3:.3f}"])
    return rows


def test_readme_table_is_what_the_logs_say(manifests):
    text = (RUNS / "README.md").read_text()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| group ", "|---"))]
    want = readme_table(manifests)
    assert len(want) == 30 and rows == want
