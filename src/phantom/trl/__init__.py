"""phantom for TRL users: the outcome gate inside ``GRPOTrainer`` and the telemetry TRL lacks.

::

    from phantom.trl import PhantomCallback, outcome_gated

    reward_funcs = outcome_gated(accuracy_reward, format_reward, num_generations=8)  # outcome first
    trainer = GRPOTrainer(model=..., reward_funcs=reward_funcs,
                          args=GRPOConfig(num_generations=8, ...),
                          callbacks=[PhantomCallback(reward_funcs)])  # optional: runs/<name>/ for `phantom watch`

Needs the ``trl`` extra (``pip install phantom[trl]``, TRL 1.16). :mod:`phantom.trl.gate` holds the
reward functions, :mod:`phantom.trl.callback` the callback, :mod:`phantom.trl.lab` the CPU-lab
runs in TRL's trainer, :mod:`phantom.trl.sweep` the committed sweep.
"""

from __future__ import annotations

from typing import Any

from phantom.trl.gate import GATES, TRL_EPS, BatchRecord, GatedRewards, check_config, observed, outcome_gated

__all__ = ["GATES", "TRL_EPS", "BatchRecord", "GatedRewards", "PhantomCallback", "check_config", "observed",
           "outcome_gated"]


def __getattr__(name: str) -> Any:
    # The callback imports transformers; keep `from phantom.trl import outcome_gated` light.
    if name == "PhantomCallback":
        from phantom.trl.callback import PhantomCallback

        return PhantomCallback
    raise AttributeError(f"module 'phantom.trl' has no attribute {name!r}")
