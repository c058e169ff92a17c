"""phantom.book.results: sweep cells with missing runs, curves, endpoints and the paper's numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from phantom.book import results as lb
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import RunDir

SWEEP = """
name: tiny_book
base: {model: tiny, steps: 6, prompts: 4, rollouts: 3, eval_n: 8, eval_every: 2, max_new: 24}
profiles:
  full: {}
  quick: {seeds: [0], base: {steps: 2}}
groups:
  core:
    grid: {arm: [none, outcome], seed: [0, 1]}
  hard:
    grid: {arm: [none], lam: [0.1], task: [{terms: [4, 5]}]}
"""
ACC = [0.6, 0.5, 0.05, 0.0]  # validation accuracy at steps 0, 2, 4, 6


def write_run(root, cell, acc=ACC, status="done", sample="1+1=2\n#### 2"):
    """A finished (or not) lab run folder with validation every 2 steps and gate telemetry every step."""
    run = RunDir.start(cell.name, cell.spec.to_dict(), kind="lab", root=root)
    for step in range(0, 2 * (len(acc) - 1) + 1):
        data = {}
        if step % 2 == 0:
            a = acc[step // 2]
            data.update({lb.VAL_ACC: a, lb.VAL_LEN: 40.0 * (1 + a), "phantom/sample": sample[: 1 + step],
                         "phantom/val/marker_frac": 1.0, "phantom/val/eos_frac": 1.0})
        if step:
            data.update({lb.TRAIN_LEN: 30.0 - step, "phantom/gen_batches": 1.0, "phantom/frac/all_fail": step / 10,
                         "phantom/frac/phantom": step / 20, "phantom/frac/zeroed": 0.0})
        run.log(step, data)
    if status == "done":
        run.finish("done", summary={"start_acc": acc[0], "final_acc": acc[-1]})
    return run


@pytest.fixture()
def book_runs(tmp_path):
    path = tmp_path / "tiny_book.yaml"
    path.write_text(SWEEP)
    root = tmp_path / "runs"
    cells = expand(load_sweep(path), "full")
    by = {(c.groups[0], c.spec.arm, c.spec.seed): c for c in cells}
    write_run(root, by[("core", "none", 0)])
    write_run(root, by[("core", "outcome", 0)], acc=[0.6, 0.65, 0.7, 0.7])
    write_run(root, by[("core", "none", 1)], status="running")  # a run still going: not a result
    write_run(root, by[("hard", "none", 0)], acc=[0.05, 0.0, 0.0, 0.0])
    # ("core", "outcome", 1) has no folder at all
    return path, root, by


def test_metric_keys_are_the_labs():
    from phantom.lab import rl

    assert (lb.VAL_ACC, lb.VAL_LEN) == (rl.VAL_ACC, rl.VAL_LEN)


def test_load_cells_marks_done_and_missing_cells(book_runs):
    path, root, by = book_runs
    t = lb.load_cells("full", root, sweep=path)
    assert len(t) == len(by) and t.attrs["profile"] == "full" and t.attrs["runs_root"] == str(root.resolve())
    done = dict(zip(t["name"], t["done"]))
    assert done[by[("core", "none", 0)].name] and done[by[("hard", "none", 0)].name]
    assert not done[by[("core", "none", 1)].name] and not done[by[("core", "outcome", 1)].name]
    core = lb.select(t, "core")
    assert len(core) == 4 and core.attrs["runs_root"] == t.attrs["runs_root"]
    note = lb.missing_note(core, "core cells")
    assert "2 of 4 core cells" in note and by[("core", "outcome", 1)].name in note and "(running)" in note
    assert by[("core", "none", 0)].name not in note
    assert lb.missing_note(lb.select(t, "core", seed=0)) == ""
    assert list(lb.select(t, "hard", lam=0.1, task={"terms": [4, 5]})["name"]) == [by[("hard", "none", 0)].name]
    assert lb.select(t, "hard", task={"terms": [2, 3]}).empty
    with pytest.raises(ValueError, match="field 'colour' is unknown"):
        lb.select(t, "core", colour="red")
    quick = lb.load_cells("quick", root, sweep=path)
    assert set(quick["seed"]) == {0} and not quick["done"].any()  # the quick profile's cells have other specs


def test_curves_endpoints_and_collapse(book_runs):
    path, root, by = book_runs
    t = lb.load_cells("full", root, sweep=path)
    core = lb.select(t, "core")
    acc = lb.curves(core, lb.VAL_ACC)
    assert set(acc) == {by[("core", "none", 0)].name, by[("core", "outcome", 0)].name}  # unfinished cells skipped
    a = acc[by[("core", "none", 0)].name]
    assert list(a.index) == [0, 2, 4, 6] and a.tolist() == ACC
    assert lb.collapse_step(a, 0.1) == 4 and lb.collapse_step(a, 0.01) == 6
    assert lb.collapse_step(a.loc[:2], 0.1) is None and lb.first_below(a, 0.55) == 2
    assert lb.collapse_step(a, 0.9) == "start" and lb.collapse_step(pd.Series(dtype=float), 0.1) is None
    e = lb.endpoints(t, collapse_acc=0.1, early_steps=2)
    row = e.loc[t.index[t["name"] == by[("core", "none", 0)].name][0]]
    assert row["acc0"] == ACC[0] and row["acc_end"] == ACC[-1] and row["collapse"] == 4
    assert isinstance(row["collapse"], int)
    assert math.isclose(row["all_fail_early"], np.mean([0.1, 0.2]))  # steps 1..2 only
    assert math.isclose(row["all_fail_first"], 0.1)
    hard = e.loc[t.index[t["name"] == by[("hard", "none", 0)].name][0]]
    assert hard["collapse"] == "start"
    missing = e.loc[t.index[t["name"] == by[("core", "outcome", 1)].name][0]]
    assert np.isnan(missing["acc_end"]) and missing["collapse"] is None


def test_same_curves_samples_and_vanished_runs(book_runs):
    path, root, by = book_runs
    a, b = by[("core", "none", 0)].name, by[("core", "outcome", 0)].name
    ma = lb.metrics(a, root)
    assert lb.same_curves(ma, ma.copy()) and not lb.same_curves(ma, lb.metrics(b, root))
    s = lb.samples(ma)
    assert list(s.index) == [0, 2, 4, 6] and all(isinstance(v, str) for v in s)
    assert lb.metrics("no-such-run", root).empty and lb.curve(pd.DataFrame(), lb.VAL_ACC).empty


def test_reported_picks_the_pooled_row_and_formats():
    from phantom.book import paper_reported, repo_root

    csv = pd.read_csv(repo_root() / "data" / "paper_reported.csv")
    pooled = csv[(csv.experiment == "core") & (csv.arm == "none") & (csv.metric == "val_em_step40") & csv.sd.notna()]
    rep = lb.reported("core", "val_em_step40", arm="none")
    assert rep["value"] == pooled["value"].iloc[0] and rep["sd"] == pooled["sd"].iloc[0] and rep["n"] == pooled["n"].iloc[0]
    assert rep["label"] == f"reported by the paper (§{pooled['section'].iloc[0]})"
    dose = lb.reported("dose", "val_em_step40", arm="outcome", lam=0.5)
    want = paper_reported(experiment="dose", arm="outcome", metric="val_em_step40")
    assert dose["value"] == want[np.isclose(want["lam"], 0.5)]["value"].iloc[0]
    assert lb.reported("core", "no_such_metric") is None and lb.reported_text(None) == "–"
    assert lb.fmt_pm(float("nan")) == "–" and lb.fmt_pm(0.5) == "0.500"
    assert lb.fmt_pm(0.5, 0.1, 3) == "0.500 ± 0.100 (n = 3)" and lb.fmt_pm(0.25, digits=1) == "0.2"
    m, s, n = lb.mean_sd([0.2, 0.4, float("nan"), None])
    assert n == 2 and math.isclose(m, 0.3) and math.isclose(s, np.std([0.2, 0.4], ddof=1))


def test_profile_and_runs_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("PHANTOM_PROFILE", raising=False)
    assert lb.resolve_profile("") == "full" and lb.resolve_profile("quick") == "quick"
    monkeypatch.setenv("PHANTOM_PROFILE", "quick")
    assert lb.resolve_profile("") == "quick"
    with pytest.raises(ValueError, match="profile='huge' is unknown; allowed: quick, full"):
        lb.resolve_profile("huge")
    monkeypatch.setenv("PHANTOM_RUNS", str(tmp_path))
    assert lb.resolve_runs("") == tmp_path.resolve()
    assert lb.resolve_runs(tmp_path / "x") == (tmp_path / "x").resolve()
    from phantom.book import repo_root

    assert lb.resolve_runs("runs") == (repo_root() / "runs").resolve()


def test_same_prefix_compares_what_the_shorter_run_logged():
    """A continued run repeats its cell: same values where the cell logged one; more steps, finer
    validation and other timings allowed; one changed value, a missing step or column is not."""
    short = pd.DataFrame({"loss": [1.0, 0.9, 0.8], lb.VAL_ACC: [0.5, np.nan, 0.4], "timing_s/step": [1.0, 2.0, 3.0]},
                         index=[0, 1, 2])
    longer = pd.DataFrame({"loss": [1.0, 0.9, 0.8, 0.7], lb.VAL_ACC: [0.5, 0.45, 0.4, 0.3],
                           "timing_s/step": [9.0, 9.0, 9.0, 9.0], "extra": [0, 0, 0, 0]}, index=[0, 1, 2, 3])
    assert lb.same_prefix(longer, short)
    changed = longer.copy()
    changed.loc[2, "loss"] = 0.81
    assert not lb.same_prefix(changed, short)
    assert not lb.same_prefix(longer.drop(index=2), short)
    assert not lb.same_prefix(longer.drop(columns="loss"), short)
    assert not lb.same_prefix(longer, short.iloc[:0])
