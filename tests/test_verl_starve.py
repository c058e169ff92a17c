"""The refill bound (phantom.verl.starve): a step over the bound raises, a finished starved run is reused."""

import json

import pytest

from phantom.runs import RunDir
from phantom.verl.starve import RefillGuard, Starved


def _append(path, *recs, partial=""):
    with path.open("a") as fh:
        for step, n in recs:
            fh.write(json.dumps({"step": step, "requests": n, "seconds": 0.1, "tokens": 10 * n}) + "\n")
        fh.write(partial)


def test_guard_counts_per_step_and_raises_past_the_bound(tmp_path):
    log = tmp_path / "rollout.jsonl"
    guard = RefillGuard(log, batches=2, per_batch=160, val=256)  # limit 2*160 + 256 = 576
    guard.check()  # no file yet: nothing to do
    _append(log, (0, 256), (1, 160), (1, 160), (2, 160))
    guard.check()
    assert guard.counts == {0: 256, 1: 320, 2: 160}
    _append(log, (2, 160), (2, 256), partial='{"step": 2, "requ')  # 576: at the bound, not past it
    guard.check()
    assert guard.counts[2] == 576
    with log.open("a") as fh:  # the half-written line completes: 736 > 576
        fh.write('ests": 160}\n')
    with pytest.raises(Starved) as exc:
        guard.check()
    assert (exc.value.step, exc.value.sequences, exc.value.limit) == (2, 736, 576)
    assert "step 2 generated 736 sequences" in str(exc.value)


def test_guard_rejects_a_bound_below_one(tmp_path):
    with pytest.raises(ValueError, match="starve_batches=0 is invalid"):
        RefillGuard(tmp_path / "r.jsonl", batches=0, per_batch=160)


def test_a_starved_run_is_finished_and_reused(tmp_path):
    run = RunDir.start("r", {"a": 1}, kind="verl", root=tmp_path)
    run.finish("starved", starved={"step": 3, "sequences": 900, "limit": 576})
    assert run.finished and not run.done
    assert run.check_startable({"a": 1})  # reused, not re-run


def test_sweep_refuses_a_negative_bound(capsys):
    from phantom.verl.sweep import main

    assert main(["--starve-batches", "-1", "--dry-run"]) == 2
    assert "--starve-batches -1 is invalid" in capsys.readouterr().err


def test_sigterm_runs_the_same_clean_up_as_ctrl_c():
    """A `kill` of a sweep or launcher raises KeyboardInterrupt where its clean-up (stop verl, stop the Ray head)
    runs; outside the block SIGTERM is what it was."""
    import os
    import signal

    from phantom.verl.cluster import term_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(KeyboardInterrupt), term_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        finally:
            cleaned.append(True)
    assert cleaned == [True] and signal.getsignal(signal.SIGTERM) is before


def test_a_bad_bound_is_refused_before_anything_is_written(tmp_path, capsys):
    from phantom.verl.launch import main

    runs = tmp_path / "runs"
    assert main(["run", "--starve-batches", "0", "--runs-dir", str(runs)]) == 2
    assert "starve_batches=0 is invalid; allowed: an integer >= 1" in capsys.readouterr().err
    assert not runs.exists()
