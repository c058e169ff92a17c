"""Unmerged LoRA adapters in the ``hf`` CPU rollout server: the same two-phase sync verl does for vLLM.

With ``actor_rollout_ref.model.lora.merge=False`` (verl 0.9.1's default) the FSDP worker does not
send merged weights. ``ActorRolloutRefWorker.update_weights`` (``verl/workers/engine_workers.py``)
sends every step only the **adapter** tensors (``base_sync_done=True``; PEFT's
``get_peft_model_state_dict`` names, ``base_model.model....q_proj.lora_A.weight``) with the
adapter's ``peft_config`` as a dict; vLLM applies them as a LoRA request on an unchanged base. The
base is what the rollout engine read from the model folder, unless ``rollout.load_format=dummy``:
then the worker first sends the frozen **base** weights once (``base_sync_done=False``; names as
verl's ``replace_lora_wrapper`` writes them, ``...q_proj.base_layer.weight`` for every LoRA-wrapped
linear).

The functions here do the same to a Hugging Face model: wrap it with PEFT from that dict, load the
base weights into the wrapped layers, then load adapters into it step after step. Sampling then runs
the adapted model, while the base stays what the first sync sent: a wrong adapter sync shows up as a
rollout/actor log-prob mismatch (``training/rollout_probs_diff_*``), not as silently merged weights.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["wrap", "load_base", "load_adapters", "lora_config"]


def lora_config(peft_config: dict[str, Any]):
    """A ``peft.LoraConfig`` from the dict verl sends (``LoraConfig.to_dict()``; unknown keys are dropped)."""
    import dataclasses

    from peft import LoraConfig

    known = {f.name for f in dataclasses.fields(LoraConfig)}
    kwargs = {k: v for k, v in peft_config.items() if k in known and k not in ("peft_type", "auto_mapping")}
    kwargs["inference_mode"] = True  # the server never trains
    if isinstance(kwargs.get("target_modules"), (set, frozenset)):
        kwargs["target_modules"] = sorted(kwargs["target_modules"])
    return LoraConfig(**kwargs)


def wrap(model: torch.nn.Module, peft_config: dict[str, Any]) -> torch.nn.Module:
    """``model`` wrapped in PEFT LoRA layers described by ``peft_config`` (adapter weights still zero)."""
    from peft import get_peft_model

    peft = get_peft_model(model, lora_config(peft_config))
    peft.requires_grad_(False)
    return peft.eval()


def _inner(peft_model: torch.nn.Module) -> torch.nn.Module:
    return peft_model.base_model.model  # the original transformers model, LoRA layers inside


def load_base(peft_model: torch.nn.Module, state: dict[str, torch.Tensor]) -> int:
    """Load base weights sent with ``base_sync_done=False``; every base parameter must arrive.

    Names are those of the wrapped model's inner module (``model.layers.0.self_attn.q_proj.base_layer.weight``
    for wrapped layers, plain names for the rest); a name without ``base_layer`` that belongs to a wrapped
    layer is accepted too.
    """
    inner = _inner(peft_model)
    expected = {k for k in inner.state_dict() if "lora_" not in k}
    fixed = {}
    for name, tensor in state.items():
        if name not in expected and name.endswith((".weight", ".bias")):
            head, _, leaf = name.rpartition(".")
            alt = f"{head}.base_layer.{leaf}"
            name = alt if alt in expected else name
        fixed[name] = tensor
    unexpected = sorted(set(fixed) - expected)
    missing = sorted(k for k in expected - set(fixed) if not k.endswith("lm_head.weight"))  # tied embeddings
    if unexpected or missing:
        raise RuntimeError(f"LoRA base sync mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    inner.load_state_dict(fixed, strict=False)
    if getattr(inner.config, "tie_word_embeddings", False):
        inner.tie_weights()
    return len(fixed)


def load_adapters(peft_model: torch.nn.Module, state: dict[str, torch.Tensor]) -> int:
    """Load adapter tensors sent with ``base_sync_done=True``; all of the adapter's tensors must arrive."""
    from peft.utils.save_and_load import get_peft_model_state_dict, set_peft_model_state_dict

    expected = set(get_peft_model_state_dict(peft_model))
    got = set(state)
    if got != expected:
        raise RuntimeError(f"LoRA adapter sync mismatch: missing={sorted(expected - got)[:5]} "
                           f"unexpected={sorted(got - expected)[:5]}")
    result = set_peft_model_state_dict(peft_model, state)
    bad = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if bad:
        raise RuntimeError(f"LoRA adapter sync: PEFT rejected {bad[:5]}")
    return len(state)
