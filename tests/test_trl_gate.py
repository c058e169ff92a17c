"""phantom.trl's gate against TRL's own advantage computation (the pinned TRL's real trainer).

Each case builds a real ``GRPOTrainer`` on the tiny lab checkpoint whose ``rollout_func`` (TRL's
own extension point for custom generation) returns a planned batch of completions, and calls the
trainer's ``_generate_and_score_completions``: TRL calls the reward functions, sums them with
``reward_weights``, normalizes per ``scale_rewards`` mode and returns the advantages it trains on.
Those are compared with :func:`phantom.advantages.group_advantages` on the raw shaped reward.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from phantom.advantages import group_advantages  # noqa: E402
from phantom.lab.sft import ensure_sft_model  # noqa: E402
from phantom.trl import outcome_gated  # noqa: E402
from phantom.trl.callback import record_metrics, trl_advantages  # noqa: E402
from phantom.trl.gate import TRL_EPS, observed  # noqa: E402
from phantom.trl.lab import LengthPenalty, accuracy_reward  # noqa: E402

G = 4
PROMPTS = 8
#: per group: the outcome of each member (None = the outcome function cannot tell)
PLAN = [
    [0, 0, 0, 0],  # all fail, spread in length: the phantom
    [0, 0, 0, 0],
    [1, 1, 1, 1],  # all pass, spread in length
    [1, 0, 0, 1],  # mixed
    [0, 1, 1, 1],
    [1, 0, 0, 0],
    [0, 0, 0, 0],
    [1, 1, 0, 1],
]


@pytest.fixture(scope="module")
def ckpt():
    return ensure_sft_model("tiny", progress=False)


@pytest.fixture(scope="module")
def tok(ckpt):
    t = AutoTokenizer.from_pretrained(ckpt)
    t.padding_side = "left"
    return t


def _batch(seed: int = 0, plan=PLAN):
    rng = np.random.default_rng(seed)
    prompts, answers, texts = [], [], []
    for i, outcomes in enumerate(plan):
        a = 10 + i
        for o in outcomes:
            steps = "\n".join(f"{j}+1={j + 1}" for j in range(int(rng.integers(0, 12))))
            texts.append(f"{steps}\n#### {a if o else a + 1}")
            prompts.append(f"Q: {i}+10\n")
            answers.append(a)
    return prompts, answers, texts


def _trainer(ckpt, tok, reward_funcs, texts, *, scale_rewards="group", weights=None,
             aggregation="sum_then_normalize"):
    plan = {"texts": texts}

    def rollout(prompts, trainer):
        assert len(prompts) == len(plan["texts"])
        return {"prompt_ids": [tok(p)["input_ids"] for p in prompts],
                "completion_ids": [tok(t)["input_ids"] + [tok.eos_token_id] for t in plan["texts"]],
                "logprobs": None}

    args = GRPOConfig(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "phantom-trl-eq"),
                      num_generations=G, per_device_train_batch_size=len(texts), max_steps=1, report_to=[],
                      use_cpu=True, scale_rewards=scale_rewards, reward_weights=weights, save_strategy="no",
                      multi_objective_aggregation=aggregation, disable_tqdm=True)
    n = len(texts) // G
    ds = Dataset.from_dict({"prompt": [f"Q: {i}+10\n" for i in range(n)], "answer": [10 + i for i in range(n)]})
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tr = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=ds, processing_class=tok,
                     rollout_func=rollout)
    tr.model.train()
    return tr


def _trl_advantages(tr, prompts, answers):
    inputs = [{"prompt": p, "answer": a} for p, a in zip(prompts, answers)]
    out = tr._generate_and_score_completions(inputs)
    return out["advantages"].detach().numpy().astype(np.float64)


def _raw(texts, answers, lam=0.3, weights=(1.0, 1.0)):
    """The raw reward terms and their weighted sum in float32, as TRL sums them."""
    acc = np.array(accuracy_reward(texts, answers), dtype=np.float32)
    pen = np.array(LengthPenalty(lam)(texts), dtype=np.float32)
    w = np.asarray(weights, dtype=np.float32)
    return acc, (acc * w[0] + pen * w[1]).astype(np.float32)


GID = np.repeat(np.arange(PROMPTS), G)
GATED = np.repeat([len(set(g)) == 1 for g in PLAN], G)


@pytest.mark.slow
@pytest.mark.parametrize("weights", [None, [0.7, 0.3]])
@pytest.mark.parametrize("mode", ["group", "none"])
def test_trl_advantages_with_wrapper_equal_outcome_gate(ckpt, tok, mode, weights):
    prompts, answers, texts = _batch()
    rf = outcome_gated(accuracy_reward, LengthPenalty(0.3), num_generations=G)
    tr = _trainer(ckpt, tok, rf, texts, scale_rewards=mode, weights=weights)
    adv = _trl_advantages(tr, prompts, answers)
    acc, score = _raw(texts, answers, weights=weights or (1.0, 1.0))
    ref, stats = group_advantages(score, GID, outcomes=acc, gate="outcome", norm="std" if mode == "group" else "none",
                                  eps=TRL_EPS)
    assert stats.zeroed == 4 and stats.phantom == 3 and stats.mixed == 4
    assert np.all(adv[GATED] == 0.0)  # exactly, for any reward weights
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-6)
    assert np.abs(adv[~GATED]).max() > 0.1
    # the telemetry's model of TRL's arithmetic is TRL's arithmetic
    np.testing.assert_allclose(trl_advantages(rf.records[-1], mode), adv, rtol=0, atol=1e-7)


@pytest.mark.slow
def test_trl_batch_mode_is_a_rescaled_drgrpo_gate(ckpt, tok):
    """``scale_rewards="batch"`` divides by the std of the whole (gated) batch, one number for all groups:
    gated groups are exactly 0, and every other advantage is the Dr. GRPO outcome-gate advantage divided
    by ``std(gated summed rewards, ddof=1) + 1e-4``. No per-group gate can equal it for every batch."""
    prompts, answers, texts = _batch()
    rf = outcome_gated(accuracy_reward, LengthPenalty(0.3), num_generations=G)
    tr = _trainer(ckpt, tok, rf, texts, scale_rewards="batch")
    adv = _trl_advantages(tr, prompts, answers)
    acc, score = _raw(texts, answers)
    centred, _ = group_advantages(score, GID, outcomes=acc, gate="outcome", norm="none", eps=TRL_EPS)
    rec = rf.records[-1]
    sigma = np.std(np.nansum(rec.gated * rec.weights, axis=1).astype(np.float32), ddof=1)
    assert np.all(adv[GATED] == 0.0)
    np.testing.assert_allclose(adv, centred / (sigma + TRL_EPS), rtol=1e-4, atol=1e-6)
    # and it differs from the std-normalized group gate: batch scaling is not a per-group gate
    grouped, _ = group_advantages(score, GID, outcomes=acc, gate="outcome", norm="std", eps=TRL_EPS)
    assert np.abs(adv - grouped).max() > 0.1
    np.testing.assert_allclose(trl_advantages(rec, "batch"), adv, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_without_the_gate_trl_gives_phantom_groups_full_advantages(ckpt, tok):
    """The failure the wrapper fixes, in TRL's default: observed() changes nothing (TRL equals the
    ungated estimator) and the all-fail groups get |A| ~ 1 from length noise alone."""
    prompts, answers, texts = _batch()
    rf = observed(accuracy_reward, LengthPenalty(0.3), num_generations=G)
    tr = _trainer(ckpt, tok, rf, texts)
    adv = _trl_advantages(tr, prompts, answers)
    acc, score = _raw(texts, answers)
    ref, stats = group_advantages(score, GID, outcomes=acc, gate="none", eps=TRL_EPS)
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-6)
    all_fail = np.repeat([set(g) == {0} for g in PLAN], G)
    assert np.abs(adv[all_fail]).mean() > 0.5
    assert stats.phantom == 3 and stats.zeroed == 0
    # TRL's own dashboard counts those groups as live: frac_reward_zero_std sees the summed reward
    assert tr._metrics["train"]["frac_reward_zero_std"][-1] == 0.0
    m = record_metrics([rf.records[-1]], "group")
    assert m["phantom/groups/phantom"] == 3 and m["phantom/frac/all_fail"] == 3 / 8


@pytest.mark.slow
def test_normalize_then_sum_zeroes_gated_groups(ckpt, tok):
    """TRL's other aggregation normalizes each function per group, then the sum over the batch: the gated
    groups' terms are flat, so they get 0 up to the float32 batch mean of the others (~1e-8)."""
    prompts, answers, texts = _batch()
    rf = outcome_gated(accuracy_reward, LengthPenalty(0.3), num_generations=G)
    tr = _trainer(ckpt, tok, rf, texts, aggregation="normalize_then_sum")
    adv = _trl_advantages(tr, prompts, answers)
    assert np.abs(adv[GATED]).max() < 1e-5
    assert np.abs(adv[~GATED]).max() > 0.1


@pytest.mark.slow
def test_none_outcomes_and_three_terms_with_weights(ckpt, tok):
    """An outcome function that returns None for a whole group (open-r1's accuracy_reward does when the
    gold answer does not parse) leaves no outcome contrast: the group is gated. Three terms, odd weights."""
    prompts, answers, texts = _batch(seed=1)
    skip = {1, 5}

    def outcome(completions, answer, **kw):
        return [None if (i // G) in skip else v for i, v in enumerate(accuracy_reward(completions, answer))]

    def bonus(completions, **kw):
        return [0.05 * c.count("\n") for c in completions]

    rf = outcome_gated(outcome, LengthPenalty(0.3), bonus, num_generations=G)
    tr = _trainer(ckpt, tok, rf, texts, weights=[0.9, 0.37, 0.21])
    adv = _trl_advantages(tr, prompts, answers)
    gated = GATED | np.isin(GID, list(skip))
    assert np.all(adv[gated] == 0.0)
    rec = rf.records[-1]
    w = np.float32([0.9, 0.37, 0.21])
    raw = np.nansum(np.nan_to_num(rec.raw, nan=0.0).astype(np.float32) * w, axis=1).astype(np.float32)
    ref, _ = group_advantages(raw, GID, outcomes=np.nan_to_num(rec.outcomes), gate="outcome", eps=TRL_EPS)
    np.testing.assert_allclose(adv[~gated], ref[~gated], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_shaping_means_survive_in_trl_logs(ckpt, tok):
    """The flattened constant is the group mean (to 2**-12), so TRL's logged per-function means stay true."""
    prompts, answers, texts = _batch()
    rf = outcome_gated(accuracy_reward, LengthPenalty(0.3), num_generations=G)
    tr = _trainer(ckpt, tok, rf, texts)
    _trl_advantages(tr, prompts, answers)
    pen = np.array(LengthPenalty(0.3)(texts))
    logged = tr._metrics["train"]["rewards/length_penalty/mean"][-1]
    assert abs(logged - pen.mean()) < 2**-12
    assert tr._metrics["train"]["rewards/accuracy_reward/mean"][-1] == pytest.approx(
        np.mean(accuracy_reward(texts, answers)))


def test_gate_rows_exact_for_random_weights():
    """The float32 flattening is exact (sum - group mean == 0 in TRL's ops) for arbitrary weights."""
    from phantom.trl.gate import gate_rows

    rng = np.random.default_rng(3)
    for trial in range(40):
        Gs = int(rng.integers(2, 17))
        n = 6 * Gs
        o = (rng.random(n) < rng.random()).astype(float)
        o[:Gs] = 0
        o[Gs:2 * Gs] = 1
        vals = np.stack([o, -rng.random(n) * 0.3, rng.normal(size=n)], 1)
        w = rng.uniform(0.05, 3.0, size=3)
        gated, _ = gate_rows(vals, w, Gs)
        x = (torch.tensor(gated, dtype=torch.float32) * torch.tensor(w, dtype=torch.float32)).nansum(1).view(-1, Gs)
        degenerate = torch.tensor([len(set(o[g * Gs:(g + 1) * Gs])) == 1 for g in range(6)])
        diff = (x - torch.nanmean(x, dim=1, keepdim=True))[degenerate]
        assert torch.all(diff == 0), (trial, Gs, w)
        np.testing.assert_array_equal(gated[~np.repeat(degenerate.numpy(), Gs)],
                                      vals[~np.repeat(degenerate.numpy(), Gs)])
