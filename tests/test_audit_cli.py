"""``phantom audit`` as a newcomer meets it: every bad input is named with exit 2 and no traceback (issue 44).

Table-driven, each case a real subprocess of the command line: a reward that returns NaN or inf, calls
sys.exit at import, or hangs; bad flag values; the help screen; a closed stdout pipe. The reward
modules are written into a temporary folder by the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).parent / "fixtures" / "audit"
CFG = str(FIX / "overrides_filter_acc.txt")
REWARDS = {
    "nan.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
              "    return float('nan') if '7' in solution_str else 1.0\n",
    "inf.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
              "    return {'score': float('-inf'), 'acc': 0.0}\n",
    "trl_nan.py": "def reward(completions, **kw):\n    return [float('nan')] * len(completions)\n",
    "exits.py": "import sys\nprint('reading REWARD_CFG')\nsys.exit('REWARD_CFG is not set')\n",
    "hangs.py": "import time\ndef compute_score(**kw):\n    while True:\n        time.sleep(0.05)\n",
    "hangs_at_import.py": "import time\nwhile True:\n    time.sleep(0.05)\n",
    "noisy.py": "print('hello from the module')\ndef compute_score(data_source, solution_str, ground_truth, "
                "extra_info=None):\n    print('scoring')\n    return float('42' in solution_str)\n",
}


def _run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phantom.cli", "audit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def rewards(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rewards")
    for name, text in REWARDS.items():
        (d / name).write_text(text)
    return d


@pytest.mark.parametrize("args, needles", [
    (["--reward-fn", "{d}/nan.py"], ["returned nan", "wrong, #### format", "finite"]),
    (["--reward-fn", "{d}/inf.py"], ["returned -inf"]),
    (["--reward-fn", "{d}/trl_nan.py:reward"], ["returned nan"]),
    (["--reward-fn", "{d}/exits.py"], ["exits.py", "sys.exit('REWARD_CFG is not set')", "reading REWARD_CFG"]),
    (["--reward-fn", "{d}/hangs.py", "--probe-timeout", "1"], ["hangs.py", "did not return within 1 s"]),
    (["--reward-fn", "{d}/hangs_at_import.py", "--probe-timeout", "1"], ["did not finish within 1 s"]),
    (["--trl-version", "banana"], ["--trl-version 'banana'", "allowed: X.Y"]),
    (["--ignore", "PH999"], ["--ignore 'PH999'", "PH001", "PH062"]),
    (["--probe-timeout", "0"], ["--probe-timeout 0", "positive"]),
    (["--probe-timeout", "nan"], ["--probe-timeout nan", "positive"]),
    (["--all-same-frac", "nan"], ["--all-same-frac nan", "[0, 1]"]),
    (["--format", "xml"], ["invalid choice: 'xml'", "text", "json", "sarif"]),
    (["--entrypoint", "main_banana"], ["main_banana", "main_ppo", "recipe.entropy"]),
])
def test_bad_input_is_named_with_exit_2(rewards, args, needles):
    res = _run(CFG, *[a.format(d=rewards) for a in args])
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    for n in needles:
        assert n in out, (n, out)


def test_a_reward_that_prints_keeps_the_json_clean(rewards):
    res = _run(CFG, "--reward-fn", str(rewards / "noisy.py"), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["probes"][0]["returns"] == "float"
    assert "hello" not in res.stdout and "scoring" not in res.stdout


def test_help_has_a_description_examples_allowed_values_and_exit_codes():
    res = _run("--help")
    text = res.stdout
    assert res.returncode == 0
    for needle in ("without running it", "examples:", "phantom audit run_dapo.sh", "{text,json,sarif}",
                   "e.g. 0.21 or 1.16", "exit codes:", "2  an input",
                   "entry points it knows", "recipe.entropy", "easyr1", "rules (--ignore takes these ids)", "PH062"):
        assert needle in text, needle


def test_a_closed_pipe_ends_quietly():
    shapes = sorted(str(p) for p in (FIX / "shapes").glob("*.sh"))
    cmd = [sys.executable, "-m", "phantom.cli", "audit", *shapes]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    _, err = proc.communicate(timeout=120)
    assert first and proc.returncode in (0, 1, 2), err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_the_audit_never_imports_torch():
    code = ("import sys\nfrom phantom.audit import main\n"
            f"main([{str(FIX / 'trainers' / 'easyr1_filter_overall.sh')!r}, {str(FIX / 'trainers' / 'trl_local_bodies.py')!r},"
            f" {str(FIX / 'trainers' / 'hydra_rejected.sh')!r}, {str(FIX / 'trainers' / 'nemo_overlong_no_filter.yaml')!r}])\n"
            "bad = [m for m in ('torch', 'hydra', 'verl', 'omegaconf') if m in sys.modules]\n"
            "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
