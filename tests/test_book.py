"""phantom.book: chapter discovery, safe parameters, the cache key, post-processing, the CLI contract."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from phantom import book
from phantom.book import build
from phantom.book.build import LabMissing
from phantom.book.chapters import (
    Chapter,
    coerce_parameters,
    find_chapters,
    parameters_of,
    parse_value,
    resolve_chapter,
    toc_files,
)
from phantom.book.execute import ChapterError, cache_key, execute_chapter, phantom_modules, postprocess
from phantom.book.paper import reported_label

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = """---
jupytext:
  text_representation: {{extension: .md, format_name: myst}}
kernelspec: {{display_name: Python 3, language: python, name: python3}}
{meta}---

# A chapter

```{{code-cell}} ipython3
:tags: [parameters]

lam = 0.3
steps = 40
name = "outcome"
flag = False
sizes = [5, 8]
```

```{{code-cell}} ipython3
from phantom.rewards import length_short
print("lam =", lam)
```
"""


def write_book(tmp_path: Path, meta: str = "", chapters: tuple[str, ...] = ("01_alpha",)) -> Path:
    (tmp_path / "book" / "chapters").mkdir(parents=True)
    (tmp_path / "book" / "intro.md").write_text("# Intro\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.csv").write_text("a\n1\n")
    toc = {"format": "jb-book", "root": "book/intro",
           "parts": [{"caption": "c", "chapters": [{"file": f"book/chapters/{c}"} for c in chapters]}]}
    import yaml

    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(toc))
    for c in chapters:
        (tmp_path / "book" / "chapters" / f"{c}.md").write_text(CHAPTER.format(meta=meta))
    return tmp_path


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "default", "expected"), [
    ("0.5", 0.3, 0.5), ("1", 0.3, 1.0), ("1e-3", 1e-6, 1e-3), ("12", 40, 12), ("true", False, True),
    ("No", True, False), ("score", "outcome", "score"), ("3.5", "x", "3.5"), ("[1, 2]", [5], [1, 2]),
    ("(1, 2)", (0,), (1, 2)), ("[1, 2]", (0,), (1, 2)), ("{'a': 1}", {}, {"a": 1}), ("abc", None, "abc"),
    ("7", None, 7),
])
def test_parse_value_follows_the_default_type(text, default, expected):
    got = parse_value(text, default)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("text", "default"), [
    ("abc", 0.3), ("nan", 0.3), ("inf", 1.0), ("1.5", 40), ("maybe", True), ("'s'", [1]), ("[1", [1]),
])
def test_parse_value_rejects_bad_values(text, default):
    with pytest.raises(ValueError):
        parse_value(text, default)


def test_parse_value_never_evaluates_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    assert parse_value(payload, None) == payload  # stays a string
    with pytest.raises(ValueError):
        parse_value(payload, [1])
    assert not marker.exists()


def test_coerce_parameters_names_unknown_and_bad_values():
    defaults = {"lam": 0.3, "steps": 40}
    assert coerce_parameters([("lam", "0.5"), ("steps", "8")], defaults) == {"lam": 0.5, "steps": 8}
    with pytest.raises(ValueError, match="'lr' is unknown; allowed: lam, steps"):
        coerce_parameters([("lr", "1")], defaults)
    with pytest.raises(ValueError, match="steps='x'"):
        coerce_parameters([("steps", "x")], defaults)


def test_parameters_cell_is_read_without_executing_it():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("a = 1\nb: float = 2.5\n'doc'\nc = (1, 'x')",
                                                                   metadata={"tags": ["parameters"]})])
    assert parameters_of(nb) == {"a": 1, "b": 2.5, "c": (1, "x")}
    nb.cells[0].source = "import os\na = os.getcwd()"
    with pytest.raises(ValueError, match="only hold `name = literal`"):
        parameters_of(nb)
    nb.cells[0].source = "a = len('x')"
    with pytest.raises(ValueError, match="literal default"):
        parameters_of(nb)
    nb.cells[0].metadata["tags"] = []
    with pytest.raises(ValueError, match="exactly one code cell tagged 'parameters'"):
        parameters_of(nb)


# --------------------------------------------------------------------------------------------
# chapters, toc
# --------------------------------------------------------------------------------------------
def test_resolve_chapter_by_stem_short_name_and_number(tmp_path):
    root = write_book(tmp_path, chapters=("01_alpha", "02_beta_gamma"))
    assert resolve_chapter("beta_gamma", root).stem == "02_beta_gamma"
    assert resolve_chapter("02_beta_gamma", root).stem == "02_beta_gamma"
    assert resolve_chapter("1", root).stem == "01_alpha"
    with pytest.raises(ValueError, match="allowed: alpha, beta_gamma"):
        resolve_chapter("delta", root)
    assert [c.stem for c in find_chapters(root)] == ["01_alpha", "02_beta_gamma"]


def test_find_chapters_fails_on_a_toc_entry_without_source(tmp_path):
    root = write_book(tmp_path)
    (root / "book" / "chapters" / "01_alpha.md").unlink()
    with pytest.raises(FileNotFoundError, match="01_alpha"):
        find_chapters(root)


def test_the_repository_toc_lists_existing_chapters_with_the_required_shape():
    chapters = find_chapters(ROOT)
    assert [c.number for c in chapters if c.number is not None] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    appendices = [c for c in chapters if c.number is None]
    assert appendices and all(c.stem.startswith("appendix_") for c in appendices)  # no number prefix
    assert toc_files(ROOT)[0] == "book/intro"
    for ch in appendices:
        assert ch.parameters(), f"{ch.stem}: empty parameters cell"
        assert ch.notebook().metadata["jupytext"]["text_representation"]["format_name"] == "myst"
    for ch in (c for c in chapters if c.number is not None):  # the teaching spine's shape
        text = ch.path.read_text()
        nb = ch.notebook()
        assert ch.parameters(), f"{ch.stem}: empty parameters cell"
        assert "What you will learn" in text, f"{ch.stem} must open with what the reader will learn"
        assert "## Try it" in text and "phantom chapter run" in text, f"{ch.stem} needs 'try it' commands"
        assert "## Exercises" in text, f"{ch.stem} needs exercises"
        assert nb.metadata["jupytext"]["text_representation"]["format_name"] == "myst"
        assert "{eval}" not in text, "eval roles need a live kernel; use myst_nb.glue"


def test_chapter_front_matter_is_read(tmp_path):
    root = write_book(tmp_path, meta="phantom:\n  inputs: [data/in.csv]\n  lab_sweep: paper\n")
    ch = Chapter(root / "book" / "chapters" / "01_alpha.md")
    assert ch.meta() == {"inputs": ["data/in.csv"], "lab_sweep": "paper"}
    assert ch.short == "alpha" and ch.number == 1


# --------------------------------------------------------------------------------------------
# cache key
# --------------------------------------------------------------------------------------------
def test_cache_key_changes_with_source_parameters_and_declared_inputs(tmp_path):
    root = write_book(tmp_path, meta="phantom:\n  inputs: [data/in.csv]\n")
    ch = Chapter(root / "book" / "chapters" / "01_alpha.md")
    runs = tmp_path / "runs"
    k0 = cache_key(ch, {}, root=root, runs=runs)
    assert cache_key(ch, {}, root=root, runs=runs) == k0
    assert cache_key(ch, {"lam": 0.5}, root=root, runs=runs) != k0
    (root / "data" / "in.csv").write_text("a\n2\n")
    k1 = cache_key(ch, {}, root=root, runs=runs)
    assert k1 != k0
    ch.path.write_text(ch.path.read_text() + "\nmore prose\n")
    assert cache_key(ch, {}, root=root, runs=runs) != k1


def test_cache_key_follows_run_folders_only_when_the_chapter_reads_runs(tmp_path):
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "manifest.json").write_text(json.dumps({"status": "done"}))
    (runs / "r1" / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n')
    for meta, follows in (("", False), ("phantom:\n  reads_runs: true\n", True)):
        root = write_book(tmp_path / ("b" + str(follows)), meta=meta)
        ch = Chapter(root / "book" / "chapters" / "01_alpha.md")
        k0 = cache_key(ch, {}, root=root, runs=runs)
        (runs / "r1" / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n{"step": 1, "data": {}}\n')
        assert (cache_key(ch, {}, root=root, runs=runs) != k0) is follows
        (runs / "r1" / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n')


def test_cache_key_follows_the_run_folders_a_run_root_parameter_names(tmp_path):
    """Chapter 5 reads the verl runs under its ``run_root`` parameter (``-p run_root runs`` reads your
    own): a new run there must re-execute it, while the lab's runs root, which it never reads, must not."""
    ch = resolve_chapter("05_verl_runs", ROOT)
    mine, lab = tmp_path / "mine", tmp_path / "lab"
    for base in (mine, lab):
        base.mkdir()
    params = {"run_root": str(mine)}
    k0 = cache_key(ch, params, root=ROOT, runs=lab)
    (lab / "r1").mkdir()
    (lab / "r1" / "manifest.json").write_text(json.dumps({"status": "done"}))
    assert cache_key(ch, params, root=ROOT, runs=lab) == k0
    (mine / "r1").mkdir()
    (mine / "r1" / "manifest.json").write_text(json.dumps({"status": "done"}))
    assert cache_key(ch, params, root=ROOT, runs=lab) != k0


def test_a_runs_root_parameter_names_the_folder_the_key_hashes_and_the_kernel_reads(tmp_path):
    """`execute_chapter(ch, out, {"runs_root": DIR})` without `runs=`: the key must follow DIR's runs (a
    stale cache otherwise), and the kernel's $PHANTOM_RUNS is the same folder."""
    from phantom.book.execute import chapter_env, chapter_runs

    root = write_book(tmp_path / "b", meta="phantom:\n  reads_runs: true\n")
    ch = Chapter(root / "book" / "chapters" / "01_alpha.md")
    (root / "copy" / "r1").mkdir(parents=True)
    (root / "copy" / "r1" / "manifest.json").write_text(json.dumps({"status": "done"}))
    (root / "copy" / "r1" / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n')
    params = {"runs_root": "copy"}
    runs = chapter_runs(params, root)
    assert runs == (root / "copy").resolve()
    assert chapter_env(root, "full", runs)["PHANTOM_RUNS"] == str(runs)
    k0 = cache_key(ch, params, root=root, runs=runs)
    (root / "copy" / "r1" / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n{"step": 1, "data": {}}\n')
    assert cache_key(ch, params, root=root, runs=chapter_runs(params, root)) != k0
    assert chapter_runs(params, root, tmp_path / "given") == tmp_path / "given"  # an explicit folder wins


def test_phantom_modules_follow_imports_transitively_but_not_book_plumbing():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from phantom.advantages import group_advantages\n%time x")])
    names = {p.name for p in phantom_modules(nb)}
    assert {"advantages.py", "figures.py", "execute.py", "chapters.py", "__init__.py"} <= names
    assert not any("lab" in p.parts for p in phantom_modules(nb)), "the book build's lazy lab import must not count"


# --------------------------------------------------------------------------------------------
# post-processing and the paper's numbers
# --------------------------------------------------------------------------------------------
def test_postprocess_hides_injected_parameters_and_drops_unused_widget_state():
    cells = [nbformat.v4.new_code_cell("lam = 0.3", metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell("lam = 0.5", metadata={"tags": ["injected-parameters"]}),
             nbformat.v4.new_code_cell("w", metadata={"tags": ["remove-cell"]})]
    cells[2].outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "x"}})]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"widgets": {"state": {}}})
    out = postprocess(nb)
    assert "hide-input" in out.cells[1].metadata["tags"]
    assert "widgets" not in out.metadata
    cells[2].metadata["tags"] = []
    nb2 = nbformat.v4.new_notebook(cells=cells, metadata={"widgets": {"state": {}}})
    assert "widgets" in postprocess(nb2).metadata


def test_paper_reported_has_the_schema_and_every_row_a_section():
    df = book.paper_reported(ROOT)
    assert {"source", "experiment", "arm", "estimator", "lam", "metric", "value", "sd", "n", "section", "label"} <= set(df.columns)
    assert set(df["source"]) == {"paper", "dapo"}
    assert df["section"].notna().all() and pd.to_numeric(df["value"], errors="coerce").notna().all()
    assert (df[df.source == "paper"]["label"].str.fullmatch(r"reported by the paper \(§\d+\)")).all()
    core = book.paper_reported(ROOT, experiment="core", metric="val_em_step40", note="pooled mean ± sample SD")
    assert dict(zip(core.arm, core.value)) == {"none": 0.080, "score": 0.040, "outcome": 0.754}
    arith = book.paper_reported(ROOT, experiment="arithmetic").set_index("metric")["value"]
    assert (arith["adv_span_grpo_allfail"], arith["adv_span_drgrpo_allfail"], arith["adv_span_drgrpo_mixed"]) == (1.4, 0.12, 0.7)
    with pytest.raises(ValueError, match="column 'nope' is unknown"):
        book.paper_reported(ROOT, nope=1)


def test_paper_reported_tau2_rows_say_what_the_paper_says():
    # §10: "a 7B policy" on τ²-bench airline; the paper names neither the model nor the estimator
    ab = book.paper_reported(ROOT, experiment="rezero_ab")
    assert len(ab) == 4 and set(ab["model"]) == {"7b-policy"} and ab["estimator"].isna().all()
    assert set(ab["task"]) == {"tau2-airline"} and (ab["section"] == "10").all()
    assert sorted(ab["value"]) == [0.4125, 0.5375, 0.55, 0.5625]


def test_reported_label():
    assert reported_label(9) == "reported by the paper (§9)"
    assert reported_label("12", "dapo") == "reported by the DAPO paper (deep dive §12)"
    with pytest.raises(ValueError):
        reported_label(1, "blog")


# --------------------------------------------------------------------------------------------
# CLI contract (no kernels started)
# --------------------------------------------------------------------------------------------
def test_chapter_cli_rejects_bad_input_with_exit_code_2(capsys):
    assert build.chapter_main(["run", "no_such_chapter"]) == 2
    assert "allowed:" in capsys.readouterr().err
    assert build.chapter_main(["run", "phantom_advantage", "-p", "nope", "1"]) == 2
    assert "'nope' is unknown" in capsys.readouterr().err
    assert build.chapter_main(["run", "phantom_advantage", "-p", "lam", "abc"]) == 2
    assert build.chapter_main(["run", "phantom_advantage", "-o", "x.html"]) == 2


def test_chapter_cli_lists_chapters(capsys):
    assert build.chapter_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "phantom_advantage" in out and "lam=0.3" in out


def test_book_build_fails_loudly_when_a_chapter_needs_the_missing_lab(monkeypatch):
    monkeypatch.setitem(sys.modules, "phantom.lab.sweep", None)  # makes the import raise ImportError
    with pytest.raises(LabMissing, match="needs? lab sweeps 'paper'|lab sweeps paper"):
        build._run_lab_sweeps({"paper": ["04_collapse_cpu"]}, "quick", 2)
    build._run_lab_sweeps({}, "quick", 2)  # nothing needed: nothing imported


def test_book_build_reports_a_failed_sweep(monkeypatch):
    import types

    def run_sweep(name, *, profile, jobs, runs_root=None, on_cells_start=None):
        raise RuntimeError("cell 3 failed")

    monkeypatch.setitem(sys.modules, "phantom.lab.sweep", types.SimpleNamespace(run_sweep=run_sweep))
    with pytest.raises(RuntimeError, match="lab sweep 'paper' .* failed: cell 3 failed"):
        build._run_lab_sweeps({"paper": ["04_collapse_cpu"]}, "quick", 2)


def test_book_build_rejects_bad_jobs(capsys):
    assert build.book_main(["build", "--jobs", "0"]) == 2


def test_execute_chapter_reports_the_failing_cell(tmp_path):
    root = write_book(tmp_path)
    src = root / "book" / "chapters" / "01_alpha.md"
    src.write_text(src.read_text() + '\n```{code-cell} ipython3\nraise RuntimeError("boom in chapter")\n```\n')
    out = tmp_path / "out" / "01_alpha.ipynb"
    with pytest.raises(ChapterError, match="boom in chapter"):
        execute_chapter(Chapter(src), out, root=root, runs=tmp_path / "runs")
    assert not out.exists() and (tmp_path / "out" / "01_alpha.failed.ipynb").is_file()
