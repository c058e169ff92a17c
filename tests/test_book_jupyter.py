"""`make jupyter`: a real Jupyter server opens the chapters as notebooks, pairs them, runs widgets."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server(tmp_path):
    """JupyterLab's server on a copy of one chapter and the book's jupytext config."""
    (tmp_path / "book" / "chapters").mkdir(parents=True)
    shutil.copy(ROOT / "book" / "jupytext.toml", tmp_path / "book" / "jupytext.toml")
    shutil.copy(ROOT / "book" / "chapters" / "02_phantom_advantage.md", tmp_path / "book" / "chapters")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / ".jupyter"), "JUPYTER_RUNTIME_DIR": str(tmp_path / ".rt")}
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                             f"--ServerApp.token={token}", "--ServerApp.allow_root=True",
                             f"--ServerApp.root_dir={tmp_path}"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def api(path: str, method: str = "GET", body: dict | None = None) -> dict:
        req = urllib.request.Request(f"{base}{path}", method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    try:
        for _ in range(240):
            try:
                api("/api/status")
                break
            except OSError:
                time.sleep(0.25)
        else:
            pytest.fail("jupyter lab did not start within 60 s")
        yield api, tmp_path
    finally:
        proc.terminate()
        proc.wait(20)


def test_chapter_opens_as_a_notebook_and_pairs_with_a_git_ignored_ipynb(server):
    api, root = server
    model = api("/api/contents/book/chapters/02_phantom_advantage.md?type=notebook&content=1")
    assert model["type"] == "notebook"
    nb = model["content"]
    assert len(nb["cells"]) > 20 and nb["metadata"]["phantom"] == {"inputs": ["data/paper_reported.csv"]}
    assert any("parameters" in c["metadata"].get("tags", []) for c in nb["cells"])
    api("/api/contents/book/chapters/02_phantom_advantage.md", "PUT", {"type": "notebook", "format": "json", "content": nb})
    paired = root / "book" / "_build" / "lab" / "02_phantom_advantage.ipynb"
    assert paired.is_file(), "saving should write the paired notebook under book/_build/lab"
    text = (root / "book" / "chapters" / "02_phantom_advantage.md").read_text()
    assert "phantom:\n  inputs: [data/paper_reported.csv]" in text, "the build's front matter must survive a save"
    assert text == (ROOT / "book" / "chapters" / "02_phantom_advantage.md").read_text(), "a save must not rewrite the source"
    ignored = subprocess.run(["git", "check-ignore", "-q", "book/_build/lab/02_phantom_advantage.ipynb"], cwd=ROOT)
    assert ignored.returncode == 0, "the paired notebooks must be git-ignored"


def test_lab_extensions_for_jupytext_plotly_and_widgets_are_enabled():
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True,
                         text=True, timeout=120)
    text = out.stdout + out.stderr
    for ext in ("jupyterlab-jupytext", "jupyterlab-plotly", "@jupyter-widgets/jupyterlab-manager"):
        line = next((ln for ln in text.splitlines() if ext in ln), "")
        assert "enabled" in line and "OK" in line, f"{ext} is not enabled: {line!r}"
    overrides = json.loads((ROOT / "book" / "_lab" / "overrides.json").read_text())
    assert overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["markdown"] == "Jupytext Notebook"


def test_widgets_work_in_a_live_kernel():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        code = ("import ipywidgets as w\ns = w.FloatSlider(value=0.3, min=0.01, max=0.9)\n"
                "out = w.interactive_output(lambda lam: print('lam', lam), {'lam': s})\ns.value = 0.5\n"
                "print(s._repr_mimebundle_().keys())")
        msgs = []
        reply = kc.execute_interactive(code, timeout=120, output_hook=msgs.append)
        assert reply["content"]["status"] == "ok"
        text = "".join(m["content"].get("text", "") for m in msgs if m["msg_type"] == "stream")
        assert "application/vnd.jupyter.widget-view+json" in text
        comm_opens = [m for m in msgs if m["msg_type"] == "comm_open"]
        assert comm_opens, "widgets must open comms to the frontend"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
