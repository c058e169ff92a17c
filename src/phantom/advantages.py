"""Group-relative advantages (GRPO, Dr. GRPO) with group gates, and the telemetry of what they did.

One vectorized function, :func:`group_advantages`, serves the book, the CPU lab and verl's
estimator plugin. With ``gate="none"`` it reproduces verl 0.9.1's ``compute_grpo_outcome_advantage``
and ``compute_grpo_vectorized_outcome_advantage`` (unbiased std, ``eps`` added outside the square
root, a single-member group gets mean 0 and std 1). The gates only ever zero *advantages* of whole
groups; response masks, and hence token-mean loss denominators, are untouched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import torch

__all__ = ["GATES", "NORMS", "GateStats", "group_advantages", "group_ids", "broadcast_to_tokens"]

GATES: tuple[str, ...] = ("none", "score", "outcome")
NORMS: tuple[str, ...] = ("std", "none")
Gate = Literal["none", "score", "outcome"]
Norm = Literal["std", "none"]


@dataclass(frozen=True)
class GateStats:
    """What a batch looked like to the gate, counted in groups.

    ``phantom`` counts all-fail groups whose shaped scores still spread by more than ``eps``: they
    carry no outcome contrast, yet std normalization gives them full-size advantages. Outcome
    fields are ``None`` when no outcomes were given.
    """

    gate: str
    norm: str
    groups: int
    zeroed: int
    singletons: int
    all_fail: int | None = None
    all_pass: int | None = None
    mixed: int | None = None
    phantom: int | None = None
    #: outcome-degenerate (all-fail or all-pass, >= 2 members) groups the gate left live
    degenerate_live: int | None = None

    @property
    def live(self) -> int:
        return self.groups - self.zeroed

    @property
    def live_frac(self) -> float:
        return self.live / self.groups if self.groups else 0.0

    def to_metrics(self, prefix: str = "phantom/") -> dict[str, float]:
        """Flat metrics (counts and fractions of groups) for a run's metrics.jsonl."""
        out: dict[str, float] = {}
        g = max(self.groups, 1)
        for key, value in asdict(self).items():
            if value is None or isinstance(value, str):
                continue
            out[f"{prefix}groups/{key}" if key != "groups" else f"{prefix}groups/total"] = float(value)
            if key not in ("groups",):
                out[f"{prefix}frac/{key}"] = float(value) / g
        out[f"{prefix}frac/live"] = self.live_frac
        return out


def group_ids(index: Any) -> tuple[torch.Tensor, int]:
    """Contiguous group ids ``0..G-1`` (first-appearance order) for labels of any hashable type."""
    if isinstance(index, torch.Tensor) and not index.is_floating_point():
        uniq, inv = torch.unique(index.reshape(-1), return_inverse=True)
        return inv.to(torch.long), int(uniq.numel())
    import pandas as pd  # hash-based factorization: O(n), and fast for uuid strings

    arr = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index).reshape(-1)
    codes, uniques = pd.factorize(arr, use_na_sentinel=False)
    return torch.from_numpy(np.asarray(codes, dtype=np.int64)), len(uniques)


def _segment_sum(values: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, gid, values)


def group_advantages(
    scores: Any,
    index: Any,
    *,
    outcomes: Any = None,
    gate: Gate = "none",
    norm: Norm = "std",
    eps: float = 1e-6,
) -> tuple[Any, GateStats]:
    """Per-sample group-relative advantages and the gate's statistics.

    Args:
        scores: (N,) shaped scalar reward per response (torch tensor or anything numpy reads).
        index: (N,) group label per response (prompt uid): strings, ints, a tensor.
        outcomes: (N,) binary task outcome. Needed by ``gate="outcome"``; always used for stats.
        gate: ``"none"`` (plain GRPO), ``"score"`` zeroes groups whose shaped-score std <= eps
            (DAPO with ``metric=score``/``reward``), ``"outcome"`` zeroes groups whose binary
            outcomes are all equal (DAPO with ``metric=acc``). Single-member groups are never
            gated, as verl's DAPO filter keeps them.
        norm: ``"std"`` divides by the group std (GRPO); ``"none"`` only centres (Dr. GRPO).
        eps: added to the std before dividing (verl: 1e-6), and the score gate's flatness threshold.

    Returns:
        ``(advantages, stats)``; advantages have the type of ``scores`` (tensor or ndarray).
    """
    if gate not in GATES:
        raise ValueError(f"gate={gate!r} is unknown; allowed: {', '.join(GATES)}")
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r} is unknown; allowed: {', '.join(NORMS)}")
    if not (eps >= 0 and np.isfinite(eps)):
        raise ValueError(f"eps={eps!r} is invalid; allowed: a finite eps >= 0")
    if gate == "outcome" and outcomes is None:
        raise ValueError("gate='outcome' needs outcomes (the binary task outcome of each response)")

    as_numpy = not isinstance(scores, torch.Tensor)
    s = torch.as_tensor(np.asarray(scores, dtype=np.float64) if as_numpy else scores)
    if not s.is_floating_point():
        s = s.double()
    s = s.reshape(-1)
    n = s.numel()
    gid, num_groups = group_ids(index)
    gid = gid.to(s.device)
    if gid.numel() != n:
        raise ValueError(f"scores has {n} entries but index has {gid.numel()}")

    with torch.no_grad():
        count = torch.bincount(gid, minlength=num_groups).to(s.dtype)
        mean = _segment_sum(s, gid, num_groups) / count.clamp_min(1)
        centred = s - mean[gid]
        var = _segment_sum(centred * centred, gid, num_groups) / (count - 1).clamp_min(1)
        std = var.sqrt()
        single = count <= 1
        multi = ~single
        # verl: a single-member group has mean 0 and std 1, so its advantage is score/(1+eps).
        centred = torch.where(single[gid], s, centred)
        if norm == "std":
            adv = centred / (torch.where(single, torch.ones_like(std), std)[gid] + eps)
        else:
            adv = centred

        flat = multi & (std <= eps)
        all_fail = all_pass = None
        if outcomes is not None:
            o = torch.as_tensor(np.asarray(outcomes.cpu() if isinstance(outcomes, torch.Tensor) else outcomes,
                                           dtype=np.float64)).reshape(-1).to(s.device)
            if o.numel() != n:
                raise ValueError(f"scores has {n} entries but outcomes has {o.numel()}")
            if bool(((o != 0) & (o != 1)).any()):
                raise ValueError("outcomes must be binary (0 or 1)")
            passes = _segment_sum(o.to(s.dtype), gid, num_groups)
            all_fail = passes == 0
            all_pass = passes == count

        if gate == "score":
            zero = flat
        elif gate == "outcome":
            zero = multi & (all_fail | all_pass)
        else:
            zero = torch.zeros_like(multi)
        if gate != "none":
            adv = adv.masked_fill(zero[gid], 0.0)

        if all_fail is not None:
            degenerate = multi & (all_fail | all_pass)
            stats = GateStats(
                gate=gate, norm=norm, groups=num_groups, zeroed=int(zero.sum()), singletons=int(single.sum()),
                all_fail=int(all_fail.sum()), all_pass=int(all_pass.sum()),
                mixed=int((~all_fail & ~all_pass).sum()),
                phantom=int((all_fail & multi & ~flat).sum()),
                degenerate_live=int((degenerate & ~zero).sum()),
            )
        else:
            stats = GateStats(gate=gate, norm=norm, groups=num_groups, zeroed=int(zero.sum()),
                              singletons=int(single.sum()))

    if as_numpy:
        return adv.numpy(), stats
    return adv, stats


def broadcast_to_tokens(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-sample advantages to per-token ones, as verl does (``adv[:, None] * response_mask``)."""
    return advantages.unsqueeze(-1) * response_mask
