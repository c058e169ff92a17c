"""The GPU backend's choices: attention kernel, micro-batches and vLLM's memory share, from the machine.

verl 0.9.1's actor defaults to ``attn_implementation=flash_attention_2`` and
``use_remove_padding=True`` (the packed-sequence path needs flash-attn's varlen kernels). flash-attn
is not in the ``verl[vllm]`` extra and has no prebuilt wheel for torch 2.11, so on a plain install
both defaults fail minutes after launch, inside a Ray worker. The launcher therefore decides here,
before anything starts: flash-attn imports -> FA2 with remove-padding; it does not -> ``sdpa``
without remove-padding (what the paper's artifact ran, ``gsm8k_outcome_gating/run_gate_arm.sh``).

Micro-batches and ``rollout.gpu_memory_utilization`` left unset (``None`` or ``"auto"``) come from
:data:`MEMORY_TABLE`, keyed by the smallest visible GPU's memory. The table is ours: the 32 GB row
is the artifact's setting on an RTX 5090; the other rows scale the actor micro-batch with the memory
left after vLLM's share. ``scripts/device_check.py`` measures the training peak these rows rest on.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Hardware", "MemoryRow", "MEMORY_TABLE", "probe", "no_gpu", "memory_row", "attention", "model_params",
           "resolve", "gpu_overrides", "BIG_MODEL_PARAMS"]

#: Models above this many parameters take the next smaller memory row (7B-class vs the paper's 1.5B).
BIG_MODEL_PARAMS = 4e9


@dataclass(frozen=True)
class Hardware:
    """What the launcher needs to know about a machine (``probe()`` measures it; tests build one)."""

    gpus: tuple[tuple[str, float], ...] = ()  # (name, total memory in GiB) per visible GPU
    flash_attn: str | None = None  # flash-attn version when it imports
    flash_attn_error: str | None = "not checked"
    torch_cuda: str | None = None  # torch.version.cuda (None: a CPU build)
    driver: str | None = None  # NVIDIA driver version (nvidia-smi)
    probed: bool = False  # True: measured on this machine

    @property
    def min_memory(self) -> float | None:
        return min(m for _, m in self.gpus) if self.gpus else None


@dataclass(frozen=True)
class MemoryRow:
    """One row of the memory table: per-GPU micro-batches and vLLM's share of the GPU."""

    label: str
    min_gib: float  # smallest total memory (GiB, as torch reports it) that selects this row
    micro: int  # actor.ppo_micro_batch_size_per_gpu
    logprob_micro: int  # rollout/ref log_prob_micro_batch_size_per_gpu
    gpu_memory_utilization: float  # rollout.gpu_memory_utilization
    why: str = field(default="", compare=False)


MEMORY_TABLE: tuple[MemoryRow, ...] = (
    MemoryRow("80+ GB", 72, 8, 16, 0.4, "ours: A100/H100 80 GB and larger; micro-batch 8 leaves ~half the card "
              "to the actor after vLLM's 40%"),
    MemoryRow("48 GB", 44, 4, 8, 0.35, "ours: L40S / A6000 / RTX 6000 Ada; micro-batch 4"),
    MemoryRow("32 GB", 30, 2, 2, 0.3, "the artifact's setting on an RTX 5090 32 GB (run_gate_arm.sh, "
              "~50 min per 40-step arm, paper section 12)"),
    MemoryRow("24 GB", 22, 1, 2, 0.25, "ours: RTX 3090/4090, A10; micro-batch 1 and a quarter of the card for vLLM"),
)


def memory_row(gib: float | None, params: float | None = None) -> tuple[MemoryRow, str]:
    """The row for a GPU of ``gib`` GiB (``None``: no GPU here -> the smallest row) and a model size."""
    rows = sorted(MEMORY_TABLE, key=lambda r: -r.min_gib)
    if gib is None:
        return rows[-1], "no GPU on this machine: the smallest row; the launcher picks again on the GPU machine"
    i = next((k for k, r in enumerate(rows) if gib >= r.min_gib), len(rows) - 1)
    why = f"{gib:.1f} GiB GPU"
    if gib < rows[-1].min_gib:
        why += f" (below the {rows[-1].label} row: expect out-of-memory errors)"
    if params is not None and params > BIG_MODEL_PARAMS and i < len(rows) - 1:
        i += 1
        why += f", {params / 1e9:.1f}B-parameter model: one row smaller"
    return rows[i], why


def _smi() -> tuple[str | None, list[tuple[str, float]]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, []
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None, []
    rows = [[x.strip() for x in line.split(",")] for line in out.strip().splitlines() if line.count(",") >= 2]
    return (rows[0][0] if rows else None), [(r[1], float(r[2]) / 1024) for r in rows if r[2].replace(".", "").isdigit()]


@functools.lru_cache(maxsize=1)
def probe() -> Hardware:
    """This machine: GPUs (torch, else nvidia-smi), the NVIDIA driver, torch's CUDA build, flash-attn."""
    driver, smi_gpus = _smi()
    gpus: list[tuple[str, float]] = []
    cuda = None
    try:
        import torch

        cuda = torch.version.cuda
        if torch.cuda.is_available():
            gpus = [(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory / 2**30)
                    for i in range(torch.cuda.device_count())]
    except Exception:  # a broken torch install: the doctor reports it, the probe goes on
        pass
    fa, err = None, None
    try:
        import flash_attn  # noqa: F401  (a real import: an ABI mismatch only shows here)

        fa = str(getattr(flash_attn, "__version__", "unknown"))
    except Exception as exc:  # ImportError, or OSError / RuntimeError from a wheel built for another torch
        err = f"{type(exc).__name__}: {exc}"
    return Hardware(gpus=tuple(gpus or smi_gpus), flash_attn=fa, flash_attn_error=err, torch_cuda=cuda,
                    driver=driver, probed=True)


def no_gpu() -> Hardware:
    """A machine without GPU or flash-attn (what printing a command on a CPU machine assumes)."""
    return Hardware(flash_attn_error="not installed", probed=False)


def attention(choice: str, hw: Hardware) -> tuple[str, bool, str]:
    """(attn_implementation, use_remove_padding, why) for ``choice`` in auto | sdpa | flash_attention_2."""
    if choice == "sdpa":
        return "sdpa", False, "sdpa without remove-padding (set by the spec)"
    if choice == "flash_attention_2":
        if hw.flash_attn is None and hw.probed:
            raise ValueError(f"attention='flash_attention_2' but flash-attn does not import here "
                             f"({hw.flash_attn_error}); use attention=auto or sdpa")
        return "flash_attention_2", True, "flash_attention_2 with remove-padding (set by the spec)"
    if hw.flash_attn is not None:
        return "flash_attention_2", True, f"flash_attention_2 with remove-padding (flash-attn {hw.flash_attn} imports)"
    return "sdpa", False, f"sdpa without remove-padding (flash-attn does not import: {hw.flash_attn_error})"


_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*[Bb](?![a-zA-Z])")


def model_params(model: str) -> float | None:
    """Parameter count of a model: from a local ``config.json`` (Qwen2/Llama shapes), else from its name."""
    cfg_path = Path(model) / "config.json"
    if cfg_path.is_file():
        try:
            c = json.loads(cfg_path.read_text())
            h, n, i, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
            kv = c.get("num_key_value_heads", c["num_attention_heads"]) / c["num_attention_heads"]
            per_layer = h * h * (2 + 2 * kv) + 3 * h * i
            return float(n * per_layer + v * h * (1 if c.get("tie_word_embeddings") else 2))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
    m = _SIZE.search(Path(model).name)
    return float(m.group(1)) * 1e9 if m else None


def _auto(value: Any) -> bool:
    return value is None or value == "auto"


def resolve(spec: Any, hw: Hardware) -> dict[str, Any]:
    """The concrete GPU settings for ``spec`` on ``hw``, and one line per decision (``why``).

    Called once per launch, by :func:`phantom.verl.plan.make_plan`; the command and the doctor read that plan.
    """
    attn, rmpad, attn_why = attention(spec.attention, hw)
    row, row_why = memory_row(hw.min_memory, model_params(spec.model))
    micro = row.micro if _auto(spec.micro_batch_size) else spec.micro_batch_size
    lp = row.logprob_micro if _auto(spec.logprob_micro_batch_size) else spec.logprob_micro_batch_size
    util = row.gpu_memory_utilization if _auto(spec.gpu_memory_utilization) else spec.gpu_memory_utilization
    from_row = [k for k, v in (("micro_batch_size", spec.micro_batch_size), ("logprob_micro_batch_size",
                spec.logprob_micro_batch_size), ("gpu_memory_utilization", spec.gpu_memory_utilization)) if _auto(v)]
    mem_why = (f"memory row {row.label} ({row_why}) for {', '.join(from_row)}" if from_row
               else "micro-batches and gpu_memory_utilization set by the spec")
    return {"attn": attn, "remove_padding": rmpad, "micro": int(micro), "logprob_micro": int(lp),
            "gpu_memory_utilization": float(util), "row": row, "why": [f"attention: {attn_why}", mem_why]}


def gpu_overrides(spec: Any, plan: Any) -> list[str]:
    """The backend block of a GPU run from its :class:`phantom.verl.plan.Plan`: vLLM rollout, attention,
    micro-batches, memory, LoRA sync."""
    a, r, m = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
    o = [f"{m}.use_remove_padding={plan.remove_padding}",
         f"+{m}.override_config.attn_implementation={plan.attn}",
         f"{a}.ppo_micro_batch_size_per_gpu={plan.micro}",
         f"{r}.name=vllm", f"{r}.tensor_model_parallel_size=1",
         f"{r}.log_prob_micro_batch_size_per_gpu={plan.logprob_micro}",
         f"{r}.gpu_memory_utilization={plan.gpu_memory_utilization}"]
    if spec.gradient_checkpointing is not None:
        o.append(f"{m}.enable_gradient_checkpointing={spec.gradient_checkpointing}")
    if spec.lora_rank > 0:
        o.append(f"{r}.load_format=safetensors")  # verl's LoRA docs: vLLM loads the real base weights
        if spec.lora_merge is not None:
            o.append(f"{m}.lora.merge={spec.lora_merge}")
    if spec.kl_loss_coef > 0:
        o.append(f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={plan.logprob_micro}")
    return o
