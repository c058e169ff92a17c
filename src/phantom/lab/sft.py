"""The SFT warm start: a Qwen2 checkpoint that already solves the task some of the time.

RL needs a policy whose rollouts sometimes pass and sometimes fail (the paper starts at ~0.72 EM).
A freshly initialised model never passes, so every lab run starts from a checkpoint fine-tuned on
worked solutions. Checkpoints are cached under ``$PHANTOM_ARTIFACTS/lab`` (default
``./artifacts/lab``) in a directory named by a hash of the full configuration; a missing one is
rebuilt deterministically (same seed, same data, one torch thread), never downloaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from phantom.lab.model import LabQwen2, ModelConfig, load_checkpoint, save_checkpoint
from phantom.lab.task import Problem, TaskConfig, problem, sample_solution, worked_solution
from phantom.lab.tokenizer import LabTokenizer, TokenizerConfig, save_tokenizer, train_tokenizer
from phantom.lab.warmstart import announce_build, shipped_sft
from phantom.paths import artifacts_base
from phantom.rewards import has_answer_marker, is_correct

__all__ = ["SFTConfig", "PROFILES", "CODE_VERSION", "artifacts_root", "resolve_sft", "ensure_sft_model",
           "locate_sft", "shipped_sft", "load_sft", "evaluate", "EvalResult"]

#: Bump when code changes what a given configuration builds (invalidates every cached checkpoint).
CODE_VERSION = 3
#: SFT runs alone (before any RL process starts), so it takes both cores of the 2-core target machine:
#: 1.65x faster than one thread there. Checkpoints are bit-identical built with 1 or 2 threads (torch
#: 2.13.0 CPU): `lab_base` in two fresh clones (2 threads) and in a 1-thread build stopped at step 750
#: with the same weights (`lab` warm start 0.570 held-out). The development checkpoint the committed
#: TRL and verl CPU runs start from (step 800, 0.555) was built before the SFT code was committed.
#: On a machine shared with other work two threads can be many times slower than one (each waits for
#: the other at every op): ``$PHANTOM_SFT_THREADS`` overrides the count (a positive integer, or ``auto``:
#: the CPUs this process may use, at most 2).
SFT_THREADS = 2
#: first val-split index of the stopping rule's check problems (the RL held-out set is 0..eval_n-1)
CHECK_START = 100_000


def sft_threads() -> int:
    """Threads for SFT: ``$PHANTOM_SFT_THREADS`` if set (a positive integer or ``auto``, as
    ``$PHANTOM_LAB_THREADS`` takes: :func:`phantom.lab.threads.parse_threads`), else :data:`SFT_THREADS`."""
    from phantom.lab.threads import parse_threads

    raw = os.environ.get("PHANTOM_SFT_THREADS", "").strip()
    return parse_threads(raw, what="PHANTOM_SFT_THREADS") if raw else SFT_THREADS


@dataclass(frozen=True)
class SFTConfig:
    """Everything that determines a warm-start checkpoint."""

    profile: str = "lab"
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    steps: int = 1250
    batch: int = 64
    lr: float = 2e-3
    warmup: int = 100
    final_lr_frac: float = 0.1
    #: length of the cosine schedule; ``steps`` < this stops training part-way (0: equal to ``steps``)
    schedule_steps: int = 0
    #: terse-style targets only: each line spaced ("a + b = c") with this probability, a "Total:" line
    #: with ``p_recap``; correct answers then vary in length, as real reasoning traces do. The worked
    #: style's variation is its prose (``task.slack``).
    p_spaced: float = 0.5
    p_recap: float = 0.3
    #: SFT data mixture: a target is terse with probability ``p_terse``, else worked with a slack drawn
    #: uniformly from ``slack_range`` (``None``: the task's own slack). The arithmetic base learns from
    #: mostly terse targets - small models learn to add several times sooner on them - while the
    #: worked ones teach it every prose token, so a re-styling continuation is cheap and gentle.
    p_terse: float = 0.0
    slack_range: tuple[float, float] | None = None
    #: range of terms in the SFT problems (``None``: the task's); the task itself (RL, held-out
    #: evaluation, the stopping check) may ask for more terms than SFT ever showed
    sft_terms: tuple[int, int] | None = None
    #: continuation profiles: at least this many steps before the stopping rule may end training
    min_steps: int = 0
    seed: int = 0
    eval_n: int = 256
    max_new: int = 80
    #: stop as soon as greedy accuracy on ``check_n`` held-out-distribution problems (disjoint from the
    #: RL held-out set) reaches this, checked every ``check_every`` steps (0: train all ``steps``).
    #: Small models learn to add in a sudden transition whose step varies with the seed and the
    #: machine (400 steps apart on two seeds here), so a fixed step gives warm starts anywhere from 0.2
    #: to 0.9; stopping at a target accuracy gives every seed and machine a comparable start.
    target_acc: float = 0.0
    check_every: int = 50
    check_n: int = 128
    #: a profile whose checkpoint (built with this config's ``seed``) this one continues from, with its
    #: model shape and tokenizer ('' = train from scratch): the answer-style variants re-style the
    #: default warm start's arithmetic in a few hundred steps instead of learning it again
    init: str = ""

    def parent(self) -> SFTConfig | None:
        """The config of the checkpoint this one starts from (``None``: from scratch)."""
        if not self.init:
            return None
        base = resolve_sft(self.init)
        return replace(base, seed=self.seed) if base.seed != self.seed else base

    def key(self) -> str:
        parent = self.parent()
        blob = json.dumps({"code": CODE_VERSION, **asdict(self), "init_key": parent.key() if parent else None},
                          sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


#: Every answer-style profile continues from the arithmetic base for the same number of steps, on the
#: same problems (2-5 terms), and is then used on the lab task: 4-6 terms, harder than anything SFT
#: showed (6-term sums are almost never right), so about a third of rollout groups fail entirely - the
#: phantom's dose, which the paper sets by task difficulty relative to the model (§7). With 3-6 terms
#: (a quarter of all-fail groups) one no-filter seed in three was still at 0.13 after 40 steps.
LAB_TASK = TaskConfig(terms=(4, 6))
_STYLE: dict[str, Any] = dict(init="lab_base", task=LAB_TASK, sft_terms=(2, 5), steps=300, lr=2e-3, warmup=20,
                              final_lr_frac=1.0, max_new=160)

PROFILES: dict[str, SFTConfig] = {
    # the arithmetic base: ~0.35M parameters trained from scratch on 2-5 term problems, 80% terse and
    # 20% worked targets (slack uniform in [0, 1]), at a constant lr until greedy accuracy on held-out-
    # distribution problems reaches 0.7 (checked every 50 steps; ~800-1000 steps here)
    "lab_base": SFTConfig(profile="lab_base", task=TaskConfig(terms=(2, 5)), steps=2000, lr=3e-3, warmup=100,
                          final_lr_frac=1.0, p_terse=0.8, slack_range=(0.0, 1.0), target_acc=0.7, max_new=136),
    # the book's warm start: the base re-styled for 300 steps on worked solutions at slack 0.6 (after 150 the
    # style is not settled yet: RL's residual length pressure then strips the outcome arm's prose too)
    "lab": SFTConfig(profile="lab", **_STYLE),
    # answer-style variants (the same base, the same 300 steps): less and more removable prose, and
    # the terse style of the first lab (steps only)
    "lab_slack_low": SFTConfig(profile="lab_slack_low", **{**_STYLE, "task": replace(LAB_TASK, slack=0.3)}),
    "lab_slack_high": SFTConfig(profile="lab_slack_high", **{**_STYLE, "task": replace(LAB_TASK, slack=1.0),
                                                             "max_new": 192}),
    # the graded style (one wording per piece, the kinds kept with probabilities 0.6 / 0.65 / 0.7 / 0.9), a
    # candidate for a gradual length decline: greedy answers drop one kind at a time, the tails last
    "lab_graded": SFTConfig(profile="lab_graded", **{**_STYLE, "task": replace(LAB_TASK, style="graded")}),
    "lab_terse": SFTConfig(profile="lab_terse", **{**_STYLE, "task": replace(LAB_TASK, style="terse"), "max_new": 96}),
    # `make test`'s book: a smaller model, a fraction of the steps, the same recipe in one profile
    "quick": SFTConfig(profile="quick", model=ModelConfig(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128),
                       task=LAB_TASK, sft_terms=(2, 5), p_terse=0.8, slack_range=(0.0, 1.0), steps=200, lr=3e-3,
                       warmup=20, eval_n=64, max_new=160),
    # unit tests: seconds
    "tiny": SFTConfig(profile="tiny", model=ModelConfig(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64),
                      tokenizer=TokenizerConfig(vocab_size=300, corpus=400), steps=20, batch=16, lr=3e-3,
                      warmup=5, eval_n=16, max_new=48),
}


def artifacts_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Where built checkpoints are cached: ``lab/`` under :func:`phantom.paths.artifacts_base` (``root``,
    else ``$PHANTOM_ARTIFACTS``, else the checkout's ``artifacts/``, else the user's cache folder)."""
    return artifacts_base(root) / "lab"


def resolve_sft(profile_or_config: str | SFTConfig | dict[str, Any]) -> SFTConfig:
    """A profile name, an :class:`SFTConfig`, or ``{"profile": name, **overrides}``."""
    if isinstance(profile_or_config, SFTConfig):
        return profile_or_config
    if isinstance(profile_or_config, str):
        if profile_or_config not in PROFILES:
            raise ValueError(f"SFT profile {profile_or_config!r} is unknown; allowed: {', '.join(PROFILES)}")
        return PROFILES[profile_or_config]
    if isinstance(profile_or_config, dict):
        d = dict(profile_or_config)
        base = resolve_sft(d.pop("profile", "lab"))
        allowed = ("steps", "batch", "lr", "warmup", "final_lr_frac", "schedule_steps", "seed", "eval_n", "task",
                   "max_new", "init", "target_acc", "check_every", "check_n")
        bad = set(d) - set(allowed)
        if bad:
            raise ValueError(f"SFT override(s) {sorted(bad)} are not allowed; allowed: {', '.join(allowed)}")
        if "task" in d:
            d["task"] = TaskConfig.from_dict(d["task"])
        return replace(base, **d)
    raise ValueError(f"model={profile_or_config!r} is invalid; allowed: a profile name ({', '.join(PROFILES)}), "
                     "an SFTConfig or a dict")


# -------------------------------------------------------------------------------------------
# evaluation (shared with the RL loop)
# -------------------------------------------------------------------------------------------
@dataclass
class EvalResult:
    texts: list[str]
    correct: np.ndarray  # bool, true outcome
    lengths: np.ndarray  # characters
    tokens: np.ndarray  # response tokens (EOS excluded)
    ended: np.ndarray  # bool, emitted EOS

    @property
    def acc(self) -> float:
        return float(self.correct.mean()) if len(self.correct) else 0.0

    @property
    def mean_len(self) -> float:
        return float(self.lengths.mean()) if len(self.lengths) else 0.0

    @property
    def marker_frac(self) -> float:
        return float(np.mean([has_answer_marker(t) for t in self.texts])) if self.texts else 0.0


def evaluate(model: LabQwen2, tok: LabTokenizer, problems: Sequence[Problem], *, max_new: int,
             greedy: bool = True, generator: torch.Generator | None = None, chunk: int = 512) -> EvalResult:
    """Generate for each problem and score with :func:`phantom.rewards.is_correct` (strict marker)."""
    was_training = model.training
    model.eval()
    toks: list[list[int]] = []
    ended: list[bool] = []
    try:
        for i in range(0, len(problems), chunk):
            part = problems[i:i + chunk]
            t, e = model.generate(tok.encode_batch([p.prompt for p in part]), max_new=max_new, eos_id=tok.eos_id,
                                  pad_id=tok.pad_id, greedy=greedy, generator=generator)
            toks += t
            ended += e
    finally:
        model.train(was_training)
    texts = tok.decode_batch(toks)
    correct = np.array([is_correct(s, p.answer, strict=True) for s, p in zip(texts, problems)], dtype=bool)
    return EvalResult(texts=texts, correct=correct, lengths=np.array([len(s) for s in texts], dtype=float),
                      tokens=np.array([len(t) for t in toks], dtype=float), ended=np.array(ended, dtype=bool))


# -------------------------------------------------------------------------------------------
# training
# -------------------------------------------------------------------------------------------
def _target(cfg: SFTConfig, operands: tuple[int, ...], rng: random.Random) -> str:
    """One SFT target in the configured mixture of styles."""
    if cfg.p_terse and rng.random() < cfg.p_terse:
        return sample_solution(replace(cfg.task, style="terse"), operands, rng, p_spaced=cfg.p_spaced,
                               p_recap=cfg.p_recap)
    if cfg.slack_range is not None and cfg.task.style == "worked":
        lo, hi = cfg.slack_range
        return worked_solution(operands, rng, lo + (hi - lo) * rng.random())
    return sample_solution(cfg.task, operands, rng, p_spaced=cfg.p_spaced, p_recap=cfg.p_recap)


def sft_task(cfg: SFTConfig) -> TaskConfig:
    """The task SFT draws its problems from (the profile's task, with ``sft_terms`` if set)."""
    return cfg.task if cfg.sft_terms is None else replace(cfg.task, terms=tuple(cfg.sft_terms))


def _batches(cfg: SFTConfig, tok: LabTokenizer) -> Iterator[tuple[list[list[int]], list[list[int]]]]:
    # a continuation draws problems its parent never saw
    i = cfg.seed * 10_000_000 + (5_000_000 if cfg.init else 0)
    rng = random.Random(cfg.seed)
    task = sft_task(cfg)
    while True:
        probs = [problem(task, "train", i + j) for j in range(cfg.batch)]
        i += cfg.batch
        prompts = tok.encode_batch([p.prompt for p in probs])
        sols = [_target(cfg, p.operands, rng) for p in probs]
        targets = [t + [tok.eos_id] for t in tok.encode_batch(sols)]
        yield prompts, targets


def _lr(cfg: SFTConfig, step: int) -> float:
    if step <= cfg.warmup:
        return cfg.lr * step / max(cfg.warmup, 1)
    total = cfg.schedule_steps or cfg.steps
    frac = min(1.0, (step - cfg.warmup) / max(total - cfg.warmup, 1))
    return cfg.lr * (cfg.final_lr_frac + (1 - cfg.final_lr_frac) * 0.5 * (1 + np.cos(np.pi * frac)))


def train_sft(cfg: SFTConfig, out_dir: Path, *, progress: bool = True,
              root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Train the tokenizer and the model, write the checkpoint to ``out_dir``; returns its metadata."""
    threads = torch.get_num_threads()
    torch.set_num_threads(sft_threads())
    try:
        return _train_sft(cfg, out_dir, progress=progress, root=root)
    finally:
        torch.set_num_threads(threads)


def _train_sft(cfg: SFTConfig, out_dir: Path, *, progress: bool, root: str | os.PathLike[str] | None,
               ) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from phantom.lab.task import make_split

    parent = cfg.parent()
    if parent is not None:  # continue from the parent's checkpoint: its weights and its tokenizer
        parent_dir = ensure_sft_model(parent, root=root, progress=progress)
        tok = LabTokenizer.load(parent_dir)
        save_tokenizer(tok.tok, out_dir, model_max_length=cfg.model.max_positions)
        model = load_checkpoint(parent_dir)
        if model.cfg != cfg.model:
            raise ValueError(f"profile {cfg.profile!r} continues from {cfg.init!r}, whose model shape "
                             f"{model.cfg} differs from its own {cfg.model}")
    else:
        raw_tok = train_tokenizer(cfg.tokenizer)
        save_tokenizer(raw_tok, out_dir, model_max_length=cfg.model.max_positions)
        tok = LabTokenizer(raw_tok)
        torch.manual_seed(cfg.seed)
        model = LabQwen2(cfg.model, tok.vocab_size)
    torch.manual_seed(cfg.seed)
    t0 = time.time()  # this profile's own training (a parent's is in the parent's metadata)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    data = _batches(cfg, tok)
    losses: list[float] = []
    val_task = replace(cfg.task, wording="symbolic")
    check = make_split(val_task, "val", cfg.check_n, start=CHECK_START) if cfg.target_acc > 0 else []
    check_acc, stopped = None, cfg.steps
    bar = tqdm(range(1, cfg.steps + 1), desc=f"SFT {cfg.profile}", disable=not progress, leave=False)
    for step in bar:
        prompts, targets = next(data)
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step)
        logp, mask, _ = model.response_logprobs(prompts, targets, pad_id=tok.pad_id)
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        if check and step % cfg.check_every == 0:
            check_acc = evaluate(model, tok, check, max_new=cfg.max_new).acc
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", check=f"{check_acc:.2f}")
            if check_acc >= cfg.target_acc and step >= cfg.min_steps:
                stopped = step
                break
    val = make_split(val_task, "val", cfg.eval_n)
    greedy = evaluate(model, tok, val, max_new=cfg.max_new)
    sampled = evaluate(model, tok, val, max_new=cfg.max_new, greedy=False,
                       generator=torch.Generator().manual_seed(cfg.seed))
    meta = {
        "config": asdict(cfg), "key": cfg.key(), "code_version": CODE_VERSION,
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": float(np.mean(losses[-50:])), "train_seconds": time.time() - t0,
        "val_greedy_acc": greedy.acc, "val_sampled_acc": sampled.acc, "val_greedy_len_chars": greedy.mean_len,
        "val_task": val_task.to_dict(), "val_n": len(val), "built": time.time(),
        "init": {"profile": parent.profile, "key": parent.key()} if parent is not None else None,
        "steps_trained": stopped, "check_acc": check_acc,
        "reached_target": None if not cfg.target_acc else bool(check_acc is not None and check_acc >= cfg.target_acc),
    }
    save_checkpoint(model, out_dir, eos_id=tok.eos_id, pad_id=tok.pad_id, meta=meta)
    return meta


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sft_dir(cfg: SFTConfig, root: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder a build of ``cfg`` lands in (whether or not it exists)."""
    return artifacts_root(root) / f"sft-{cfg.profile}-{cfg.key()}"


def locate_sft(profile_or_config: str | SFTConfig | dict[str, Any],
               root: str | os.PathLike[str] | None = None) -> Path:
    """Where ``profile_or_config``'s checkpoint is or would be: the shipped copy, else the cache folder."""
    cfg = resolve_sft(profile_or_config)
    return shipped_sft(cfg) or sft_dir(cfg, root)


def ensure_sft_model(profile_or_config: str | SFTConfig | dict[str, Any] = "lab", *,
                     root: str | os.PathLike[str] | None = None, progress: bool = True,
                     rebuild: bool = False) -> Path:
    """Directory of the warm-start checkpoint for a profile/config: the shipped copy if the checkout has
    one (``rebuild=False``), else the cached build, built once if missing.

    Loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``. Safe to
    call from several processes at once: one builds (under a file lock), the others wait and reuse.
    ``rebuild=True`` ignores the shipped copy (``phantom lab sft`` does, to test the SFT itself) but still
    reuses a cached build.
    """
    cfg = resolve_sft(profile_or_config)
    if not rebuild and (shipped := shipped_sft(cfg)) is not None:
        return shipped
    final = sft_dir(cfg, root)
    if (final / "lab_meta.json").is_file():
        return final
    lock = final.with_name(f".{final.name}.lock")
    with _locked(lock):
        if (final / "lab_meta.json").is_file():
            return final
        if progress:
            announce_build(cfg, final, lambda c: sft_dir(c, final.parent.parent),
                           reference=(PROFILES["lab_base"], PROFILES["lab_graded"]))
        tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            train_sft(cfg, tmp, progress=progress, root=root)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            # no empty lock file stays behind (an interrupted build included): a process still waiting
            # on this one holds its own handle, and finds the checkpoint (or builds it) when it gets it
            lock.unlink(missing_ok=True)
    return final


def load_sft(path: str | Path) -> tuple[LabQwen2, LabTokenizer, dict[str, Any]]:
    """Model, tokenizer and build metadata of a checkpoint directory."""
    p = Path(path)
    meta = json.loads((p / "lab_meta.json").read_text()) if (p / "lab_meta.json").is_file() else {}
    return load_checkpoint(p), LabTokenizer.load(p), meta
