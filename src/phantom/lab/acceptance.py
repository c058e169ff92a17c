"""The lab's acceptance criteria, one row per warm start, read from committed multi-warm-start sweeps.

Why a module: the question "does the main setting hold on this checkpoint?" is asked of several sweeps
(100 steps on six warm starts, a lower learning rate on eight, the same runs cut at step 40), by the
chapter and by the tests that pin the committed tables. One definition keeps them from drifting apart.

The criteria (issue "Lab v2", for each SFT checkpoint with three RL seeds per arm):

* **collapse** - every no-filter GRPO run ends at or below ``collapse_acc`` held-out accuracy;
* **order** - in at least ``min_length_first`` no-filter runs, held-out length falls by the length
  threshold at an earlier validation step than accuracy falls by the accuracy threshold
  (:func:`phantom.dynamics.dynamics`, ``order == "length first"``);
* both of these for the shaped-score filter's runs too, where ``unsafe`` names that arm (``score``);
* **outcome** - the outcome arm's mean final accuracy is at least ``min_gain`` above the start, and no
  outcome run ends more than ``max_loss`` below it;
* **Dr. GRPO** - no Dr. GRPO no-filter run collapses (every one ends above ``collapse_acc``).

A table passed in has one row per run with ``sft_seed``, ``seed``, ``kind`` (``none``, ``outcome`` or
``drgrpo``, see :func:`run_kind`), ``acc0``, ``acc_end`` and ``order`` - what
:func:`warmstart_runs` reads from a sweep's run folders. :func:`at_step` cuts such a table
at a shorter horizon, from the runs' own metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

__all__ = ["KINDS", "UNSAFE", "run_kind", "sweep_runs", "warmstart_runs", "at_step", "acceptance", "passing"]

#: the three arms the criteria read: GRPO without a filter, GRPO with the outcome filter, Dr. GRPO without one
KINDS: tuple[str, ...] = ("none", "outcome", "drgrpo")
#: the unsafe arms the collapse and order criteria may read: no filter (always) and the shaped-score filter
UNSAFE: tuple[str, ...] = ("none", "score")
_NEEDED = ("sft_seed", "seed", "kind", "acc0", "acc_end", "order")


def run_kind(estimator: str, arm: str) -> str | None:
    """Which criterion a run belongs to: ``none``, ``score``, ``outcome``, ``drgrpo``, or None (not read)."""
    if estimator == "drgrpo":
        return "drgrpo" if arm == "none" else None
    if estimator == "grpo" and arm in ("none", "score", "outcome"):
        return arm
    return None


def sweep_runs(sweep: str, root: Any, fields: Sequence[str], **thresholds: Any,
               ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """The finished cells (profile full) of a sweep whose run folders lie under ``root``.

    One row per run (index: run name) with the spec ``fields`` and its :func:`phantom.dynamics.dynamics`
    row (``thresholds``: ``length_drop``, ``acc_drop``), and each run's metrics by name. A run counts when
    its manifest says ``done`` and its metrics file has rows; with none, the same columns and no rows.
    """
    from pathlib import Path

    from phantom.dynamics import COLUMNS, dynamics_table
    from phantom.lab.sweep import sweep_table
    from phantom.runs import read_metrics

    cells = sweep_table(sweep, profile="full", runs_root=root)
    frames = {}
    for name in cells.loc[cells["status"].eq("done"), "name"]:
        path = Path(root) / name / "metrics.jsonl"
        if path.is_file() and len(df := read_metrics(path)):
            frames[name] = df
    table = cells[cells["name"].isin(frames)].set_index("name")[list(fields)].copy()
    if not frames:
        return table.reindex(columns=[*fields, *COLUMNS]), frames
    return table.join(dynamics_table(frames, **thresholds)), frames


def warmstart_runs(sweep: str, root: Any, **thresholds: Any) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """:func:`sweep_runs` of a multi-warm-start sweep, ready for :func:`acceptance`.

    ``sft_seed`` is an int (a spec without one is SFT seed 0, the default warm start); ``kind`` is
    :func:`run_kind`; rows are sorted by warm start, kind and RL seed.
    """
    table, frames = sweep_runs(sweep, root, ["sft_seed", "seed", "estimator", "arm", "steps"], **thresholds)
    table["sft_seed"] = [int(v) if pd.notna(v) else 0 for v in table["sft_seed"]]
    table["kind"] = [run_kind(e, a) for e, a in zip(table["estimator"], table["arm"])]
    return table.sort_values(["sft_seed", "kind", "seed"]), frames


def at_step(table: pd.DataFrame, frames: Mapping[str, pd.DataFrame], step: int, **thresholds: Any) -> pd.DataFrame:
    """``table`` as if every run had stopped after ``step`` (its dynamics recomputed on the cut metrics)."""
    from phantom.dynamics import COLUMNS, dynamics, up_to

    out = table.copy()
    rows = {name: dynamics(up_to(frames[name], step), **thresholds) for name in out.index}
    for col in COLUMNS:
        out[col] = pd.Series([rows[n][col] for n in out.index], index=out.index, dtype=object)
    for col in ("acc0", "len0", "acc_end", "len_end"):
        out[col] = out[col].astype(float)
    return out


def acceptance(table: pd.DataFrame, *, collapse_acc: float = 0.10, min_length_first: int = 2,
               min_gain: float = 0.03, max_loss: float = 0.05, unsafe: Sequence[str] = ("none",)) -> pd.DataFrame:
    """One row per warm start (index ``sft_seed``): the numbers each criterion reads and whether it holds.

    ``unsafe``: the arms the collapse and order criteria read - ``("none",)``, or ``("none", "score")``
    for a sweep that ran the shaped-score filter too (its columns then carry a ``score_`` prefix).
    A warm start missing the runs of an arm fails that arm's criterion (nothing is assumed).
    """
    unsafe = tuple(unsafe)
    if unsafe not in (("none",), UNSAFE):
        raise ValueError(f"unsafe={unsafe!r} is invalid; allowed: ('none',) or {UNSAFE!r}")
    missing = [c for c in _NEEDED if c not in table.columns]
    if missing:
        raise ValueError(f"acceptance() needs the column(s) {missing}; the table has {list(table.columns)}")
    for name, value in (("collapse_acc", collapse_acc), ("min_gain", min_gain), ("max_loss", max_loss)):
        if not (isinstance(value, (int, float)) and -1.0 < float(value) < 1.0):
            raise ValueError(f"{name}={value!r} is invalid; allowed: -1 < {name} < 1")
    if not (isinstance(min_length_first, int) and min_length_first >= 1):
        raise ValueError(f"min_length_first={min_length_first!r} is invalid; allowed: an int >= 1")
    def held(runs: pd.DataFrame) -> tuple[bool, bool]:
        """Whether an unsafe arm's runs all collapse, and whether enough of them lose length first."""
        return (bool(len(runs) and (runs["acc_end"] <= collapse_acc).all()),
                runs["order"].tolist().count("length first") >= min_length_first)

    rows = []
    for sft, g in table.groupby("sft_seed", sort=True):
        n, o, d = (g[g["kind"] == k] for k in KINDS)
        change = o["acc_end"] - o["acc0"]
        orders = n["order"].tolist()
        row = {
            "sft_seed": int(sft), "acc0": float(g["acc0"].iloc[0]),
            "none_n": len(n), "none_max": float(n["acc_end"].max()) if len(n) else float("nan"),
            "length_first": orders.count("length first"), "same_step": orders.count("same step"),
            "accuracy_first": orders.count("accuracy first"),
            "outcome_n": len(o), "outcome_gain": float(change.mean()) if len(o) else float("nan"),
            "outcome_worst": float(change.min()) if len(o) else float("nan"),
            "drgrpo_n": len(d), "drgrpo_min": float(d["acc_end"].min()) if len(d) else float("nan"),
        }
        verdicts = [held(n)]
        if "score" in unsafe:
            sc = g[g["kind"] == "score"]
            row.update(score_n=len(sc), score_max=float(sc["acc_end"].max()) if len(sc) else float("nan"),
                       score_length_first=sc["order"].tolist().count("length first"))
            verdicts.append(held(sc))
        row["collapse_ok"] = all(c for c, _ in verdicts)
        row["order_ok"] = all(o_ for _, o_ in verdicts)
        row["outcome_ok"] = bool(len(o) and row["outcome_gain"] >= min_gain and row["outcome_worst"] >= -max_loss)
        row["drgrpo_ok"] = bool(len(d) and (d["acc_end"] > collapse_acc).all())
        row["all_ok"] = row["collapse_ok"] and row["order_ok"] and row["outcome_ok"] and row["drgrpo_ok"]
        rows.append(row)
    cols = ["sft_seed", "acc0", "none_n", "none_max", "length_first", "same_step", "accuracy_first",
            *(["score_n", "score_max", "score_length_first"] if "score" in unsafe else []), "outcome_n",
            "outcome_gain", "outcome_worst", "drgrpo_n", "drgrpo_min", "collapse_ok", "order_ok", "outcome_ok",
            "drgrpo_ok", "all_ok"]
    return pd.DataFrame(rows, columns=cols).set_index("sft_seed")


def passing(accepted: pd.DataFrame) -> list[int]:
    """The warm starts (SFT seeds) on which every criterion holds."""
    return [int(s) for s, ok in accepted["all_ok"].items() if ok]
