"""phantom watch: following a growing metrics.jsonl and warning on length before accuracy.

metrics_collapse.jsonl and metrics_healthy.jsonl are CONSTRUCTED fixtures in verl's file-logger
format with the lab's keys (tests/fixtures/audit/make_fixtures.py), not recordings of a run: the
collapse file's length decays from step 4 and its validation accuracy drops at step 15, and the
file ends in a torn line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantom.audit.watch import MetricsTail, detect, follow, indicators, main, render

FIX = Path(__file__).parent / "fixtures" / "audit"


def line(step: int, **data) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def test_once_on_a_collapse_warns_on_length_before_accuracy(capsys):
    assert main([str(FIX / "metrics_collapse.jsonl"), "--once", "--color", "never"]) == 1
    out = capsys.readouterr().out
    length_at = out.index("WARNING [length]")
    acc_at = out.index("WARNING [accuracy]")
    assert length_at < acc_at and "LEADING INDICATOR" in out and "last line incomplete" in out
    tail = MetricsTail(FIX / "metrics_collapse.jsonl")
    tail.poll()
    alerts = {a.kind: a for a in detect(indicators(tail.rows)[0])}
    assert alerts["length"].step < alerts["accuracy"].step == 15
    assert "has not dropped yet" in alerts["length"].message


def test_once_on_a_healthy_run_is_quiet(capsys):
    assert main([str(FIX / "metrics_healthy.jsonl"), "--once", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "WARNING" not in out and "val acc" in out and "refill" in out


def test_threshold_controls_the_length_warning():
    tail = MetricsTail(FIX / "metrics_collapse.jsonl")
    tail.poll()
    table, _ = indicators(tail.rows)
    early = next(a for a in detect(table, length_drop=0.2) if a.kind == "length")
    late = next(a for a in detect(table, length_drop=0.8) if a.kind == "length")
    assert early.step < late.step
    assert "already dropped" in late.message  # at 80% the accuracy alarm came first


def test_tail_handles_torn_lines_bad_lines_and_truncation(tmp_path):
    p = tmp_path / "metrics.jsonl"
    tail = MetricsTail(p)
    assert tail.poll() is False  # the file does not exist yet
    p.write_text(line(0, **{"val-core/openai/gsm8k/acc/mean@4": 0.5}) + '{"step": 1, "data": {"response_le')
    assert tail.poll() is True and sorted(tail.rows) == [0] and tail.torn
    with p.open("a") as fh:
        fh.write('ngth/mean": 200.0}}\nnot json\n' + line(2, **{"response_length/mean": 190.0}))
    assert tail.poll() is True and sorted(tail.rows) == [0, 1, 2] and not tail.torn
    assert tail.rows[1]["response_length/mean"] == 200.0 and tail.bad_lines == 1
    table, source = indicators(tail.rows)
    assert source["val_acc"] == "val-core/openai/gsm8k/acc/mean@4"  # verl's key, matched by pattern
    p.write_text(line(0, **{"response_length/mean": 10.0}))  # verl reopens with "wb" on restart
    tail.poll()
    assert sorted(tail.rows) == [0] and tail.rows[0] == {"response_length/mean": 10.0}


def test_lines_of_one_step_are_merged(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(line(5, **{"response_length/mean": 100.0}) + line(5, **{"val-core/x/acc/mean@1": 0.4}))
    tail = MetricsTail(p)
    tail.poll()
    assert tail.rows[5] == {"response_length/mean": 100.0, "val-core/x/acc/mean@1": 0.4}


def test_follow_waits_for_the_file_and_redraws_as_it_grows(tmp_path):
    p = tmp_path / "run" / "metrics.jsonl"
    p.parent.mkdir()
    src = (FIX / "metrics_collapse.jsonl").read_text().splitlines(keepends=True)[:21]
    emitted: list[str] = []
    now = [0.0]
    chunks = iter([src[:5], src[5:12], src[12:]])

    def sleep(dt: float) -> None:  # each tick the run writes a few more steps
        now[0] += dt
        chunk = next(chunks, None)
        if chunk is not None:
            with p.open("a") as fh:
                fh.writelines(chunk)

    opts = {"val_key": None, "length_drop": 0.3, "acc_drop": 0.1, "rows": 50, "color": False}
    res = follow(MetricsTail(p), interval=1.0, emit=emitted.append, opts=opts, timeout=5.0, sleep=sleep,
                 clock=lambda: now[0])
    assert emitted[0].startswith("waiting for")
    tables = [e for e in emitted if e.startswith("phantom watch")]
    assert len(tables) == 3 and "(5 steps" in tables[0] and "(21 steps" in tables[-1]
    assert "WARNING [length]" not in tables[0] and "WARNING [length]" in tables[-1]
    assert res.steps == 21 and {a.kind for a in res.alerts} >= {"length", "accuracy"}


def test_follow_stops_when_the_run_is_done(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text((FIX / "metrics_healthy.jsonl").read_text())
    (run / "manifest.json").write_text(json.dumps({"status": "done"}))
    opts = {"val_key": None, "length_drop": 0.3, "acc_drop": 0.1, "rows": 5, "color": False}
    out: list[str] = []
    res = follow(MetricsTail(run), interval=1.0, emit=out.append, opts=opts, until_done=True,
                 sleep=lambda _: pytest.fail("should not sleep"))
    assert res.steps == 31 and len(out) == 1


def test_render_colors_and_plain():
    tail = MetricsTail(FIX / "metrics_collapse.jsonl")
    tail.poll()
    table, source = indicators(tail.rows)
    alerts = detect(table)
    plain = render(table, source, alerts, rows=5)
    assert "\x1b[" not in plain and len([ln for ln in plain.splitlines() if ln.strip()[:2].isdigit()]) == 5
    assert "\x1b[33m" in render(table, source, alerts, rows=40, color=True)  # the length-warning row


@pytest.mark.parametrize("args, needle", [
    (["/nonexistent/metrics.jsonl", "--once"], "no such file"),
    (["{empty}", "--once"], "no complete"),
    (["{healthy}", "--once", "--length-drop", "1.5"], "--length-drop"),
])
def test_cli_errors_exit_2(tmp_path, capsys, args, needle):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"step": 0, "data": ')
    args = [a.format(empty=empty, healthy=FIX / "metrics_healthy.jsonl") for a in args]
    assert main(args) == 2
    assert needle in capsys.readouterr().err


# --- recorded lab runs (tests/fixtures/watch/README.md) -----------------------------------------
REC = Path(__file__).parent / "fixtures" / "watch"


def test_recorded_lab_collapse_warns_on_both_and_says_accuracy_came_first(capsys):
    """On the lab's real collapse the length warning comes *after* the accuracy alarm, and says so."""
    assert main([str(REC / "lab_none_s0.jsonl"), "--once", "--color", "never"]) == 1
    out = capsys.readouterr().out
    assert "WARNING [length]" in out and "WARNING [accuracy]" in out
    tail = MetricsTail(REC / "lab_none_s0.jsonl")
    tail.poll()
    table, source = indicators(tail.rows)
    assert source["val_acc"] == "val-core/phantom_lab/acc/mean@1" and source["length"] == "response_length/mean"
    alerts = {a.kind: a for a in detect(table)}
    assert alerts["accuracy"].step <= alerts["length"].step
    assert "already dropped" in alerts["length"].message and "LEADING" not in alerts["length"].message


def test_recorded_outcome_arm_gets_no_length_warning(capsys):
    main([str(REC / "lab_outcome_s0.jsonl"), "--once", "--color", "never"])
    out = capsys.readouterr().out
    assert "WARNING [length]" not in out and "val acc" in out


def test_recorded_worked_answer_collapse_warns_on_length_first(capsys):
    """On a collapse of the worked-answer lab (prose to remove) the paper's order holds: `--once` prints
    the length warning as a leading indicator at a step before the accuracy drop."""
    assert main([str(REC / "lab_worked_none_s0.jsonl"), "--once", "--color", "never"]) == 1
    out = capsys.readouterr().out
    assert out.index("WARNING [length] LEADING INDICATOR") < out.index("WARNING [accuracy]")
    tail = MetricsTail(REC / "lab_worked_none_s0.jsonl")
    tail.poll()
    alerts = {a.kind: a for a in detect(indicators(tail.rows)[0])}
    assert alerts["length"].step < alerts["accuracy"].step
    assert "has not dropped yet" in alerts["length"].message
    assert f"length warned {alerts['accuracy'].step - alerts['length'].step} step(s) earlier" in out


@pytest.mark.parametrize("folder, least", [("lab_warmstarts_long_2e-3", 23), ("lab_paper", 15),
                                           ("lab_graded_2e-3", 23)])
def test_committed_main_setting_collapses_warn_on_length_first(capsys, folder, least):
    """The lab's collapses, read where their runs are committed: the book's `paper` sweep (its no-filter GRPO
    cells: core, lambda, difficulty, three seeds each), the same setting on eight warm starts (validated at
    every step), and the earlier worked answers run for 100 steps on eight warm starts. On every no-filter
    run whose held-out length fell before its accuracy, `phantom watch --once` prints the length warning
    as a leading indicator at an earlier step than the accuracy drop."""
    from phantom.dynamics import run_dynamics
    from phantom.runs import iter_runs

    root = Path(__file__).resolve().parents[1] / "data" / "runs" / folder
    checked = 0
    for run in iter_runs(root, arm="none", estimator="grpo"):
        if run_dynamics(run.path)["order"] != "length first":
            continue
        assert main([str(run.metrics_path), "--once", "--color", "never"]) == 1
        out = capsys.readouterr().out
        assert out.index("WARNING [length] LEADING INDICATOR") < out.index("WARNING [accuracy]"), run.name
        tail = MetricsTail(run.metrics_path)
        tail.poll()
        alerts = {a.kind: a for a in detect(indicators(tail.rows)[0])}
        assert alerts["length"].step < alerts["accuracy"].step, run.name
        checked += 1
    assert checked >= least  # counted on the committed folders (see data/runs/README.md)
