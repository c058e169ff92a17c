"""A ``TrainerCallback`` that logs what TRL does not, into a run folder ``phantom watch`` follows.

TRL logs ``frac_reward_zero_std`` on the summed reward, so a phantom group (all fail, spread by a
shaping term) counts as live there. :class:`PhantomCallback` reads the gate's per-batch records
(:class:`phantom.trl.gate.BatchRecord`) and writes, per optimizer step, the project's keys:
``phantom/groups/*`` and ``phantom/frac/*`` (all-fail, all-pass, mixed, phantom, zeroed, live),
``phantom/acc/mean``, ``critic/score/mean``, ``response_length/mean``, ``phantom/adv/abs_mean``,
``timing_s/step``; TRL's own logs go to the same step as ``trl/<key>``. The folder is a
:class:`phantom.runs.RunDir` (``kind: trl``), so ``phantom watch runs/<name>`` and
``phantom.runs.read_metrics`` read it like a lab or verl run.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import fields
from importlib import metadata
from typing import Any

import numpy as np
from transformers import TrainerCallback

from phantom.advantages import GateStats
from phantom.runs import RunDir, runs_root
from phantom.trl.gate import TRL_EPS, BatchRecord, GatedRewards, check_config

__all__ = ["PhantomCallback", "merge_stats", "record_metrics", "trl_advantages", "CONFIG_KEYS"]

#: GRPOConfig fields a run's manifest records (and its default spec hashes)
CONFIG_KEYS = ("num_generations", "num_generations_eval", "scale_rewards", "loss_type", "reward_weights",
               "multi_objective_aggregation", "learning_rate", "lr_scheduler_type", "per_device_train_batch_size",
               "gradient_accumulation_steps", "steps_per_generation", "num_iterations", "beta", "epsilon",
               "epsilon_high", "temperature", "top_p", "top_k", "max_completion_length", "max_steps", "seed",
               "weight_decay", "max_grad_norm", "adam_beta2", "warmup_steps", "mask_truncated_completions")


def merge_stats(stats: list[GateStats]) -> GateStats | None:
    """Counts of several batches added up (one optimizer step may score several generation batches)."""
    if not stats:
        return None
    out: dict[str, Any] = {"gate": stats[0].gate, "norm": stats[0].norm}
    for f in fields(GateStats):
        if f.name in ("gate", "norm"):
            continue
        vals = [getattr(s, f.name) for s in stats]
        out[f.name] = None if any(v is None for v in vals) else int(sum(vals))
    return GateStats(**out)


def trl_advantages(record: BatchRecord, scale_rewards: str) -> np.ndarray:
    """TRL 1.16's ``sum_then_normalize`` advantages of a recorded batch (telemetry only).

    ``tests/test_trl_gate.py`` checks this against the advantages TRL's trainer computes.
    """
    import torch
    from trl.trainer.utils import nanstd

    r = (torch.tensor(record.gated, dtype=torch.float32) * torch.tensor(record.weights, dtype=torch.float32)).nansum(1)
    unscorable = torch.isnan(torch.tensor(record.gated)).all(dim=1)
    r[unscorable] = torch.nan
    G = record.num_generations
    mean = torch.nanmean(r.view(-1, G), dim=1).repeat_interleave(G)
    if scale_rewards == "batch":
        std = nanstd(r).expand_as(r)
    else:
        std = nanstd(r.view(-1, G), dim=1).repeat_interleave(G)
    adv = r - mean
    if scale_rewards != "none":
        adv = adv / (std + TRL_EPS)
    return torch.nan_to_num(adv, nan=0.0).numpy()


def record_metrics(records: list[BatchRecord], scale_rewards: str | None = None) -> dict[str, float]:
    """The project's per-step keys from the batches scored in one step."""
    if not records:
        return {}
    out: dict[str, float] = {"phantom/gen_batches": float(len(records))}
    merged = merge_stats([r.stats for r in records])
    if merged is not None:
        out.update(merged.to_metrics())
    outcomes = np.concatenate([r.outcomes for r in records])
    totals = np.concatenate([r.raw_total for r in records])
    if np.isfinite(outcomes).any():
        out["phantom/acc/mean"] = float(np.nanmean(outcomes))
    out["critic/score/mean"] = float(np.mean(totals))
    lens = [r.lengths for r in records if r.lengths is not None]
    if lens:
        out["response_length/mean"] = float(np.concatenate(lens).mean())
    if scale_rewards in ("group", "batch", "none"):
        adv = np.concatenate([trl_advantages(r, scale_rewards) for r in records])
        out["phantom/adv/abs_mean"] = float(np.abs(adv).mean())
    return out


def _numeric(logs: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[f"trl/{k}"] = float(v)
    return out


class PhantomCallback(TrainerCallback):
    """Per-step group telemetry of a gated (or merely observed) TRL run, in a phantom run folder.

    Args:
        rewards: the list from :func:`phantom.trl.outcome_gated` or :func:`phantom.trl.observed`
            that the trainer was given as ``reward_funcs``.
        name: run folder name under ``root`` (``$PHANTOM_RUNS``, else ``./runs``); default
            ``trl-<gate>-<date>-<time>``.
        spec: what the manifest's ``spec`` holds (default: the GRPOConfig fields of
            :data:`CONFIG_KEYS`, the reward names and the gate).
        evaluator: ``evaluator(model, step) -> dict`` of held-out metrics (e.g.
            ``val-core/<ds>/acc/mean@1``), run before training (step 0), every ``eval_every`` steps
            and at the last step.
        extra: more manifest fields.
    """

    def __init__(self, rewards: GatedRewards, *, name: str | None = None, root: Any = None,
                 spec: Mapping[str, Any] | None = None, evaluator: Callable[[Any, int], dict] | None = None,
                 eval_every: int = 0, extra: Mapping[str, Any] | None = None):
        if not isinstance(rewards, GatedRewards):
            raise ValueError(f"PhantomCallback needs the list returned by outcome_gated()/observed() (the one "
                             f"passed as reward_funcs), got {type(rewards).__name__}")
        if evaluator is not None and (isinstance(eval_every, bool) or not isinstance(eval_every, int)
                                      or eval_every < 1):
            raise ValueError(f"eval_every={eval_every!r} is invalid; allowed: an integer >= 1 with an evaluator")
        self.rewards = rewards
        self.name = name or f"trl-{rewards.gate}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.root = root
        self.spec = dict(spec) if spec is not None else None
        self.evaluator = evaluator
        self.eval_every = eval_every
        self.extra = dict(extra or {})
        self.run: RunDir | None = None
        self.history: list[dict[str, Any]] = []
        self._t_step = 0.0
        self._t_start = 0.0
        self.per_generation = 1  # optimizer steps per generation batch (GRPOConfig.steps_per_generation)

    @property
    def path(self):
        return runs_root(self.root) / self.name

    # ------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        check_config(self.rewards, args)  # before the first generation: a mismatch fails here
        if not state.is_world_process_zero:
            return
        cfg = {k: _plain(getattr(args, k, None)) for k in CONFIG_KEYS}
        spec = self.spec if self.spec is not None else {"trl": cfg, "reward_funcs": self.rewards.names,
                                                         "gate": self.rewards.gate}
        versions = {}
        for pkg in ("trl", "transformers", "accelerate", "peft"):
            with contextlib.suppress(metadata.PackageNotFoundError):
                versions[pkg] = metadata.version(pkg)
        self.run = RunDir.start(self.name, spec, kind="trl", root=self.root,
                                extra={"trl_config": cfg, "reward_funcs": self.rewards.names, "gate": self.rewards.gate,
                                       "trl_versions": versions, **self.extra})
        self._t_start = time.time()
        # Several optimizer steps may share one generation batch (mini-batches, as verl's ppo_mini_batch_size):
        # the run folder counts training steps (generations), like the lab's and verl's.
        self.per_generation = max(1, int(getattr(args, "steps_per_generation", None) or 1))
        self.rewards.records.clear()
        if self.evaluator is not None:
            self._log(0, self._evaluate(model, 0))

    def _step(self, global_step: int) -> int:
        """The training step (generation batch) an optimizer step belongs to (1-based)."""
        return -(-int(global_step) // self.per_generation)

    def on_step_begin(self, args, state, control, **kwargs):
        if int(state.global_step) % self.per_generation == 0:  # the first optimizer step of a generation batch
            self._t_step = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.run is None or int(state.global_step) % self.per_generation:
            return  # logged once per training step, after its last optimizer step
        step = self._step(state.global_step)
        new = [r for r in self.rewards.records if r.mode == "train"]
        self.rewards.records.clear()  # consumed: a long run does not accumulate batches
        trainer = self.rewards.trainer
        m: dict[str, Any] = record_metrics(new, getattr(trainer, "scale_rewards", None))
        m["timing_s/step"] = time.perf_counter() - self._t_step
        last = state.max_steps and int(state.global_step) >= state.max_steps
        if self.evaluator is not None and (step % self.eval_every == 0 or last):
            m.update(self._evaluate(model, step))
        self._log(step, m)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is not None and logs:
            data = _numeric(logs)
            if data:
                self.run.log(self._step(state.global_step), data)

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is not None and self.run.status == "running":
            self.run.finish("done", wall_seconds=time.time() - self._t_start, summary=summary(self.history))

    # ------------------------------------------------------------------------------------------
    def _evaluate(self, model, step: int) -> dict[str, Any]:
        t = time.perf_counter()
        out = dict(self.evaluator(model, step))
        out["timing_s/eval"] = time.perf_counter() - t
        return out

    def _log(self, step: int, m: dict[str, Any]) -> None:
        bad = [k for k, v in m.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise FloatingPointError(f"step {step}: non-finite metrics {bad}")
        self.run.log(step, m)
        self.history.append({"_step": step, **m})

    def fail(self, error: BaseException) -> None:
        """Mark the run failed, or interrupted on Ctrl-C (TRL has no exception hook; runners call this)."""
        if self.run is not None and self.run.status == "running":
            self.run.abort(error)


def _plain(v: Any) -> Any:
    if hasattr(v, "value") and not isinstance(v, (int, float, str)):  # enums (lr_scheduler_type)
        return v.value
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Endpoints of a run: start/final held-out accuracy and length, seconds per step."""
    from phantom.lab.rl import VAL_ACC, VAL_LEN

    evals = [(h["_step"], h[VAL_ACC], h.get(VAL_LEN)) for h in history if VAL_ACC in h]
    steps = [h["timing_s/step"] for h in history if "timing_s/step" in h]
    out: dict[str, Any] = {"seconds_per_step": float(np.mean(steps)) if steps else None,
                           "steps": len(steps)}
    if evals:
        below = [st for st, acc, _ in evals if acc < 0.1]
        out.update(start_acc=evals[0][1], final_acc=evals[-1][1], start_len=evals[0][2], final_len=evals[-1][2],
                   min_acc=min(a for _, a, _ in evals), **{"first_step_acc_below_0.1": below[0] if below else None})
    af = [h["phantom/groups/all_fail"] for h in history if "phantom/groups/all_fail" in h]
    if af:
        out["all_fail_groups_total"] = float(sum(af))
        out["phantom_groups_total"] = float(sum(h.get("phantom/groups/phantom", 0) for h in history))
        out["zeroed_groups_total"] = float(sum(h.get("phantom/groups/zeroed", 0) for h in history))
    return out

