"""One lab arm, fully specified and validated before any work starts.

An :class:`ArmSpec` holds every knob a run depends on; its ``to_dict()`` is the run's manifest
``spec`` (so chapters select runs with ``iter_runs(root, arm="outcome", lam=0.3, ...)``) and its
hash names the run folder. Bad values raise ``ValueError`` naming the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from phantom.advantages import GATES
from phantom.lab.loss import AGG_MODES, KL_TYPES
from phantom.lab.task import TaskConfig
from phantom.rewards import KINDS, check_lam, check_noise_p
from phantom.runs import spec_hash

__all__ = ["ArmSpec", "ESTIMATORS", "SAMPLINGS", "DROPS", "DAPO_METRIC"]

ESTIMATORS: tuple[str, ...] = ("grpo", "drgrpo", "gspo")
SAMPLINGS: tuple[str, ...] = ("gate", "dapo")
DROPS: tuple[str, ...] = ("zero", "mask")
#: seeds go to torch's and numpy's generators; every count has an upper bound too, so that a typo
#: (``--set prompts=1e23``) is refused with its name before a folder is made, not deep in a run
#: (eval_n: the held-out problems stop below index 100000, where the SFT's check problems start)
MAX_SEED = 2**32 - 1
#: DAPO's ``filter_groups.metric`` for each arm (the arm is which signal decides "no contrast").
DAPO_METRIC = {"score": "score", "outcome": "acc"}


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is unknown; allowed: {', '.join(allowed)}")
    return value


def _int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    allowed = f"{lo} <= {name} <= {hi}" if hi is not None else f"{name} >= {lo}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or int(value) != value:
        raise ValueError(f"{name}={value!r} is not an integer; allowed: an integer, {allowed}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name}={value!r} is out of range; allowed: {allowed}")
    return v


def _float(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number") from None
    ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        lb, hb = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ValueError(f"{name}={value!r} is out of range; allowed: {lb}{lo}, {hi}{hb}")
    return v


@dataclass(frozen=True)
class ArmSpec:
    """Every knob of one RL run (paper §4 at lab scale).

    The defaults are the lab's earlier main setting (worked answers, ``model="lab"``, lr 2.5e-3); the
    book's main setting is the `paper` sweep's base (``model="lab_graded"``, lr 2e-3), which the CLI's
    ``phantom lab run`` starts from. The defaults stay because the committed sweeps' files rely on them.
    """

    arm: str = "outcome"  # none | score | outcome: which groups get zero advantage
    estimator: str = "grpo"  # grpo (std-normalised) | drgrpo (centred only) | gspo (sequence ratio)
    kind: str = "length_short"  # shaped-reward family (phantom.rewards.KINDS)
    lam: float = 0.3  # phantom strength
    cap: int = 512  # characters at which the length term saturates (the paper's 512)
    seed: int = 0
    steps: int = 40
    prompts: int = 32  # train batch: groups per step
    rollouts: int = 5  # group size
    lr: float = 2.5e-3  # LoRA adapters, 2 updates a step (worked style; the graded main setting: 2e-3, ARCHITECTURE.md)
    warmup_steps: int = 10  # linear lr warm-up (verl lr_warmup_steps); without it the first updates
    #                         alone cost every arm ~0.1 of held-out accuracy by step 5
    adam_beta2: float = 0.999
    weight_decay: float = 0.01  # verl actor default
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2  # 0.28 = DAPO's Clip-Higher
    clip_c: float = 3.0  # dual-clip bound for negative advantages (verl's default)
    loss_agg: str = "token-mean"
    kl_coef: float = 0.0  # KL loss to the SFT policy (verl use_kl_loss)
    kl_type: str = "low_var_kl"
    train_embeddings: bool = False  # False: the tied embedding/LM head stays fixed (as under the paper's LoRA)
    lora_rank: int = 8  # >0: LoRA adapters on every projection (paper: r=32 on 1.5B); 0: full fine-tuning
    lora_alpha: float = 16.0
    mini_batches: int = 2  # optimizer steps per epoch (verl ppo_mini_batch_size = prompts/mini_batches);
    #                        2 = the paper's artifact (ppo_mini_batch_size 16 of 32 prompts)
    ppo_epochs: int = 1
    temperature: float = 1.0
    max_new: int | None = None  # response cap in tokens; None: the SFT profile's (its evaluation cap)
    eval_every: int = 5
    eval_n: int = 256
    task: dict | None = None  # TaskConfig fields; None: the task the model's SFT profile was trained on
    model: str = "lab"  # SFT profile (phantom.lab.sft.PROFILES)
    sft_seed: int | None = None  # seed of the warm start's SFT (another checkpoint); None: the profile's own
    noise_p: float = 0.0  # verifier flip probability
    sampling: str = "gate"  # gate: zero advantages; dapo: physical deletion and refill
    gen_prompts: int = 0  # DAPO generation batch in prompts (0: 2 x prompts)
    max_gen_batches: int = 10
    drop: str = "zero"  # zero: advantage-zeroing; mask: drop gated rows from the loss mask (§10)
    profile: str = "adhoc"  # label only: which sweep profile produced the run

    def __post_init__(self) -> None:
        s = object.__setattr__
        _choice("arm", self.arm, GATES)
        _choice("estimator", self.estimator, ESTIMATORS)
        _choice("kind", self.kind, KINDS)
        s(self, "lam", check_lam(self.lam, upper=1.0))
        s(self, "cap", _int("cap", self.cap, 1, 1_000_000))
        s(self, "seed", _int("seed", self.seed, 0, MAX_SEED))
        s(self, "steps", _int("steps", self.steps, 1, 100_000))
        s(self, "prompts", _int("prompts", self.prompts, 1, 4096))
        s(self, "rollouts", _int("rollouts", self.rollouts, 2, 256))
        s(self, "lr", _float("lr", self.lr, 0.0, 1.0, lo_open=True))
        s(self, "warmup_steps", _int("warmup_steps", self.warmup_steps, 0, 100_000))
        s(self, "adam_beta2", _float("adam_beta2", self.adam_beta2, 0.0, 1.0, hi_open=True))
        s(self, "weight_decay", _float("weight_decay", self.weight_decay, 0.0, 1.0))
        s(self, "grad_clip", _float("grad_clip", self.grad_clip, 0.0, 1e6, lo_open=True))
        s(self, "clip_low", _float("clip_low", self.clip_low, 0.0, 1.0, lo_open=True, hi_open=True))
        s(self, "clip_high", _float("clip_high", self.clip_high, 0.0, 10.0, lo_open=True))
        s(self, "clip_c", _float("clip_c", self.clip_c, 1.0, 1e6, lo_open=True))
        _choice("loss_agg", self.loss_agg, AGG_MODES)
        s(self, "kl_coef", _float("kl_coef", self.kl_coef, 0.0, 100.0))
        _choice("kl_type", self.kl_type, KL_TYPES)
        s(self, "lora_rank", _int("lora_rank", self.lora_rank, 0, 96))
        s(self, "lora_alpha", _float("lora_alpha", self.lora_alpha, 0.0, 1e4, lo_open=True))
        if not isinstance(self.train_embeddings, bool):
            raise ValueError(f"train_embeddings={self.train_embeddings!r} is invalid; allowed: true, false")
        s(self, "mini_batches", _int("mini_batches", self.mini_batches, 1, 4096))
        s(self, "ppo_epochs", _int("ppo_epochs", self.ppo_epochs, 1, 100))
        s(self, "temperature", _float("temperature", self.temperature, 0.0, 10.0, lo_open=True))
        s(self, "eval_every", _int("eval_every", self.eval_every, 1, 100_000))
        s(self, "eval_n", _int("eval_n", self.eval_n, 1, 100_000))
        from phantom.lab.sft import PROFILES  # lazy: keeps `phantom lab --help` light

        _choice("model", self.model, tuple(PROFILES))
        # a partial task dict overrides the profile's task field by field: `{terms: [3, 5]}` from the
        # graded warm start must keep its graded style and slack, not fall back to TaskConfig's defaults
        own = PROFILES[self.model].task
        if self.task is not None and not isinstance(self.task, dict):
            raise ValueError(f"task={self.task!r} is invalid; allowed: a mapping of task fields, e.g. {{terms: [3, 5]}}")
        task = own if self.task is None else TaskConfig.from_dict({**own.to_dict(), **dict(self.task)})
        s(self, "task", task.to_dict())
        s(self, "max_new", _int("max_new", PROFILES[self.model].max_new if self.max_new is None else self.max_new,
                                1, 192))
        if self.sft_seed is not None:
            s(self, "sft_seed", _int("sft_seed", self.sft_seed, 0, MAX_SEED))
            if self.sft_seed == PROFILES[self.model].seed:  # the profile's own checkpoint: one spec, one run
                s(self, "sft_seed", None)
        s(self, "noise_p", check_noise_p(self.noise_p))
        _choice("sampling", self.sampling, SAMPLINGS)
        s(self, "gen_prompts", _int("gen_prompts", self.gen_prompts, 0, 65_536))
        s(self, "max_gen_batches", _int("max_gen_batches", self.max_gen_batches, 1, 1000))
        _choice("drop", self.drop, DROPS)
        if self.prompts % self.mini_batches:
            raise ValueError(f"mini_batches={self.mini_batches} must divide prompts={self.prompts}")
        if self.sampling == "dapo":
            if self.arm == "none":
                raise ValueError("arm='none' has no DAPO filter metric; allowed with sampling='dapo': score, outcome")
            if self.drop != "zero":
                raise ValueError(f"drop={self.drop!r} applies to sampling='gate' only; DAPO deletes groups itself")
            gen = self.gen_prompts or 2 * self.prompts
            if gen < self.prompts:
                raise ValueError(f"gen_prompts={self.gen_prompts} is smaller than the train batch "
                                 f"prompts={self.prompts}; allowed: gen_prompts >= prompts (or 0 for 2 x prompts)")
            s(self, "gen_prompts", gen)
        elif self.gen_prompts not in (0, self.prompts):
            if self.gen_prompts < self.prompts:
                raise ValueError(f"gen_prompts={self.gen_prompts} is smaller than the train batch "
                                 f"prompts={self.prompts}; allowed: gen_prompts >= prompts")
            raise ValueError(f"gen_prompts={self.gen_prompts} needs sampling='dapo' (gate sampling generates "
                             "exactly one batch)")
        if self.kind == "overlong" and self.max_new < 4:
            raise ValueError("kind='overlong' needs max_new >= 4 (its ramp is the last quarter of max_new)")

    # ---------------------------------------------------------------------------------------
    @property
    def norm(self) -> str:
        return "none" if self.estimator == "drgrpo" else "std"

    @property
    def loss_mode(self) -> str:
        return "gspo" if self.estimator == "gspo" else "vanilla"

    @property
    def dapo_metric(self) -> str | None:
        return DAPO_METRIC[self.arm] if self.sampling == "dapo" else None

    @property
    def sft(self) -> str | dict[str, Any]:
        """The warm start, as :func:`phantom.lab.sft.ensure_sft_model` takes it (profile, or profile + seed)."""
        return self.model if self.sft_seed is None else {"profile": self.model, "seed": self.sft_seed}

    @property
    def task_config(self) -> TaskConfig:
        return TaskConfig.from_dict(self.task)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dapo_metric"] = self.dapo_metric
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | ArmSpec | None = None, **overrides: Any) -> ArmSpec:
        if isinstance(d, ArmSpec):
            d = d.to_dict()
        merged = {**(d or {}), **overrides}
        merged.pop("dapo_metric", None)  # derived
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(merged) - known)
        if unknown:
            raise ValueError(f"unknown spec field(s) {unknown}; allowed: {', '.join(sorted(known))}")
        return cls(**merged)

    def run_name(self) -> str:
        """Folder name: readable head plus the spec hash (two specs never share a folder)."""
        est = "" if self.estimator == "grpo" else f"-{self.estimator}"
        samp = "" if self.sampling == "gate" else f"-dapo{self.dapo_metric}"
        return (f"lab-{self.arm}{est}{samp}-{self.kind}-lam{self.lam:g}-s{self.seed}-"
                f"{spec_hash(self.to_dict())[:8]}")
