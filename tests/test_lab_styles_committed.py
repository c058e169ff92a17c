"""The committed answer-style sweep (data/runs/lab_styles): complete, readable, and what it shows.

These are the run logs of ``phantom lab sweep styles`` (one arithmetic base re-styled at slack 0.3, 0.6
and 1.0 and in the terse style; no filter and outcome filter; RL seeds 0-2), from checkpoints the
committed code builds (the base is the one every fresh clone builds: 750 steps, warm start 0.570). The assertions are what
chapter 4 states about them; a re-run whose data stops supporting one fails here, before the book.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from phantom.dynamics import dynamics
from phantom.lab.rl import VAL_ACC
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs, read_metrics

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs" / "lab_styles"
STYLES = ("lab_slack_low", "lab", "lab_slack_high", "lab_terse")


@pytest.fixture(scope="module")
def cells() -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for run in iter_runs(RUNS):
        m = run.manifest()
        df = read_metrics(run.path)
        out[m["spec"]["model"], m["spec"]["arm"]].append({"name": run.name, "seed": m["spec"]["seed"], "manifest": m,
                                                          **dynamics(df), "last_step": df[VAL_ACC].dropna().index[-1]})
    return out


def test_the_committed_runs_are_the_sweeps_cells(cells):
    want = sorted(c.name for c in expand(load_sweep("styles"), "full"))
    assert sorted(r["name"] for runs in cells.values() for r in runs) == want
    for runs in cells.values():
        assert sorted(r["seed"] for r in runs) == [0, 1, 2]
        for r in runs:
            assert r["manifest"]["status"] == "done"
            assert r["manifest"]["sweep"]["name"] == "styles"
            assert r["last_step"] == 40


def test_greedy_start_length_orders_the_styles(cells):
    """Greedy answers at slack 0.3 drop every removable piece (each is in a target with p = 0.3), so they
    start shorter even than the terse style's spaced steps."""
    len0 = {m: {round(r["len0"], 6) for r in cells[m, "none"] + cells[m, "outcome"]} for m in STYLES}
    assert all(len(v) == 1 for v in len0.values()), len0
    first = {m: next(iter(v)) for m, v in len0.items()}
    assert first["lab_slack_low"] < first["lab_terse"] < first["lab"] < first["lab_slack_high"]


def test_length_leads_where_greedy_answers_carry_removable_text(cells):
    """Length falls first in every no-filter run where the greedy answers carry removable text (slack 0.6
    and 1.0, the terse style's spaces); at slack 0.3, whose greedy answers carry none, accuracy falls first
    or alone in every run."""
    leads = {m: sum(r["order"] in ("length first", "length only") for r in cells[m, "none"]) for m in STYLES}
    assert leads["lab"] == leads["lab_slack_high"] == leads["lab_terse"] == 3 and leads["lab_slack_low"] == 0
    assert {r["order"] for r in cells["lab_slack_low", "none"]} <= {"accuracy first", "accuracy only"}


def test_no_filter_mostly_collapses_and_outcome_holds(cells):
    for m in STYLES:
        assert sum(r["acc_end"] < 0.1 for r in cells[m, "none"]) >= 2, m
        assert all(r["acc_end"] >= r["acc0"] - 0.05 for r in cells[m, "outcome"]), m


def test_the_books_reader_of_committed_sweeps(tmp_path):
    """phantom.book.results.committed_runs (what chapter 4 reads): one row per committed cell with its
    dynamics, the metrics by run name, and the same columns with no rows where nothing is committed."""
    from phantom.book.results import committed_runs
    from phantom.dynamics import COLUMNS

    table, frames = committed_runs("styles", RUNS, ["model", "arm", "seed"])
    assert len(table) == 24 and set(frames) == set(table.index)
    assert list(table.columns) == ["model", "arm", "seed", *COLUMNS]
    lab_none = table[(table["model"] == "lab") & (table["arm"] == "none")]
    assert list(lab_none["order"]) == ["length first"] * 3
    empty, none = committed_runs("styles", tmp_path / "nothing", ["model", "arm", "seed"])
    assert len(empty) == 0 and none == {} and list(empty.columns) == list(table.columns)
