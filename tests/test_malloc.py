"""tcmalloc for the lab's processes: chosen by $PHANTOM_MALLOC, preloaded by the console script, and
without effect on any number a run logs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phantom.proc.malloc import choice, in_use, preload_env, tcmalloc_path

LIB = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def test_choice_defaults_to_tcmalloc_and_names_the_allowed_values():
    assert choice({}) == "tcmalloc"
    assert choice({"PHANTOM_MALLOC": " System "}) == "system"
    with pytest.raises(ValueError, match=r"PHANTOM_MALLOC='jemalloc' is unknown; allowed: tcmalloc, system"):
        choice({"PHANTOM_MALLOC": "jemalloc"})


def test_preload_env_adds_the_library_once_and_keeps_other_preloads():
    env = preload_env({"LD_PRELOAD": "/opt/libx.so"}, lib=LIB)
    assert env is not None and env["LD_PRELOAD"] == f"{LIB} /opt/libx.so"
    assert preload_env(env, lib=LIB) is None  # already there: the re-executed process stops here
    assert preload_env({"LD_PRELOAD": f"/opt/libx.so:{LIB}"}, lib=LIB) is None
    assert preload_env({"PHANTOM_MALLOC": "system"}, lib=LIB) is None


def test_no_library_changes_nothing(monkeypatch):
    monkeypatch.setattr("phantom.proc.malloc.tcmalloc_path", lambda: None)
    assert preload_env({}) is None


def test_a_call_from_python_never_re_executes(monkeypatch):
    from phantom.cli import main

    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail(f"execve called: {a}"))
    assert main(["lab", "list"]) == 0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is a Linux loader feature")
def test_runs_under_tcmalloc_log_exactly_what_runs_under_glibc_log(tmp_path):
    """The console script preloads tcmalloc (scripts/setup_env.sh installs it), the manifest records it,
    and a short lab run logs the same values, step for step, as under glibc's malloc."""
    assert tcmalloc_path() is not None, "scripts/setup_env.sh installs Debian's libtcmalloc-minimal4"
    exe = shutil.which("phantom", path=str(Path(sys.executable).parent))
    assert exe, "the phantom console script is installed next to this Python"
    env = {**os.environ, "PHANTOM_ARTIFACTS": str(tmp_path / "art"), "OMP_NUM_THREADS": "1"}
    env.pop("LD_PRELOAD", None)
    logs = {}
    for mode in ("system", "tcmalloc"):
        cmd = [exe, "lab", "run", "--model", "tiny", "--steps", "3", "--runs-dir", str(tmp_path / "runs"),
               "--name", mode, "--set", "prompts=4", "--set", "rollouts=4", "--set", "eval_n=8",
               "--set", "eval_every=2", "--set", "max_new=24"]
        subprocess.run(cmd, env={**env, "PHANTOM_MALLOC": mode}, check=True, capture_output=True, timeout=600)
        run = tmp_path / "runs" / mode
        assert json.loads((run / "manifest.json").read_text())["malloc"] == mode
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        logs[mode] = [(d["step"], {k: v for k, v in d["data"].items() if not k.startswith("timing_s/")})
                      for d in lines]
    assert len(logs["system"]) == 4 and logs["tcmalloc"] == logs["system"]


def test_in_use_reads_this_process():
    assert in_use() in ("tcmalloc", "system")
