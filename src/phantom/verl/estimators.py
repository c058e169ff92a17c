"""Gated GRPO estimators for verl: ``algorithm.adv_estimator=phantom_grpo_{none,score,outcome}``.

verl imports this module in every process that runs ``import verl`` (driver, TaskRunner, workers)
through the ``verl.plugins`` entry point declared in ``pyproject.toml``; nothing in verl is patched.
The estimators run where verl's ``compute_advantage`` runs (the TaskRunner) and are computed by
:func:`phantom.advantages.group_advantages`, so the book, the lab and verl share one implementation.

Three facts about verl 0.9.1 shape the code:

* a custom estimator sees only ``token_level_rewards`` (the shaped score on the last token), never
  the reward dict's ``acc``. The binary outcome is decoded as ``score > 0``, which is exact for the
  phantom rewards when ``0 <= lam < 1`` and no KL term is added to the reward
  (``algorithm.use_kl_in_reward=False``); both are enforced here, and when the launcher passes
  ``+algorithm.phantom.lam`` every score is also checked against ``[-lam, 0] U [1-lam, 1]``;
* it does not receive ``norm_adv_by_std_in_grpo`` (only the built-in GRPO branch does), so the
  flag is read from ``config`` (the ``algorithm`` node): ``False`` gives the Dr. GRPO arms;
* the V1 trainer pads batches with synthetic rows whose uid starts with ``pad``
  (``trainer/ppo/padding_utils.py``); they get zero advantage and are left out of the statistics.

Per call, one JSON line of gate statistics is appended to ``$PHANTOM_GATE_LOG`` when it is set
(the launcher points it at ``runs/<name>/gate.jsonl`` and merges it into ``metrics.jsonl``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from phantom.advantages import GATES, broadcast_to_tokens, group_advantages

__all__ = ["ESTIMATORS", "GATE_LOG_ENV", "decode_outcomes", "make_estimator", "register", "registered"]

#: estimator name -> gate
ESTIMATORS: dict[str, str] = {f"phantom_grpo_{g}": g for g in GATES}
GATE_LOG_ENV = "PHANTOM_GATE_LOG"
PAD_PREFIX = "pad"  # verl.trainer.ppo.padding_utils: pad_uid = f"pad{uuid4().hex}"
_TOL = 1e-5  # rm_scores are float32; the reward is computed in float64
_calls = {"n": 0}


def _get(config: Any, key: str, default: Any) -> Any:
    """Read ``key`` from a DictConfig, a dict or a dataclass (verl passes either)."""
    if config is None:
        return default
    if hasattr(config, "get"):
        try:
            value = config.get(key, default)
        except Exception:  # omegaconf struct errors on missing keys of some node types
            value = default
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def decode_outcomes(scores: np.ndarray, lam: float | None) -> np.ndarray:
    """Binary outcomes from shaped scores (``score > 0``), after checking the scores can carry them."""
    s = np.asarray(scores, dtype=np.float64)
    if lam is not None:
        lam = float(lam)
        if not 0.0 <= lam < 1.0:
            raise ValueError(f"algorithm.phantom.lam={lam!r}: the outcome is decodable only for 0 <= lam < 1")
        ok = ((s >= -lam - _TOL) & (s <= _TOL)) | ((s >= 1.0 - lam - _TOL) & (s <= 1.0 + _TOL))
        where = f"[-{lam}, 0] or [{1 - lam:g}, 1]"
    else:
        ok = (s > -1.0) & (s <= 1.0 + _TOL)
        where = "(-1, 1]"
    if not ok.all():
        bad = s[~ok][0]
        raise ValueError(
            f"shaped score {bad!r} lies outside {where}, so the binary outcome cannot be decoded from it; "
            "use reward.custom_reward_function.path=pkg://phantom.verl.reward with the same lam"
        )
    return s > 0


def _step() -> int:
    """verl's global step (both trainers publish it on ``SkipManager.step``), else a call counter."""
    try:
        from verl.utils.skip.skip_manager import SkipManager

        step = int(SkipManager.step)
    except (ImportError, AttributeError, TypeError, ValueError):
        step = -1
    return step if step > 0 else _calls["n"]


def _log(gate: str, stats: Any, adv: np.ndarray, outcomes: np.ndarray | None) -> None:
    path = os.environ.get(GATE_LOG_ENV)
    if not path:
        return
    rec = {"step": _step(), "call": _calls["n"], "time": time.time(), "stats": asdict(stats), "rows": int(adv.size),
           "abs_adv_sum": float(np.abs(adv).sum()),
           "acc_sum": None if outcomes is None else float(outcomes.sum())}
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def make_estimator(gate: str):
    """The verl estimator function for one gate (``none``, ``score`` or ``outcome``)."""
    if gate not in GATES:
        raise ValueError(f"gate={gate!r} is unknown; allowed: {', '.join(GATES)}")

    def phantom_grpo(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                     config: Any = None, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        _calls["n"] += 1
        if index is None:
            raise ValueError(f"phantom_grpo_{gate} needs group ids (the batch's 'uid' column)")
        norm = "std" if bool(_get(config, "norm_adv_by_std_in_grpo", True)) else "none"
        kl_in_reward = bool(_get(config, "use_kl_in_reward", False))
        opts = _get(config, "phantom", {})
        lam = _get(opts, "lam", None)
        eps = float(_get(opts, "eps", 1e-6))

        scores = token_level_rewards.sum(dim=-1)
        uids = np.asarray(index, dtype=object).reshape(-1)
        real = np.array([not str(u).startswith(PAD_PREFIX) for u in uids], dtype=bool)
        s_real = scores[torch.from_numpy(real)]
        if kl_in_reward:
            if gate == "outcome":
                raise ValueError(
                    "phantom_grpo_outcome decodes the binary outcome from the reward's sign, which a KL "
                    "penalty in the reward breaks; set algorithm.use_kl_in_reward=False (KL belongs in "
                    "the loss: actor_rollout_ref.actor.use_kl_loss=True)"
                )
            outcomes = None
        else:
            outcomes = decode_outcomes(s_real.detach().cpu().numpy(), lam)

        adv = torch.zeros_like(scores)
        if real.any():
            adv_real, stats = group_advantages(s_real, uids[real], outcomes=outcomes, gate=gate, norm=norm, eps=eps)
            adv[torch.from_numpy(real)] = adv_real
        else:
            _, stats = group_advantages(s_real, uids[real], outcomes=outcomes, gate=gate, norm=norm, eps=eps)
        _log(gate, stats, adv[torch.from_numpy(real)].detach().cpu().numpy(), outcomes)
        adv_tokens = broadcast_to_tokens(adv, response_mask)
        return adv_tokens, adv_tokens

    phantom_grpo.__name__ = phantom_grpo.__qualname__ = f"phantom_grpo_{gate}"
    phantom_grpo.__doc__ = f"GRPO advantages with the {gate!r} group gate (phantom.advantages.group_advantages)."
    return phantom_grpo


def register() -> list[str]:
    """Register the estimators with verl (idempotent); returns the names now registered."""
    from verl.trainer.ppo import core_algos

    for name, gate in ESTIMATORS.items():
        # verl raises when a name is registered twice with a different function object.
        if name not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(name)(make_estimator(gate))
    return registered()


def registered() -> list[str]:
    """The phantom estimator names present in verl's registry of this process."""
    from verl.trainer.ppo import core_algos

    return sorted(n for n in ESTIMATORS if n in core_algos.ADV_ESTIMATOR_REGISTRY)


if importlib.util.find_spec("verl") is not None:  # without verl (docs, the CPU lab) there is nothing to do
    register()
