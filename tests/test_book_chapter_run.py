"""`phantom chapter run NAME -p key value`: a real papermill run with non-default parameters; the result
chapters' checked claims fail when the run data they read stop supporting their prose."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from phantom.book.chapters import resolve_chapter
from phantom.book.execute import execute_chapter
from phantom.book.results import load_cells, select

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_chapter_run_with_other_parameters(tmp_path):
    out = tmp_path / "ch2.ipynb"
    proc = subprocess.run([sys.executable, "-m", "phantom.cli", "chapter", "run", "phantom_advantage",
                           "-p", "lam", "0.5", "-p", "group_size", "6", "-o", str(out), "--force"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert str(out) in proc.stdout
    nb = nbformat.read(out, as_version=4)
    assert nb.metadata["papermill"]["parameters"] == {"lam": 0.5, "group_size": 6}
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "hide-input" in injected[0].metadata["tags"]
    html = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "λ = 0.5: all-fail group max |A| = 1.42 under GRPO" in html   # Figure 2.1 opens at the new λ
    assert "One group of 6 responses" in html                           # Figure 2.2 uses the new G
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


def _edit_metrics(run: Path, step: int, key: str, value: float) -> None:
    """Set ``key`` at ``step`` in a run folder's metrics.jsonl (verl's file-logger lines)."""
    path = run / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    hit = [rec for rec in lines if rec["step"] == step and key in rec["data"]]
    assert hit, (run.name, step, key)
    for rec in hit:
        rec["data"][key] = value
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))


def _statuses(res) -> dict[str, str]:
    return {r["key"]: r["status"] for r in res.claims}


@pytest.mark.slow
def test_verl_chapter_claims_follow_the_committed_runs(tmp_path):
    """Chapter 5 says every acc-filter run holds, and that the outcome gate holds on all three trainers: on copies
    of the runs whose acc-filter seed 0 and TRL outcome-gate seed 0 end at 0.3, those claims fail while the claims
    that do not read those endpoints still hold."""
    runs, trl = tmp_path / "verl_filter", tmp_path / "trl_lab"
    shutil.copytree(ROOT / "data" / "runs" / "verl_filter", runs)
    shutil.copytree(ROOT / "data" / "runs" / "trl_lab", trl)
    _edit_metrics(runs / "verl-c-s0", 40, "val-core/phantom_lab/acc/mean@1", 0.3)
    gated = next(trl.glob("trl-outcome-lam0.3-s0-*"))
    _edit_metrics(gated, 40, "val-core/phantom_lab/acc/mean@1", 0.3)
    m = json.loads((gated / "manifest.json").read_text())
    m["summary"]["final_acc"] = 0.3  # the summary the sweep's endpoints read, as the callback would have written it
    (gated / "manifest.json").write_text(json.dumps(m))
    res = execute_chapter(resolve_chapter("verl_runs", ROOT), tmp_path / "ch5.ipynb",
                          {"run_root": str(runs), "trl_root": str(trl), "min_seeds": 1}, root=ROOT,
                          runs=tmp_path / "runs", force=True)
    status = _statuses(res)
    assert status["acc-filter-holds"] == status["gate-and-drgrpo-hold-on-three-trainers"] == "fails", status
    assert status["no-filter-collapses-but-one"] == "holds", status
    assert status["verl-default-metric-is-reward"] == status["default-filter-evicts-only-late"] == "holds", status
    html = "".join(o.get("data", {}).get("text/html", "") for c in nbformat.read(res.path, as_version=4).cells
                   if c.cell_type == "code" for o in c.get("outputs", []))
    assert 'data-claim="acc-filter-holds"' in html  # the "not reproduced" box in place


@pytest.mark.slow
def test_rules_chapter_watch_claims_follow_the_committed_runs(tmp_path):
    """Chapter 9 says phantom watch stays quiet on every seed of the outcome-filter arm: on a copy of the paper
    sweep whose seed-1 outcome run loses half its held-out answer length by step 10, that claim fails while the
    no-filter arm's length warning still leads its accuracy alarm."""
    src = ROOT / "data" / "runs" / "lab_paper"
    runs = tmp_path / "lab_paper"
    shutil.copytree(src, runs)
    (name,) = select(load_cells("full", runs, runs / "sweep.yaml"), "core", arm="outcome", seed=1)["name"]
    gated = runs / name
    key = "val-aux/phantom_lab/len_chars/mean@1"
    start = next(json.loads(x)["data"][key] for x in (gated / "metrics.jsonl").read_text().splitlines()
                 if x.strip() and json.loads(x)["step"] == 0)
    _edit_metrics(gated, 10, key, 0.5 * start)
    res = execute_chapter(resolve_chapter("rules", ROOT), tmp_path / "ch9.ipynb",
                          {"runs_root": str(runs), "sweep": str(runs / "sweep.yaml")},
                          root=ROOT, runs=tmp_path / "runs", force=True)
    status = _statuses(res)
    assert status["watch-quiet-under-the-outcome-filter"] == "fails", status
    assert status["watch-length-leads"] == status["lab-exposure-above-the-canary"] == "holds", status


def _copy_with_outcome_ends(dest: Path, ends: dict[int, float]) -> Path:
    """A copy of the committed paper sweep whose core outcome runs end (last validation) at ``ends[seed]``."""
    shutil.copytree(ROOT / "data" / "runs" / "lab_paper", dest)
    for seed, value in ends.items():
        (run,) = [p for p in dest.glob(f"lab-outcome-length_short-lam0.3-s{seed}-*")
                  if "core" in json.loads((p / "manifest.json").read_text())["sweep"]["groups"]]
        last = max(int(json.loads(x)["step"]) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip())
        _edit_metrics(run, last, "val-core/phantom_lab/acc/mean@1", value)
    return dest


@pytest.mark.slow
def test_chapter_run_reads_another_copy_of_the_paper_sweep(tmp_path):
    """`-p sweep FILE -p runs_root DIR` (from any working directory): the chapter reads that copy's cells,
    runs nothing (they are finished), and its claims are checked there."""
    copy = _copy_with_outcome_ends(tmp_path / "copy", {2: 0.75})
    out = tmp_path / "ch4.ipynb"
    proc = subprocess.run([sys.executable, "-m", "phantom.cli", "chapter", "run", "collapse_cpu", "-p", "sweep",
                           str(copy / "sweep.yaml"), "-p", "runs_root", str(copy), "-o", str(out), "--force"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    nb = nbformat.read(out, as_version=4)
    records = nb.metadata["phantom_claims"]["claims"]
    assert records and all(r["status"] == "holds" for r in records), [r["key"] for r in records if r["status"] != "holds"]
    glued = {o["metadata"]["scrapbook"]["name"]: o["data"]["application/papermill.record/text/plain"]
             for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if "scrapbook" in o.get("metadata", {})}
    from phantom.book.results import VAL_ACC
    from phantom.runs import iter_runs, read_metrics

    gains = [float(read_metrics(r.path)[VAL_ACC].dropna().iloc[-1] - read_metrics(r.path)[VAL_ACC].dropna().iloc[0])
             for r in iter_runs(copy, arm="outcome", estimator="grpo", lam=0.3, kind="length_short")
             if "core" in r.manifest()["sweep"]["groups"]]
    assert len(gains) == 3 and float(glued["out_gain"]) == pytest.approx(sum(gains) / 3)  # the copy's, edited
    assert not (tmp_path / "runs").exists() and not (tmp_path / "artifacts").exists()  # nothing was run or built


@pytest.mark.slow
def test_chapter_run_on_another_copy_exits_1_when_a_claim_fails(tmp_path):
    """Pointing a chapter at other data of the same experiment re-checks its prose: where that copy's outcome
    arm ends far below its start, the claim that it gains fails and `phantom chapter run` exits 1 (what
    counts as the same experiment: test_only_the_chapters_sweep_or_its_copy_rechecks)."""
    copy = _copy_with_outcome_ends(tmp_path / "copy", {0: 0.1, 1: 0.1})
    out = tmp_path / "ch4.ipynb"
    proc = subprocess.run([sys.executable, "-m", "phantom.cli", "chapter", "run", "collapse_cpu", "-p", "sweep",
                           str(copy / "sweep.yaml"), "-p", "runs_root", str(copy), "-o", str(out), "--force"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "states claims its data do not support" in proc.stderr
    records = {r["key"]: r["status"] for r in nbformat.read(out, as_version=4).metadata["phantom_claims"]["claims"]}
    assert records["core-outcome-gains"] == "fails", records
    assert records["core-unsafe-collapse"] == "holds", records


def test_only_the_chapters_sweep_or_its_copy_rechecks(tmp_path):
    """A failed claim exits 1 only when the data are the chapter's experiment: the committed sweep it reads
    by default, the packaged sweep it was made from, or a copy that differs in `sft_seed` alone; another
    sweep, a copy with one setting changed, or any other -p explores (its failed claims are reported, and
    the run exits 0)."""
    import yaml

    from phantom.book.build import rechecks, same_experiment

    committed = ROOT / "data" / "runs" / "lab_paper" / "sweep.yaml"
    assert same_experiment("paper", str(committed), ROOT)
    other_start = yaml.safe_load(committed.read_text())
    other_start["base"]["sft_seed"] = 1
    (tmp_path / "sft1.yaml").write_text(yaml.safe_dump(other_start))
    assert same_experiment(str(committed), str(tmp_path / "sft1.yaml"), ROOT)
    for f in sorted((ROOT / "data" / "runs").glob("lab_paper_amd/sft*/sweep.yaml")):
        assert not same_experiment("paper", str(f), ROOT), f  # worked answers at 2.5e-3: another experiment
    assert not same_experiment("paper", "knobs", ROOT)
    changed = yaml.safe_load(committed.read_text())
    changed["base"]["lr"] = 3.5e-3
    (tmp_path / "lr.yaml").write_text(yaml.safe_dump(changed))
    assert not same_experiment("paper", str(tmp_path / "lr.yaml"), ROOT)
    ch4 = resolve_chapter("collapse_cpu", ROOT)
    assert rechecks(ch4, {}, [], ROOT)
    assert rechecks(ch4, {"sweep": str(tmp_path / "sft1.yaml"), "runs_root": "x"}, ["sweep", "runs_root"], ROOT)
    assert rechecks(ch4, {"sweep": "paper", "runs_root": "runs/paper"}, ["sweep", "runs_root"], ROOT)
    assert not rechecks(ch4, {"sweep": str(tmp_path / "lr.yaml")}, ["sweep"], ROOT)
    assert not rechecks(ch4, {"sweep": str(tmp_path / "sft1.yaml")}, ["sweep", "collapse_acc"], ROOT)


def test_chapter_run_names_a_missing_sweep_file(tmp_path, capsys):
    """A sweep file that is not there: exit 2, naming the value and the allowed ones, nothing run or written."""
    from phantom.book.build import chapter_main

    out = tmp_path / "ch7.ipynb"
    rc = chapter_main(["run", "estimators", "-p", "sweep", "data/runs/nowhere/sweep.yaml", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "'data/runs/nowhere/sweep.yaml' does not exist" in err and "paper" in err, err
    assert not out.exists()
    rc = chapter_main(["run", "estimators", "-p", "sweep", "papr", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "sweep 'papr' is unknown; allowed:" in err and "warmstarts" in err, err
