"""Checked claims (phantom.book.claims): records, the "not reproduced" box, the build's exit code.

The slow tests build a real two-chapter book (papermill + strict Jupyter Book) whose second chapter
states a claim its data contradict: under the full profile the page shows the box with the data and
`phantom book build` exits non-zero after building everything; under the quick profile the same
prose builds with one "not checked" notice and exit code 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from phantom.book.chapters import Chapter
from phantom.book.claims import META_KEY, MIME, Claims, claims_report, failed_claims, read_claims
from phantom.book.execute import execute_chapter, postprocess

ROOT = Path(__file__).resolve().parents[1]

HEADER = """---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---

"""
TRUE_CHAPTER = HEADER + """# 1. A true claim

```{code-cell} ipython3
:tags: [parameters]

x = 1
```

```{code-cell} ipython3
:tags: [remove-input]

from myst_nb import glue
from phantom.book import Claims

claims = Claims()
glue("total", x + 1, display=False)
```

```{code-cell} ipython3
:tags: [remove-input]

claims.notice()
```

One plus one is {glue:text}`total`.

```{code-cell} ipython3
:tags: [remove-input]

claims.check("sum-is-two", x + 1 == 2, claim="one plus one is two", data={"x + 1": x + 1})
```
"""
FALSE_CHAPTER = TRUE_CHAPTER.replace("# 1. A true claim", "# 2. A false claim").replace(
    'claims.check("sum-is-two", x + 1 == 2, claim="one plus one is two"',
    'claims.check("sum-is-three", x + 1 == 3, claim="one plus one is three"').replace(
    "One plus one is {glue:text}`total`.", "One plus one is three (the data say {glue:text}`total`).")


def _tiny_repo(tmp_path: Path, chapters: dict[str, str]) -> Path:
    root = tmp_path / "repo"
    (root / "book" / "chapters").mkdir(parents=True)
    for name in ("_config.yml",):
        shutil.copy(ROOT / name, root / name)
    shutil.copy(ROOT / "book" / "references.bib", root / "book" / "references.bib")
    (root / "book" / "intro.md").write_text("# Tiny book\n\nTwo chapters.\n")
    for link in ("book/_static", "book/_ext", "scripts"):
        (root / link).symlink_to(ROOT / link, target_is_directory=True)
    for stem, text in chapters.items():
        (root / "book" / "chapters" / f"{stem}.md").write_text(text)
    toc = {"format": "jb-book", "root": "book/intro",
           "chapters": [{"file": f"book/chapters/{stem}"} for stem in chapters]}
    (root / "_toc.yml").write_text(yaml.safe_dump(toc))
    return root


# --------------------------------------------------------------------------------------------
# the helper itself (no kernel)
# --------------------------------------------------------------------------------------------
def test_claims_record_status_by_profile_and_validate_input(monkeypatch, capsys):
    monkeypatch.delenv("PHANTOM_PROFILE", raising=False)
    c = Claims()
    assert c.profile == "full" and c.checked
    assert c.check("a", True, claim="a holds", data={"v": 1.0}) is None  # a cell's last line prints nothing
    c.check("b", 0, claim="b holds")
    assert [r["status"] for r in c.records] == ["holds", "fails"]
    with pytest.raises(ValueError, match="checked twice"):
        c.check("a", True, claim="again")
    with pytest.raises(ValueError, match="state what the prose says"):
        c.check("c", True, claim="")
    with pytest.raises(ValueError, match="needs a reason"):
        c.skip("d", "", claim="d")
    with pytest.raises(TypeError, match="mapping or a DataFrame"):
        c.check("e", True, claim="e", data=[1, 2])
    monkeypatch.setenv("PHANTOM_PROFILE", "quick")
    q = Claims()
    assert not q.checked and q.profile == "quick"
    q.check("a", False, claim="a holds")
    assert q.records[0]["status"] == "unchecked" and q.records[0]["holds"] is False
    assert Claims(checked=True).checked, "arithmetic chapters check in every profile"
    with pytest.raises(ValueError, match="profile='medium' is unknown"):
        Claims("medium")


def test_data_records_are_plain_json():
    import numpy as np
    import pandas as pd

    c = Claims("full")
    c.check("np", np.bool_(True), claim="numpy values", data={"x": np.float32(0.5), "n": np.int64(3), "nan": float("nan")})
    c.check("df", True, claim="a frame", data=pd.DataFrame({"arm": ["none"], "acc": [0.1]}).set_index("arm"))
    json.dumps(c.records)  # must not raise
    assert c.records[0]["data"]["rows"] == [["x", 0.5], ["n", 3], ["nan", None]]
    assert c.records[1]["data"] == {"columns": ["arm", "acc"], "rows": [["none", 0.1]]}


def test_postprocess_moves_claims_to_metadata_and_keeps_only_the_box():
    box = {MIME: {"key": "k2", "status": "fails", "claim": "c", "data": {"columns": [], "rows": []}},
           "text/html": "<div>box</div>", "text/plain": "claim"}
    cells = [
        nbformat.v4.new_code_cell("claims.check(...)", metadata={"tags": ["remove-input"]}),
        nbformat.v4.new_code_cell("claims.check(...)", metadata={"tags": ["remove-input"]}),
        nbformat.v4.new_code_cell("print(1)", metadata={"tags": []}),
    ]
    cells[0].outputs = [nbformat.v4.new_output("display_data", data={MIME: {"key": "k1", "status": "holds"},
                                                                     "text/plain": "claim"})]
    cells[1].outputs = [nbformat.v4.new_output("display_data", data=box)]
    cells[2].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    nb = postprocess(nbformat.v4.new_notebook(cells=cells))
    assert [r["key"] for r in read_claims(nb)] == ["k1", "k2"]
    assert nb.cells[0].outputs == [] and "remove-cell" in nb.cells[0].metadata["tags"]
    assert list(nb.cells[1].outputs[0]["data"]) == ["text/html", "text/plain"], "the box stays, the record moves"
    assert "remove-cell" not in nb.cells[1].metadata["tags"] and len(nb.cells[2].outputs) == 1


def test_report_lists_failed_claims_with_their_data():
    records = {"02_b": [{"key": "k", "claim": "x is 3", "status": "fails",
                         "data": {"columns": ["q", "v"], "rows": [["x", 2]]}}],
               "01_a": [{"key": "j", "claim": "y", "status": "holds", "data": {"columns": [], "rows": []}}]}
    assert [ch for ch, _ in failed_claims(records)] == ["02_b"]
    report = claims_report(records)
    assert report.splitlines()[0] == "claims: 1 holds, 1 fails, 0 unchecked, 0 skipped"
    assert "NOT REPRODUCED 02_b: k: x is 3 [x 2]" in report


# --------------------------------------------------------------------------------------------
# a real kernel (papermill), then a real book
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("profile", ["full", "quick"])
def test_executed_chapter_carries_its_claims(tmp_path, profile):
    root = _tiny_repo(tmp_path, {"02_false": FALSE_CHAPTER})
    ch = Chapter(root / "book" / "chapters" / "02_false.md")
    res = execute_chapter(ch, tmp_path / "out.ipynb", root=root, profile=profile, runs=tmp_path / "runs")
    assert [(r["key"], r["status"]) for r in res.claims] == [("sum-is-three", "fails" if profile == "full" else "unchecked")]
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert nb.metadata[META_KEY]["claims"][0]["data"]["rows"] == [["x + 1", 2]]
    html = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert ("Not reproduced in this build" in html) is (profile == "full")
    assert ("not checked in this build" in html) is (profile == "quick")
    again = execute_chapter(ch, tmp_path / "again.ipynb", root=root, profile=profile, runs=tmp_path / "runs")
    assert again.cached and again.claims == res.claims, "a cached chapter reports the same claims"


def _build(root: Path, profile: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PHANTOM_ROOT": str(root), "PHANTOM_RUNS": str(root / "runs"),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "phantom.cli", "book", "build", "--profile", profile,
                           "--out", str(root)], cwd=root, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_false_claim_fails_the_full_build_but_the_book_is_built(tmp_path):
    root = _tiny_repo(tmp_path, {"01_true": TRUE_CHAPTER, "02_false": FALSE_CHAPTER})
    proc = _build(root, "full")
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "NOT REPRODUCED 02_false: sum-is-three: one plus one is three" in proc.stderr
    html = root / "_build" / "html" / "book" / "chapters"
    false_page, true_page = (html / "02_false.html").read_text(), (html / "01_true.html").read_text()
    assert "Not reproduced in this build" in false_page and "phantom-claim-failed" in false_page
    assert "<td>x + 1</td><td>2</td>" in false_page, "the box shows the data"
    assert "One plus one is three" in false_page, "the prose is the same whatever the data"
    assert "phantom-claim-failed" not in true_page and "not checked" not in true_page
    assert "claims.check" not in true_page + false_page, "the checking cells are hidden"
    assert not re.search(r">\s*(True|False)\s*<", true_page + false_page), "a check prints no value"
    status = json.loads((root / "_build" / "phantom" / "last_build.json").read_text())
    assert status["status"] == "ok" and status["claims_failed"] == 1
    recorded = json.loads((root / "_build" / "phantom" / "claims.json").read_text())
    assert {ch: [r["status"] for r in recs] for ch, recs in recorded["chapters"].items()} == \
        {"01_true": ["holds"], "02_false": ["fails"]}
    # every chapter page offers its executed notebook and the command that re-runs it
    assert "phantom chapter run true" in re.sub(r"<[^>]+>", "", true_page)  # the command, highlighted
    assert 'href="../../_sources/book/chapters/01_true.ipynb"' in true_page
    nb = json.loads((root / "_build" / "html" / "_sources" / "book" / "chapters" / "01_true.ipynb").read_text())
    assert any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code") or nb["metadata"][META_KEY]


@pytest.mark.slow
def test_the_quick_profile_shows_one_notice_and_the_same_prose(tmp_path):
    root = _tiny_repo(tmp_path, {"02_false": FALSE_CHAPTER})
    proc = _build(root, "quick")
    assert proc.returncode == 0, proc.stderr[-4000:]
    page = (root / "_build" / "html" / "book" / "chapters" / "02_false.html").read_text()
    assert page.count("The claims on this page are not checked in this build") == 1
    assert "phantom-claim-failed" not in page and "One plus one is three" in page
    recorded = json.loads((root / "_build" / "phantom" / "claims.json").read_text())
    assert recorded["chapters"]["02_false"][0]["status"] == "unchecked"
