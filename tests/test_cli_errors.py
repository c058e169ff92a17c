"""The command line as a new user meets it (issue 44): every case is a real ``phantom`` process.

Each case asserts the exit code, that no traceback is shown, and that the message names the bad value
(and, where a run folder could have been made, that none was). The policy itself (phantom.cli) is
also called in-process for the cases a process cannot provoke on purpose: a bug, a missing extra.
The Ctrl-C cases send SIGINT to a real ``lab run`` / ``lab sft`` after they started.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phantom import cli

ROOT = Path(__file__).resolve().parents[1]
WATCH = ROOT / "tests" / "fixtures" / "watch" / "lab_none_s0.jsonl"
HELDOUT = ROOT / "data" / "runs" / "lab_warmstarts_long_2e-3"  # a committed multi-warm-start sweep
#: no re-execution under tcmalloc: one process per case, as the console script without the allocator
ENV = {**os.environ, "PHANTOM_MALLOC": "system", "PYTHONUNBUFFERED": "1"}
slow = pytest.mark.slow


def phantom(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600,
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phantom.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**ENV, **(env or {})}, timeout=timeout)


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    """A working folder with the bad inputs the cases name (written here, in the shapes users write)."""
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "unparsable.yaml").write_text("groups:\n  g1: [a, b\n")
    (tmp_path / "list.yaml").write_text("- arm: none\n- arm: outcome\n")
    (tmp_path / "group_list.yaml").write_text("groups:\n  g1:\n    - arm: none\n")
    (tmp_path / "bad_cell.yaml").write_text("base: {lr: 2}\ngroups:\n  core:\n    grid: {arm: [none]}\n")
    (tmp_path / "typo.yaml").write_text("name: x\ngroup:\n  core: {grid: {arm: [none]}}\n")
    (tmp_path / "nokeys.jsonl").write_text("".join(json.dumps({"step": s, "data": {"loss": 1.0 / (s + 1)}}) + "\n"
                                                   for s in range(5)))
    (tmp_path / "flat.jsonl").write_text("".join(json.dumps({"step": s, "response_length/mean": 50.0 - s}) + "\n"
                                                 for s in range(5)))
    rows = [{"uid": f"p{g}", "score": s, "acc": 0, "len": n} for g in range(3)
            for s, n in ((0.1, 12), (0.3, 40))]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows[3]["len"] = -3
    (tmp_path / "neglen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _check(r: subprocess.CompletedProcess, code: int, needles: list[str]) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == code, (r.returncode, out[-3000:])
    assert "Traceback" not in out, out[-3000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr[-3000:])


#: (argv, exit code, what the message must name); {ws}: the working folder, {root}: the checkout
FAST = [
    (["lab"], 2, ["say which command", "allowed: task, sft, run, sweep"]),
    (["nosuch"], 2, ["'nosuch'", "allowed: lab, verl"]),
    (["lab", "run", "--arm", "banana"], 2, ["'banana'", "allowed: 'none', 'score', 'outcome'"]),
    (["lab", "run", "--lam", "nan"], 2, ["--lam", "'nan'", "allowed: a finite number"]),
    (["lab", "task", "--n", "-3"], 2, ["--n", "'-3'", "allowed: an integer >= 1"]),
    (["lab", "sft", "--model", "huge"], 2, ["'huge'", "lab_graded"]),
    (["lab", "sweep", "paper", "--jobs", "0"], 2, ["--jobs", "'0'"]),
    (["lab", "summary", "paper", "--profile", "medium"], 2, ["'medium'", "allowed: 'full', 'quick'"]),
    (["watch", "--once", "{ws}/nokeys.jsonl"], 2, ["none of the known metric keys", "found: loss",
                                                  "response_length/mean"]),
    (["watch", "--once", "{ws}/flat.jsonl"], 2, ["5 record(s) without a \"data\" mapping"]),
    (["watch", "{ws}/never.jsonl", "--timeout", "0.5", "--interval", "0.1"], 2, ["never.jsonl never appeared",
                                                                                 "--timeout 0.5"]),
    (["watch", "--once", str(WATCH), "--val-key", "gsm8kk"], 2, ["--val-key 'gsm8kk'",
                                                                 "val-core/phantom_lab/acc/mean@1"]),
    (["watch", "--once", str(WATCH), "--interval", "nan"], 2, ["--interval", "'nan'"]),
    (["watch", "--once", str(WATCH), "--rows", "0"], 2, ["--rows", "'0'"]),
    (["exposure", "{ws}/rollouts.jsonl", "--outcome-threshold", "inf"], 2, ["--outcome-threshold", "'inf'"]),
    (["exposure", "{ws}/neglen.jsonl", "--outcome-threshold", "0"], 2, ["length column 'len'", "-3"]),
    (["exposure", "{ws}/rollouts.jsonl", "--grade", "--outcome-threshold", "0"], 2,
     ["--grade and --outcome-threshold"]),
    (["exposure", "{ws}/rollouts.jsonl", "--max-num-gen-batches", "-1"], 2, ["'-1'"]),
]

#: cases that import torch, the lab's sweeps, papermill or TRL (seconds each)
SLOW = [
    (["lab", "run", "--model", "tiny", "--runs-dir", "{ws}/a_file"], 2, ["{ws}/a_file is not a folder"]),
    (["lab", "run", "--model", "tiny", "--runs-dir", "{ws}/a_file/runs"], 2, ["{ws}/a_file is not a folder"]),
    (["lab", "run", "--model", "tiny", "--runs-dir", "/proc/phantom-runs"], 2, ["cannot create folders in /proc"]),
    (["lab", "run", "--name", "../x", "--runs-dir", "{ws}/runs"], 2, ["--name '../x'"]),
    (["lab", "run", "--name", "", "--runs-dir", "{ws}/runs"], 2, ["--name ''"]),
    (["lab", "run", "--steps", "2", "--set", "steps=1", "--runs-dir", "{ws}/runs"], 2,
     ["--steps 2 and --set steps=1"]),
    (["lab", "run", "--set", "prompts=1e23", "--runs-dir", "{ws}/runs"], 2, ["prompts='1e23'", "1 <= prompts"]),
    (["lab", "run", "--set", "prompts=100000", "--runs-dir", "{ws}/runs"], 2, ["prompts=100000 is out of range"]),
    (["lab", "run", "--set", "task=5", "--runs-dir", "{ws}/runs"], 2, ["task=5"]),
    (["lab", "run", "--set", "task={{terms: 5}}", "--runs-dir", "{ws}/runs"], 2, ["terms=5"]),
    (["lab", "run", "--set", "lr=nan", "--runs-dir", "{ws}/runs"], 2, ["lr='nan' is out of range"]),
    (["lab", "run", "--set", "seed=1", "--set", "seed=2", "--runs-dir", "{ws}/runs"], 2, ["seed= is given twice"]),
    (["lab", "sweep", "{ws}/unparsable.yaml", "--dry-run"], 2, ["unparsable.yaml:3: not valid YAML"]),
    (["lab", "sweep", "{ws}/list.yaml", "--runs-dir", "{ws}/runs"], 2, ["list.yaml:1: the top level is a list"]),
    (["lab", "sweep", "{ws}/group_list.yaml", "--runs-dir", "{ws}/runs"], 2,
     ["group_list.yaml:3: group 'g1' is a list"]),
    (["lab", "sweep", "{ws}/bad_cell.yaml", "--runs-dir", "{ws}/runs"], 2, ["bad_cell.yaml:3:", "lr=2"]),
    (["lab", "sweep", "{ws}/typo.yaml", "--runs-dir", "{ws}/runs"], 2, ["typo.yaml:2:", "unknown key 'group'"]),
    (["lab", "sweep", "{ws}/nowhere.yaml"], 2, ["nowhere.yaml", "does not exist"]),
    (["lab", "summary", "paper", "--csv", "{ws}/missing/dir/x.csv", "--runs-dir", "{ws}/runs"], 2,
     ["--csv {ws}/missing/dir/x.csv", "does not exist"]),
    (["lab", "summary", "paper", "--runs-dir", "{ws}/runs"], 2, ["no run of sweep 'paper'", "{ws}/runs"]),
    (["lab", "summary", "paper", "--runs-dir", str(HELDOUT)], 2, ["no run of sweep 'paper'"]),
    (["lab", "criteria", str(HELDOUT / "sweep.yaml"), "--runs-dir", str(HELDOUT), "--step", "100000"], 2,
     ["--step 100000 is beyond the runs' last step (100)", "allowed: 1..100"]),
    (["lab", "criteria", str(HELDOUT / "sweep.yaml"), "--runs-dir", "{ws}/runs"], 2, ["no finished run"]),
    (["data", "lab", "--out", "{ws}/a_file/sub"], 2, ["{ws}/a_file/sub", "Not a directory"]),
    (["trl", "table", "--runs-dir", "{ws}/runs"], 2, ["no finished TRL run under {ws}/runs"]),
    (["trl", "sweep", "--seeds", "0,x", "--dry-run"], 2, ["--seeds '0,x'", "'x' is not a seed"]),
    (["chapter", "run", "nope"], 2, ["'nope'"]),
    (["chapter", "run", "phantom_advantage", "-o", "{ws}/a_file/c.ipynb"], 2, ["{ws}/a_file is not a folder"]),
]


def _run_case(ws: Path, argv: list[str], code: int, needles: list[str]) -> None:
    fmt = {"ws": str(ws), "root": str(ROOT)}
    r = phantom(*(a.format(**fmt) for a in argv), cwd=ws)
    _check(r, code, [n.format(**fmt) for n in needles])
    assert not (ws / "runs").exists(), "a runs folder was made for input that was refused"


@pytest.mark.parametrize(("argv", "code", "needles"), FAST, ids=[" ".join(c[0])[:60] for c in FAST])
def test_bad_input_is_named_without_a_traceback(ws, argv, code, needles):
    _run_case(ws, argv, code, needles)


@slow
@pytest.mark.parametrize(("argv", "code", "needles"), SLOW, ids=[" ".join(c[0])[:60] for c in SLOW])
def test_bad_input_is_named_before_any_work(ws, argv, code, needles):
    _run_case(ws, argv, code, needles)


@slow
def test_a_value_the_chapter_refuses_is_bad_input_not_a_failed_claim(tmp_path):
    """`chapter run -p`: a value of the right type that the chapter's own check refuses exits 2 (1 means a claim
    failed)."""
    r = phantom("chapter", "run", "phantom_advantage", "-p", "group_size", "1", "-o", str(tmp_path / "c.ipynb"))
    _check(r, 2, ["refused a -p value", "group_size=1 is invalid"])


# --- a closed pipe (`| head`) --------------------------------------------------------------------
def _closed_pipe(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "phantom.cli", *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the command prints anything
    err = proc.stderr.read()
    return subprocess.CompletedProcess(args, proc.wait(timeout=600), "", err)


@pytest.mark.parametrize("args", [["watch", "--once", str(WATCH), "--rows", "100"]])
def test_a_closed_pipe_exits_quietly(args):
    r = _closed_pipe(*args)
    assert r.returncode == 141 and r.stderr == "", r.stderr[-2000:]


@slow
@pytest.mark.parametrize("args", [["chapter", "list"], ["verl", "presets"],
                                  ["lab", "summary", str(HELDOUT / "sweep.yaml"), "--runs-dir", str(HELDOUT)]])
def test_a_closed_pipe_exits_quietly_from_the_heavier_commands(args):
    r = _closed_pipe(*args)
    assert r.returncode == 141 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr[-2000:]


# --- Ctrl-C and a run in use ---------------------------------------------------------------------
def _wait_for(check, what: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    t0 = time.monotonic()
    while not check():
        if proc.poll() is not None:
            pytest.fail(f"the command ended before {what}: {proc.returncode}\n{proc.stderr.read()[-3000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def _sigint_default() -> None:
    """Ctrl-C as in a terminal: a runner that starts tests in the background (a shell's `&`) ignores SIGINT,
    and a child inherits that; Python installs its own handler only where SIGINT is at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@slow
def test_ctrl_c_during_rl_marks_the_run_interrupted_and_a_second_copy_is_refused(tmp_path):
    from phantom.lab.sft import artifacts_root, ensure_sft_model

    ensure_sft_model("tiny", progress=False)  # the warm start is not what this test times
    env = {**ENV, "PHANTOM_ARTIFACTS": str(artifacts_root().parent)}
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "phantom.cli", "lab", "run", "--model", "tiny", "--steps", "100000", "--threads", "1",
            "--set", "prompts=2", "--set", "rollouts=2", "--set", "eval_every=100000", "--set", "eval_n=2",
            "--runs-dir", str(runs), "--name", "long"]
    first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    metrics = runs / "long" / "metrics.jsonl"
    _wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 2, "step 1 was logged", first)

    second = phantom(*argv[3:], cwd=tmp_path, env=env)  # the same run, while the first trains it
    _check(second, 2, ["is marked running by pid", str(first.pid)])

    r = _interrupt(first)
    _check(r, 130, [f"phantom lab: interrupted (run folder {runs / 'long'} marked interrupted)"])
    assert sum("interrupted" in line for line in r.stderr.splitlines()) == 1
    manifest = json.loads((runs / "long" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["error"] == "interrupted (Ctrl-C)"
    assert not list(runs.rglob("*.lock")) and not list(runs.rglob("*.tmp"))


@slow
def test_ctrl_c_during_sft_leaves_no_half_built_checkpoint(tmp_path):
    art = tmp_path / "artifacts"
    # lab_base trains for minutes, so the interrupt lands inside the build however fast the machine is
    proc = subprocess.Popen([sys.executable, "-m", "phantom.cli", "lab", "sft", "--model", "lab_base"], cwd=tmp_path,
                            env={**ENV, "PHANTOM_ARTIFACTS": str(art)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_sigint_default)
    _wait_for(lambda: any((art / "lab").glob(".sft-lab_base-*.lock")), "the build took its lock", proc)
    time.sleep(1.0)  # into the build
    r = _interrupt(proc)
    _check(r, 130, ["phantom lab: interrupted"])
    assert not list((art / "lab").glob(".sft-*.tmp*")) and not list((art / "lab").glob("sft-lab_base-*"))


def test_ctrl_c_inside_a_string_exec_still_exits_130(tmp_path):
    """An interrupt that lands while a library runs ``exec(str)`` (CPython then marks it unhandled and
    would end the process by SIGINT at exit, returncode -2) still gives exit 130 through the policy."""
    code = ("import os, signal, sys\n"
            "from phantom import cli\n"
            "def main(rest):\n"
            "    exec('os.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass')\n"
            "sys.exit(cli.run_command('lab', main, []))\n")
    (tmp_path / "interrupted_in_exec.py").write_text(code)
    r = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path, capture_output=True, text=True,
                       env={**ENV, "PYTHONPATH": str(ROOT / "src")}, timeout=120, preexec_fn=_sigint_default)
    _check(r, 130, ["phantom lab: interrupted"])


# --- the policy itself ---------------------------------------------------------------------------
def _raising(exc: BaseException):
    def main(rest: list[str]) -> int:
        raise exc
    return main


def test_a_bug_shows_its_traceback_and_says_it_is_one(capsys):
    assert cli.run_command("lab", lambda rest: 1 // len(rest), []) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err and "this is a bug in phantom" in err


@pytest.mark.parametrize(("exc", "code", "needle"), [
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/x/file/sub"), 2, "/x/file/sub: Not a directory"),
    (PermissionError(errno.EACCES, "Permission denied", "/ro/runs"), 2, "/ro/runs: Permission denied"),
    (OSError(errno.EROFS, "Read-only file system", "/ro", None, "/ro/b"), 2, "/ro -> /ro/b: Read-only file system"),
    (ModuleNotFoundError("No module named 'trl'", name="trl"), 2, "pip install 'phantom[trl]'"),
    (ValueError("lam=2 is out of range; allowed: [0, 1)"), 2, "phantom lab: lam=2 is out of range"),
    (KeyboardInterrupt(), 130, "phantom lab: interrupted"),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), 141, ""),
])
def test_the_policy_maps_each_kind_of_exception(exc, code, needle, capsys):
    assert cli.run_command("lab", _raising(exc), []) == code
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == (1 if needle else 0)


def test_run_in_use_is_bad_input(capsys):
    from phantom.runs import RunInUse

    assert cli.run_command("lab", _raising(RunInUse("run /r is marked running by pid 7 on h")), []) == 2
    assert capsys.readouterr().err.strip() == "phantom lab: run /r is marked running by pid 7 on h"


# --- help --------------------------------------------------------------------------------------
HELP = [["lab"], ["lab", "task"], ["lab", "sft"], ["lab", "run"], ["lab", "sweep"], ["lab", "summary"],
        ["lab", "criteria"], ["lab", "list"], ["watch"], ["exposure"], ["chapter"], ["chapter", "run"],
        ["chapter", "list"], ["book"], ["book", "build"], ["trl"], ["trl", "sweep"], ["trl", "table"]]


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_every_screen_has_a_description_examples_and_exit_codes(argv, capsys):
    import importlib

    module, func = cli.COMMANDS[argv[0]][0].split(":")
    assert getattr(importlib.import_module(module), func)([*argv[1:], "--help"]) == 0
    out = capsys.readouterr().out
    usage, description = out.split("\n\n")[:2]
    assert usage.startswith(f"usage: phantom {' '.join(argv)}") and len(description.split()) >= 4, out
    assert "examples:\n  phantom " + argv[0] in out and "exit codes:\n  0    success" in out and "130" in out


def test_top_level_help_is_instant_and_imports_nothing_heavy():
    code = ("import sys; from phantom.cli import main; rc = main(['--help']); "
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'pandas', 'yaml'}); "
            "print(rc, heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "0 []", r.stdout + r.stderr


def test_the_old_spelling_of_model_still_works_with_a_note(capsys):
    from phantom.lab.cli import main

    assert main(["task", "--profile", "tiny", "--n", "1"]) == 0
    assert "--profile tiny is deprecated here; use --model tiny" in capsys.readouterr().err
    assert main(["task", "--profile", "tiny", "--model", "lab"]) == 2
    assert "name two SFT profiles" in capsys.readouterr().err


def test_the_allowed_values_the_help_lists_are_the_lab_s_own():
    from phantom.advantages import GATES
    from phantom.lab import cli as lab_cli
    from phantom.lab import sft, spec, sweep, task
    from phantom.rewards import KINDS

    assert lab_cli.ARMS == GATES and lab_cli.ESTIMATORS == spec.ESTIMATORS and lab_cli.KINDS == KINDS
    assert tuple(sft.PROFILES) == lab_cli.MODELS and lab_cli.RUN_PROFILES == sweep.PROFILES
    assert (lab_cli.SPLITS, lab_cli.WORDINGS, lab_cli.STYLES) == (task.SPLITS, task.WORDINGS, task.STYLES)


def test_a_one_answer_group_is_a_singleton_only(ws):
    import pandas as pd

    from phantom.audit.exposure import exposure

    df = pd.DataFrame([{"uid": "solo", "score": 0.2, "acc": 0}, {"uid": "a", "score": 0.1, "acc": 0},
                       {"uid": "a", "score": 0.3, "acc": 0}, {"uid": "b", "score": 0.9, "acc": 1},
                       {"uid": "b", "score": 0.1, "acc": 0}])
    e = exposure(df, outcome_col="acc")
    assert (e.groups, e.singletons, e.all_fail, e.all_pass, e.mixed, e.phantom) == (3, 1, 1, 0, 1, 1)
    fr = e.to_dict()["fractions"]
    assert fr["all_fail"] + fr["all_pass"] + fr["mixed"] + e.frac(e.singletons) == pytest.approx(1.0)


def test_file_lock_excludes_another_process_and_leaves_no_file(tmp_path):
    """phantom.runs.file_lock, the lock meant for the SFT build (sft.py still takes its own): Ctrl-C, or the end, leaves no
    empty .lock file; a process waiting on the removed file locks the path again."""
    from phantom.runs import file_lock

    lock, log = tmp_path / ".x.lock", tmp_path / "log"
    code = ("import sys, time; from phantom.runs import file_lock\n"
            "open(sys.argv[2], 'a').write('waiting\\n')\n"
            "with file_lock(sys.argv[1]):\n    open(sys.argv[2], 'a').write(f'locked {time.time()}\\n')\n")
    with file_lock(lock):
        assert lock.is_file()
        child = subprocess.Popen([sys.executable, "-c", code, str(lock), str(log)], env=ENV)
        deadline = time.monotonic() + 300
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the child asks for the lock now
        assert log.read_text() == "waiting\n"
        released = time.time()
    assert child.wait(timeout=60) == 0
    assert float(log.read_text().split()[-1]) >= released and not lock.exists()
    with pytest.raises(KeyboardInterrupt), file_lock(lock):
        raise KeyboardInterrupt
    assert not lock.exists()
