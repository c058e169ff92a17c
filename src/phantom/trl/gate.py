"""The outcome gate inside TRL's ``GRPOTrainer``, as reward functions (no TRL code patched).

TRL 1.16 sums the weighted outputs of every reward function and then normalizes per group of
``num_generations`` consecutive completions (``scale_rewards="group"``, its default). A group whose
binary outcomes are all equal (all fail, or all pass) has no outcome contrast, but a shaping term
(length, format, tag counts) still spreads it, and the group std turns that spread into full-size
advantages: the phantom. TRL has no group filter to switch on (no dynamic sampling).

:func:`outcome_gated` returns reward functions that do the gate's work before TRL sees the
rewards: they compute the outcome once per batch, group the completions exactly as ``GRPOTrainer``
does (consecutive blocks of ``num_generations``, across processes), and inside every
outcome-degenerate group replace each shaping term by one constant. Every completion of such a
group then has the same summed reward, so TRL's own ``(r - mean) / (std + 1e-4)`` is exactly 0 there
(the constant is chosen so that float32 arithmetic keeps it exact for any ``reward_weights``).
Mixed groups pass through untouched. This is verl's ``filter_groups.metric=acc`` / the project's
``gate="outcome"``; tests/test_trl_gate.py checks it against TRL's real advantage code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phantom.advantages import GateStats, group_advantages

__all__ = ["GATES", "TRL_EPS", "GatedRewards", "BatchRecord", "outcome_gated", "observed", "check_config"]

#: ``none`` records what the batch looked like and changes nothing (the TRL default arm)
GATES: tuple[str, ...] = ("outcome", "none")
#: TRL 1.16's epsilon in ``advantages / (std + 1e-4)`` (grpo_trainer.py); also our flatness threshold
TRL_EPS = 1e-4
#: batches kept in ``GatedRewards.records`` when no callback consumes them
MAX_RECORDS = 256
#: shaping constants are rounded to multiples of 2**-_GRID so that sums of them stay exact in float32
_GRID = 12


def _name(fn: Any) -> str:
    while hasattr(fn, "func") and not hasattr(fn, "__name__"):  # functools.partial
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _to_float(v: Any) -> float:
    """None and NaN both mean "no reward for this completion" to TRL; we use NaN."""
    if v is None:
        return math.nan
    if isinstance(v, bool):
        return float(v)
    return float(v)


@dataclass
class BatchRecord:
    """One generation batch as the gate saw it (the global batch, every process's rows)."""

    step: int
    mode: str  # "train" | "eval"
    outcomes: np.ndarray  # (N,) 0/1, NaN where the outcome function returned None
    raw: np.ndarray  # (N, F) every term as returned (NaN = None), outcome first
    gated: np.ndarray  # (N, F) what TRL received
    weights: np.ndarray  # (F,)
    num_generations: int
    stats: GateStats
    lengths: np.ndarray | None = None  # (N,) completion tokens where TRL passed completion_ids

    @property
    def raw_total(self) -> np.ndarray:
        return np.nansum(self.raw * self.weights, axis=1)


@dataclass
class _Pending:
    completions: Any
    columns: np.ndarray  # (n_local, F) values to return, NaN = None
    served: set[int] = field(default_factory=set)


class _Term:
    """One of the reward functions TRL calls; the first (the outcome) computes every column."""

    def __init__(self, owner: GatedRewards, index: int, fn: Callable[..., Any]):
        self.owner, self.index, self.fn = owner, index, fn
        self.__name__ = _name(fn)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float | None]:
        return self.owner._serve(self.index, prompts, completions, kwargs)

    def __repr__(self) -> str:
        role = "outcome" if self.index == 0 else "shaping"
        return f"<phantom.trl {role} term {self.__name__} of {self.owner!r}>"


class GatedRewards(list):
    """TRL reward functions ``[outcome, *shaping]`` sharing one gate (a plain ``list`` to TRL).

    Pass it as ``reward_funcs=`` (and its length is what ``GRPOConfig.reward_weights`` must match).
    ``records`` holds one :class:`BatchRecord` per scored batch for :class:`phantom.trl.PhantomCallback`.
    """

    def __init__(self, outcome_fn: Callable[..., Any] | None, *shaping_fns: Callable[..., Any],
                 num_generations: int, gate: str = "outcome", eps: float = TRL_EPS):
        if outcome_fn is None:
            raise ValueError("outcome_gated() needs the outcome reward function first (a function returning 1/0 "
                             "per completion, e.g. accuracy_reward), then the shaping ones; got outcome_fn=None")
        fns = (outcome_fn, *shaping_fns)
        for i, fn in enumerate(fns):
            if isinstance(fn, (list, tuple)):
                raise ValueError(f"reward function #{i} is a {type(fn).__name__}; pass the functions themselves: "
                                 "outcome_gated(accuracy_reward, format_reward, num_generations=8)")
            if isinstance(fn, str) or not callable(fn):
                raise ValueError(f"reward function #{i} ({fn!r}) is not a callable; allowed: Python reward "
                                 "functions with TRL's signature (prompts, completions, **kwargs) -> list[float]")
            if hasattr(fn, "forward") and hasattr(fn, "parameters"):
                raise ValueError(f"reward function #{i} ({_name(fn)}) is a model; the gate needs Python "
                                 "reward functions (a reward model's score is not a binary outcome)")
        if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 2:
            raise ValueError(f"num_generations={num_generations!r} is invalid; allowed: an integer >= 2, the same "
                             "value as GRPOConfig(num_generations=...)")
        if gate not in GATES:
            raise ValueError(f"gate={gate!r} is unknown; allowed: {', '.join(GATES)}")
        if not (eps >= 0 and math.isfinite(eps)):
            raise ValueError(f"eps={eps!r} is invalid; allowed: a finite eps >= 0")
        self.fns = fns
        self.num_generations = num_generations
        self.gate = gate
        self.eps = eps
        self.records: list[BatchRecord] = []
        self.trainer: Any = None
        self._pending: _Pending | None = None
        super().__init__(_Term(self, i, fn) for i, fn in enumerate(fns))

    def __repr__(self) -> str:
        names = ", ".join(_name(f) for f in self.fns)
        return f"GatedRewards({names}; num_generations={self.num_generations}, gate={self.gate!r})"

    @property
    def names(self) -> list[str]:
        return [_name(f) for f in self.fns]

    # ------------------------------------------------------------------------------------------
    def _serve(self, index: int, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> list[float | None]:
        if index == 0:
            self._pending = _Pending(completions, self._score(prompts, completions, kwargs))
        p = self._pending
        if p is None or index in p.served or not (p.completions is completions or p.completions == completions):
            raise RuntimeError(
                f"reward term {self[index].__name__!r} was called without its outcome term first on this batch; "
                "pass the GatedRewards list as reward_funcs unchanged (outcome first, nothing in between)")
        p.served.add(index)
        col = p.columns[:, index]
        return [None if math.isnan(v) else float(v) for v in col]

    def _score(self, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> np.ndarray:
        trainer = _trainer_of(kwargs)
        mode, group, weights = self._context(trainer)
        n = len(completions)
        cols = []
        for fn in self.fns:
            out = fn(prompts=prompts, completions=completions, **kwargs)
            out = list(out) if out is not None else []
            if len(out) != n:
                raise ValueError(f"reward function {_name(fn)!r} returned {len(out)} values for {n} completions; "
                                 "it must return one value (or None) per completion")
            try:
                cols.append([_to_float(v) for v in out])
            except (TypeError, ValueError):
                raise ValueError(f"reward function {_name(fn)!r} returned non-numeric values, e.g. "
                                 f"{next(v for v in out if not _is_number(v))!r}; allowed: numbers or None") from None
        ids = kwargs.get("completion_ids")
        cols.append([len(c) for c in ids] if ids is not None and len(ids) == n else [math.nan] * n)
        local = np.asarray(cols, dtype=np.float64).T.reshape(n, len(self.fns) + 1)
        _check_binary(self.fns[0], local[:, 0])
        both, offset = _gather_rows(local)
        full, lengths = both[:, :-1], both[:, -1]
        n_all = full.shape[0]
        if n_all % group:
            where = f" ({n_all // max(n, 1)} processes x {n})" if n_all > n else ""
            raise ValueError(f"the batch holds {n_all} completions{where}, which is not a multiple of "
                             f"num_generations={group}; GRPOTrainer scores whole groups of num_generations "
                             "consecutive completions, so the batch must hold whole groups")
        gated, stats = gate_rows(full, weights, group, gate=self.gate, eps=self.eps)
        lengths = None if np.isnan(lengths).all() else lengths
        step = int(getattr(kwargs.get("trainer_state"), "global_step", 0) or 0)
        if len(self.records) >= MAX_RECORDS:  # nobody consumes them (no PhantomCallback): keep the latest
            del self.records[:-MAX_RECORDS // 2]
        self.records.append(BatchRecord(step=step, mode=mode, outcomes=full[:, 0].copy(), raw=full, gated=gated,
                                        weights=weights, num_generations=group, stats=stats, lengths=lengths))
        return gated[offset:offset + n]

    def _context(self, trainer: Any) -> tuple[str, int, np.ndarray]:
        """(mode, group size, weights) from the trainer that calls us, checked against our settings."""
        F = len(self.fns)
        if trainer is None:
            return "train", self.num_generations, np.ones(F)
        if self.trainer is not trainer:
            check_trainer(self, trainer)
            self.trainer = trainer
        model = getattr(trainer, "model", None)
        mode = "train" if getattr(model, "training", True) else "eval"
        group = self.num_generations
        if mode == "eval":
            group = int(getattr(trainer, "num_generations_eval", None) or group)
        w = getattr(trainer, "reward_weights", None)
        weights = np.asarray(w.tolist() if hasattr(w, "tolist") else (w or [1.0] * F), dtype=np.float64)
        return mode, group, weights


def _is_number(v: Any) -> bool:
    try:
        _to_float(v)
        return True
    except (TypeError, ValueError):
        return False


def _check_binary(fn: Any, o: np.ndarray) -> None:
    bad = ~np.isnan(o) & (o != 0.0) & (o != 1.0)
    if bad.any():
        rows = np.flatnonzero(bad)
        vals = ", ".join(f"{o[r]:g}" for r in rows[:4])
        raise ValueError(f"the outcome function {_name(fn)!r} returned non-binary values ({vals} at rows "
                         f"{rows[:4].tolist()}, {bad.sum()} of {o.size}); allowed: 1/0 or True/False per "
                         "completion (None where it cannot tell). Put shaping terms after it, not inside it")


def _trainer_of(kwargs: dict[str, Any]) -> Any:
    """GRPOTrainer hands every reward function ``log_metric=self._log_metric``: its owner is the trainer."""
    owner = getattr(kwargs.get("log_metric"), "__self__", None)
    return owner if owner is not None and hasattr(owner, "reward_funcs") else None


def _gather_rows(local: np.ndarray) -> tuple[np.ndarray, int]:
    """Every process's rows in process order (GRPOTrainer's ``gather``), and where ours start.

    Under several processes a group of ``num_generations`` may straddle two of them, so the gate
    must see the whole generation batch, as TRL's normalization does.
    """
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency of TRL
        return local, 0
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local, 0
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    sizes = {p.shape[0] for p in parts}
    if len(sizes) != 1:
        raise ValueError(f"processes scored different numbers of completions {sorted(sizes)}; GRPOTrainer "
                         "slices the gathered rewards in equal parts, so they must be equal")
    return np.concatenate(parts, axis=0), dist.get_rank() * local.shape[0]


# ----------------------------------------------------------------------------------------------
# the gate on a whole batch (pure numpy; tests call it directly)
# ----------------------------------------------------------------------------------------------
def gate_rows(values: np.ndarray, weights: Sequence[float], group: int, *, gate: str = "outcome",
              eps: float = TRL_EPS) -> tuple[np.ndarray, GateStats]:
    """``values`` (N, F): outcome column first, NaN = None. Returns (what TRL should receive, stats)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    N, F = v.shape
    gid = np.repeat(np.arange(N // group), group)
    o = v[:, 0]
    known = ~np.isnan(o)
    o_fill = np.where(known, o, 0.0)
    total = np.nansum(v * w, axis=1).astype(np.float32)
    _, stats = group_advantages(total, gid, outcomes=o_fill, gate="outcome" if gate == "outcome" else "none",
                                eps=eps)
    out = v.copy()
    if gate != "outcome":
        return out, stats
    for g in range(N // group):
        rows = slice(g * group, (g + 1) * group)
        og = o[rows]
        seen = og[~np.isnan(og)]
        if seen.size and not (np.all(seen == seen[0])):
            continue  # mixed: outcome contrast, TRL's advantages stand
        out[rows] = _flat_group(v[rows], w, seen[0] if seen.size else math.nan)
    return out, stats


def _flat_group(block: np.ndarray, w: np.ndarray, outcome: float) -> np.ndarray:
    """One row of values repeated over the group whose weighted float32 sum is exactly averaged.

    Completions for which every function returned None stay None (TRL drops them itself).
    """
    G, F = block.shape
    unscorable = np.isnan(block).all(axis=1)
    row = np.full(F, math.nan)
    row[0] = outcome
    for k in range(1, F):
        col = block[:, k]
        if not np.isnan(col).all():
            row[k] = np.round(np.nanmean(col) * 2**_GRID) / 2**_GRID
    row = _exact_row(row, w, G)
    out = np.tile(row, (G, 1))
    out[unscorable] = math.nan
    return out


def _flat_ok(row: np.ndarray, w32: Any, G: int) -> bool:
    import torch

    r = torch.tensor(np.tile(row, (G, 1)), dtype=torch.float32)
    x = (r * w32.unsqueeze(0)).nansum(dim=1).view(-1, G)
    return bool((x - torch.nanmean(x, dim=1, keepdim=True) == 0).all())


def _exact_row(row: np.ndarray, w: np.ndarray, G: int) -> np.ndarray:
    """Nudge the last shaping constant until TRL's float32 ``sum - group mean`` is exactly 0.

    With ``reward_weights`` of 1 (TRL's default) the rounded constants already are; other weights
    can leave the float32 mean of G equal values one ulp off, which a ``1e-4`` std epsilon would
    turn into an advantage of ~1e-3. The row is checked with the same torch ops TRL uses.
    """
    import torch

    w32 = torch.tensor(w, dtype=torch.float32)
    if _flat_ok(row, w32, G):
        return row
    live = [k for k in range(1, len(row)) if not math.isnan(row[k]) and w[k] != 0]
    if not live:
        return row
    k = live[-1]
    base = row.copy()
    base[k] = 0.0
    partial = float((torch.tensor(base, dtype=torch.float32) * w32).nansum())
    target = np.float32(np.round((partial + w[k] * row[k]) * 2**_GRID) / 2**_GRID)
    c = np.float32((target - np.float32(partial)) / np.float32(w[k]))
    up = down = c
    candidates = [c]
    for _ in range(32):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        candidates += [up, down]
    for cand in candidates:
        trial = row.copy()
        trial[k] = float(cand)
        if _flat_ok(trial, w32, G):
            return trial
    return row


# ----------------------------------------------------------------------------------------------
def outcome_gated(outcome_fn: Callable[..., Any] | None = None, *shaping_fns: Callable[..., Any],
                  num_generations: int, eps: float = TRL_EPS) -> GatedRewards:
    """TRL reward functions with the outcome gate: ``reward_funcs=outcome_gated(acc, fmt, num_generations=8)``.

    ``outcome_fn`` must return 1/0 (or True/False, or None) per completion; ``shaping_fns`` any
    numbers. ``num_generations`` must equal ``GRPOConfig.num_generations``. Weights
    (``GRPOConfig.reward_weights``, one per function, outcome first) keep working.
    """
    return GatedRewards(outcome_fn, *shaping_fns, num_generations=num_generations, gate="outcome", eps=eps)


def observed(outcome_fn: Callable[..., Any] | None = None, *shaping_fns: Callable[..., Any],
             num_generations: int, eps: float = TRL_EPS) -> GatedRewards:
    """The same reward functions without the gate: TRL trains exactly as on the raw functions, and
    :class:`phantom.trl.PhantomCallback` can still count all-fail, all-pass and phantom groups."""
    return GatedRewards(outcome_fn, *shaping_fns, num_generations=num_generations, gate="none", eps=eps)


def check_config(rewards: GatedRewards, args: Any) -> None:
    """Raise ``ValueError`` if a ``GRPOConfig`` cannot run these reward functions as a gate."""
    if not isinstance(rewards, GatedRewards):
        raise ValueError(f"expected the list returned by outcome_gated()/observed(), got {type(rewards).__name__}")
    g_cfg = getattr(args, "num_generations", None)
    if g_cfg != rewards.num_generations:
        raise ValueError(f"GRPOConfig(num_generations={g_cfg}) differs from outcome_gated(num_generations="
                         f"{rewards.num_generations}); the gate must group completions as the trainer does")
    w = getattr(args, "reward_weights", None)
    if w is not None and len(w) != len(rewards):
        raise ValueError(f"GRPOConfig(reward_weights={list(w)}) has {len(w)} weights for {len(rewards)} reward "
                         f"functions ({', '.join(rewards.names)}); give one weight per function, outcome first")
    if w is not None and rewards.gate == "outcome" and float(w[0]) == 0.0:
        raise ValueError(f"GRPOConfig(reward_weights={list(w)}) gives the outcome function weight 0; the gate "
                         "would zero groups whose contrast the trainer never sees")
    agg = getattr(args, "multi_objective_aggregation", "sum_then_normalize")
    if agg not in ("sum_then_normalize", "normalize_then_sum"):
        raise ValueError(f"multi_objective_aggregation={agg!r} is unknown to phantom.trl; allowed: "
                         "sum_then_normalize, normalize_then_sum")


def check_trainer(rewards: GatedRewards, trainer: Any) -> None:
    """The trainer calling us must hold exactly our functions, in order, and our group size."""
    funcs = list(getattr(trainer, "reward_funcs", []))
    if len(funcs) != len(rewards) or any(a is not b for a, b in zip(funcs, rewards)):
        names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
        raise ValueError(f"GRPOTrainer holds reward functions {names}, not exactly the gated list "
                         f"{rewards.names}: a reward function outside the gate would spread degenerate groups "
                         "again. Put every reward function inside outcome_gated(outcome, *shaping)")
    args = getattr(trainer, "args", None)
    if args is not None:
        check_config(rewards, args)
    elif getattr(trainer, "num_generations", rewards.num_generations) != rewards.num_generations:
        raise ValueError(f"trainer.num_generations={trainer.num_generations} differs from outcome_gated("
                         f"num_generations={rewards.num_generations})")
