#!/usr/bin/env python
"""One command for a lent GPU machine: what the GPU path needs to know, as JSON files in OUT_DIR.

    python scripts/device_check.py OUT_DIR            # on the GPU machine, <= 6 minutes
    python scripts/device_check.py OUT_DIR --dry-run  # anywhere: the same code on CPU with tiny shapes

Written for a machine with torch (2.11, CUDA) and transformers but no vLLM, no Ray and no internet.
It needs nothing else: no peft (LoRA is a few lines of torch below), no verl, no downloads (every
model is built from a config with random weights). phantom's own source comes from ``src/`` next to
this script. Parts, each written to ``OUT_DIR/<part>.json`` as soon as it finishes, and
``OUT_DIR/summary.json`` at the end:

* ``inventory``: nvidia-smi, Python, torch and its CUDA build, transformers, flash-attn, vLLM, Ray;
* ``attention``: a Qwen2-shaped model from a config with ``flash_attention_2`` and with ``sdpa``:
  does it load, does a padded forward run, how far apart are the two;
* ``memory``: peak GPU memory of one LoRA (r=32, alpha 32, all linear layers of the decoder)
  forward/backward with gradient checkpointing in bf16, for 1.5B- and 7B-shaped models at micro-batch
  8 vs 2 and 1,024 vs 1,536 tokens, with verl's log-prob path (row-wise log-softmax of bf16 logits):
  the numbers behind ``phantom.verl.gpu.MEMORY_TABLE``;
* ``parity``: ``phantom.advantages.group_advantages``, the verl estimators and the shaped reward on a
  CUDA batch against the same computation on the CPU.

A part that fails records its error and the script goes on; ``--budget-s`` (default 330 s) skips
what would not fit. Exit code 0 when every part ran, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: Qwen2.5 shapes (the models' public config.json); random weights, nothing is downloaded.
SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
#: --dry-run: the same structure at toy size (CPU, seconds).
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, tie_word_embeddings=True)
LORA_R, LORA_ALPHA = 32, 32
MICRO = (8, 2)
TOKENS = (1024, 1536)


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _run(cmd: list[str]) -> str:
    exe = shutil.which(cmd[0])
    if not exe:
        return f"{cmd[0]}: not found"
    try:
        return subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _installed(name: str) -> dict[str, Any]:
    """Installed or not, and its version, without importing it (verl or Ray take a minute to import)."""
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec(name) is None:
        return {"installed": False}
    try:
        return {"installed": True, "version": md.version(name)}
    except md.PackageNotFoundError:
        return {"installed": True, "version": "unknown"}


def _try_import(name: str) -> dict[str, Any]:
    try:
        mod = __import__(name)
        return {"imports": True, "version": str(getattr(mod, "__version__", "unknown"))}
    except Exception as exc:  # ImportError, or an ABI mismatch surfacing as OSError/RuntimeError
        return {"imports": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def inventory(dev: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
        "nvidia_smi": _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                            "--format=csv,noheader"]),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(), "device": dev,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "disk_free_gib": round(shutil.disk_usage(ROOT).free / 2**30, 1),
    }
    if torch.cuda.is_available():
        out["gpus"] = [{"name": torch.cuda.get_device_name(i),
                        "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 2),
                        "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
                       for i in range(torch.cuda.device_count())]
        out["bf16_supported"] = torch.cuda.is_bf16_supported()
    for name in ("transformers", "flash_attn", "numpy"):  # a real import: an ABI mismatch shows only here
        out[name] = _try_import(name)
    for name in ("vllm", "ray", "peft", "verl"):
        out[name] = _installed(name)
    return out


def _config(shape: dict[str, Any], attn: str):
    from transformers import Qwen2Config

    return Qwen2Config(**shape, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6, use_cache=False,
                       attn_implementation=attn)


def _model(shape: dict[str, Any], attn: str, dev: str, dtype: Any):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        try:
            return Qwen2ForCausalLM._from_config(_config(shape, attn), attn_implementation=attn, dtype=dtype)
        except TypeError:  # transformers < 4.56 calls it torch_dtype
            return Qwen2ForCausalLM._from_config(_config(shape, attn), attn_implementation=attn, torch_dtype=dtype)


def attention(dev: str, dry: bool, budget: Budget) -> dict[str, Any]:
    """Load with flash_attention_2 and with sdpa; a left-padded forward; the two outputs compared."""
    import torch

    shape = TINY if dry else SHAPES["qwen2.5-0.5b"]
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    ids = torch.randint(0, shape["vocab_size"], (4, 256 if not dry else 32), device=dev)
    mask = torch.ones_like(ids)
    mask[1, :10] = 0  # left padding on one row, as verl's batches have without remove-padding
    out: dict[str, Any] = {"shape": "tiny" if dry else "qwen2.5-0.5b", "dtype": str(dtype)}
    logits = {}
    for attn in ("flash_attention_2", "sdpa"):
        rec: dict[str, Any] = {}
        t = time.perf_counter()
        try:
            model = _model(shape, attn, dev, dtype).eval()
            rec["loaded"] = True
            rec["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            with torch.no_grad():
                lg = model(input_ids=ids, attention_mask=mask).logits.float()
            rec["forward"] = bool(torch.isfinite(lg[mask.bool()]).all())
            logits[attn] = lg
            del model
        except Exception as exc:  # what a user without flash-attn would hit inside verl's worker
            rec.setdefault("loaded", False)
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        rec["seconds"] = round(time.perf_counter() - t, 2)
        out[attn] = rec
        if dev != "cpu":
            torch.cuda.empty_cache()
    if len(logits) == 2:
        keep = mask.bool()
        out["max_abs_logit_diff"] = float((logits["flash_attention_2"] - logits["sdpa"])[keep].abs().max())
    return out


class LoRALinear:
    """``base(x) + scale * B(A(x))`` with ``base`` frozen: PEFT's LoRA forward in plain torch."""

    @staticmethod
    def wrap(base: Any, r: int, alpha: int) -> Any:
        import math

        import torch

        class _LoRA(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.base = base.requires_grad_(False)
                w = base.weight
                self.A = torch.nn.Parameter(torch.empty(r, w.shape[1], dtype=w.dtype, device=w.device))
                self.B = torch.nn.Parameter(torch.zeros(w.shape[0], r, dtype=w.dtype, device=w.device))
                torch.nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
                self.scale = alpha / r

            def forward(self, x: Any) -> Any:
                return self.base(x) + (x @ self.A.t() @ self.B.t()) * self.scale

        return _LoRA()


def add_lora(model: Any, r: int = LORA_R, alpha: int = LORA_ALPHA) -> int:
    """LoRA on every linear layer of the decoder (PEFT's ``all-linear``: the output head excluded)."""
    import torch

    model.requires_grad_(False)
    n = 0
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, LoRALinear.wrap(child, r, alpha))
                    n += 1
    return n


def _logprobs_rowwise(logits: Any, labels: Any) -> Any:
    """verl's ``logprobs_from_logits_v2`` for bf16 logits: log-softmax one row at a time."""
    import torch

    rows = [torch.log_softmax(lg, dim=-1).gather(-1, lb.unsqueeze(-1)).squeeze(-1) for lg, lb in zip(logits, labels)]
    return torch.stack(rows)


def _step(model: Any, micro: int, tokens: int, vocab: int, dev: str) -> dict[str, Any]:
    import torch

    ids = torch.randint(0, vocab, (micro, tokens), device=dev)
    if dev != "cpu":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if dev != "cpu" else 0
    t = time.perf_counter()
    logits = model(input_ids=ids).logits[:, :-1]
    logp = _logprobs_rowwise(logits, ids[:, 1:])
    loss = -logp.float().mean()
    loss.backward()
    rec: dict[str, Any] = {"micro": micro, "tokens": tokens, "loss": round(float(loss.detach()), 4)}
    if dev != "cpu":
        torch.cuda.synchronize()
        rec["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        rec["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        rec["before_gib"] = round(before / 2**30, 3)
    rec["seconds"] = round(time.perf_counter() - t, 3)
    model.zero_grad(set_to_none=True)
    return rec


def memory(dev: str, dry: bool, budget: Budget, attn: str) -> dict[str, Any]:
    import torch

    dtype = torch.bfloat16 if dev != "cpu" else torch.float32
    tokens = (64, 96) if dry else TOKENS
    out: dict[str, Any] = {"lora": {"r": LORA_R, "alpha": LORA_ALPHA, "target": "all-linear"}, "dtype": str(dtype),
                           "attn_implementation": attn, "gradient_checkpointing": True, "cases": []}
    for label in ("qwen2.5-1.5b", "qwen2.5-7b"):
        shape = TINY if dry else SHAPES[label]
        if budget.left() < 30:
            out["cases"].append({"model": label, "skipped": "time budget"})
            continue
        try:
            model = _model(shape, attn, dev, dtype)
            n_lora = add_lora(model)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()
            weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        except Exception as exc:
            out["cases"].append({"model": label, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
            continue
        for micro in MICRO:
            for n_tok in tokens:
                case = {"model": label, "weights_gib": round(weights, 3), "lora_layers": n_lora,
                        "trainable_params": trainable}
                if budget.left() < 20:
                    case.update(micro=micro, tokens=n_tok, skipped="time budget")
                else:
                    try:
                        case.update(_step(model, micro, n_tok, shape["vocab_size"], dev))
                    except torch.OutOfMemoryError as exc:
                        case.update(micro=micro, tokens=n_tok, oom=True, error=str(exc)[:200])
                    except Exception as exc:
                        case.update(micro=micro, tokens=n_tok, error=f"{type(exc).__name__}: {str(exc)[:300]}")
                out["cases"].append(case)
                if dev != "cpu":
                    torch.cuda.empty_cache()
        del model
        if dev != "cpu":
            torch.cuda.empty_cache()
    return out


def parity(dev: str) -> dict[str, Any]:
    """group_advantages, the three verl estimators and the shaped reward: device result == CPU result."""
    import numpy as np
    import torch

    from phantom import rewards
    from phantom.advantages import group_advantages
    from phantom.verl.estimators import make_estimator
    from phantom.verl.reward import compute_score

    g = torch.Generator().manual_seed(0)
    groups, n = 64, 5
    outcome = (torch.rand(groups * n, generator=g) < 0.3).float()
    outcome[: 5 * n] = 0  # some all-fail groups: the phantom's raw material
    length = torch.randint(1, 900, (groups * n,), generator=g).float()
    lam = 0.3
    index = np.repeat(np.arange(groups), n).astype(str)
    out: dict[str, Any] = {"device": dev, "rows": groups * n}
    scores_cpu = torch.as_tensor(rewards.length_short(outcome.numpy(), length.numpy(), lam=lam), dtype=torch.float32)
    try:
        on_dev = rewards.length_short(outcome.to(dev), length.to(dev), lam=lam)
        on_dev = torch.as_tensor(on_dev).cpu() if not isinstance(on_dev, torch.Tensor) else on_dev.cpu()
        out["shaped_reward_device_tensors"] = {"ok": True, "max_abs_diff": float((on_dev.float() - scores_cpu).abs().max())}
    except Exception as exc:  # rewards take host arrays; what a caller with CUDA tensors meets
        out["shaped_reward_device_tensors"] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    texts = {"right": "6 * 7 = 42\n#### 42", "wrong": "#### 41"}
    out["compute_score"] = {k: compute_score("openai/gsm8k", v, "42", lam=lam) for k, v in texts.items()}
    for gate in ("none", "score", "outcome"):
        for norm in ("std", "none"):
            a_cpu, s_cpu = group_advantages(scores_cpu, index, outcomes=outcome, gate=gate, norm=norm)
            a_dev, s_dev = group_advantages(scores_cpu.to(dev), index, outcomes=outcome.to(dev), gate=gate, norm=norm)
            out[f"group_advantages/{gate}/{norm}"] = {
                "device_out": str(a_dev.device), "max_abs_diff": float((a_dev.cpu() - a_cpu).abs().max()),
                "stats_equal": s_cpu == s_dev, "phantom_groups": s_cpu.phantom, "zeroed": s_cpu.zeroed}
    resp = 12
    tlr = torch.zeros(groups * n, resp)
    tlr[:, -1] = scores_cpu
    mask = torch.ones(groups * n, resp, dtype=torch.long)
    cfg = {"norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False, "phantom": {"lam": lam}}
    for gate in ("none", "score", "outcome"):
        fn = make_estimator(gate)
        try:
            adv_cpu, _ = fn(tlr, mask, index=index, config=cfg)
            adv_dev, _ = fn(tlr.to(dev), mask.to(dev), index=index, config=cfg)
            out[f"estimator/phantom_grpo_{gate}"] = {"ok": True, "device_out": str(adv_dev.device),
                                                    "max_abs_diff": float((adv_dev.cpu() - adv_cpu).abs().max())}
        except Exception as exc:
            out[f"estimator/phantom_grpo_{gate}"] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    out["all_equal"] = all(v.get("max_abs_diff", 1.0) < 1e-6 and v.get("stats_equal", True) and v.get("ok", True)
                           for k, v in out.items() if k.startswith(("group_advantages/", "estimator/")))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for the JSON results (created)")
    p.add_argument("--dry-run", action="store_true", help="CPU and tiny shapes: checks the script itself")
    p.add_argument("--budget-s", type=float, default=330.0, help="time budget in seconds (default 330)")
    p.add_argument("--only", default="inventory,parity,attention,memory", help="comma list of parts")
    args = p.parse_args(argv)
    budget = Budget(args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    dev = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if dev == "cpu" and not args.dry_run:
        print("device_check: no CUDA device; use --dry-run on a machine without a GPU", file=sys.stderr)
        return 2
    fa = _try_import("flash_attn")["imports"] if dev != "cpu" else False
    summary: dict[str, Any] = {"dry_run": args.dry_run, "device": dev, "started": time.time(), "parts": {}}
    parts = {"inventory": lambda: inventory(dev), "parity": lambda: parity(dev),
             "attention": lambda: attention(dev, args.dry_run, budget),
             "memory": lambda: memory(dev, args.dry_run, budget, "flash_attention_2" if fa else "sdpa")}
    for name in [x.strip() for x in args.only.split(",") if x.strip()]:
        if name not in parts:
            print(f"device_check: part {name!r} is unknown; allowed: {', '.join(parts)}", file=sys.stderr)
            return 2
        t = time.perf_counter()
        try:
            result, status = parts[name](), "ok"
        except Exception as exc:  # one broken part must not cost the others
            result, status = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}, "error"
        result["seconds"] = round(time.perf_counter() - t, 2)
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        summary["parts"][name] = {"status": status, "seconds": result["seconds"]}
        print(f"device_check: {name}: {status} in {result['seconds']:.1f} s", file=sys.stderr)
    summary["seconds"] = round(time.time() - summary["started"], 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if all(v["status"] == "ok" for v in summary["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
