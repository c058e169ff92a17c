"""The lab's RL loop: group sampling, shaped rewards, gated advantages, PPO-clip, telemetry.

One step: draw ``prompts`` training problems, sample ``rollouts`` responses each at temperature 1,
score them (true outcome, optionally flipped by a noisy verifier, then shaped), compute group
advantages with :func:`phantom.advantages.group_advantages` (the arm's gate, GRPO or Dr. GRPO),
and take ``mini_batches x ppo_epochs`` clipped policy-gradient steps (:mod:`.loss`, equal to
verl's). With ``sampling="dapo"`` the batch is assembled by :mod:`.dapo` instead (deletion and
refill). Every step appends one line to ``metrics.jsonl`` with verl's key names where verl has one.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from phantom.advantages import GateStats, group_advantages
from phantom.lab.dapo import dapo_collect
from phantom.lab.decode_kernel import describe as describe_decode
from phantom.lab.loss import agg_loss, kl_penalty, policy_loss
from phantom.lab.rollouts import Rollouts
from phantom.lab.sft import EvalResult, artifacts_root, ensure_sft_model, evaluate, load_sft
from phantom.lab.spec import ArmSpec
from phantom.lab.task import DATA_SOURCE, make_split, problem
from phantom.lab.threads import lab_threads, threads_agree
from phantom.rewards import denoise, has_answer_marker, is_correct, noisy_outcome, shaped_reward
from phantom.runs import RunDir, runs_root, write_json_atomic

__all__ = ["Rollouts", "Trainer", "run_arm", "gated_rows", "VAL_ACC", "VAL_LEN"]

VAL_ACC = f"val-core/{DATA_SOURCE}/acc/mean@1"
VAL_LEN = f"val-aux/{DATA_SOURCE}/len_chars/mean@1"
VAL_SCORE = f"val-aux/{DATA_SOURCE}/score/mean@1"


class Trainer:
    """Holds the policy, optimizer and data stream of one arm."""

    #: leave zero-advantage rows out of the update's forward/backward (exact; see :meth:`update`)
    skip_zero_rows = True

    def __init__(self, spec: ArmSpec, checkpoint: str | os.PathLike[str], threads: int | None = None):
        """``threads``: torch threads for this arm (None: ``$PHANTOM_LAB_THREADS``, else one); more than
        one only where :func:`~phantom.lab.threads.threads_agree` finds they change no number."""
        want = lab_threads() if threads is None else threads
        if not isinstance(want, int) or want < 1:
            raise ValueError(f"threads={want!r} is invalid; allowed: a positive integer")
        torch.set_num_threads(1)
        self.spec = spec
        torch.manual_seed(spec.seed)
        self.checkpoint = Path(checkpoint)
        self.model, self.tok, self.sft_meta = load_sft(checkpoint)
        self.model.train()
        self.ref = None
        if spec.kl_coef > 0:
            self.ref = copy.deepcopy(self.model).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        if spec.lora_rank:
            self.params = self.model.enable_lora(spec.lora_rank, spec.lora_alpha)
        else:
            if not spec.train_embeddings:  # tied with the LM head: RL noise there reaches every input token
                self.model.model.embed_tokens.weight.requires_grad_(False)
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=spec.lr, betas=(0.9, spec.adam_beta2),
                                     eps=1e-8, weight_decay=spec.weight_decay)
        self.gen = torch.Generator().manual_seed(spec.seed)
        self.rng = np.random.default_rng(spec.seed)
        self.task = spec.task_config
        self.val = make_split(self.task, "val", spec.eval_n)
        self.next_group = 0
        #: threads asked for, and those used (one where more would change the numbers)
        self.threads_asked, self.threads = want, 1
        if want > 1:
            if threads_agree(self.model, pad_id=self.tok.pad_id, eos_id=self.tok.eos_id, threads=want):
                self.threads = want
            else:
                warnings.warn(f"{want} torch threads change this model's numbers on this machine (torch "
                              f"{torch.__version__}); the arm runs on 1 thread", RuntimeWarning, stacklevel=2)
        torch.set_num_threads(self.threads)

    # -------------------------------------------------------------------------------------------
    def rollout(self, n_prompts: int, step: int, tag: str = "") -> Rollouts:
        """Sample ``rollouts`` responses for ``n_prompts`` fresh training problems and score them."""
        s, G = self.spec, self.spec.rollouts
        probs = [problem(self.task, "train", int(i)) for i in self.rng.integers(0, 2**40, n_prompts)]
        pids = self.tok.encode_batch([p.prompt for p in probs])
        prompt_ids = [ids for ids in pids for _ in range(G)]
        toks, ended = self.model.generate(prompt_ids, max_new=s.max_new, eos_id=self.tok.eos_id,
                                          pad_id=self.tok.pad_id, temperature=s.temperature, generator=self.gen)
        texts = self.tok.decode_batch(toks)
        true = np.array([float(is_correct(t, probs[i // G].answer, strict=True)) for i, t in enumerate(texts)])
        outcome = true
        if s.noise_p > 0:
            ids = [f"train:{s.seed}:{step}:{tag}:{self.next_group + i // G}:{i % G}" for i in range(len(texts))]
            outcome = noisy_outcome(true, ids, s.noise_p, seed=s.seed)
        chars = np.array([len(t) for t in texts], dtype=float)
        score = self.shape(outcome, chars, np.array([len(t) for t in toks], dtype=float), texts)
        group = np.repeat(np.arange(self.next_group, self.next_group + n_prompts), G)
        self.next_group += n_prompts
        resp = [t + [self.tok.eos_id] if e else t for t, e in zip(toks, ended)]
        return Rollouts(prompt_ids, resp, texts, group, true, np.asarray(outcome, dtype=float), score, chars,
                        np.array(ended, dtype=bool))

    def shape(self, outcome: np.ndarray, chars: np.ndarray, tokens: np.ndarray, texts: list[str]) -> np.ndarray:
        s = self.spec
        return np.asarray(shaped_reward(s.kind, outcome, tokens if s.kind == "overlong" else chars, lam=s.lam,
                                        cap=s.cap, has_marker=[has_answer_marker(t) for t in texts],
                                        l_max=s.max_new, l_cache=max(1, s.max_new // 4)), dtype=float)

    # -------------------------------------------------------------------------------------------
    def advantages(self, batch: Rollouts, gate: str) -> tuple[np.ndarray, GateStats]:
        return group_advantages(batch.score.astype(np.float32), batch.group, outcomes=batch.outcome, gate=gate,
                                norm=self.spec.norm)

    def update(self, batch: Rollouts, adv: np.ndarray, live_rows: np.ndarray | None, step: int) -> dict[str, float]:
        """``mini_batches x ppo_epochs`` optimizer steps on the batch; verl's actor metrics."""
        s = self.spec
        lr = s.lr * min(1.0, step / s.warmup_steps) if s.warmup_steps else s.lr
        for g in self.opt.param_groups:
            g["lr"] = lr
        n = len(batch)
        rows = np.arange(n) if live_rows is None else live_rows
        if len(rows) == 0:
            return {"actor/lr": lr, "actor/pg_loss": 0.0, "phantom/update_skipped": 1.0}
        chunks = np.array_split(rows, s.mini_batches)
        # Rows with exactly zero advantage contribute exactly zero policy gradient (-A * ratio), so
        # without a KL term they are left out of the forward and backward; their tokens (or sequences)
        # stay in the aggregation's denominator through `scale`, so the loss and its gradient are those
        # of the whole mini-batch (test_lab_rl pins it). The gated arms zero half their groups or more.
        trained = [c if s.kl_coef > 0 or not self.skip_zero_rows else c[adv[c] != 0] for c in chunks]
        scales = [_denominator(batch, t, s.loss_agg) / max(_denominator(batch, c, s.loss_agg), 1)
                  for c, t in zip(chunks, trained)]
        need_old = s.mini_batches > 1 or s.ppo_epochs > 1
        pre: list[dict[str, torch.Tensor]] = []
        with torch.no_grad():
            for k, c in enumerate(trained):
                p, r = [batch.prompt_ids[i] for i in c], [batch.response_ids[i] for i in c]
                d = {}
                # the first mini-batch's old log-probs are its own first forward's, bit for bit (the
                # weights have not moved yet; grad mode changes no kernel): taken there, not here
                if need_old and len(c) and k > 0:
                    d["old"] = self.model.response_logprobs(p, r, pad_id=self.tok.pad_id)[0]
                if self.ref is not None and len(c):
                    d["ref"] = self.ref.response_logprobs(p, r, pad_id=self.tok.pad_id)[0]
                pre.append(d)
        stats: dict[str, list[float]] = {}
        adv_t = torch.as_tensor(adv, dtype=torch.float32)
        for epoch in range(s.ppo_epochs):
            for c, d, scale in zip(trained, pre, scales):
                self.opt.zero_grad(set_to_none=False)
                if len(c):
                    p, r = [batch.prompt_ids[i] for i in c], [batch.response_ids[i] for i in c]
                    logp, mask, ent = self.model.response_logprobs(p, r, pad_id=self.tok.pad_id,
                                                                   with_entropy=epoch == 0)
                    old = d.setdefault("old", logp.detach())
                    a = adv_t[torch.as_tensor(c)][:, None] * mask
                    loss, m = policy_loss(old, logp, a, mask, mode=s.loss_mode, clip_low=s.clip_low,
                                          clip_high=s.clip_high, clip_c=s.clip_c, agg=s.loss_agg)
                    loss = loss * scale
                    m["actor/pg_loss"] = loss.item()
                    if self.ref is not None:
                        kl = agg_loss(kl_penalty(logp, d["ref"], s.kl_type), mask, s.loss_agg)
                        loss = loss + s.kl_coef * kl
                        m["actor/kl_loss"] = kl.item()
                    if ent is not None:
                        m["actor/entropy"] = float(agg_loss(ent.detach(), mask, "token-mean"))
                    loss.backward()
                else:  # nothing to score: a zero gradient, but Adam's moments still take their step
                    m = {"actor/pg_loss": 0.0}
                    for q in self.params:
                        if q.grad is None:
                            q.grad = torch.zeros_like(q)
                m["actor/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, s.grad_clip))
                self.opt.step()
                for k, v in m.items():
                    stats.setdefault(k, []).append(v)
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out["actor/lr"] = lr
        out["phantom/update/rows_scored"] = float(sum(len(t) for t in trained))
        if s.kl_coef > 0:
            out["actor/kl_coef"] = s.kl_coef
        return out

    # -------------------------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, Any]:
        s = self.spec
        r: EvalResult = (self._evaluate_start() if step == 0 else
                         evaluate(self.model, self.tok, self.val, max_new=s.max_new))
        observed = r.correct.astype(float)
        if s.noise_p > 0:
            ids = [f"val:{s.seed}:{step}:{i}" for i in range(len(observed))]
            observed = noisy_outcome(observed, ids, s.noise_p, seed=s.seed)
        score = self.shape(observed, r.lengths, r.tokens, r.texts)
        out: dict[str, Any] = {
            VAL_ACC: float(np.mean(observed)), VAL_LEN: r.mean_len, VAL_SCORE: float(score.mean()),
            "phantom/val/acc_true": r.acc, "phantom/val/len_tokens": float(r.tokens.mean()),
            "phantom/val/marker_frac": r.marker_frac, "phantom/val/empty_frac": float(np.mean(r.lengths == 0)),
            "phantom/val/eos_frac": float(r.ended.mean()), "phantom/sample": r.texts[0],
        }
        if s.noise_p > 0:
            out["phantom/val/acc_denoised"] = float(denoise(float(np.mean(observed)), s.noise_p))
        return out

    def _evaluate_start(self) -> EvalResult:
        """The held-out evaluation before the first update, shared by every arm of a warm start.

        Before any update the policy is the checkpoint (LoRA's B starts at zero, and evaluation is
        greedy and draws no random numbers), so its evaluation depends only on the checkpoint, the
        held-out set, the response cap and the code: a sweep's 36 cells from one warm start would
        repeat the same ~1.3 s of generation. It is cached in the artifacts cache (never in the checkpoint
        folder: the book's warm start is committed data) under a key of all of those
        (``$PHANTOM_EVAL0_CACHE=0`` turns the cache off); the result is bit-identical.
        """
        s = self.spec
        if os.environ.get("PHANTOM_EVAL0_CACHE", "1") == "0":
            return evaluate(self.model, self.tok, self.val, max_new=s.max_new)
        path = artifacts_root() / "eval0" / self.checkpoint.name / f"{_eval0_key(self.checkpoint, s)}.json"
        try:
            d = json.loads(path.read_text())
            return EvalResult(texts=d["texts"], correct=np.array(d["correct"], dtype=bool),
                              lengths=np.array(d["lengths"], dtype=float), tokens=np.array(d["tokens"], dtype=float),
                              ended=np.array(d["ended"], dtype=bool))
        except (OSError, ValueError, KeyError):
            pass
        r = evaluate(self.model, self.tok, self.val, max_new=s.max_new)
        with contextlib.suppress(OSError):  # a read-only cache only loses the cache
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {"texts": r.texts, "correct": r.correct.tolist(), "lengths": r.lengths.tolist(),
                                     "tokens": r.tokens.tolist(), "ended": r.ended.tolist()})
        return r

    def collect(self, step: int) -> tuple[Rollouts, np.ndarray, GateStats, dict[str, float], np.ndarray | None]:
        """The step's training batch, its advantages, gate stats, extra metrics and live rows."""
        s = self.spec
        if s.sampling == "dapo":
            return dapo_collect(s, self.rollout, step)
        batch = self.rollout(s.prompts, step)
        adv, stats = self.advantages(batch, s.arm)
        live = None
        if s.drop == "mask":  # §10's variant: gated rows leave the loss (and its token-mean denominator)
            live = np.flatnonzero(~gated_rows(batch.group, batch.score, batch.outcome, s.arm))
        return batch, adv, stats, {"phantom/gen_batches": 1.0}, live

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch, adv, stats, extra, live = self.collect(step)
        t_gen = time.perf_counter() - t0
        metrics: dict[str, Any] = {**extra, **stats.to_metrics()}
        if len(batch):  # a DAPO step that kept no group trains on nothing: leave its batch metrics out
            tokens = np.array([len(r) for r in batch.response_ids], dtype=float)
            metrics.update({
                "response_length/mean": float(tokens.mean()),
                "phantom/response_chars/mean": float(batch.chars.mean()),
                "critic/score/mean": float(batch.score.mean()),
                "phantom/acc/mean": float(batch.outcome.mean()),
                "phantom/acc_true/mean": float(batch.true_outcome.mean()),
                "phantom/adv/abs_mean": float(np.abs(adv).mean()),
                "phantom/frac/no_eos": float(1 - batch.ended.mean()),
                "phantom/train_sample": batch.texts[0],
            })
        metrics["timing_s/gen"] = t_gen
        if self.spec.noise_p > 0 and len(batch):
            metrics["phantom/noise/flip_rate"] = float(np.mean(batch.outcome != batch.true_outcome))
        if live is not None:
            metrics["phantom/mask/live_frac"] = len(live) / max(len(batch), 1)
        t1 = time.perf_counter()
        metrics.update(self.update(batch, adv, live, step) if len(batch) else {"phantom/update_skipped": 1.0})
        metrics["timing_s/update"] = time.perf_counter() - t1
        s = self.spec
        if step % s.eval_every == 0 or step == s.steps:
            t2 = time.perf_counter()
            metrics.update(self.evaluate(step))
            metrics["timing_s/eval"] = time.perf_counter() - t2
        metrics["timing_s/step"] = time.perf_counter() - t0
        return metrics


def _denominator(batch: Rollouts, rows: np.ndarray, agg: str) -> int:
    """What ``agg_loss`` divides by for these rows: response tokens, or sequences with a token."""
    lengths = [len(batch.response_ids[i]) for i in rows]
    return sum(lengths) if agg == "token-mean" else sum(1 for n in lengths if n > 0)


def gated_rows(group: np.ndarray, score: np.ndarray, outcome: np.ndarray, gate: str,
               eps: float = 1e-6) -> np.ndarray:
    """Per row: does ``gate`` zero its group? (the predicate of :func:`group_advantages`, in float32)."""
    _, inv = np.unique(group, return_inverse=True)
    count = np.bincount(inv)
    multi = count > 1
    if gate == "score":
        sc = score.astype(np.float32)
        mean = (np.bincount(inv, sc) / count).astype(np.float32)
        var = np.bincount(inv, (sc - mean[inv]) ** 2) / np.maximum(count - 1, 1)
        flat = multi & (np.sqrt(var) <= eps)
    elif gate == "outcome":
        passes = np.bincount(inv, outcome)
        flat = multi & ((passes == 0) | (passes == count))
    else:
        flat = np.zeros(len(count), dtype=bool)
    return flat[inv]


def _summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [(h["_step"], h[VAL_ACC], h[VAL_LEN]) for h in history if VAL_ACC in h]
    below = [st for st, acc, _ in evals if acc < 0.1]
    steps = [h["timing_s/step"] for h in history if "timing_s/step" in h]
    return {
        "start_acc": evals[0][1], "final_acc": evals[-1][1], "start_len": evals[0][2], "final_len": evals[-1][2],
        "min_acc": min(a for _, a, _ in evals), "first_step_acc_below_0.1": below[0] if below else None,
        "seconds_per_step": float(np.mean(steps)) if steps else None,
        "gen_batches_total": float(sum(h.get("phantom/gen_batches", 0) for h in history)),
    }


#: the sources whose code decides a greedy evaluation's tokens and scores
_EVAL_SOURCES = ("model.py", "sft.py", "task.py", "tokenizer.py", "../rewards.py")


def _eval0_key(checkpoint: Path, spec: ArmSpec) -> str:
    """Hash of what a start-of-run evaluation depends on (see :meth:`Trainer._evaluate_start`)."""
    h = hashlib.sha256(b"eval0/1")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        f = checkpoint / name
        h.update(name.encode() + (f.read_bytes() if f.is_file() else b"-"))
    here = Path(__file__).resolve().parent
    for src in _EVAL_SOURCES:
        h.update(src.encode() + (here / src).read_bytes())
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        h.update(f"tokenizers={metadata.version('tokenizers')}".encode())
    # the kernels torch dispatches to (AVX2 / AVX-512 ...) decide the last bits: a copied artifacts
    # folder must not hand one machine's evaluation to another
    h.update(json.dumps({"task": spec.task_config.to_dict(), "eval_n": spec.eval_n, "max_new": spec.max_new,
                         "torch": torch.__version__, "threads": torch.get_num_threads(),
                         "cpu": torch.backends.cpu.get_cpu_capability()}, sort_keys=True).encode())
    return h.hexdigest()[:20]


def run_arm(spec: ArmSpec | dict[str, Any], *, name: str | None = None,
            root: str | os.PathLike[str] | None = None, progress: bool = True,
            extra: dict[str, Any] | None = None, threads: int | None = None) -> RunDir:
    """Run one arm into ``<root>/<name>`` (reusing a finished run of the same spec) and return it.

    ``threads``: torch threads (see :class:`Trainer`); the manifest records those asked for and used.

    The folder is marked ``running`` while training, ``done`` at the end, ``failed`` on any
    exception, ``interrupted`` on Ctrl-C; such a folder, or a stale one, is wiped and re-run next time.
    """
    from tqdm.auto import tqdm

    spec = spec if isinstance(spec, ArmSpec) else ArmSpec.from_dict(spec)
    d = spec.to_dict()
    name = name or spec.run_name()
    existing = RunDir(runs_root(root) / name)
    if existing.check_startable(d):
        if progress:  # a reader who asked for a run should not mistake a reused folder for a fresh one
            print(f"phantom lab: reusing the finished run {existing.path} (same spec; delete the folder to run it "
                  "again)", file=sys.stderr)
        return existing
    ckpt = ensure_sft_model(spec.sft, progress=progress)
    trainer = Trainer(spec, ckpt, threads=threads)
    c = trainer.model.cfg
    run = RunDir.start(name, d, kind="lab", root=root,
                       extra={"checkpoint": str(ckpt), "sft": {k: trainer.sft_meta.get(k) for k in
                              ("key", "val_greedy_acc", "val_sampled_acc", "params")},
                              "decode": describe_decode(c.heads, c.kv_heads, c.head_dim, c.max_positions),
                              "threads": {"asked": trainer.threads_asked, "used": trainer.threads},
                              **(extra or {})})
    t_start = time.time()
    history: list[dict[str, Any]] = []
    try:
        m0 = trainer.evaluate(0)
        run.log(0, m0)
        history.append({"_step": 0, **m0})
        bar = tqdm(range(1, spec.steps + 1), desc=name[:40], disable=not progress, leave=False)
        for st in bar:
            m = trainer.step(st)
            bad = [k for k, v in m.items() if isinstance(v, float) and not math.isfinite(v)]
            if bad:
                raise FloatingPointError(f"step {st}: non-finite metrics {bad}")
            run.log(st, m)
            history.append({"_step": st, **m})
            if VAL_ACC in m:
                bar.set_postfix(acc=f"{m[VAL_ACC]:.2f}", len=f"{m[VAL_LEN]:.0f}")
    except BaseException as e:
        run.abort(e)
        raise
    run.finish("done", wall_seconds=time.time() - t_start, summary=_summary(history))
    return run
