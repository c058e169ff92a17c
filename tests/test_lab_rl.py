"""The lab's RL loop on a tiny model: the real code path, its telemetry and its run-folder rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from phantom.lab import decode_kernel
from phantom.lab.dapo import no_contrast_groups
from phantom.lab.rl import VAL_ACC, VAL_LEN, Trainer, _eval0_key, gated_rows, run_arm
from phantom.lab.spec import ArmSpec
from phantom.runs import RunDir, read_metrics

TINY = dict(model="tiny", steps=3, prompts=4, rollouts=4, eval_n=8, eval_every=2, max_new=24)
EVERY_STEP = ["response_length/mean", "critic/score/mean", "phantom/acc/mean", "phantom/adv/abs_mean",
              "phantom/gen_batches", "timing_s/step", "phantom/groups/total", "phantom/frac/all_fail",
              "phantom/frac/phantom", "phantom/frac/zeroed", "phantom/frac/live", "phantom/train_sample",
              "actor/pg_loss", "actor/grad_norm"]
EVAL = [VAL_ACC, VAL_LEN, "phantom/sample", "phantom/val/acc_true"]


@pytest.fixture(scope="module")
def lab_env(tmp_path_factory):
    from phantom.lab.sft import ensure_sft_model

    art = tmp_path_factory.mktemp("artifacts")
    mp = pytest.MonkeyPatch()
    mp.setenv("PHANTOM_ARTIFACTS", str(art))
    ckpt = ensure_sft_model("tiny", progress=False)
    yield ckpt
    mp.undo()


pytestmark = pytest.mark.slow


def test_smoke_run_writes_contract_metrics(lab_env, tmp_path):
    run = run_arm({**TINY, "arm": "score"}, root=tmp_path, progress=False)
    m = run.manifest()
    assert m["status"] == "done" and m["kind"] == "lab"
    assert m["decode"] == ("torch" if os.environ.get("PHANTOM_DECODE") == "torch" or decode_kernel._compiler() is None
                           else "c")  # the tiny model's shape is one the kernel reproduces
    for key in ("arm", "estimator", "lam", "kind", "seed", "steps", "kl_coef", "noise_p", "sampling"):
        assert key in m["spec"]
    # which kind of CPU made the run (runs agree bit for bit only within one kind)
    import torch

    assert m["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert m["machine"]["cores"] == os.cpu_count() and m["machine"]["arch"]
    df = read_metrics(run.path)
    assert list(df.index) == [0, 1, 2, 3]
    assert df.loc[[0, 2, 3], VAL_ACC].notna().all() and np.isnan(df.loc[1, VAL_ACC])
    for key in EVERY_STEP:
        assert df.loc[1:, key].notna().all(), key
    for key in EVAL:
        assert key in df.columns
    assert (df.loc[1:, "phantom/groups/total"] == 4).all()
    lines = run.metrics_path.read_text().splitlines()
    assert all(set(json.loads(line)) == {"step", "data"} for line in lines)
    assert m["summary"]["start_acc"] == df.loc[0, VAL_ACC]


def test_runs_are_reproducible_and_reused(lab_env, tmp_path):
    a = run_arm({**TINY, "arm": "none", "seed": 3}, name="a", root=tmp_path, progress=False)
    b = run_arm({**TINY, "arm": "none", "seed": 3}, name="b", root=tmp_path, progress=False)
    cols = ["critic/score/mean", "actor/pg_loss", "phantom/train_sample"]
    assert read_metrics(a.path)[cols].equals(read_metrics(b.path)[cols])
    before = a.metrics_path.stat().st_mtime_ns
    again = run_arm({**TINY, "arm": "none", "seed": 3}, name="a", root=tmp_path, progress=False)
    assert again.path == a.path and a.metrics_path.stat().st_mtime_ns == before


def test_a_reused_run_says_so(lab_env, tmp_path, capsys):
    run_arm({**TINY, "arm": "none", "seed": 4}, name="r", root=tmp_path, progress=False)
    capsys.readouterr()
    run_arm({**TINY, "arm": "none", "seed": 4}, name="r", root=tmp_path, progress=True)
    assert f"reusing the finished run {tmp_path / 'r'}" in capsys.readouterr().err


def test_start_evaluation_cache_changes_nothing(lab_env, tmp_path, monkeypatch):
    """The step-0 evaluation is computed once per warm start and reused; a run that reads it logs
    exactly what a run that computed it logs (every value but timings), and the cache is keyed on
    what the evaluation depends on (here: the response cap)."""
    spec = {**TINY, "arm": "none", "seed": 5}
    key = lab_env.parent / "eval0" / lab_env.name / f"{_eval0_key(lab_env, ArmSpec.from_dict(spec))}.json"
    key.unlink(missing_ok=True)  # other tests of this module share the warm start
    monkeypatch.setenv("PHANTOM_EVAL0_CACHE", "0")
    ref = read_metrics(run_arm(spec, name="off", root=tmp_path, progress=False).path)
    assert not key.exists()
    monkeypatch.setenv("PHANTOM_EVAL0_CACHE", "1")
    first = read_metrics(run_arm(spec, name="fill", root=tmp_path, progress=False).path)
    assert key.is_file() and not (lab_env / "eval0").exists()  # in the cache, never in the checkpoint
    written = key.stat().st_mtime_ns
    hit = read_metrics(run_arm(spec, name="hit", root=tmp_path, progress=False).path)
    assert key.stat().st_mtime_ns == written
    cols = [c for c in ref.columns if not c.startswith("timing_s/")]
    assert ref[VAL_ACC].notna().sum() >= 2
    for df in (first, hit):
        pd.testing.assert_frame_equal(df[cols], ref[cols])
    assert _eval0_key(lab_env, ArmSpec.from_dict({**spec, "max_new": 20})) != key.stem
    assert _eval0_key(lab_env, ArmSpec.from_dict({**spec, "seed": 6, "arm": "outcome", "lam": 0.1})) == key.stem


def test_crash_leaves_failed_and_is_rerun(lab_env, tmp_path, monkeypatch):
    spec = {**TINY, "arm": "outcome"}
    orig = Trainer.step

    def boom(self, step):
        if step == 2:
            raise RuntimeError("simulated crash")
        return orig(self, step)

    monkeypatch.setattr(Trainer, "step", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_arm(spec, name="x", root=tmp_path, progress=False)
    run = RunDir(tmp_path / "x")
    assert run.status == "failed" and "simulated crash" in run.manifest()["error"]
    assert not run.done
    monkeypatch.setattr(Trainer, "step", orig)
    run = run_arm(spec, name="x", root=tmp_path, progress=False)
    assert run.status == "done"
    assert list(read_metrics(run.path).index) == [0, 1, 2, 3]  # re-run from scratch, no stale lines


def test_interrupt_leaves_interrupted(lab_env, tmp_path, monkeypatch):
    def interrupt(self, step):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "step", interrupt)
    with pytest.raises(KeyboardInterrupt) as caught:
        run_arm({**TINY, "arm": "none"}, name="k", root=tmp_path, progress=False)
    assert RunDir(tmp_path / "k").status == "interrupted"
    assert caught.value.__notes__ == [f"run folder {tmp_path / 'k'} marked interrupted"]  # phantom.cli's one line
    assert not RunDir(tmp_path / "k").check_startable(RunDir(tmp_path / "k").manifest()["spec"])  # re-run next time


def test_killed_run_stays_running_and_is_rerun(lab_env, tmp_path):
    """A process killed mid-run cannot mark itself failed: its folder says running with a dead pid."""
    code = ("import os, signal\nfrom phantom.lab.rl import Trainer, run_arm\n"
            "orig = Trainer.step\n"
            "def step(self, s):\n    if s == 2: os.kill(os.getpid(), signal.SIGKILL)\n    return orig(self, s)\n"
            "Trainer.step = step\n"
            f"run_arm({TINY!r}, name='killed', root={str(tmp_path)!r}, progress=False)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    run = RunDir(tmp_path / "killed")
    assert run.status == "running" and not run.done
    run = run_arm(TINY, name="killed", root=tmp_path, progress=False)
    assert run.status == "done" and list(read_metrics(run.path).index) == [0, 1, 2, 3]


def test_dapo_refill_direction_on_an_all_fail_policy(lab_env, tmp_path):
    """A policy that never passes: acc-filtering deletes every group and refills to the cap; score
    filtering keeps groups whose failures differ in length, so one generation batch suffices (§8)."""
    common = {**TINY, "steps": 2, "sampling": "dapo", "gen_prompts": 4, "max_gen_batches": 3}
    acc = read_metrics(run_arm({**common, "arm": "outcome"}, root=tmp_path, progress=False).path)
    score = read_metrics(run_arm({**common, "arm": "score"}, root=tmp_path, progress=False).path)
    # nothing survives the acc filter: no update, and no batch metrics logged as if a batch were trained
    assert (acc.loc[1:, "phantom/dapo/train_groups"] == 0).all() and (acc.loc[1:, "phantom/update_skipped"] == 1).all()
    for key in ("response_length/mean", "phantom/acc/mean", "critic/score/mean"):
        assert key not in acc or acc.loc[1:, key].isna().all()
    assert (acc.loc[1:, "phantom/gen_batches"] == 3).all()
    assert (acc.loc[1:, "phantom/dapo/exhausted"] == 1).all()
    assert (score.loc[1:, "phantom/gen_batches"] == 1).all()
    assert (score.loc[1:, "training/filter_groups/evicted_samples"] <= 4).all()
    assert (score.loc[1:, "phantom/dapo/train_groups"] == 4).all()


def test_no_contrast_groups_uses_exact_equality():
    group = np.array([5, 5, 5, 9, 9, 9, 2, 7, 7])
    metric = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 1e-12, 3.0, 0.5, 0.5])
    labels, delete = no_contrast_groups(group, metric)
    assert labels.tolist() == [5, 9, 2, 7]  # first-appearance order
    assert delete.tolist() == [True, False, False, True]  # singletons stay, as in verl


def _trainer_batch(lab_env, **kw):
    # one mini-batch: the gradient compared is then that of the restored weights (with two, the second
    # is taken after an Adam step whose moments carry over from call to call)
    spec = ArmSpec.from_dict({**TINY, "lam": 0.0, "mini_batches": 1, **kw})
    tr = Trainer(spec, lab_env)
    batch = tr.rollout(8, step=1)
    rng = np.random.default_rng(0)
    out = (rng.random(len(batch)) < 0.5).astype(float)
    out[:4] = 0.0  # one all-fail group
    out[4:8] = 1.0  # one all-pass group
    batch.outcome = batch.true_outcome = out
    batch.score = tr.shape(out, batch.chars, batch.chars, batch.texts)
    return tr, batch


def _grads(tr, batch, adv, live):
    """Gradient of one update; the weights are restored, so calls are independent."""
    state = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.update(batch, adv, live, step=1)
    grads = [p.grad.detach().clone() for p in tr.params]
    tr.model.load_state_dict(state)
    return grads


def test_rezeroing_binary_dead_groups_is_gradient_redundant(lab_env):
    """§10: at lam=0 the outcome gate zeroes only groups whose advantages are already 0."""
    tr, batch = _trainer_batch(lab_env, arm="outcome", grad_clip=1e6)
    a_none, _ = tr.advantages(batch, "none")
    a_gate, stats = tr.advantages(batch, "outcome")
    assert stats.zeroed >= 2
    np.testing.assert_array_equal(a_none, a_gate)
    g_none, g_gate = _grads(tr, batch, a_none, None), _grads(tr, batch, a_gate, None)
    for x, y in zip(g_none, g_gate):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("variant", [
    dict(),
    dict(estimator="gspo", loss_agg="seq-mean-token-mean", mini_batches=2),
    dict(estimator="drgrpo"),
])
def test_score_gate_zeroes_only_groups_with_zero_advantage(lab_env, variant):
    """Why the paper sweep runs the shaped-score arm only in its core cells: under advantage-zeroing the
    score gate zeroes groups whose shaped scores tie, whose centred scores (with or without the std
    divisor) are already zero, so its advantages and its update equal the no-filter arm's exactly."""
    tr, batch = _trainer_batch(lab_env, arm="score", lam=0.3, grad_clip=1e6, rollouts=5, **variant)
    n = tr.spec.rollouts
    batch.score[:n] = batch.score[0]  # one all-fail group whose shaped scores tie
    a_none, _ = tr.advantages(batch, "none")
    a_score, stats = tr.advantages(batch, "score")
    assert stats.zeroed >= 1 and (a_none[:n] == 0).all()
    assert np.abs(a_none).max() > 0
    np.testing.assert_array_equal(a_none, a_score)
    twin = Trainer(tr.spec, lab_env)  # fresh optimizer state: several mini-batches step in between
    tr.update(batch, a_none, None, step=1)
    twin.update(batch, a_score, None, step=1)
    for x, y in zip(tr.params, twin.params):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert any(p.grad is not None and p.grad.abs().max() > 0 for p in tr.params)


@pytest.mark.parametrize("norm", ["std", "none"])
@pytest.mark.parametrize("lam,cap", [(0.1, 512), (0.3, 512), (0.5, 512), (0.3, 64)])
def test_a_tied_group_of_five_has_exactly_zero_advantage(norm, lam, cap):
    """The identity above needs more than algebra: float32 must round the mean of a tie back to the
    tied score, or the no-filter arm gives the tie a spurious advantage of ulp / (ulp + eps) ~ 0.03
    that the score gate zeroes. At the sweeps' group size 5 and caps it holds for every length."""
    from phantom.advantages import group_advantages
    from phantom.rewards import shaped_reward

    lengths = np.arange(0, 2 * cap + 1, dtype=float)
    ties = shaped_reward("length_short", np.zeros_like(lengths), lengths, lam=lam, cap=cap).astype(np.float32)
    scores = np.repeat(ties, 5)
    adv, stats = group_advantages(scores, np.repeat(np.arange(len(ties)), 5), outcomes=np.zeros_like(scores),
                                  gate="none", norm=norm)
    assert stats.groups == len(ties)
    assert not np.any(adv), f"{np.count_nonzero(adv) // 5} tied groups got a nonzero advantage"


def test_mask_drop_rescales_token_mean(lab_env):
    """§10: dropping gated rows from the mask changes only the token-mean denominator (1/live_frac)."""
    tr, batch = _trainer_batch(lab_env, arm="outcome", grad_clip=1e6)
    adv, _ = tr.advantages(batch, "outcome")
    gated = gated_rows(batch.group, batch.score, batch.outcome, "outcome")
    assert gated.any() and not gated.all()
    assert (adv[gated] == 0).all()
    live = np.flatnonzero(~gated)
    tokens = np.array([len(r) for r in batch.response_ids])
    scale = tokens.sum() / tokens[live].sum()
    g_zero, g_mask = _grads(tr, batch, adv, None), _grads(tr, batch, adv, live)
    for x, y in zip(g_zero, g_mask):
        torch.testing.assert_close(y, x * scale, rtol=1e-4, atol=1e-5 * float(x.abs().max()) + 1e-12)
    assert any(x.abs().max() > 0 for x in g_zero)


def test_noisy_verifier_telemetry(lab_env, tmp_path):
    run = run_arm({**TINY, "arm": "outcome", "noise_p": 0.15}, root=tmp_path, progress=False)
    df = read_metrics(run.path)
    assert "phantom/val/acc_denoised" in df and "phantom/noise/flip_rate" in df
    ev = df[df[VAL_ACC].notna()]
    np.testing.assert_allclose(ev["phantom/val/acc_denoised"], (ev[VAL_ACC] - 0.15) / 0.7)


@pytest.mark.parametrize("variant", [
    dict(arm="outcome"),  # token-mean, one mini-batch
    dict(arm="outcome", estimator="gspo", loss_agg="seq-mean-token-mean", mini_batches=2),  # live ratio
    dict(arm="outcome", kl_coef=0.05),  # KL: nothing may be skipped
])
def test_skipping_zero_advantage_rows_changes_no_parameter(lab_env, variant):
    """The update leaves zero-advantage rows out of the forward/backward but keeps them in the
    aggregation's denominator: after a step the adapters equal the full computation's."""
    spec = ArmSpec.from_dict({**TINY, "prompts": 8, **variant})
    a, b = Trainer(spec, lab_env), Trainer(spec, lab_env)
    b.skip_zero_rows = False
    batch = a.rollout(8, step=1)
    adv, _ = a.advantages(batch, "outcome")
    adv[: 2 * spec.rollouts] = 0.0  # at least two dead groups, whatever the tiny model sampled
    adv[2 * spec.rollouts: 3 * spec.rollouts] += 0.5  # and one live one
    ma, mb = a.update(batch, adv, None, step=1), b.update(batch, adv, None, step=1)
    skipped = ma["phantom/update/rows_scored"] < mb["phantom/update/rows_scored"]
    assert skipped == (variant.get("kl_coef", 0) == 0)
    for pa, pb in zip(a.params, b.params):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-6)  # float sums in another order
    assert ma["actor/pg_loss"] == pytest.approx(mb["actor/pg_loss"], rel=1e-4, abs=1e-7)
    # a mini-batch with no live row still takes Adam's step (momentum), as the full computation does
    zero = np.zeros_like(adv)
    a.update(batch, zero, None, step=2), b.update(batch, zero, None, step=2)
    for pa, pb in zip(a.params, b.params):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-6)  # float sums in another order


@pytest.mark.parametrize("variant", [dict(mini_batches=2), dict(mini_batches=2, ppo_epochs=2),
                                     dict(estimator="gspo", loss_agg="seq-mean-token-mean", mini_batches=4)])
def test_first_mini_batch_takes_its_old_logprobs_from_its_own_forward(lab_env, variant):
    """With several mini-batches the update needs the pre-update log-probs of every row. The first
    mini-batch's are read off its own training forward (the weights have not moved yet) instead of a
    separate no-grad pass: exactly the same numbers, so the same update, bit for bit."""
    spec = ArmSpec.from_dict({**TINY, "prompts": 8, "arm": "none", **variant})
    a, b = Trainer(spec, lab_env), Trainer(spec, lab_env)
    batch = a.rollout(8, step=1)
    p, r = batch.prompt_ids, batch.response_ids
    with torch.no_grad():
        separate = a.model.response_logprobs(p, r, pad_id=a.tok.pad_id)[0]
    own = a.model.response_logprobs(p, r, pad_id=a.tok.pad_id, with_entropy=True)[0]
    assert torch.equal(separate, own.detach())  # the premise: grad mode changes no value
    adv, _ = a.advantages(batch, "none")
    calls: list[int] = []
    orig = b.model.response_logprobs
    b.model.response_logprobs = lambda *x, **k: calls.append(torch.is_grad_enabled()) or orig(*x, **k)
    ma, mb = a.update(batch, adv, None, step=1), b.update(batch, adv, None, step=1)
    for pa, pb in zip(a.params, b.params):
        assert torch.equal(pa, pb)
    assert ma == mb
    # no-grad passes only for the mini-batches after the first; one training forward each per epoch
    assert calls.count(False) == spec.mini_batches - 1
    assert calls.count(True) == spec.mini_batches * spec.ppo_epochs
