"""Sweeps execute notebooks/lab_arm.py with papermill, skip finished cells, and report failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phantom.lab import sweep as sweep_mod
from phantom.lab.sweep import SweepFailed, expand, load_sweep, run_sweep, sweep_table
from phantom.runs import RunDir, iter_runs, read_metrics

pytestmark = pytest.mark.slow

TINY_SWEEP = """
name: tiny
base: {model: tiny, steps: 2, prompts: 4, rollouts: 3, eval_n: 8, eval_every: 1, max_new: 24}
profiles:
  full: {}
  quick: {seeds: [0], base: {steps: 1}}
groups:
  core:
    grid: {arm: [none, outcome], seed: [0, 1]}
  again:
    set: {arm: none}
    grid: {seed: [0]}
  variants:
    grid: {variant: [{arm: none, lam: 0.0}, {arm: outcome, lam: 0.0, drop: mask}]}
"""


@pytest.fixture()
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("PHANTOM_ARTIFACTS", str(tmp_path / "artifacts"))
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SWEEP)
    return path, tmp_path / "runs"


def test_expand_dedupes_and_applies_profiles(env):
    path, _ = env
    full = expand(load_sweep(path), "full")
    assert len(full) == 6  # 4 core + 2 variants; "again" duplicates a core cell
    dup = [c for c in full if c.groups == ["core", "again"]]
    assert len(dup) == 1 and dup[0].spec.arm == "none" and dup[0].spec.seed == 0
    quick = expand(load_sweep(path), "quick")
    assert {c.spec.seed for c in quick} == {0} and all(c.spec.steps == 1 for c in quick)
    assert {(c.spec.arm, c.spec.drop) for c in quick if "variants" in c.groups} == {("none", "zero"), ("outcome", "mask")}


def test_sweep_runs_papermill_then_skips(env, monkeypatch):
    path, runs = env
    out = run_sweep(path, profile="quick", runs_root=runs, jobs=2, progress=False)
    assert len(out) == 4 and all(r.done for r in out)
    for r in out:
        assert (r.path / "lab_arm.ipynb").is_file() and r.stdout_path.is_file()
        nb = json.loads((r.path / "lab_arm.ipynb").read_text())
        assert any("injected-parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"])
        assert any(o.get("output_type") == "display_data" for c in nb["cells"] for o in c.get("outputs", []))
        m = r.manifest()
        assert m["sweep"]["name"] == "tiny" and m["sweep"]["profile"] == "quick"
        assert read_metrics(r.path).index.max() == 1
    assert len(list(iter_runs(runs, arm="outcome", drop="mask", profile="quick"))) == 1

    def no_launch(*a, **k):
        raise AssertionError("a finished cell was launched again")

    monkeypatch.setattr(sweep_mod.subprocess, "Popen", no_launch)
    again = run_sweep(path, profile="quick", runs_root=runs, jobs=2, progress=False)
    assert [r.path for r in again] == [r.path for r in out]
    table = sweep_table(path, profile="quick", runs_root=runs)
    assert (table["status"] == "done").all() and "final_acc" in table


def test_failed_cell_is_reported_and_rerun(env, monkeypatch, tmp_path):
    path, runs = env
    bad = tmp_path / "bad_nb.py"
    bad.write_text('# %% tags=["parameters"]\nspec = {}\nrun_name = None\nruns_root = None\nextra = {}\n'
                   "progress = False\n\n# %%\nraise RuntimeError('notebook failure')\n")
    monkeypatch.setenv("PHANTOM_LAB_NOTEBOOK", str(bad))
    with pytest.raises(SweepFailed, match=r"4 of 4 cells failed"):
        run_sweep(path, profile="quick", runs_root=runs, jobs=2, progress=False)
    monkeypatch.delenv("PHANTOM_LAB_NOTEBOOK")
    out = run_sweep(path, profile="quick", runs_root=runs, jobs=2, progress=False)
    assert all(r.done for r in out)


def test_stale_running_cell_is_rerun(env):
    path, runs = env
    cell = expand(load_sweep(path), "quick")[0]
    dead = subprocess.Popen(["true"])
    dead.wait()
    run = RunDir.start(cell.name, cell.spec.to_dict(), kind="lab", root=runs)
    run.update(pid=dead.pid)  # a run whose process is gone
    out = run_sweep(path, profile="quick", runs_root=runs, jobs=2, progress=False)
    assert all(r.done for r in out)


def test_cell_whose_kernel_never_started_is_relaunched(env, monkeypatch):
    """Two kernels started at once can draw the same TCP port; the cell is started again, not failed.

    The first launch of every cell is replaced by a process that exits 1 after papermill's real log
    of such a clash (tests/fixtures/lab/kernel_port_clash.log, recorded in a `make test` run)."""
    path, runs = env
    clash = (Path(__file__).parent / "fixtures" / "lab" / "kernel_port_clash.log").read_text()
    real, first = sweep_mod._launch, []

    def launch(cell, sweep_name, nb_in, root, env):
        if cell.name in first:
            return real(cell, sweep_name, nb_in, root, env)
        first.append(cell.name)
        log = root / sweep_mod._NB_DIR / f"{cell.name}.log"
        log.write_text(clash)
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"]), log, log.open("a")

    monkeypatch.setattr(sweep_mod, "_launch", launch)
    out = run_sweep(path, profile="quick", runs_root=runs, jobs=2, progress=False)
    assert len(first) == len(out) and all(r.done for r in out)


def test_launch_order_starts_the_expensive_cells_first():
    """The paper sweep's longest cells (DAPO's acc arm, the reversed phantom without a filter, whose
    answers grow to the budget) start first and a cheap collapsing cell last; every cell is launched
    exactly once."""
    cells = sweep_mod.expand(sweep_mod.load_sweep("paper"), "full")
    order = sweep_mod.launch_order(cells)
    assert sorted(c.name for c in order) == sorted(c.name for c in cells)
    # each cell runs under several RL seeds: compare the first two distinct settings
    firsts = []
    for c in order:
        key = (c.spec.sampling, c.spec.kind, c.spec.arm, c.spec.cap, c.spec.estimator)
        if key not in firsts:
            firsts.append(key)
    n_dapo = sum(1 for c in cells if (c.spec.sampling, c.spec.arm) == ("dapo", "outcome"))
    assert n_dapo >= 1 and all((c.spec.sampling, c.spec.arm) == ("dapo", "outcome") for c in order[:n_dapo])
    assert firsts[0][0] == "dapo" and firsts[0][2] == "outcome"
    assert firsts[1][1:4] == ("length_long", "none", 512)
    last = order[-1].spec
    assert last.arm != "outcome" and last.sampling == "gate" and last.kind != "length_long"


def test_cells_forked_from_the_zygote_log_exactly_what_plain_kernels_log(env, monkeypatch):
    """The sweep's kernels are forked from a zygote with torch and the lab imported (phantom.proc.zygote);
    the run folders hold the same metrics, step for step, as with ordinary kernels."""
    import contextlib

    path, runs = env
    real = sweep_mod.kernel_zygote

    @contextlib.contextmanager
    def ready_zygote(*a, **k):  # wait until it serves, so that every cell goes through it
        with real(*a, **k) as z:
            assert z.env(wait=180)
            yield z

    monkeypatch.setattr(sweep_mod, "kernel_zygote", ready_zygote)
    forked = run_sweep(path, profile="quick", runs_root=runs / "forked", jobs=2, progress=False)
    log = (runs / "forked" / sweep_mod._NB_DIR / "zygote.log").read_text()
    # each cell's papermill process and its kernel (a kernel that clashed on a port is started again)
    assert len(forked) == 4 and log.count("[phantom.zygote] process ") >= 4 and log.count("[phantom.zygote] kernel ") >= 4
    monkeypatch.setattr(sweep_mod, "kernel_zygote", real)
    monkeypatch.setenv("PHANTOM_ZYGOTE", "0")
    plain = run_sweep(path, profile="quick", runs_root=runs / "plain", jobs=2, progress=False)

    def logged(run: RunDir) -> list[dict]:
        rows = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
        return [{k: v for k, v in r["data"].items() if not k.startswith("timing_s/")} for r in rows]

    assert [r.path.name for r in forked] == [r.path.name for r in plain]
    for a, b in zip(forked, plain):
        assert logged(a) == logged(b), a.path.name
