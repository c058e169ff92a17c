"""The CPU lab's setting run through TRL's real ``GRPOTrainer`` (no vLLM): the collapse there.

Same warm start (:func:`phantom.lab.sft.ensure_sft_model`, loaded by ``transformers``), the same
task and reward (``is_correct`` + the project's ``length_short`` as two TRL reward functions, so
their sum is ``outcome - lam * min(len/cap, 1)``), LoRA r=8 / alpha 16 on every projection (PEFT),
lr after a linear warm-up, AdamW, PPO clip 0.2, token-mean loss (TRL's ``loss_type="dapo"``), no KL,
``mini_batches`` optimizer steps per generation batch of ``prompts x rollouts`` completions (TRL's
``steps_per_generation``; the lab's two mini-batches, verl's ``ppo_mini_batch_size`` 16 of 32). Arms:

* ``none``: TRL's default (``scale_rewards="group"``), no filter;
* ``drgrpo``: ``scale_rewards="none"`` (Dr. GRPO), no filter;
* ``outcome``: TRL's default scaling with :func:`phantom.trl.outcome_gated`.

Held-out accuracy is greedy on ``eval_n`` validation problems (the lab's keys). A run is a
:class:`phantom.runs.RunDir` (``kind: trl``) written by :class:`phantom.trl.PhantomCallback`.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from phantom.runs import RunDir, runs_root, spec_hash

__all__ = ["ARMS", "TrlArmSpec", "accuracy_reward", "length_penalty", "greedy_evaluator", "build_trainer",
           "run_trl_arm"]

#: arm -> (gate, scale_rewards)
ARMS: dict[str, tuple[str, str]] = {"none": ("none", "group"), "drgrpo": ("none", "none"),
                                    "outcome": ("outcome", "group")}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class TrlArmSpec:
    """Every knob of one TRL lab run (defaults: the lab's setting of the book, ``phantom.lab`` paper.yaml's
    base: the ``lab_graded`` warm start, two updates per step at lr 2e-3 after a 10-step warm-up)."""

    arm: str = "outcome"
    lam: float = 0.3
    cap: int = 512
    seed: int = 0
    steps: int = 40
    prompts: int = 32
    rollouts: int = 5
    lr: float = 2e-3
    warmup_steps: int = 10  # training steps of linear lr warm-up, as the lab's (TRL counts optimizer steps, from 0)
    mini_batches: int = 2  # optimizer steps per generation batch (TRL steps_per_generation)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    clip: float = 0.2
    temperature: float = 1.0
    max_new: int | None = None  # response cap in tokens; None: the SFT profile's, as the lab's ArmSpec
    eval_every: int = 5
    eval_n: int = 256
    model: str = "lab_graded"  # SFT profile; the task is the one that profile was trained on
    profile: str = "adhoc"  # label only: which sweep profile produced the run

    def __post_init__(self) -> None:
        from phantom.lab.sft import PROFILES
        from phantom.lab.spec import ArmSpec

        if self.arm not in ARMS:
            raise ValueError(f"arm={self.arm!r} is unknown; allowed: {', '.join(ARMS)}")
        if self.model not in PROFILES:
            raise ValueError(f"model={self.model!r} is unknown; allowed: {', '.join(PROFILES)}")
        if self.max_new is None:
            object.__setattr__(self, "max_new", PROFILES[self.model].max_new)
        # the lab's own validation of the shared knobs (ranges, integers)
        ArmSpec(lam=self.lam, cap=self.cap, seed=self.seed, steps=self.steps, prompts=self.prompts,
                rollouts=self.rollouts, lr=self.lr, warmup_steps=self.warmup_steps, lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
                weight_decay=self.weight_decay, grad_clip=self.grad_clip, clip_low=self.clip, clip_high=self.clip,
                temperature=self.temperature, max_new=self.max_new, eval_every=self.eval_every,
                eval_n=self.eval_n, model=self.model)
        if isinstance(self.mini_batches, bool) or not isinstance(self.mini_batches, int) or self.mini_batches < 1 \
                or (self.prompts * self.rollouts) % self.mini_batches:
            raise ValueError(f"mini_batches={self.mini_batches!r} is invalid; allowed: an integer >= 1 that divides "
                             f"prompts x rollouts = {self.prompts * self.rollouts}")
        if self.lora_rank < 1:
            raise ValueError(f"lora_rank={self.lora_rank} is invalid here; allowed: >= 1 (TRL runs use PEFT LoRA)")

    @property
    def gate(self) -> str:
        return ARMS[self.arm][0]

    @property
    def scale_rewards(self) -> str:
        return ARMS[self.arm][1]

    def to_dict(self) -> dict[str, Any]:
        from phantom.lab.sft import resolve_sft

        d = asdict(self)
        d.update(gate=self.gate, scale_rewards=self.scale_rewards, task=resolve_sft(self.model).task.to_dict())
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None = None, **overrides: Any) -> TrlArmSpec:
        merged = {**(d or {}), **overrides}
        for derived in ("gate", "scale_rewards", "task"):
            merged.pop(derived, None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(merged) - known)
        if unknown:
            raise ValueError(f"unknown spec field(s) {unknown}; allowed: {', '.join(sorted(known))}")
        return cls(**merged)

    def run_name(self) -> str:
        return f"trl-{self.arm}-lam{self.lam:g}-s{self.seed}-{spec_hash(self.to_dict())[:8]}"


# ----------------------------------------------------------------------------------------------
# reward functions in TRL's signature (dataset column "answer" arrives as a keyword)
# ----------------------------------------------------------------------------------------------
def accuracy_reward(completions: list[str], answer: list[int], **kwargs: Any) -> list[float]:
    """1.0 when the completion's ``#### n`` answer equals the gold sum (the lab's strict checker)."""
    from phantom.rewards import is_correct

    return [float(is_correct(c, a, strict=True)) for c, a in zip(completions, answer)]


class LengthPenalty:
    """``-lam * min(len(chars)/cap, 1)``: with :func:`accuracy_reward`, the project's ``length_short``."""

    def __init__(self, lam: float = 0.3, cap: int = 512):
        from phantom.rewards import check_lam

        self.lam, self.cap = check_lam(lam), int(cap)
        self.__name__ = "length_penalty"

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [-self.lam * min(len(c) / self.cap, 1.0) for c in completions]


length_penalty = LengthPenalty()


def greedy_evaluator(tokenizer: Any, problems: list[Any], *, max_new: int, lam: float, cap: int,
                     chunk: int = 256):
    """``evaluator(model, step)``: greedy held-out accuracy and length under the lab's metric keys."""
    import numpy as np
    import torch

    from phantom.lab.rl import VAL_ACC, VAL_LEN, VAL_SCORE
    from phantom.rewards import has_answer_marker, is_correct, shaped_reward

    def evaluate(model: Any, step: int) -> dict[str, Any]:
        was = model.training
        model.eval()
        texts: list[str] = []
        ntok: list[int] = []
        ended: list[bool] = []
        try:
            for i in range(0, len(problems), chunk):
                part = problems[i:i + chunk]
                enc = tokenizer([p.prompt for p in part], return_tensors="pt", padding=True, padding_side="left")
                with torch.no_grad():
                    out = model.generate(**enc, max_new_tokens=max_new, do_sample=False,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
                for row in out[:, enc["input_ids"].shape[1]:].tolist():
                    stop = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else None
                    ids = row[:stop] if stop is not None else [t for t in row if t != tokenizer.pad_token_id]
                    ended.append(stop is not None)
                    ntok.append(len(ids))
                    texts.append(tokenizer.decode(ids, skip_special_tokens=True))
        finally:
            model.train(was)
        correct = np.array([is_correct(t, p.answer, strict=True) for t, p in zip(texts, problems)], dtype=float)
        chars = np.array([len(t) for t in texts], dtype=float)
        score = shaped_reward("length_short", correct, chars, lam=lam, cap=cap)
        return {VAL_ACC: float(correct.mean()), VAL_LEN: float(chars.mean()), VAL_SCORE: float(np.mean(score)),
                "phantom/val/acc_true": float(correct.mean()), "phantom/val/len_tokens": float(np.mean(ntok)),
                "phantom/val/marker_frac": float(np.mean([has_answer_marker(t) for t in texts])),
                "phantom/val/empty_frac": float(np.mean(chars == 0)), "phantom/val/eos_frac": float(np.mean(ended)),
                "phantom/sample": texts[0]}

    return evaluate


# ----------------------------------------------------------------------------------------------
def build_trainer(spec: TrlArmSpec, *, output_dir: str, name: str, root: Any = None,
                  extra: dict[str, Any] | None = None, evaluate: bool = True):
    """``(GRPOTrainer, PhantomCallback)`` for one arm; nothing trains yet."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from phantom.lab.sft import ensure_sft_model, resolve_sft
    from phantom.lab.task import make_split
    from phantom.trl.callback import PhantomCallback
    from phantom.trl.gate import observed, outcome_gated

    torch.set_num_threads(1)
    ckpt = ensure_sft_model(spec.model, progress=False)
    task = resolve_sft(spec.model).task
    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    train = make_split(task, "train", spec.prompts * spec.steps)
    ds = Dataset.from_dict({"prompt": [p.prompt for p in train], "answer": [p.answer for p in train]})
    wrap = outcome_gated if spec.gate == "outcome" else observed
    rewards = wrap(accuracy_reward, LengthPenalty(spec.lam, spec.cap), num_generations=spec.rollouts)
    args = GRPOConfig(
        output_dir=output_dir, num_generations=spec.rollouts,
        per_device_train_batch_size=spec.prompts * spec.rollouts // spec.mini_batches,
        steps_per_generation=spec.mini_batches, gradient_accumulation_steps=1, max_steps=spec.steps * spec.mini_batches,
        learning_rate=spec.lr, lr_scheduler_type="constant_with_warmup",
        warmup_steps=spec.warmup_steps * spec.mini_batches, weight_decay=spec.weight_decay, max_grad_norm=spec.grad_clip, adam_beta2=0.999,
        epsilon=spec.clip, beta=0.0, loss_type="dapo", scale_rewards=spec.scale_rewards,
        temperature=spec.temperature, max_completion_length=spec.max_new, seed=spec.seed, data_seed=spec.seed,
        use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, disable_dropout=True)
    peft = LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=0.0, target_modules=LORA_TARGETS,
                      task_type="CAUSAL_LM")
    val = make_split(task, "val", spec.eval_n)
    evaluator = greedy_evaluator(tok, val, max_new=spec.max_new, lam=spec.lam, cap=spec.cap) if evaluate else None
    cb = PhantomCallback(rewards, name=name, root=root, spec=spec.to_dict(), eval_every=spec.eval_every,
                         evaluator=evaluator,
                         extra={"checkpoint": str(ckpt), **(extra or {})})
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=ds, processing_class=tok,
                          peft_config=peft, callbacks=[cb])
    return trainer, cb


def run_trl_arm(spec: TrlArmSpec | dict[str, Any], *, name: str | None = None, root: Any = None,
                extra: dict[str, Any] | None = None) -> RunDir:
    """Run one arm into ``<root>/<name>`` (reusing a finished run of the same spec) and return it."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    spec = spec if isinstance(spec, TrlArmSpec) else TrlArmSpec.from_dict(spec)
    name = name or spec.run_name()
    existing = RunDir(runs_root(root) / name)
    if existing.check_startable(spec.to_dict()):
        return existing
    out = runs_root(root) / f".{name}.trl-output"
    trainer, cb = build_trainer(spec, output_dir=str(out), name=name, root=root, extra=extra)
    t0 = time.time()
    try:
        trainer.train()
    except BaseException as e:
        cb.fail(e)
        raise
    finally:
        shutil.rmtree(out, ignore_errors=True)
    run = RunDir(runs_root(root) / name)
    if run.status != "done":  # pragma: no cover - on_train_end always runs after a clean train()
        run.finish("done", wall_seconds=time.time() - t0)
    bad = [h["_step"] for h in cb.history if any(isinstance(v, float) and not math.isfinite(v) for v in h.values())]
    if bad:  # pragma: no cover - _log refuses non-finite values
        raise FloatingPointError(f"non-finite metrics at steps {bad}")
    return run
