"""Policy losses with verl 0.9.1's exact arithmetic: PPO-clip (decoupled bounds, dual clip), GSPO, KL.

The lab claims to run "the same GRPO as verl", so its loss is written to equal, element for element,
``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla`` / ``compute_policy_loss_gspo`` followed
by ``agg_loss``, and ``kl_penalty`` for the KL loss (tests compare them on random inputs). Nothing
here imports verl, so the lab runs without it.

Conventions (verl's): ``log_prob``/``old_log_prob``/``advantages``/``mask`` are (batch, response)
tensors, advantages already broadcast to tokens; the loss is to be minimised. Pass the mask as
verl's actor does (``bool``): the dtype of the per-sequence token counts follows it, and with it
the last bits of the sequence-mean modes.
"""

from __future__ import annotations

import torch

__all__ = ["AGG_MODES", "LOSS_MODES", "KL_TYPES", "agg_loss", "policy_loss", "kl_penalty", "masked_mean"]

AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo")
KL_TYPES: tuple[str, ...] = ("low_var_kl", "k1", "k2")


def _masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    v = torch.where(mask.bool(), values, 0.0) * mask
    return v.sum() if dim is None else v.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _masked_sum(values, mask) / (mask.sum() + 1e-8)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Aggregate a (B, R) loss matrix like verl's ``agg_loss`` on one data-parallel rank."""
    if mode == "token-mean":
        return _masked_sum(loss_mat, mask) / mask.sum()
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        tokens = mask.sum(-1)
        seq = (loss_mat * mask).sum(-1)
        if mode == "seq-mean-token-mean":
            seq = seq / (tokens + 1e-8)
        seq_mask = (tokens > 0).float()
        return _masked_sum(seq, seq_mask) / seq_mask.sum()
    raise ValueError(f"loss_agg={mode!r} is unknown; allowed: {', '.join(AGG_MODES)}")


def policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                *, mode: str = "vanilla", clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float = 3.0,
                agg: str = "token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate and verl's diagnostics (``actor/pg_clipfrac``, ``actor/ppo_kl`` ...).

    ``mode="vanilla"``: per-token ratio, clipped to ``[1-clip_low, 1+clip_high]`` (``clip_high=0.28``
    is DAPO's Clip-Higher), plus dual clip at ``clip_c`` for negative advantages.
    ``mode="gspo"``: one ratio per sequence, the geometric mean of its token ratios, applied to every
    token with a straight-through token gradient (GSPO-token), clipped with the same bounds.
    """
    neg_kl = log_prob - old_log_prob
    if mode == "vanilla":
        if not clip_c > 1.0:
            raise ValueError(f"clip_c={clip_c!r} is invalid; allowed: clip_c > 1")
        neg_kl = torch.clamp(neg_kl, min=-20.0, max=20.0)
        ratio = torch.exp(neg_kl)
        pg1 = -advantages * ratio
        pg2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
        clip1 = torch.maximum(pg1, pg2)
        clipfrac = masked_mean(torch.gt(pg2, pg1).float(), mask)
        pg3 = -advantages * clip_c
        clip2 = torch.min(pg3, clip1)
        clipfrac_lower = masked_mean(torch.gt(clip1, pg3) * (advantages < 0).float(), mask)
        losses = torch.where(advantages < 0, clip2, clip1)
    elif mode == "gspo":
        lengths = torch.sum(mask, dim=-1).clamp(min=1)
        seq_neg_kl = torch.sum(neg_kl * mask, dim=-1) / lengths
        log_ratio = log_prob - log_prob.detach() + seq_neg_kl.detach().unsqueeze(-1)
        ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
        pg1 = -advantages * ratio
        pg2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
        losses = torch.maximum(pg1, pg2)
        clipfrac = masked_mean(torch.gt(pg2, pg1).float(), mask)
        clipfrac_lower = torch.zeros(())
    else:
        raise ValueError(f"loss mode={mode!r} is unknown; allowed: {', '.join(LOSS_MODES)}")
    loss = agg_loss(losses, mask, agg)
    metrics = {"actor/pg_clipfrac": float(clipfrac), "actor/ppo_kl": float(masked_mean(-neg_kl.detach(), mask)),
               "actor/pg_clipfrac_lower": float(clipfrac_lower)}
    return loss, metrics


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate to the reference policy (verl's ``kl_penalty``; ``low_var_kl`` = k3)."""
    if kind == "k1":
        return log_prob - ref_log_prob
    if kind == "k2":
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind == "low_var_kl":
        kl = torch.clamp(ref_log_prob - log_prob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise ValueError(f"kl_type={kind!r} is unknown; allowed: {', '.join(KL_TYPES)}")
