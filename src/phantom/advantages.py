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


def group_ids(index: Any) -> tuple[np.ndarray, int]:
    """Contiguous group ids ``0..G-1`` (first-appearance order) for labels of any hashable type."""
    import pandas as pd  # hash-based factorization: O(n), and fast for uuid strings

    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    arr = np.asarray(index).reshape(-1)
    codes, uniques = pd.factorize(arr, use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64), len(uniques)


def _segment_sum(values: np.ndarray, gid: np.ndarray, num_groups: int) -> np.ndarray:
    # Sequential accumulation in row order and in the values' dtype, like torch's index_add_ on
    # CPU, so float32 results agree bit for bit with verl's vectorized estimator.
    out = np.zeros(num_groups, dtype=values.dtype)
    np.add.at(out, gid, values)
    return out


def _as_array(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x if x.dtype != torch.bfloat16 else x.float()).numpy().reshape(-1)
    return np.asarray(x).reshape(-1)


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
        ``(advantages, stats)``; advantages have the type, dtype and device of ``scores`` (a
        tensor in, a tensor out; integer scores give float64).
    """
    if gate not in GATES:
        raise ValueError(f"gate={gate!r} is unknown; allowed: {', '.join(GATES)}")
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r} is unknown; allowed: {', '.join(NORMS)}")
    if not (eps >= 0 and np.isfinite(eps)):
        raise ValueError(f"eps={eps!r} is invalid; allowed: a finite eps >= 0")
    if gate == "outcome" and outcomes is None:
        raise ValueError("gate='outcome' needs outcomes (the binary task outcome of each response)")

    s = _as_array(scores)
    if s.dtype.kind != "f":
        s = s.astype(np.float64)
    n = s.size
    gid, num_groups = group_ids(index)
    if gid.size != n:
        raise ValueError(f"scores has {n} entries but index has {gid.size}")

    dt = s.dtype.type
    count = np.bincount(gid, minlength=num_groups)
    cnt = count.astype(s.dtype)
    mean = _segment_sum(s, gid, num_groups) / np.maximum(cnt, dt(1))
    centred = s - mean[gid]
    var = _segment_sum(centred * centred, gid, num_groups) / np.maximum(cnt - dt(1), dt(1))
    std = np.sqrt(var)
    single = count <= 1
    multi = ~single
    if single.any():
        # verl: a one-member group has mean 0 and std 1, so its advantage is score/(1+eps).
        centred = np.where(single[gid], s, centred)
        std = np.where(single, dt(1), std)
    adv = centred / (std[gid] + dt(eps)) if norm == "std" else centred

    flat = multi & (std <= eps)
    all_fail = all_pass = None
    if outcomes is not None:
        o = _as_array(outcomes)
        if o.size != n:
            raise ValueError(f"scores has {n} entries but outcomes has {o.size}")
        if o.dtype != np.bool_:
            if np.any((o != 0) & (o != 1)):
                raise ValueError("outcomes must be binary (0 or 1)")
            o = o != 0
        passes = np.bincount(gid, weights=o, minlength=num_groups) if n else np.zeros(num_groups)
        all_fail = passes == 0
        all_pass = passes == count

    if gate == "score":
        zero = flat
    elif gate == "outcome":
        zero = multi & (all_fail | all_pass)
    else:
        zero = np.zeros(num_groups, dtype=bool)
    if gate != "none" and zero.any():
        adv = np.where(zero[gid], dt(0), adv)

    counts = {"gate": gate, "norm": norm, "groups": num_groups, "zeroed": int(zero.sum()),
              "singletons": int(single.sum())}
    if all_fail is not None:
        degenerate = multi & (all_fail | all_pass)
        counts.update(
            all_fail=int(all_fail.sum()), all_pass=int(all_pass.sum()),
            mixed=int(num_groups - (all_fail | all_pass).sum()),
            phantom=int((all_fail & multi & ~flat).sum()),
            degenerate_live=int((degenerate & ~zero).sum()),
        )
    stats = GateStats(**counts)

    adv = np.ascontiguousarray(adv, dtype=s.dtype)
    if isinstance(scores, torch.Tensor):
        out = torch.from_numpy(adv)
        if scores.is_floating_point() and scores.dtype != out.dtype:
            out = out.to(scores.dtype)
        return out.to(scores.device), stats
    return adv, stats


def broadcast_to_tokens(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-sample advantages to per-token ones: the values of verl's ``adv[:, None] * response_mask``.

    verl's masks are 0/1 integers. Multiplying float by int64 takes torch's slow type-promotion
    path (about 2x the time of a select on this machine), so integer and bool masks use
    ``torch.where`` instead, which gives the same values for a 0/1 mask (a masked token gets +0.0
    where the product would give -0.0 for a negative advantage; the two compare equal). Floating
    masks may carry weights and are multiplied.
    """
    adv = advantages.unsqueeze(-1)
    if response_mask.is_floating_point():
        return adv * response_mask
    keep = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    return torch.where(keep, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))
