"""The CPU lab: the phantom-advantage collapse, reproduced with a real policy on two CPU cores.

Modules: :mod:`.task` (problems), :mod:`.tokenizer` and :mod:`.model` (a Qwen2 checkpoint in Hugging
Face format), :mod:`.sft` (the cached warm start), :mod:`.loss` (PPO-clip / GSPO / KL, equal to
verl's), :mod:`.spec` (a validated arm), :mod:`.rl` and :mod:`.dapo` (the training loop),
:mod:`.sweep` (papermill sweeps) and :mod:`.cli` (``phantom lab ...``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ensure_sft_model", "run_sweep", "run_arm"]


def __getattr__(name: str) -> Any:  # lazy: `import phantom.lab` stays cheap
    if name == "ensure_sft_model":
        from phantom.lab.sft import ensure_sft_model

        return ensure_sft_model
    if name == "run_sweep":
        from phantom.lab.sweep import run_sweep

        return run_sweep
    if name == "run_arm":
        from phantom.lab.rl import run_arm

        return run_arm
    raise AttributeError(name)
