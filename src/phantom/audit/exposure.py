"""``phantom exposure ROLLOUTS``: how exposed is a model-task pair to the phantom?

The paper's third rule: before adding shaping, measure how often a rollout group fails entirely.
From a rollout dump (JSONL, a folder of verl's ``{step}.jsonl`` dumps, CSV or parquet) this
counts all-fail / all-pass / mixed / phantom groups, the size of the advantages a phantom group
gets under GRPO (std) and Dr. GRPO (no std) next to a mixed group's, and what DAPO's refill would
cost: the expected number of generation batches when the filter drops the all-same groups under
the outcome predicate versus the shaped-score predicate.

The refill arithmetic (:func:`refill_estimate`) is torch-free so ``phantom audit`` can use it;
the advantage arithmetic uses :func:`phantom.advantages.group_advantages`, imported when needed.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from phantom.cli import exit_code_of as _exit_code

__all__ = ["Exposure", "RefillEstimate", "exposure", "load_rollouts", "main", "refill_estimate"]

GROUP_COLS = ("uid", "group", "group_id", "prompt_id", "index", "prompt", "input")
OUTCOME_COLS = ("acc", "outcome", "correct", "is_correct")
SCORE_COLS = ("score", "reward", "rewards", "seq_reward")
LENGTH_COLS = ("len", "length", "response_length", "len_chars", "response_len", "num_tokens")
_V1_KEY = re.compile(r"_\d+_\d+$")  # verl V1 dumps: uid = f"{prompt_uid}_{rollout}_{output}"


# ------------------------------------------------------------------------------------------------
# Refill arithmetic (classic DAPO loop: accumulate kept groups batch by batch)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RefillEstimate:
    """Generation batches needed to collect ``train_batch`` kept groups."""

    all_same: float
    train_batch: int
    gen_batch: int
    max_batches: int
    expected: float  # E[number of generation batches]
    p_exceed: float  # P(more than max_batches are needed); 0 when uncapped
    suggest: int  # smallest cap exceeded with probability < 1e-4 per step
    prompts_v1: float  # verl 0.9.1 V1: expected prompts generated per step (refill without batches)


def _p_short(n: int, p: float, need: int) -> float:
    """P(Binomial(n, p) < need): the kept groups of n generated ones fall short."""
    if need <= 0:
        return 0.0
    if n < need or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    k = np.arange(need, dtype=np.float64)
    logpmf = (math.lgamma(n + 1) - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in k])
              + k * math.log(p) + (n - k) * math.log1p(-p))
    top = logpmf.max()
    return float(min(1.0, math.exp(top) * np.exp(logpmf - top).sum()))


def refill_estimate(all_same: float, *, train_batch: int, gen_batch: int, max_batches: int = 0) -> RefillEstimate:
    """Expected generation batches when a fraction ``all_same`` of groups is dropped.

    Each generation batch holds ``gen_batch`` groups, each kept with probability ``1 - all_same``
    independently; the step needs ``train_batch`` kept groups (verl-recipe's DAPO loop).
    """
    if not 0.0 <= all_same <= 1.0:
        raise ValueError(f"all_same={all_same!r} is invalid; allowed: a fraction in [0, 1]")
    if train_batch < 1 or gen_batch < 1:
        raise ValueError(f"train_batch={train_batch}, gen_batch={gen_batch} are invalid; allowed: integers >= 1")
    p = 1.0 - all_same
    if p <= 0.0:
        return RefillEstimate(all_same, train_batch, gen_batch, max_batches, math.inf, 1.0 if max_batches > 0 else 0.0,
                              0, math.inf)
    expected, m, suggest, tail = 0.0, 0, None, 1.0
    while tail > 1e-12 and m < 100_000:
        tail = _p_short(m * gen_batch, p, train_batch)  # P(N > m)
        expected += tail
        if suggest is None and tail < 1e-4:
            suggest = max(m, 1)
        m += 1
    p_exceed = _p_short(max_batches * gen_batch, p, train_batch) if max_batches > 0 else 0.0
    return RefillEstimate(all_same, train_batch, gen_batch, max_batches, expected, p_exceed, suggest or m,
                          train_batch / p)


# ------------------------------------------------------------------------------------------------
# Reading a dump
# ------------------------------------------------------------------------------------------------
class RolloutError(ValueError):
    """A dump the command cannot use (exit code 2)."""


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open() as fh:
        for no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RolloutError(f"{path}:{no}: invalid JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise RolloutError(f"{path}:{no}: expected one JSON object per line")
            rows.append(rec)
    return rows


def load_rollouts(path: str | Path):
    """A DataFrame from a JSONL / CSV / parquet file, or a folder of verl ``{step}.jsonl`` dumps."""
    import pandas as pd

    p = Path(path)
    if not p.exists():
        raise RolloutError(f"{p}: no such file or folder")
    files = sorted(p.glob("*.jsonl"), key=lambda f: (len(f.stem), f.stem)) if p.is_dir() else [p]
    if not files:
        raise RolloutError(f"{p}: the folder holds no *.jsonl dumps")
    frames = []
    for f in files:
        suffix = f.suffix.lower()
        try:
            if suffix in (".jsonl", ".json"):
                frames.append(pd.DataFrame(_read_jsonl(f)))
            elif suffix == ".parquet":
                frames.append(pd.read_parquet(f))
            elif suffix == ".csv":
                frames.append(pd.read_csv(f))
            else:
                raise RolloutError(f"{f}: unknown dump format {suffix or '(none)'}; allowed: .jsonl, .parquet, .csv")
        except RolloutError:
            raise
        except Exception as exc:  # pyarrow / pandas errors on a damaged file
            raise RolloutError(f"{f}: cannot read it ({type(exc).__name__}: {exc})") from None
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise RolloutError(f"{p}: no rows")
    return df


def _pick(df: Any, given: str | None, candidates: tuple[str, ...], what: str, required: bool = True) -> str | None:
    if given is not None:
        if given not in df.columns:
            raise RolloutError(f"--{what}-col {given!r} is not a column; columns: {', '.join(map(str, df.columns))}")
        return given
    for c in candidates:
        if c in df.columns:
            return c
    if required:
        raise RolloutError(f"no {what} column (looked for {', '.join(candidates)}); columns: "
                           f"{', '.join(map(str, df.columns))}; name it with --{what}-col")
    return None


# ------------------------------------------------------------------------------------------------
# The measurement
# ------------------------------------------------------------------------------------------------
@dataclass
class Exposure:
    """Counts are of groups; fractions are of all groups (singletons included)."""

    source: str
    rows: int
    groups: int
    singletons: int
    all_fail: int
    all_pass: int
    mixed: int
    phantom: int
    drop_outcome: int  # multi-member groups an outcome filter (metric=acc) drops
    drop_score: int  # multi-member groups a shaped-score filter drops (spread <= eps)
    abs_adv: dict[str, float | None] = field(default_factory=dict)  # "<groups>/<estimator>" -> mean |A|
    length: dict[str, float | None] = field(default_factory=dict)
    columns: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refill: dict[str, RefillEstimate] = field(default_factory=dict)

    def frac(self, count: int) -> float:
        return count / self.groups if self.groups else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fractions"] = {k: self.frac(getattr(self, k)) for k in
                          ("all_fail", "all_pass", "mixed", "phantom", "drop_outcome", "drop_score")}
        return d


def _outcomes(df: Any, col: str | None, grade: bool, threshold: float | None, score_col: str) -> tuple[np.ndarray, str]:
    if col is not None:
        o = df[col].to_numpy()
        try:
            f = o.astype(np.float64)
        except (TypeError, ValueError):
            raise RolloutError(f"outcome column {col!r} holds non-numeric values, e.g. {o[0]!r}; allowed: 0/1") from None
        bad = ~np.isin(f, (0.0, 1.0))
        if bad.any():
            raise RolloutError(f"outcome column {col!r} is not binary (e.g. {o[bad][0]!r}); allowed: 0/1 or "
                               "True/False; use --outcome-threshold or --grade for a shaped column")
        return f, col
    if grade:
        from phantom.rewards import is_correct

        for c in ("output", "gts"):
            if c not in df.columns:
                raise RolloutError(f"--grade needs the columns output and gts (verl's dump); {c!r} is missing")
        return np.array([float(is_correct(t, g)) for t, g in zip(df["output"], df["gts"])]), "graded(output, gts)"
    if threshold is not None:
        if not math.isfinite(threshold):
            raise RolloutError(f"--outcome-threshold {threshold!r} is invalid; allowed: a finite number (0 for phantom "
                               "rewards)")
        return (df[score_col].to_numpy(np.float64) > threshold).astype(np.float64), f"{score_col} > {threshold:g}"
    raise RolloutError(f"no outcome column (looked for {', '.join(OUTCOME_COLS)}); name it with --outcome-col, "
                       "grade verl dumps with --grade, or use --outcome-threshold 0 for phantom-style rewards "
                       "(outcome = score > 0 when 0 <= lam < 1)")


def exposure(df: Any, *, source: str = "", group_col: str | None = None, outcome_col: str | None = None,
             score_col: str | None = None, length_col: str | None = None, step_col: str | None = "step",
             grade: bool = False, outcome_threshold: float | None = None, eps: float = 1e-6,
             train_batch: int = 32, gen_batch: int = 96, max_batches: int = 10) -> Exposure:
    """Measure a rollout DataFrame (see the module docstring)."""
    import pandas as pd

    from phantom.advantages import group_advantages

    notes: list[str] = []
    g_col = _pick(df, group_col, GROUP_COLS, "group")
    s_col = _pick(df, score_col, SCORE_COLS, "score")
    o_col = None if (grade or outcome_threshold is not None) and outcome_col is None else \
        _pick(df, outcome_col, OUTCOME_COLS, "outcome", required=False)
    outcomes, o_name = _outcomes(df, o_col, grade, outcome_threshold, s_col)
    l_col = _pick(df, length_col, LENGTH_COLS, "length", required=False)
    lengths = None
    if l_col is not None:
        lengths = pd.to_numeric(df[l_col], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(lengths) | (lengths < 0)
        if bad.any():
            raise RolloutError(f"length column {l_col!r} holds {df[l_col].to_numpy()[bad][0]!r} ({int(bad.sum())} such "
                               "row(s)); allowed: finite lengths >= 0")
    elif "output" in df.columns:
        lengths, l_col = df["output"].astype(str).str.len().to_numpy(np.float64), "len(output) chars"
    scores = pd.to_numeric(df[s_col], errors="coerce").to_numpy(np.float64)
    if np.isnan(scores).any():
        raise RolloutError(f"score column {s_col!r} has missing or non-numeric values")
    labels = df[g_col].astype(str)
    if labels.is_unique and len(labels) > 1:
        stripped = labels.str.replace(_V1_KEY, "", regex=True)
        if not stripped.is_unique:
            labels = stripped
            notes.append(f"group ids taken from {g_col!r} without the _<rollout>_<output> suffix (verl V1 keys)")
    if step_col and step_col in df.columns and df[step_col].nunique() > 1:
        labels = df[step_col].astype(str) + "/" + labels
        notes.append(f"groups are per {step_col!r} ({df[step_col].nunique()} steps)")
    index = labels.to_numpy()

    adv_std, st = group_advantages(scores, index, outcomes=outcomes, gate="none", norm="std", eps=eps)
    adv_none, _ = group_advantages(scores, index, outcomes=outcomes, gate="none", norm="none", eps=eps)
    _, st_score = group_advantages(scores, index, outcomes=outcomes, gate="score", norm="std", eps=eps)
    _, st_out = group_advantages(scores, index, outcomes=outcomes, gate="outcome", norm="std", eps=eps)

    frame = pd.DataFrame({"g": index, "o": outcomes, "s": scores})
    grp = frame.groupby("g", sort=False)
    size, passes, spread = grp["o"].size(), grp["o"].sum(), grp["s"].std(ddof=1).fillna(0.0)
    # a one-answer group is a singleton only: counted as all-fail or all-pass too, the fractions of the
    # table would add up to more than 1 (GateStats counts outcomes over every group)
    multi = size > 1
    n_fail, n_pass = int(((passes == 0) & multi).sum()), int(((passes == size) & multi).sum())
    phantom_g = (passes == 0) & multi & (spread > eps)
    mixed_g = (passes > 0) & (passes < size)
    row_phantom = frame["g"].map(phantom_g).to_numpy(bool)
    row_mixed = frame["g"].map(mixed_g).to_numpy(bool)
    abs_adv = {
        f"{name}/{est}": (float(np.abs(a[mask]).mean()) if mask.any() else None)
        for name, mask in (("phantom", row_phantom), ("mixed", row_mixed))
        for est, a in (("grpo", adv_std), ("drgrpo", adv_none))
    }
    length: dict[str, float | None] = {}
    if lengths is not None:
        fail = outcomes == 0
        length = {"all": float(lengths.mean()), "fail": float(lengths[fail].mean()) if fail.any() else None,
                  "pass": float(lengths[~fail].mean()) if (~fail).any() else None}
    exp = Exposure(source, len(df), st.groups, st.singletons, n_fail, n_pass, st.mixed or 0, st.phantom or 0,
                   st_out.zeroed, st_score.zeroed, abs_adv, length,
                   {"group": g_col, "outcome": o_name, "score": s_col, "length": l_col}, notes)
    assert int(phantom_g.sum()) == exp.phantom, "phantom count disagrees with GateStats"
    for pred, count in (("outcome", exp.drop_outcome), ("score", exp.drop_score)):
        exp.refill[pred] = refill_estimate(exp.frac(count), train_batch=train_batch, gen_batch=gen_batch,
                                           max_batches=max_batches)
    return exp


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def _fmt(x: float | None, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def render_text(e: Exposure) -> str:
    cols = ", ".join(f"{k}={v}" for k, v in e.columns.items() if v)
    lines = [f"rollouts: {e.source} ({e.rows} responses, {e.groups} groups; {cols})"]
    lines += [f"  note: {n}" for n in e.notes]
    lines += ["", f"{'groups':<34}{'count':>7}{'frac':>8}"]
    for label, count in (("all-fail", e.all_fail), ("all-pass", e.all_pass), ("mixed", e.mixed),
                         ("phantom (all-fail with spread)", e.phantom), ("singletons", e.singletons)):
        lines.append(f"  {label:<32}{count:>7}{_fmt(e.frac(count)):>8}")
    lines += ["", f"{'mean |advantage|':<34}{'GRPO':>9}{'Dr. GRPO':>10}"]
    for name in ("phantom", "mixed"):
        lines.append(f"  {name + ' groups':<32}{_fmt(e.abs_adv.get(name + '/grpo')):>9}"
                     f"{_fmt(e.abs_adv.get(name + '/drgrpo')):>10}")
    if e.length:
        lines.append(f"  mean length: all {_fmt(e.length.get('all'), '.1f')}, failures "
                     f"{_fmt(e.length.get('fail'), '.1f')}, passes {_fmt(e.length.get('pass'), '.1f')}")
    r = e.refill["outcome"]
    lines += ["", f"refill (classic DAPO: {r.train_batch} kept groups from batches of {r.gen_batch}, "
                  f"max_num_gen_batches={r.max_batches})",
              f"  {'filter':<24}{'drops':>7}{'E[batches]':>12}{'P(> max)':>10}{'safe cap':>10}{'V1 prompts':>12}"]
    for pred, label in (("outcome", "outcome (metric=acc)"), ("score", "shaped score (score)")):
        r = e.refill[pred]
        lines.append(f"  {label:<24}{_fmt(r.all_same):>7}{_fmt(r.expected, '.2f'):>12}{_fmt(r.p_exceed, '.2g'):>10}"
                     f"{r.suggest:>10}{_fmt(r.prompts_v1, '.1f'):>12}")
    if e.phantom:
        lines += ["", f"{e.phantom} of {e.groups} groups are phantom groups: all-fail, yet their shaped scores "
                      "differ, so a score filter keeps them and GRPO gives them full-size advantages."]
    return "\n".join(lines)


def _finite(x: Any) -> Any:
    """JSON has no infinity: an unreachable refill (all groups dropped) becomes null."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


@_exit_code
def main(argv: list[str] | None = None) -> int:
    from phantom.cli import ArgTypes, command_parser, exit_codes

    ap = command_parser("phantom exposure", "How exposed is a model-task pair to the phantom? From a rollout dump: "
                        "all-fail / all-pass / mixed / phantom groups, the advantages a phantom group gets under GRPO "
                        "and Dr. GRPO, and what DAPO's refill would cost under each filter predicate.",
                        ["phantom exposure rollouts.jsonl --outcome-threshold 0",
                         "phantom exposure checkpoints/my_run/rollout_dumps/ --grade --format json",
                         "phantom exposure dump.parquet --group-col uid --outcome-col acc --score-col score"],
                        exit_codes(c2="the dump cannot be read or lacks a needed column, or a bad flag value"))
    ap.add_argument("rollouts", help="JSONL, CSV or parquet dump, or a folder of verl {step}.jsonl dumps")
    ap.add_argument("--group-col", help=f"group id column (default: first of {', '.join(GROUP_COLS)})")
    ap.add_argument("--outcome-col", help=f"binary outcome column (default: first of {', '.join(OUTCOME_COLS)})")
    ap.add_argument("--score-col", help=f"shaped score column (default: first of {', '.join(SCORE_COLS)})")
    ap.add_argument("--length-col", help=f"length column (default: first of {', '.join(LENGTH_COLS)}, "
                                         "else len(output))")
    ap.add_argument("--step-col", default="step", help="step column: groups are per step (default: step)")
    ap.add_argument("--grade", action="store_true", help="outcome = phantom.rewards.is_correct(output, gts)")
    ap.add_argument("--outcome-threshold", type=ArgTypes.finite,
                    help="outcome = score > THRESHOLD, a finite number (0 for phantom rewards)")
    ap.add_argument("--eps", type=ArgTypes.nonnegative, default=1e-6,
                    help="spread below which a group is flat, >= 0 (verl: 1e-6)")
    ap.add_argument("--train-batch-size", type=ArgTypes.count, default=32, help="kept groups per step (default 32)")
    ap.add_argument("--gen-batch-size", type=ArgTypes.count, default=96,
                    help="groups per generation batch (default 96)")
    ap.add_argument("--max-num-gen-batches", type=ArgTypes.index, default=10,
                    help="the recipe's cap, 0 for none (default 10)")
    ap.add_argument("--format", choices=("text", "json"), default="text", help="text or json (default: text)")
    args = ap.parse_args(argv)
    given = [f for f, on in (("--outcome-col", args.outcome_col is not None), ("--grade", args.grade),
                             ("--outcome-threshold", args.outcome_threshold is not None)) if on]
    if len(given) > 1:
        print(f"phantom exposure: {' and '.join(given)} both define the outcome; allowed: one of --outcome-col, "
              "--grade, --outcome-threshold", file=sys.stderr)
        return 2
    try:
        df = load_rollouts(args.rollouts)
        e = exposure(df, source=str(args.rollouts), group_col=args.group_col, outcome_col=args.outcome_col,
                     score_col=args.score_col, length_col=args.length_col, step_col=args.step_col,
                     grade=args.grade, outcome_threshold=args.outcome_threshold, eps=args.eps,
                     train_batch=args.train_batch_size, gen_batch=args.gen_batch_size,
                     max_batches=args.max_num_gen_batches)
    except (RolloutError, ValueError) as exc:
        print(f"phantom exposure: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(_finite(e.to_dict()), indent=2))
    else:
        print(render_text(e))
    return 0
