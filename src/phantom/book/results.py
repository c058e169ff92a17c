"""What the lab chapters (4, 6, 7, 8) share: the sweep's cells, their curves, the paper's numbers.

A chapter loads the sweep once with :func:`load_cells` (one row per cell, from
:func:`phantom.lab.sweep.sweep_table`, plus ``done`` and ``label``), picks a group with
:func:`select`, reads curves of the finished cells with :func:`curves`, and shows each result
beside the paper's number from :func:`reported`. A cell whose run is missing or unfinished is never
an error here: it is listed by :func:`missing_note` and left out of figures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["ARMS", "VAL_ACC", "VAL_LEN", "TRAIN_LEN", "resolve_profile", "resolve_runs", "load_cells",
           "committed_runs", "select", "missing_note", "metrics", "curve", "curves", "first_below", "collapse_step",
           "endpoints", "dynamics", "mean_sd", "fmt_pm", "reported", "reported_text", "samples", "same_curves",
           "same_prefix"]

ARMS: tuple[str, ...] = ("none", "score", "outcome")
#: Metric keys of the lab's runs (the same names as ``phantom.lab.rl``; a test keeps them equal).
VAL_ACC = "val-core/phantom_lab/acc/mean@1"
VAL_LEN = "val-aux/phantom_lab/len_chars/mean@1"
TRAIN_LEN = "response_length/mean"
PROFILES: tuple[str, ...] = ("quick", "full")


def resolve_profile(profile: str = "") -> str:
    """``profile``, else ``$PHANTOM_PROFILE`` (set by the book build), else ``full``; validated."""
    value = profile or os.environ.get("PHANTOM_PROFILE") or "full"
    if value not in PROFILES:
        raise ValueError(f"profile={value!r} is unknown; allowed: {', '.join(PROFILES)}")
    return value


def resolve_runs(runs_root: str | os.PathLike[str] = "") -> Path:
    """The runs folder: ``runs_root`` (relative to the repository root), else ``$PHANTOM_RUNS``, else ``runs/``."""
    from phantom.book.chapters import repo_root

    if runs_root:
        p = Path(runs_root)
        return (p if p.is_absolute() else repo_root() / p).resolve()
    env = os.environ.get("PHANTOM_RUNS")
    return Path(env).resolve() if env else (repo_root() / "runs").resolve()


def load_cells(profile: str = "", runs_root: str | os.PathLike[str] = "",
               sweep: str | os.PathLike[str] = "paper") -> pd.DataFrame:
    """One row per sweep cell (spec fields, status, endpoint summary), with ``done`` and ``label``.

    ``sweep`` is a sweep's name or its file: the paper sweep's copy with another ``sft_seed`` (run with
    ``phantom lab sweep FILE --runs-dir DIR``) lets a chapter's claims be checked on another warm start.

    ``done`` is True only for a run folder whose manifest says ``status: done``; the table also
    carries ``runs_root`` and ``profile`` in ``attrs``.
    """
    from phantom.book.chapters import repo_root
    from phantom.figures import ARM_LABELS
    from phantom.lab.sweep import sweep_file, sweep_table

    prof, root = resolve_profile(profile), resolve_runs(runs_root)
    if Path(sweep).suffix in (".yaml", ".yml"):
        sweep = sweep_file(sweep, repo_root())  # a sweep file, like runs_root, is relative to the repository root
    table = sweep_table(sweep, profile=prof, runs_root=root)
    table["done"] = table["status"].eq("done")
    table["label"] = [ARM_LABELS.get(a, a) for a in table["arm"]]
    table.attrs.update(runs_root=str(root), profile=prof)
    return table


def _matches(value: Any, want: Any) -> bool:
    if isinstance(want, Mapping):  # e.g. task={"terms": [2, 3]}: compare the given keys only
        return isinstance(value, Mapping) and all(_matches(value.get(k), v) for k, v in want.items())
    if isinstance(want, (list, tuple)):
        return isinstance(value, (list, tuple)) and list(value) == list(want)
    if isinstance(want, float) or isinstance(value, float):
        try:
            return math.isclose(float(value), float(want), abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return value == want


def select(table: pd.DataFrame, group: str | None = None, **fields: Any) -> pd.DataFrame:
    """Cells of ``group`` (a cell may belong to several) whose spec fields equal ``fields``."""
    keep = np.ones(len(table), dtype=bool)
    if group is not None:
        keep &= np.array([group in str(g).split(",") for g in table["groups"]], dtype=bool)
    for key, want in fields.items():
        if key not in table.columns:
            raise ValueError(f"field {key!r} is unknown; allowed: {', '.join(map(str, table.columns))}")
        keep &= np.array([_matches(v, want) for v in table[key]], dtype=bool)
    out = table[keep].copy()
    out.attrs.update(table.attrs)
    return out


def missing_note(rows: pd.DataFrame, what: str = "cells") -> str:
    """Markdown naming the cells of ``rows`` without a finished run ('' when none is missing)."""
    bad = rows[~rows["done"]]
    if bad.empty:
        return ""
    names = ", ".join(f"`{n}` ({s if isinstance(s, str) else 'no run folder'})"
                      for n, s in zip(bad["name"], bad["status"]))
    return (f"**Missing:** {len(bad)} of {len(rows)} {what} have no finished run under "
            f"`{rows.attrs.get('runs_root', 'runs')}`, so they are left out of the figures and shown as "
            f"– in the tables: {names}.")


@lru_cache(maxsize=256)
def _read(path: str, mtime: float) -> pd.DataFrame:
    from phantom.runs import read_metrics

    return read_metrics(path)


def metrics(name: str, runs_root: str | os.PathLike[str]) -> pd.DataFrame:
    """A run's per-step metrics (empty when its folder or metrics file is gone)."""
    path = Path(runs_root) / name / "metrics.jsonl"
    try:
        return _read(str(path), path.stat().st_mtime).copy()
    except (OSError, ValueError):
        return pd.DataFrame()


def curve(df: pd.DataFrame, key: str) -> pd.Series:
    """One metric over steps as floats, steps without a value dropped (empty if the key is absent)."""
    if key not in df.columns:
        return pd.Series(dtype=float)
    return pd.to_numeric(df[key], errors="coerce").dropna()


def curves(rows: pd.DataFrame, key: str) -> dict[str, pd.Series]:
    """``{cell name: curve}`` for the finished cells of ``rows`` (runs folder from ``rows.attrs``)."""
    root = rows.attrs.get("runs_root") or resolve_runs()
    out = {}
    for name in rows.loc[rows["done"], "name"]:
        c = curve(metrics(name, root), key)
        if len(c):
            out[name] = c
    return out


def first_below(series: pd.Series, threshold: float) -> int | None:
    """First step at which ``series`` is below ``threshold`` (None if never)."""
    hit = series[series < threshold]
    return int(hit.index[0]) if len(hit) else None


def collapse_step(acc: pd.Series, threshold: float) -> int | str | None:
    """First validation step below ``threshold``; ``"start"`` when the run already starts below it."""
    if acc.empty:
        return None
    if acc.iloc[0] < threshold:
        return "start"
    return first_below(acc, threshold)


def endpoints(rows: pd.DataFrame, collapse_acc: float = 0.1, early_steps: int = 10) -> pd.DataFrame:
    """Per cell of ``rows`` (same index): first/last validation, collapse step and early gate telemetry.

    Columns ``acc0, acc_end, collapse, len0, len_end, marker_end, eos_end`` (validation),
    ``all_fail_early, phantom_early, zeroed_early`` (mean over steps 1..early_steps) and
    ``all_fail_first`` (first training step: the starting policy's exposure); NaN/None for a cell
    without a finished run.
    """
    root = rows.attrs.get("runs_root") or resolve_runs()
    out = []
    for name, done in zip(rows["name"], rows["done"]):
        df = metrics(name, root) if done else pd.DataFrame()
        acc, ln = curve(df, VAL_ACC), curve(df, VAL_LEN)
        rec: dict[str, Any] = {"acc0": np.nan, "acc_end": np.nan, "collapse": None, "len0": np.nan, "len_end": np.nan}
        if len(acc) and len(ln):
            rec.update(acc0=acc.iloc[0], acc_end=acc.iloc[-1], collapse=collapse_step(acc, collapse_acc),
                       len0=ln.iloc[0], len_end=ln.iloc[-1])
        for col, key in (("marker_end", "phantom/val/marker_frac"), ("eos_end", "phantom/val/eos_frac")):
            c = curve(df, key)
            rec[col] = c.iloc[-1] if len(c) else np.nan
        for col in ("all_fail", "phantom", "zeroed"):
            c = curve(df, f"phantom/frac/{col}").loc[1:early_steps]
            rec[f"{col}_early"] = float(c.mean()) if len(c) else np.nan
        rec["all_fail_first"] = float(c0.iloc[0]) if len(c0 := curve(df, "phantom/frac/all_fail")) else np.nan
        out.append(rec)
    table = pd.DataFrame(out, index=rows.index)
    table["collapse"] = pd.Series([r["collapse"] for r in out], index=rows.index, dtype=object)  # ints stay ints
    return table


def dynamics(rows: pd.DataFrame, **thresholds: Any) -> pd.DataFrame:
    """:func:`phantom.dynamics.dynamics_table` of the finished cells of ``rows`` (index: cell name):
    the step where held-out length fell 20%, held-out accuracy fell 0.10, the all-fail fraction
    passed 50%, and which came first. ``thresholds`` go to :func:`phantom.dynamics.dynamics`."""
    from phantom.dynamics import dynamics_table

    root = rows.attrs.get("runs_root") or resolve_runs()
    frames = {name: df for name in rows.loc[rows["done"], "name"] if len(df := metrics(name, root))}
    return dynamics_table(frames, **thresholds)


def committed_runs(sweep: str, root: str | os.PathLike[str], fields: Sequence[str], **thresholds: Any,
                   ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """The finished full-profile cells of a sweep whose run folders are committed under ``root`` (the
    other warm starts' sweeps, which the book reads and never re-runs): :func:`phantom.lab.acceptance.sweep_runs`,
    with a sweep file, like ``root``, relative to the repository root.
    """
    from phantom.book.chapters import repo_root
    from phantom.lab.acceptance import sweep_runs
    from phantom.lab.sweep import sweep_file

    if Path(sweep).suffix in (".yaml", ".yml"):
        sweep = sweep_file(sweep, repo_root())
    return sweep_runs(sweep, resolve_runs(root), fields, **thresholds)


def mean_sd(values: Iterable[float]) -> tuple[float, float, int]:
    """Mean, sample SD (nan for n < 2) and n of the finite values."""
    v = np.array([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if not len(v):
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else float("nan"), len(v)


def fmt_pm(mean: float, sd: float = float("nan"), n: int | None = None, digits: int = 3) -> str:
    """``0.754 ± 0.005 (n = 4)``; '–' for a missing value; no ± for a single value."""
    if mean is None or not np.isfinite(mean):
        return "–"
    text = f"{mean:.{digits}f}"
    if sd is not None and np.isfinite(sd):
        text += f" ± {sd:.{digits}f}"
    if n is not None and n != 1:
        text += f" (n = {n})"
    return text


def reported(experiment: str, metric: str, *, root: Path | None = None, **fields: Any) -> dict[str, Any] | None:
    """The paper's number for one cell: ``{value, sd, n, label, section, note}``, or None if not reported.

    With several matching rows (per-run values and a pooled row) the pooled row (with ``sd``) wins.
    """
    from phantom.book.paper import paper_reported

    df = paper_reported(root, experiment=experiment, metric=metric)
    for key, want in fields.items():
        if want is not None:
            df = df[[_matches(v, want) for v in df[key]]]
    if df.empty:
        return None
    pooled = df[df["sd"].notna()]
    row = (pooled if len(pooled) else df).iloc[0]
    n = row["n"] if pd.notna(row["n"]) else None
    return {"value": float(row["value"]), "sd": float(row["sd"]) if pd.notna(row["sd"]) else float("nan"),
            "n": int(n) if n is not None else None, "label": row["label"], "section": row["section"],
            "note": row["note"] if isinstance(row["note"], str) else ""}


def reported_text(rep: Mapping[str, Any] | None, digits: int = 3) -> str:
    """A reported number as table text (``0.080 ± 0.112 (n = 4)``), '–' when the paper has none."""
    if rep is None:
        return "–"
    return fmt_pm(rep["value"], rep["sd"], rep["n"] if rep["n"] and rep["n"] > 1 else None, digits)


def samples(df: pd.DataFrame, key: str = "phantom/sample") -> pd.Series:
    """The held-out sample output logged at each validation step (strings)."""
    if key not in df.columns:
        return pd.Series(dtype=object)
    s = df[key].dropna()
    return s[[isinstance(v, str) for v in s]]


def same_curves(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str] = (VAL_ACC, TRAIN_LEN)) -> bool:
    """True when two runs logged exactly the same values for every key (and both have them)."""
    for key in keys:
        x, y = curve(a, key), curve(b, key)
        if x.empty or not x.index.equals(y.index) or not np.array_equal(x.to_numpy(), y.to_numpy()):
            return False
    return True


def same_prefix(longer: pd.DataFrame, shorter: pd.DataFrame) -> bool:
    """True when ``longer`` logged every value ``shorter`` logged, at the same steps, timings aside.

    Why: a lab run's first steps do not depend on how many follow, so a run continued past its cell's
    horizon must repeat the cell. ``longer`` may hold more (later steps, validations at steps the
    shorter run skipped); where ``shorter`` logged nothing it is not compared.
    """
    cols = [c for c in shorter.columns if not str(c).startswith("timing_s/")]
    if not len(shorter) or not set(cols) <= set(longer.columns) or not set(shorter.index) <= set(longer.index):
        return False
    want = shorter[cols]
    return bool(longer.loc[want.index, cols].where(want.notna()).equals(want))
