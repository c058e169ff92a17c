"""phantom.advantages: agreement with verl 0.9.1, gate semantics, the paper's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phantom.advantages import GateStats, broadcast_to_tokens, group_advantages
from phantom.rewards import length_short

verl_core = pytest.importorskip("verl.trainer.ppo.core_algos")


# --------------------------------------------------------------------------------------------
# random batches: mixed group sizes (singletons included), shaped scores
# --------------------------------------------------------------------------------------------
@st.composite
def batches(draw):
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=24))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    labels = draw(st.sampled_from(["int", "str"]))
    gid = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(gid)  # groups need not be contiguous
    index = gid if labels == "int" else np.array([f"uid-{g:04d}-{seed}" for g in gid], dtype=object)
    p_pass = rng.random()
    outcomes = (rng.random(n) < p_pass).astype(float)
    lengths = rng.integers(0, 800, n)
    lam = draw(st.sampled_from([0.05, 0.1, 0.3, 0.5, 0.9]))
    scores = length_short(outcomes, lengths, lam=lam)
    return scores, index, outcomes


def _verl(fn, scores: torch.Tensor, index, norm: bool) -> torch.Tensor:
    # verl takes token-level rewards (reward on the last response token) and a response mask.
    width = 6
    tlr = torch.zeros(scores.numel(), width, dtype=scores.dtype)
    tlr[:, -1] = scores
    mask = torch.ones(scores.numel(), width, dtype=torch.int64)
    adv, _ = fn(tlr, mask, index, norm_adv_by_std_in_grpo=norm)
    return adv[:, 0]


@given(batch=batches(), norm=st.booleans())
@settings(max_examples=150, deadline=None)
def test_matches_verl_loop_estimator(batch, norm):
    """verl's loop estimator computes each group's mean/std in the input dtype: compare in float64.

    (In float32 verl's own two estimators disagree with each other by up to ~1e-4 on low-spread
    groups -- measured 8.4e-5 -- because they sum in different orders; see the vectorized test.)
    """
    scores, index, _ = batch
    s = torch.tensor(scores, dtype=torch.float64)
    ref = _verl(verl_core.compute_grpo_outcome_advantage, s, index, norm)
    ours, _ = group_advantages(s, index, norm="std" if norm else "none")
    assert ours.dtype == torch.float64
    assert torch.max(torch.abs(ours - ref)).item() <= 1e-6


@given(batch=batches(), norm=st.booleans())
@settings(max_examples=150, deadline=None)
def test_matches_verl_vectorized_estimator(batch, norm):
    """verl's vectorized estimator works in float32 (its group_mean_std casts): compare in float32."""
    scores, index, _ = batch
    s = torch.tensor(scores, dtype=torch.float32)
    ref = _verl(verl_core.compute_grpo_vectorized_outcome_advantage, s, index, norm)
    ours, _ = group_advantages(s, index, norm="std" if norm else "none")
    assert ours.dtype == torch.float32
    assert torch.max(torch.abs(ours - ref)).item() <= 1e-6


def test_singleton_group_like_verl():
    # verl: mean 0, std 1 for a one-member group -> advantage = score / (1 + eps)
    adv, stats = group_advantages(np.array([0.7]), ["only"], eps=1e-6)
    assert adv[0] == pytest.approx(0.7 / (1 + 1e-6))
    adv, _ = group_advantages(np.array([0.7]), ["only"], norm="none")
    assert adv[0] == pytest.approx(0.7)
    assert stats.singletons == 1


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------
def _groups(index):
    index = np.asarray(index, dtype=object)
    return {g: np.flatnonzero(index == g) for g in dict.fromkeys(index.tolist())}


@given(batch=batches(), gate=st.sampled_from(["none", "score", "outcome"]), norm=st.sampled_from(["std", "none"]))
@settings(max_examples=150, deadline=None)
def test_advantages_sum_to_zero_in_every_live_group(batch, gate, norm):
    scores, index, outcomes = batch
    adv, _ = group_advantages(scores, index, outcomes=outcomes, gate=gate, norm=norm)
    for rows in _groups(index).values():
        if len(rows) > 1:
            assert abs(adv[rows].sum()) < 1e-9


@given(batch=batches())
@settings(max_examples=150, deadline=None)
def test_outcome_gate_zeroes_exactly_the_outcome_degenerate_groups(batch):
    scores, index, outcomes = batch
    adv, stats = group_advantages(scores, index, outcomes=outcomes, gate="outcome")
    zeroed = 0
    for rows in _groups(index).values():
        degenerate = len(rows) > 1 and len(set(outcomes[rows])) == 1
        if degenerate:
            zeroed += 1
            assert np.all(adv[rows] == 0)
        elif len(rows) > 1:
            assert np.any(adv[rows] != 0)  # a mixed group always carries signal
    assert stats.zeroed == zeroed
    assert stats.degenerate_live == 0


@given(batch=batches())
@settings(max_examples=150, deadline=None)
def test_score_gate_keeps_every_phantom_group(batch):
    scores, index, outcomes = batch
    adv, stats = group_advantages(scores, index, outcomes=outcomes, gate="score")
    phantoms = 0
    for rows in _groups(index).values():
        if len(rows) > 1 and not outcomes[rows].any() and np.std(scores[rows], ddof=1) > 1e-6:
            phantoms += 1
            assert np.any(adv[rows] != 0)
    assert stats.phantom == phantoms


def _all_fail_group(lam: float) -> np.ndarray:
    return length_short(np.zeros(5), np.array([40, 120, 200, 310, 480]), lam=lam)


@pytest.mark.parametrize("lam", [0.01, 0.1, 0.3, 0.9])
def test_lambda_cancels_under_std_normalization(lam):
    base, _ = group_advantages(_all_fail_group(0.3), [0] * 5)
    scaled, _ = group_advantages(_all_fail_group(lam), [0] * 5)
    # identical up to the eps in the denominator: eps / (lam * std) <= 1e-6 / (0.01 * 0.28) ~ 4e-4
    np.testing.assert_allclose(scaled, base, rtol=5e-4)
    assert np.abs(scaled).max() > 1.0  # full size, whatever lam is


@pytest.mark.parametrize("lam", [0.01, 0.1, 0.3, 0.9])
def test_lambda_scales_linearly_without_std_normalization(lam):
    base, _ = group_advantages(_all_fail_group(0.3), [0] * 5, norm="none")
    scaled, _ = group_advantages(_all_fail_group(lam), [0] * 5, norm="none")
    np.testing.assert_allclose(scaled, base * lam / 0.3, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------------------------
# the paper's worked example (§9)
# --------------------------------------------------------------------------------------------
def test_paper_section_9_arithmetic():
    # All-fail group spanning [-0.30, -0.05] (paper §9): r = [-0.30, -0.175, -0.175, -0.175, -0.05].
    #   mean = -0.175; deviations = [-0.125, 0, 0, 0, +0.125]
    #   unbiased var = 2 * 0.125^2 / 4 = 0.0078125  ->  std = 0.08839  ("std ~ 0.09")
    #   GRPO:     A = +-0.125 / 0.08839 = +-1.4142   ("spans ~ +-1.4")
    #   Dr. GRPO: A = +-0.125                         ("spans ~ +-0.12")
    phantom = np.array([-0.30, -0.175, -0.175, -0.175, -0.05])
    grpo, stats = group_advantages(phantom, [0] * 5, outcomes=np.zeros(5))
    drgrpo, _ = group_advantages(phantom, [0] * 5, norm="none")
    assert np.std(phantom, ddof=1) == pytest.approx(0.08839, abs=1e-5)
    assert grpo.max() == pytest.approx(1.41421, abs=1e-4) and grpo.min() == pytest.approx(-1.41421, abs=1e-4)
    assert np.abs(drgrpo).max() == pytest.approx(0.125, abs=1e-12)
    assert stats.phantom == 1 and stats.all_fail == 1
    # A mixed group (2 short correct answers, 3 failures) under Dr. GRPO:
    #   r = [0.95, 0.95, -0.05, -0.30, -0.30]; mean = 1.25/5 = 0.25
    #   A = r - mean = [+0.70, +0.70, -0.30, -0.55, -0.55]   ("~ +-0.7", 0.70/0.125 = 5.6x louder)
    mixed = np.array([0.95, 0.95, -0.05, -0.30, -0.30])
    mixed_dr, _ = group_advantages(mixed, [0] * 5, norm="none")
    np.testing.assert_allclose(mixed_dr, [0.70, 0.70, -0.30, -0.55, -0.55], atol=1e-12)
    assert np.abs(mixed_dr).max() / np.abs(drgrpo).max() == pytest.approx(5.6)


# --------------------------------------------------------------------------------------------
# GateStats on a hand-built batch
# --------------------------------------------------------------------------------------------
HAND = {
    # group: (scores, outcomes)
    "phantom": ([-0.3, -0.1, -0.2], [0, 0, 0]),      # all-fail, spread
    "flat_fail": ([-0.2, -0.2, -0.2], [0, 0, 0]),    # all-fail, no spread
    "pass_spread": ([0.9, 0.8, 0.7], [1, 1, 1]),     # all-pass, spread
    "mixed": ([0.9, -0.1, -0.2], [1, 0, 0]),
}


def _hand_batch():
    scores = np.concatenate([np.array(s) for s, _ in HAND.values()])
    outcomes = np.concatenate([np.array(o, dtype=float) for _, o in HAND.values()])
    index = np.repeat(list(HAND), 3)
    return scores, index, outcomes


@pytest.mark.parametrize(
    ("gate", "zeroed", "degenerate_live", "zero_groups"),
    [
        ("none", 0, 3, set()),
        ("score", 1, 2, {"flat_fail"}),
        ("outcome", 3, 0, {"phantom", "flat_fail", "pass_spread"}),
    ],
)
def test_gate_stats_on_hand_batch(gate, zeroed, degenerate_live, zero_groups):
    scores, index, outcomes = _hand_batch()
    adv, stats = group_advantages(scores, index, outcomes=outcomes, gate=gate)
    assert (stats.groups, stats.all_fail, stats.all_pass, stats.mixed, stats.phantom) == (4, 2, 1, 1, 1)
    assert stats.zeroed == zeroed and stats.degenerate_live == degenerate_live
    assert stats.live_frac == pytest.approx((4 - zeroed) / 4)
    for name in HAND:
        rows = index == name
        if name in zero_groups:
            assert np.all(adv[rows] == 0)  # gated: exactly zero
        elif name == "flat_fail":
            assert np.abs(adv[rows]).max() < 1e-9  # ungated flat group: zero up to rounding of its mean
        else:
            assert np.any(adv[rows] != 0)
    metrics = stats.to_metrics()
    assert metrics["phantom/frac/phantom"] == 0.25
    assert metrics["phantom/groups/zeroed"] == zeroed
    assert metrics["phantom/frac/live"] == stats.live_frac


def test_torch_and_numpy_give_the_same_numbers():
    scores, index, outcomes = _hand_batch()
    a_np, s_np = group_advantages(scores, index, outcomes=outcomes, gate="score")
    a_t, s_t = group_advantages(torch.tensor(scores), index, outcomes=torch.tensor(outcomes), gate="score")
    assert isinstance(a_np, np.ndarray) and isinstance(a_t, torch.Tensor)
    np.testing.assert_allclose(a_t.numpy(), a_np)
    assert s_np == s_t
    ints = torch.tensor(np.unique(index, return_inverse=True)[1])
    a_i, _ = group_advantages(torch.tensor(scores), ints, outcomes=outcomes, gate="score")
    np.testing.assert_allclose(a_i.numpy(), a_np)


def test_stats_without_outcomes():
    adv, stats = group_advantages(np.array([1.0, 0.0]), ["a", "a"])
    assert stats.all_fail is None and stats.phantom is None
    assert "phantom/frac/phantom" not in stats.to_metrics()
    assert isinstance(stats, GateStats)


def test_broadcast_to_tokens_like_verl():
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(broadcast_to_tokens(adv, mask), torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]]))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gate": "acc"}, "gate='acc' is unknown; allowed: none, score, outcome"),
        ({"norm": "batch"}, "norm='batch' is unknown; allowed: std, none"),
        ({"gate": "outcome"}, "needs outcomes"),
        ({"eps": -1.0}, "eps=-1.0"),
        ({"outcomes": [0, 1, 0]}, "outcomes has 3"),
        ({"outcomes": [0, 0.5]}, "binary"),
    ],
)
def test_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        group_advantages(np.array([0.1, 0.2]), [0, 0], **kwargs)


def test_index_length_mismatch():
    with pytest.raises(ValueError, match="index has 3"):
        group_advantages(np.array([0.1, 0.2]), [0, 0, 1])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float32])
def test_broadcast_equals_verls_product(dtype):
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(64, generator=gen)
    mask = (torch.rand(64, 33, generator=gen) < 0.6).to(dtype)
    ours = broadcast_to_tokens(adv, mask)
    assert ours.dtype == adv.dtype
    assert torch.equal(ours, adv.unsqueeze(-1) * mask.to(adv.dtype))  # -0.0 == 0.0


def test_broadcast_keeps_fractional_float_weights():
    adv = torch.tensor([2.0])
    torch.testing.assert_close(broadcast_to_tokens(adv, torch.tensor([[0.5, 0.0]])), torch.tensor([[1.0, 0.0]]))
