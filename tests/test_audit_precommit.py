"""The pre-commit hook (.pre-commit-hooks.yaml), run the way pre-commit runs it.

pre-commit itself would build a fresh virtualenv and install this package and the hook's
additional_dependencies from PyPI, which the test suite does not do. Instead the test reads the
hook definition and does what pre-commit does with it: select the staged files with the hook's
``files`` regex, then run ``entry`` + ``args`` + the selected file names as one command and use its
exit code (the console script ``phantom`` is replaced by ``python -m phantom.cli`` so the source
under test is the one that runs). The hook's pins must equal the ``audit`` extra in pyproject.toml.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HOOK = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())[0]
SHAPES = ROOT / "tests" / "fixtures" / "audit" / "shapes"


def _selected(paths: list[str]) -> list[str]:
    rx = re.compile(HOOK["files"])
    return [p for p in paths if rx.search(p)]


def _run_hook(repo: Path, files: list[str]) -> subprocess.CompletedProcess:
    entry = shlex.split(HOOK["entry"])
    assert entry[0] == "phantom"
    cmd = [sys.executable, "-m", "phantom.cli", *entry[1:], *HOOK.get("args", []), *files]
    return subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300)


def test_hook_definition():
    assert HOOK["id"] == "phantom-audit" and HOOK["language"] == "python"
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^audit = \[(.*?)\]", pyproject, re.S | re.M).group(1)
    assert sorted(re.findall(r'"([^"]+)"', extra)) == sorted(HOOK["additional_dependencies"])


def test_files_pattern_selects_launch_scripts_and_configs():
    paths = ["scripts/run_qwen3_8b_grpo.sh", "examples/train.sh", "recipe/dapo/run_dapo_32b.sh",
             "configs/grpo_math.yaml", "cfg/verl_ppo.json", "outputs/x/.hydra/overrides.yaml", "slurm/train.slurm",
             "README.md", ".github/workflows/ci.yml", "setup.sh", "src/model.py", "data/prep.yaml"]
    assert _selected(paths) == paths[:7]


def test_hook_passes_clean_files_and_fails_phantom_prone_ones(tmp_path):
    repo = tmp_path / "user_repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("arrays_gsm8k_clean.sh", "no_trainer.sh", "arrays_append_filter_score.sh"):
        shutil.copy(SHAPES / name, repo / "scripts" / f"run_{name}")
    clean = _selected(["scripts/run_arrays_gsm8k_clean.sh", "scripts/run_no_trainer.sh"])
    res = _run_hook(repo, clean)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "skipped" in res.stdout  # a data script matched by the pattern is skipped, not failed
    res = _run_hook(repo, _selected(["scripts/run_arrays_gsm8k_clean.sh", "scripts/run_arrays_append_filter_score.sh"]))
    assert res.returncode == 1 and "PH001" in res.stdout
