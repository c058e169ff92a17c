"""Batch kernels (phantom.proc.kernels) and the chapters the book executes beside the lab (phantom.book.background)."""

from __future__ import annotations

import sys

import nbformat
import papermill
import pytest

from phantom.book.background import free_chapters
from phantom.book.chapters import find_chapters, repo_root
from phantom.book.execute import chapter_env, environ
from phantom.proc.kernels import STARTUP, batch_ipython_dir, batch_kernel_env


def test_batch_ipython_dir_holds_the_startup_file_and_is_idempotent(tmp_path):
    d = batch_ipython_dir(tmp_path)
    f = d / "profile_default" / "startup" / "00-phantom-batch.py"
    assert f.read_text() == STARTUP
    mtime = f.stat().st_mtime_ns
    assert batch_ipython_dir(tmp_path) == d and f.stat().st_mtime_ns == mtime
    assert batch_kernel_env(tmp_path) == {"IPYTHONDIR": str(d)}


@pytest.mark.slow
def test_a_batch_kernel_skips_rfc3987_and_a_plain_one_does_not(tmp_path):
    """The start-up file runs in a papermill kernel: jsonschema's optional backend is marked absent
    there, and only there (the package itself stays installed and importable elsewhere)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys\nprint('RFC', sys.modules.get('rfc3987_syntax', 'unset'))")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src = tmp_path / "probe.ipynb"
    nbformat.write(nb, src)

    def probe(env: dict[str, str]) -> str:
        out = tmp_path / "out.ipynb"
        with environ(env):
            papermill.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False)
        return nbformat.read(out, as_version=4).cells[0].outputs[0]["text"].strip()

    assert probe(batch_kernel_env(tmp_path)) == "RFC None"
    assert probe({"IPYTHONDIR": str(tmp_path / "plain")}) == "RFC unset"
    assert "rfc3987_syntax" not in sys.modules or sys.modules["rfc3987_syntax"] is not None


def test_chapter_kernels_get_the_batch_startup(tmp_path):
    env = chapter_env(repo_root(), "quick", tmp_path)
    assert env["IPYTHONDIR"].endswith(".ipython")


def test_free_chapters_are_those_that_read_no_lab_runs():
    """Executed beside the lab sweep: only chapters without lab_sweep and without reads_runs."""
    chapters = find_chapters(repo_root())
    free = {ch.stem for ch in free_chapters(chapters)}
    for ch in chapters:
        meta = ch.meta()
        assert (ch.stem in free) == (not meta.get("lab_sweep") and not meta.get("reads_runs")), ch.stem
    # the lab chapters read committed runs (their inputs), so they too execute beside the build's own sweep
    assert {"01_grpo_dapo", "02_phantom_advantage", "03_filter", "04_collapse_cpu", "06_dose_direction_format",
            "07_estimators", "08_what_does_not_matter"} <= free
    assert "appendix_rerun" not in free
