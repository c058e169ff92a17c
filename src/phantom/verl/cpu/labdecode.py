"""The lab's decoder behind the ``hf`` rollout server, for checkpoints the lab wrote.

The server's :class:`phantom.verl.cpu.rollout.BatchGenerator` runs ``transformers``' Qwen2 one token at
a time; at the lab's 0.35M parameters per-op overhead, not arithmetic, sets its speed (about a
hundred module calls per token). The lab samples the same function with
:meth:`phantom.lab.model.LabQwen2.generate`: fused q/k/v and gate/up projections, a preallocated KV
cache, the prefill run once per distinct prompt of a group, and the C decode kernel
(:mod:`phantom.lab.decode_kernel`, bit-identical to torch's ops). Its parameter names and
computation are transformers' Qwen2 (the lab's tests compare logits), so the server loads the same
weights, takes the same weight updates, and returns per-token log-probabilities of the same
quantity (``log_softmax(logits)`` of each sampled token, at temperature 1 or greedy), which verl's
actor recomputes (``training/rollout_probs_diff_*``).

Used for a checkpoint folder holding ``lab_meta.json`` and requests it can serve (temperature 1 or
greedy, no top-k/top-p, EOS honoured); anything else, unmerged LoRA adapters, or
``PHANTOM_HF_DECODER=hf`` take the transformers path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["LabDecoder", "usable", "DECODER_ENV"]

DECODER_ENV = "PHANTOM_HF_DECODER"


def usable(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a lab checkpoint and the lab decoder is not switched off."""
    return (Path(path) / "lab_meta.json").is_file() and os.environ.get(DECODER_ENV, "lab").strip().lower() != "hf"


class LabDecoder:
    """Batched sampling and log-probabilities with :class:`phantom.lab.model.LabQwen2`."""

    def __init__(self, path: str | os.PathLike[str], eos_ids: set[int], pad_id: int, generator: torch.Generator):
        from phantom.lab.model import load_checkpoint

        self.model = load_checkpoint(path).eval()
        self.model.requires_grad_(False)
        if len(eos_ids) != 1:
            raise ValueError(f"the lab decoder stops on one EOS token, the checkpoint names {sorted(eos_ids)}")
        self.eos, self.pad, self.generator = next(iter(eos_ids)), int(pad_id), generator
        self.calls = 0

    def supports(self, req: Any) -> bool:
        greedy = req.temperature <= 0
        return ((greedy or req.temperature == 1.0) and req.top_k in (-1, 0) and req.top_p >= 1.0
                and not req.ignore_eos and len(req.prompt_ids) + req.max_tokens <= self.model.cfg.max_positions)

    @torch.inference_mode()
    def generate(self, requests: list[Any]) -> list[dict]:
        """``{"token_ids", "log_probs"}`` per request, in order (EOS included when sampled, as transformers')."""
        out: list[dict | None] = [None] * len(requests)
        groups: dict[tuple[bool, int], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.temperature <= 0, r.max_tokens), []).append(i)
        for (greedy, max_new), idx in groups.items():
            prompts = [list(requests[i].prompt_ids) for i in idx]
            self.calls += 1
            ids, ended = self.model.generate(prompts, max_new=max_new, eos_id=self.eos, pad_id=self.pad,
                                             greedy=greedy, generator=self.generator)
            tokens = [t + [self.eos] if e else t for t, e in zip(ids, ended)]
            logp, mask, _ = self.model.response_logprobs(prompts, tokens, pad_id=self.pad)
            for j, i in enumerate(idx):
                out[i] = {"token_ids": tokens[j], "log_probs": logp[j, :len(tokens[j])].tolist()}
        return out  # type: ignore[return-value]

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Full (or merged-LoRA) weights in transformers' names; ``lm_head`` is tied to the embeddings."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if missing or unexpected:
            raise RuntimeError(f"lab decoder weight sync mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
