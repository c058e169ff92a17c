"""`phantom chapter run NAME -p key value`: a real papermill run with non-default parameters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

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
