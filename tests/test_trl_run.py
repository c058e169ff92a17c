"""A real 2-step TRL GRPOTrainer run on CPU with the gate and the callback, through the sweep's
papermill notebook (notebooks/trl_arm.py), read back by phantom.runs and `phantom watch`."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from phantom.runs import iter_runs, read_metrics  # noqa: E402
from phantom.trl.sweep import endpoints, expand, run_sweep  # noqa: E402


@pytest.fixture(scope="module")
def gated_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-runs")
    (run,) = run_sweep("quick", arms=["outcome"], runs_dir=root, progress=False)
    return root, run


@pytest.mark.slow
def test_two_step_gated_trl_run_writes_phantom_keys(gated_run):
    tmp_path, run = gated_run
    m = run.manifest()
    assert m["status"] == "done" and m["kind"] == "trl" and m["gate"] == "outcome"
    assert m["trl_versions"]["trl"] == "1.16.0"
    assert m["trl_config"]["num_generations"] == 4 and m["trl_config"]["scale_rewards"] == "group"
    # two optimizer steps per generation batch (the lab's mini-batches), logged as one training step each
    assert (m["trl_config"]["steps_per_generation"], m["trl_config"]["max_steps"]) == (2, 4)
    assert (run.path / "trl_arm.ipynb").is_file() and (run.path / "stdout.log").is_file()
    df = read_metrics(run.path)
    assert list(df.index) == [0, 1, 2]
    assert "val-core/phantom_lab/acc/mean@1" in df and df["val-core/phantom_lab/acc/mean@1"].notna().all()
    for key in ("phantom/groups/total", "phantom/frac/all_fail", "phantom/frac/all_pass", "phantom/frac/mixed",
                "phantom/frac/phantom", "phantom/groups/zeroed", "phantom/frac/live", "phantom/acc/mean",
                "critic/score/mean", "response_length/mean", "timing_s/step", "trl/loss",
                "trl/frac_reward_zero_std"):
        assert df.loc[[1, 2], key].notna().all(), key
    assert (df.loc[[1, 2], "phantom/groups/total"] == 4).all()
    # every group the gate zeroed is one TRL's own std check now sees as flat
    zeroed = df.loc[[1, 2], "phantom/frac/zeroed"]
    assert (df.loc[[1, 2], "trl/frac_reward_zero_std"] >= zeroed - 1e-9).all()
    # the tiny checkpoint fails everything: the gate zeroes every group, so TRL's update is exactly nothing
    if (zeroed == 1).all():
        assert (df.loc[[1, 2], "trl/grad_norm"] == 0).all()
    assert [r.name for r in iter_runs(tmp_path)] == [run.name]
    (row,) = endpoints(tmp_path)
    assert row["arm"] == "outcome" and row["start_acc"] is not None and row["seconds_per_step"] > 0
    # re-running the sweep reuses the finished folder
    (again,) = run_sweep("quick", arms=["outcome"], runs_dir=tmp_path, progress=False)
    assert again.manifest()["finished"] == m["finished"]


@pytest.mark.slow
def test_watch_reads_a_trl_run(gated_run, capsys):
    from phantom.audit.watch import main as watch

    _, run = gated_run
    rc = watch([str(run.path / "metrics.jsonl"), "--once"])
    out = capsys.readouterr().out
    assert rc in (0, 1)
    assert "all-fail" in out and "phantom" in out


def test_sweep_cells():
    cells = expand("full")
    assert [(c.arm, c.seed) for c in cells] == [(a, s) for s in (0, 1, 2) for a in ("none", "drgrpo", "outcome")]
    assert {c.scale_rewards for c in cells} == {"group", "none"} and all(c.model == "lab_graded" for c in cells)
    assert len({c.run_name() for c in cells}) == 9 and {(c.lr, c.mini_batches) for c in cells} == {(2e-3, 2)}
    from phantom.lab.sft import resolve_sft

    for model in ("lab_graded", "quick"):  # the task always comes with the lab profile (redo on a new lab default)
        assert expand("full", model=model)[0].to_dict()["task"] == resolve_sft(model).task.to_dict()
    with pytest.raises(ValueError, match="arms \\['dapo'\\] are unknown"):
        expand("full", arms=["dapo"])
    with pytest.raises(ValueError, match="profile='paper' is unknown"):
        expand("paper")
