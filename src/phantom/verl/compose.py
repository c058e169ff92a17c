"""verl's own config composed from our overrides, and checked by verl's own ``validate_config``.

A typo or an inconsistent batch size then fails in seconds instead of after Ray has started ~30
processes. On a machine without vLLM one line of verl's validation cannot run: for a vLLM rollout
with unmerged LoRA it looks up the ranks vLLM accepts (``get_vllm_max_lora_rank`` in
``verl/workers/rollout/vllm_rollout/utils.py``), and importing that module imports vLLM. There,
and only there, :func:`compose` runs ``validate_config`` on a copy with ``lora.merge=True`` (the
one condition verl checks before that lookup) and checks the rank against the list verl itself
falls back to when vLLM's type is unavailable. Every other check is verl's, unchanged.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

__all__ = ["compose", "VLLM_LORA_RANKS", "vllm_available"]

#: verl 0.9.1's fallback for vLLM's ``MaxLoRARanks`` (used when ``vllm.config.lora`` cannot be imported).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _lora_rank(cfg: Any) -> tuple[int, bool]:
    model = cfg.actor_rollout_ref.model
    lora = model.get("lora", {}) or {}
    rank = int(lora.get("rank", 0) or 0) or int(model.get("lora_rank", 0) or 0)
    return rank, bool(lora.get("merge", False))


def _validate(cfg: Any, notes: list[str] | None) -> None:
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    target = cfg
    rank, merge = _lora_rank(cfg)
    if rank > 0 and not merge and cfg.actor_rollout_ref.rollout.name == "vllm" and not vllm_available():
        if rank > VLLM_LORA_RANKS[-1]:
            raise ValueError(f"lora_rank must be less than or equal to {VLLM_LORA_RANKS[-1]}, but got {rank}")
        target = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        with open_dict(target):
            target.actor_rollout_ref.model.lora.merge = True
        if notes is not None:
            notes.append(f"vLLM is not installed here: its LoRA-rank lookup was replaced by verl's fallback list "
                         f"(rank {rank} -> vLLM max_lora_rank {min(r for r in VLLM_LORA_RANKS if r >= rank)}); "
                         "every other check is verl's validate_config")
    with warnings.catch_warnings():  # "Disabled critic as adv_estimator != gae": expected for GRPO
        warnings.filterwarnings("ignore", message="Disabled critic")
        validate_config(target, use_reference_policy=need_reference_policy(target), use_critic=need_critic(target))


def compose(overrides: list[str], trainer: str = "v1", recipe_path: str | None = None, validate: bool = True,
            notes: list[str] | None = None) -> Any:
    """verl's config composed from ``overrides`` and (``validate=True``) checked by verl's ``validate_config``.

    ``trainer``: ``v1`` / ``legacy`` compose verl's ``ppo_trainer``; ``recipe_dapo`` composes
    ``<recipe_path>/recipe/dapo/config/dapo_trainer.yaml`` on top of it. Raises ``ValueError`` with
    Hydra's or verl's message; ``hydra.*`` overrides are skipped (they configure the launcher process,
    not the config). ``notes`` (a list) receives a line when part of the validation was substituted.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    cfg_overrides = [x for x in overrides if not x.startswith("hydra.")]
    GlobalHydra.instance().clear()
    try:
        if trainer == "recipe_dapo":
            cfg_overrides.append("hydra.searchpath=[pkg://verl.trainer.config]")
            folder = (Path(recipe_path or ".") / "recipe" / "dapo" / "config").resolve()
            ctx, name = initialize_config_dir(str(folder), version_base=None), "dapo_trainer"
        else:
            ctx, name = initialize_config_module("verl.trainer.config", version_base=None), "ppo_trainer"
        with ctx:
            cfg = hydra_compose(config_name=name, overrides=cfg_overrides)
        if validate:
            _validate(cfg, notes)
    except Exception as exc:  # Hydra/OmegaConf/verl raise many types; the caller wants one
        raise ValueError(f"verl config rejected the overrides: {type(exc).__name__}: {exc}") from exc
    finally:
        GlobalHydra.instance().clear()
    return cfg
