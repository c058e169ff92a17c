"""The order of a run's dynamics: when held-out length, held-out accuracy and the all-fail dose move.

The paper's second practical rule (§11) is about order: in its collapse runs mean response length
moves *before* validation accuracy, so length is a leading indicator. Endpoints cannot show that;
this module reads it off a run's per-step metrics, one row per run:

* ``len_step``: first evaluation step at which held-out mean length is at least ``length_drop``
  (default 20%) below its first value;
* ``acc_step``: first evaluation step at which held-out accuracy is at least ``acc_drop`` (default
  0.10, absolute) below its first value;
* ``all_fail_step``: first training step at which the fraction of all-fail groups exceeds
  ``all_fail_above`` (default 0.5);
* ``order``: ``length first`` / ``accuracy first`` / ``same step`` when both fell, ``length only`` /
  ``accuracy only`` when one did, ``neither`` otherwise; ``lead`` = ``acc_step - len_step`` (steps
  by which length led; negative when accuracy fell first).

Pure pandas on the frame :func:`phantom.runs.read_metrics` returns (indexed by step, verl's metric
keys), so lab, verl and TRL runs share it; the book and ``phantom watch`` read the order from here.
Keys are found by pattern: ``val-core/<ds>/acc/mean@<n>`` and ``val-aux/<ds>/len_chars/mean@<n>``
of the same data source, and ``phantom/frac/all_fail``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

__all__ = ["LENGTH_DROP", "ACC_DROP", "ALL_FAIL_ABOVE", "COLUMNS", "val_keys", "first_fall", "first_above",
           "order", "dynamics", "dynamics_table", "run_dynamics", "validated_every", "up_to"]

LENGTH_DROP = 0.20  # relative fall of held-out mean length
ACC_DROP = 0.10  # absolute fall of held-out accuracy
ALL_FAIL_ABOVE = 0.5  # fraction of all-fail groups
ALL_FAIL_KEY = "phantom/frac/all_fail"
COLUMNS: tuple[str, ...] = ("acc0", "len0", "len_step", "acc_step", "all_fail_step", "order", "lead", "acc_end",
                            "len_end", "acc_key", "len_key")
_ACC = re.compile(r"^val-core/(?P<ds>.+)/acc/mean@(?P<n>\d+)$")
_EPS = 1e-9


def val_keys(df: pd.DataFrame, data_source: str | None = None) -> tuple[str | None, str | None]:
    """(held-out accuracy key, held-out length key) of ``df``; the first data source unless one is named.

    The length key belongs to the same data source as the accuracy key (``None`` where the run logs
    no ``len_chars``).
    """
    for key in sorted(c for c in df.columns if isinstance(c, str) and _ACC.match(c)):
        m = _ACC.match(key)
        if data_source is not None and m.group("ds") != data_source:
            continue
        ln = f"val-aux/{m.group('ds')}/len_chars/mean@{m.group('n')}"
        return key, (ln if ln in df.columns else None)
    return None, None


def _series(df: pd.DataFrame, key: str | None) -> pd.Series:
    if key is None or key not in df.columns:
        return pd.Series(dtype=float)
    s = pd.to_numeric(df[key], errors="coerce").dropna()
    return s[[math.isfinite(v) for v in s]].sort_index()


def first_fall(series: pd.Series, *, drop: float, relative: bool) -> int | None:
    """First step after the first value at which ``series`` is at least ``drop`` below that value.

    ``relative=True``: below ``(1 - drop) * start``; else below ``start - drop``. ``None`` when it
    never falls that far (or has fewer than two points).
    """
    s = series.dropna().sort_index()
    if len(s) < 2:
        return None
    start = float(s.iloc[0])
    bound = start * (1 - drop) if relative else start - drop
    hit = s.iloc[1:][s.iloc[1:] <= bound + _EPS]
    return int(hit.index[0]) if len(hit) else None


def first_above(series: pd.Series, threshold: float) -> int | None:
    """First step at which ``series`` exceeds ``threshold`` (``None`` if never)."""
    s = series.dropna().sort_index()
    hit = s[s > threshold + _EPS]
    return int(hit.index[0]) if len(hit) else None


def order(len_step: int | None, acc_step: int | None) -> str:
    """Which fell first: ``length first``, ``accuracy first``, ``same step``, ``... only`` or ``neither``."""
    if len_step is None and acc_step is None:
        return "neither"
    if acc_step is None:
        return "length only"
    if len_step is None:
        return "accuracy only"
    if len_step < acc_step:
        return "length first"
    return "accuracy first" if acc_step < len_step else "same step"


def dynamics(df: pd.DataFrame, *, length_drop: float = LENGTH_DROP, acc_drop: float = ACC_DROP,
             all_fail_above: float = ALL_FAIL_ABOVE, data_source: str | None = None) -> dict[str, Any]:
    """One run's dynamics row (see the module docstring) from its metrics frame (index = step)."""
    for name, v, hi in (("length_drop", length_drop, 1.0), ("acc_drop", acc_drop, 1.0),
                        ("all_fail_above", all_fail_above, 1.0)):
        if not (isinstance(v, (int, float)) and 0.0 < float(v) < hi):
            raise ValueError(f"{name}={v!r} is invalid; allowed: 0 < {name} < {hi:g}")
    acc_key, len_key = val_keys(df, data_source)
    acc, ln = _series(df, acc_key), _series(df, len_key)
    len_step = first_fall(ln, drop=length_drop, relative=True)
    acc_step = first_fall(acc, drop=acc_drop, relative=False)
    nan = float("nan")
    return {
        "acc0": float(acc.iloc[0]) if len(acc) else nan, "len0": float(ln.iloc[0]) if len(ln) else nan,
        "len_step": len_step, "acc_step": acc_step,
        "all_fail_step": first_above(_series(df, ALL_FAIL_KEY), all_fail_above),
        "order": order(len_step, acc_step),
        "lead": acc_step - len_step if len_step is not None and acc_step is not None else None,
        "acc_end": float(acc.iloc[-1]) if len(acc) else nan, "len_end": float(ln.iloc[-1]) if len(ln) else nan,
        "acc_key": acc_key, "len_key": len_key,
    }


def dynamics_table(frames: Mapping[str, pd.DataFrame], **kwargs: Any) -> pd.DataFrame:
    """One :func:`dynamics` row per run (index: the mapping's keys, e.g. run names); steps stay ints."""
    rows = {name: dynamics(df, **kwargs) for name, df in frames.items()}
    table = pd.DataFrame({c: pd.Series([r[c] for r in rows.values()], index=list(rows), dtype=object)
                          for c in COLUMNS})
    for col in ("acc0", "len0", "acc_end", "len_end"):
        table[col] = table[col].astype(float)
    return table


def run_dynamics(path: str | os.PathLike[str], **kwargs: Any) -> dict[str, Any]:
    """:func:`dynamics` of a run folder or ``metrics.jsonl`` (read with :func:`phantom.runs.read_metrics`)."""
    from phantom.runs import read_metrics

    return dynamics(read_metrics(path), **kwargs)


def _is_validation(col: Any) -> bool:
    return isinstance(col, str) and col.startswith(("val-core/", "val-aux/", "phantom/val/", "phantom/sample"))


def validated_every(df: pd.DataFrame, every: int) -> pd.DataFrame:
    """``df`` as a run validating only at multiples of ``every`` steps (and at step 0) would have logged it.

    Why: the lab's validation is greedy and draws no random numbers, so a run validated at every step
    trains exactly as one validated every fifth step (the paper's ``test_freq``). Blanking the other
    validations reads the coarse run's dynamics off the fine one, without training it twice.
    Training columns are kept; rows are kept.
    """
    if not (isinstance(every, int) and not isinstance(every, bool) and every >= 1):
        raise ValueError(f"every={every!r} is invalid; allowed: a positive integer")
    out = df.copy()
    cols = [c for c in out.columns if _is_validation(c)]
    steps = pd.Series(out.index, index=out.index)
    out.loc[(steps % every != 0).to_numpy(), cols] = float("nan")
    return out


def up_to(df: pd.DataFrame, step: int) -> pd.DataFrame:
    """The rows of ``df`` up to and including ``step``: a longer run read at a shorter horizon (its
    first steps are the shorter run's, since nothing in a lab run depends on its length)."""
    return df.loc[df.index <= step]
