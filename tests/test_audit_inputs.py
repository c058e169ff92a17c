"""Robust readers: no traceback on any input, a separate exit code for the audit's own bugs, a size guard.

Inputs people feed the audit by accident or by paste: a 50 MB file, a binary, NUL bytes, colour
codes, random text in every supported suffix, YAML nested a thousand levels deep, a batch where one
input breaks. None may raise; an internal error is exit 3 with the input named, and the other
inputs of the batch are still reported.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phantom.audit import audit, main
from phantom.audit.text import MAX_BYTES, clean_text


def test_size_guard_refuses_a_50_mb_file_before_reading_it(tmp_path, capsys):
    big = tmp_path / "checkpoint_index.yaml"
    with big.open("wb") as fh:  # sparse: the guard must not need to read it
        fh.truncate(50 * 1024 * 1024)
    assert main([str(big)]) == 2
    out = capsys.readouterr().out
    assert "50.0 MiB" in out and f"{MAX_BYTES // 1024} KiB" in out


def test_binary_and_empty_files(tmp_path):
    b = tmp_path / "model.sh"
    b.write_bytes(b"\x00\x01" * 5000)
    e = tmp_path / "empty.yaml"
    e.write_text("\n\n")
    rep = audit([str(b), str(e)])
    assert rep.exit_code == 2
    assert "binary" in str(rep.inputs[0].error) and "empty" in str(rep.inputs[1].error)


def test_clean_text_counts_what_it_removed():
    text, notes = clean_text("\ufeffa: 1\r\nb: \x1b[31mred\x1b[0m\x00\r\n")
    assert text == "a: 1\nb: red\n"
    assert notes.bom and notes.crlf_lines == 2 and notes.ansi == 2 and notes.control == 1
    assert notes.first_line == {"ansi": 2, "control": 2}


def test_deeply_nested_yaml_is_an_input_error(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("algorithm:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 120)) + "  " * 120 + "x: 1\n")
    rep = audit([str(p)])
    assert rep.exit_code == 2 and "nests" in str(rep.inputs[0].error)


def test_internal_error_is_exit_3_and_the_batch_goes_on(monkeypatch, capsys):
    import phantom.audit as audit_pkg

    fix = Path(__file__).parent / "fixtures" / "audit"

    def boom(*a, **k):
        raise KeyError("simulated bug")

    monkeypatch.setattr(audit_pkg, "verl_findings", boom)
    code = main([str(fix / "verl_dapo_score.sh"), str(fix / "trl_grpo_multi.yaml"), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3 == out["exit_code"]
    first, second = out["inputs"]
    assert first["error"]["internal"] is True and "verl_dapo_score.sh" in first["error"]["text"]
    assert "simulated bug" in first["error"]["message"]
    assert {f["rule"] for f in second["findings"]} == {"PH020", "PH021"}  # the other input is still audited


SUFFIXES = [".sh", ".yaml", ".json", ".py", ".txt", ".yml", ""]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400),
       suffix=st.sampled_from(SUFFIXES),
       prefix=st.sampled_from(["", "python3 -m verl.trainer.main_ppo ", "algorithm:\n  ", "trl grpo --",
                               "ARGS=(\n", "reward_funcs: [", "GRPOConfig(", "#!/bin/bash\nif [ x ]; then\n",
                               "python3 -m verl.trainer.main config=", "swift rlhf --rlhf_type grpo --reward_funcs ",
                               "python3 -m openrlhf.cli.train_ppo_ray --algo.advantage.estimator ",
                               "python -m oat.experiment.run_math_rl --critic_type ",
                               "python3 -m recipe.entropy.main_entropy reward_model.", "defaults: a.yaml\ngrpo:\n  ",
                               "worker:\n  reward:\n    reward_function: ", "RLOOTrainer(reward_funcs=[",
                               "def f(c):\n    return [len(x) for x in c]\nGRPOTrainer(reward_funcs=[f, "]))
def test_no_input_makes_the_audit_raise(tmp_path_factory, text, suffix, prefix):
    p = tmp_path_factory.mktemp("fuzz") / f"input{suffix}"
    p.write_text(prefix + text, encoding="utf-8", errors="surrogatepass")
    rep = audit([str(p)])
    assert rep.exit_code in (0, 1, 2), [str(r.error) for r in rep.inputs]


def test_characters_that_crash_the_bash_grammar_are_read_as_written():
    """tree-sitter-bash 0.25.1 segfaults on a word like ``x{<U+DDA15>m`` (found by the fuzz test above):
    the reader hands the parser a stand-in of the same byte length and keeps the original text. Run in
    subprocesses, so that a regression fails this test instead of killing the test run."""
    import subprocess
    import sys

    code = (
        "from phantom.audit.bash import interpret\n"
        "chars = [chr(c) for c in range(0x20000, 0x110000, 0x101)] + ['\\U000dda15', '\\U0010fffd']\n"
        "for ch in chars:\n"
        "    for form in ('x{{{ch}m', 'echo x{{{ch}m\\n', 'python3 -m verl.trainer.main_ppo x{{{ch}m "
        "data.train_files=a{ch}.parquet\\n'):\n"
        "        s = interpret(form.format(ch=ch))\n"
        "    words = [f.text for c in s.commands for f in c.argv]\n"
        "    assert f'data.train_files=a{ch}.parquet' in words, words\n"
        "print('ok', len(chars))\n")
    for _ in range(3):  # the unguarded crash depends on memory layout: ~60% of processes hit it
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith("ok"), (proc.returncode, proc.stderr[-2000:])
