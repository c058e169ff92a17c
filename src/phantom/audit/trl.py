"""What the audit knows about TRL: version-dependent settings, the fix it prints, GRPOConfig's fields.

* ``scale_rewards`` was a bool up to TRL 0.21 (``True`` = divide by the group std) and is a string
  since 0.22 (``"group"|"batch"|"none"``; TRL 1.16 still maps ``True``/``False`` to ``"group"``/``"none"``).
  A fix names the form of the version the config states (``--trl-version``), else both.
* The fix for a shaped TRL reward is the outcome-gated wrapper of :mod:`phantom.trl`
  (:data:`OUTCOME_GATED_SNIPPET`, the one place its exact code lives): it flattens the shaping terms
  inside groups whose outcome is all-equal, so TRL's own normalization gives them zero advantage.
* :data:`GRPO_FIELDS` records the type and default of each ``GRPOConfig`` field the audit reads or
  prints, for the pinned TRL (1.16.x); ``tests/test_audit_fixes.py`` checks it against TRL's real
  dataclass when TRL is installed and constructs ``GRPOConfig`` with every printed fix.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["PINNED_TRL", "OUTCOME_GATED_SNIPPET", "GRPO_FIELDS", "scale_rewards_fix", "version_tuple",
           "check_kwargs"]

PINNED_TRL = "1.16"

#: The outcome-gated wrapper, as the TRL fix prints it (the agreed phantom.trl API).
OUTCOME_GATED_SNIPPET = (
    "from phantom.trl import outcome_gated\n"
    "reward_funcs = outcome_gated(accuracy_reward, format_reward, num_generations=8)"
    "  # outcome first, shaping terms after\n"
    "trainer = GRPOTrainer(model=..., reward_funcs=reward_funcs, args=GRPOConfig(num_generations=8, ...))"
)

#: GRPOConfig fields of TRL 1.16.x: name -> (type, default, allowed values or None)
GRPO_FIELDS: dict[str, tuple[str, Any, tuple[Any, ...] | None]] = {
    "scale_rewards": ("str", "group", ("group", "batch", "none", True, False)),
    "loss_type": ("str", "dapo", ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")),
    "multi_objective_aggregation": ("str", "sum_then_normalize", ("sum_then_normalize", "normalize_then_sum")),
    "mask_truncated_completions": ("bool", False, None),
    "num_generations": ("int | None", 8, None),
    "reward_weights": ("list[float] | None", None, None),
    "beta": ("float", 0.0, None),
    "max_completion_length": ("int | None", 512, None),
}


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    m = re.match(r"^\s*v?(\d+)(?:\.(\d+))?", str(v))
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def scale_rewards_fix(trl_version: str | None) -> tuple[str, dict[str, Any]]:
    """The Dr. GRPO settings as text and as GRPOConfig kwargs, for the given TRL version (None: both)."""
    v = version_tuple(trl_version)
    if v is not None and v < (0, 22):
        return ("scale_rewards=False, loss_type='dr_grpo' (TRL <= 0.21: scale_rewards is a bool)",
                {"scale_rewards": False, "loss_type": "dr_grpo"})
    both = "" if v is not None else " on TRL >= 0.22; scale_rewards=False on TRL <= 0.21, where it is a bool"
    return (f"scale_rewards='none', loss_type='dr_grpo'{both}", {"scale_rewards": "none", "loss_type": "dr_grpo"})


def check_kwargs(kwargs: dict[str, Any]) -> list[str]:
    """Problems with ``kwargs`` against the recorded TRL 1.16 field table (empty: all good)."""
    out = []
    for k, v in kwargs.items():
        if k not in GRPO_FIELDS:
            out.append(f"{k} is not a recorded GRPOConfig field")
            continue
        typ, _, allowed = GRPO_FIELDS[k]
        if allowed is not None and v not in allowed:
            out.append(f"{k}={v!r} is not one of {allowed}")
        elif typ == "bool" and not isinstance(v, bool):
            out.append(f"{k}={v!r} is not a bool")
    return out
