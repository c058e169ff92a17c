"""phantom.lab.loss equals verl 0.9.1's policy losses and KL penalty on the same inputs."""

from __future__ import annotations

import pytest
import torch

from phantom.lab.loss import agg_loss, kl_penalty, policy_loss

core = pytest.importorskip("verl.trainer.ppo.core_algos")
actor_cfg = pytest.importorskip("verl.workers.config.actor")


def _inputs(seed: int, batch: int = 12, width: int = 9, spread: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(batch, width, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(batch, generator=g, dtype=torch.float64)[:, None].expand(batch, width).clone()
    lengths = torch.randint(1, width + 1, (batch,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return old, logp, adv * mask, mask


def _config(lo: float, hi: float, agg: str):
    return actor_cfg.ActorConfig(strategy="fsdp", rollout_n=5, ppo_micro_batch_size_per_gpu=4, clip_ratio=0.2,
                                 clip_ratio_low=lo, clip_ratio_high=hi, loss_agg_mode=agg)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("lo", "hi"), [(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)])
def test_vanilla_token_mean_equals_verl(seed, lo, hi):
    old, logp, adv, mask = _inputs(seed)
    ref, ref_m = core.compute_policy_loss_vanilla(old, logp, adv, mask, loss_agg_mode="token-mean",
                                                  config=_config(lo, hi, "token-mean"))
    ours, m = policy_loss(old, logp, adv, mask, mode="vanilla", clip_low=lo, clip_high=hi, agg="token-mean")
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert m[k] == pytest.approx(ref_m[k], abs=1e-12)


def test_dual_clip_branch_is_exercised():
    """Big negative-advantage ratios hit verl's dual clip; the equality must hold there too."""
    old, logp, adv, mask = _inputs(7, spread=3.0)
    adv = -adv.abs() - 0.5 * mask
    ref, ref_m = core.compute_policy_loss_vanilla(old, logp, adv, mask, config=_config(0.2, 0.28, "token-mean"))
    ours, m = policy_loss(old, logp, adv, mask, clip_low=0.2, clip_high=0.28)
    assert ref_m["actor/pg_clipfrac_lower"] > 0
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_gspo_equals_verl(seed, agg):
    old, logp, adv, mask = _inputs(seed)
    logp.requires_grad_(True)
    ref, _ = core.compute_policy_loss_gspo(old, logp, adv, mask, loss_agg_mode=agg,
                                           config=_config(0.2, 0.28, agg))
    (g_ref,) = torch.autograd.grad(ref, logp)
    ours, _ = policy_loss(old, logp, adv, mask, mode="gspo", clip_low=0.2, clip_high=0.28, agg=agg)
    (g_ours,) = torch.autograd.grad(ours, logp)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_agg_loss_equals_verl(agg):
    old, logp, _, mask = _inputs(3)
    mat = (logp - old) ** 2
    torch.testing.assert_close(agg_loss(mat, mask, agg), core.agg_loss(mat, mask, agg), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["low_var_kl", "k1", "k2"])
def test_kl_penalty_equals_verl(kind):
    old, logp, _, _ = _inputs(5, spread=2.0)
    torch.testing.assert_close(kl_penalty(logp, old, kind), core.kl_penalty(logp, old, kind), rtol=0, atol=0)


def test_gradient_equals_verl():
    old, logp, adv, mask = _inputs(11, spread=0.4)
    logp.requires_grad_(True)
    ref, _ = core.compute_policy_loss_vanilla(old, logp, adv, mask, config=_config(0.2, 0.28, "token-mean"))
    (g_ref,) = torch.autograd.grad(ref, logp)
    ours, _ = policy_loss(old, logp, adv, mask, clip_low=0.2, clip_high=0.28)
    (g_ours,) = torch.autograd.grad(ours, logp)
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-12)


def test_unknown_modes_fail_fast():
    old, logp, adv, mask = _inputs(0)
    with pytest.raises(ValueError, match="allowed: vanilla, gspo"):
        policy_loss(old, logp, adv, mask, mode="ppo2")
    with pytest.raises(ValueError, match="allowed: token-mean"):
        agg_loss(logp, mask, "token-sum-norm")
    with pytest.raises(ValueError, match="allowed: low_var_kl"):
        kl_penalty(logp, old, "full")
