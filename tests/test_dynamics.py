"""phantom.dynamics: the step where length, accuracy and the all-fail dose move, read from metrics frames."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from phantom.dynamics import (
    dynamics,
    dynamics_table,
    first_above,
    first_fall,
    order,
    run_dynamics,
    up_to,
    val_keys,
    validated_every,
)
from phantom.runs import read_metrics

ROOT = Path(__file__).resolve().parents[1]
ACC, LEN = "val-core/phantom_lab/acc/mean@1", "val-aux/phantom_lab/len_chars/mean@1"


def frame(acc: dict[int, float], length: dict[int, float], all_fail: dict[int, float] | None = None,
          acc_key: str = ACC, len_key: str = LEN) -> pd.DataFrame:
    """A metrics frame as read_metrics returns it: evaluations every 5 steps, training keys every step."""
    steps = sorted(set(acc) | set(length) | set(all_fail or {}))
    rows = {s: {} for s in steps}
    for s, v in acc.items():
        rows[s][acc_key] = v
    for s, v in length.items():
        rows[s][len_key] = v
    for s, v in (all_fail or {}).items():
        rows[s]["phantom/frac/all_fail"] = v
    return pd.DataFrame.from_dict(rows, orient="index").sort_index()


def test_length_first_on_a_paper_like_collapse():
    df = frame({0: 0.70, 5: 0.71, 10: 0.66, 15: 0.58, 20: 0.10},
               {0: 120.0, 5: 100.0, 10: 95.0, 15: 60.0, 20: 5.0},
               {1: 0.2, 2: 0.25, 12: 0.45, 14: 0.51, 15: 0.9})
    d = dynamics(df)
    # 95/120 = 0.79: 21% below start at step 10 (100/120 at step 5 is only 17%); 0.58 is 0.12 below at 15
    assert (d["len_step"], d["acc_step"], d["all_fail_step"]) == (10, 15, 14)
    assert d["order"] == "length first" and d["lead"] == 5
    assert (d["acc0"], d["len0"], d["acc_end"], d["len_end"]) == (0.70, 120.0, 0.10, 5.0)
    assert (d["acc_key"], d["len_key"]) == (ACC, LEN)


def test_accuracy_first_when_correctness_goes_before_length():
    d = dynamics(frame({0: 0.64, 5: 0.31, 10: 0.0}, {0: 37.0, 5: 35.0, 10: 0.0}))
    assert (d["len_step"], d["acc_step"], d["order"], d["lead"]) == (10, 5, "accuracy first", -5)


def test_thresholds_are_inclusive_and_absolute_for_accuracy():
    # exactly 20% shorter and exactly 0.10 lower count (floating point of 0.7 - 0.1 included)
    d = dynamics(frame({0: 0.7, 5: 0.6}, {0: 100.0, 5: 80.0}, {1: 0.5}))
    assert (d["len_step"], d["acc_step"], d["order"]) == (5, 5, "same step")
    assert d["all_fail_step"] is None  # exceeds, not reaches, 0.5
    # the accuracy drop is absolute: 0.30 -> 0.25 is a 17% relative fall but only 0.05
    assert dynamics(frame({0: 0.30, 5: 0.25}, {0: 50.0, 5: 50.0}))["order"] == "neither"
    assert dynamics(frame({0: 0.30, 5: 0.25}, {0: 50.0, 5: 50.0}), acc_drop=0.05)["acc_step"] == 5
    assert dynamics(frame({0: 0.7, 5: 0.7}, {0: 100.0, 5: 85.0}), length_drop=0.1)["order"] == "length only"
    assert dynamics(frame({0: 0.7, 5: 0.5}, {0: 100.0, 5: 99.0}))["order"] == "accuracy only"


def test_a_rise_never_counts_and_missing_keys_give_none():
    d = dynamics(frame({0: 0.5, 5: 0.9}, {0: 40.0, 5: 80.0}))
    assert d["order"] == "neither" and d["lead"] is None
    empty = dynamics(pd.DataFrame({"response_length/mean": [10.0, 5.0]}))
    assert empty["acc_key"] is None and empty["len_step"] is None and math.isnan(empty["acc0"])
    assert empty["order"] == "neither"


def test_keys_are_found_by_data_source():
    df = frame({0: 0.7, 5: 0.5}, {0: 300.0, 5: 100.0}, acc_key="val-core/openai/gsm8k/acc/mean@1",
               len_key="val-aux/openai/gsm8k/len_chars/mean@1")
    df["val-core/phantom_lab/acc/mean@1"] = [0.6, 0.6]
    assert val_keys(df)[0] == "val-core/openai/gsm8k/acc/mean@1"  # sorted: the first data source
    assert val_keys(df, "phantom_lab") == ("val-core/phantom_lab/acc/mean@1", None)
    d = dynamics(df, data_source="openai/gsm8k")
    assert (d["len_step"], d["acc_step"]) == (5, 5)


@pytest.mark.parametrize("kwargs", [dict(length_drop=0.0), dict(acc_drop=1.5), dict(all_fail_above=-0.1),
                                    dict(length_drop="0.2")])
def test_bad_thresholds_fail_with_the_allowed_range(kwargs):
    with pytest.raises(ValueError, match="allowed: 0 <"):
        dynamics(frame({0: 0.7}, {0: 10.0}), **kwargs)


def test_helpers():
    s = pd.Series({0: 10.0, 5: 9.0, 10: 7.9, 15: 2.0})
    assert first_fall(s, drop=0.2, relative=True) == 10
    assert first_fall(s, drop=8.0, relative=False) == 15
    assert first_fall(s.iloc[:1], drop=0.1, relative=True) is None
    assert first_above(pd.Series({1: 0.2, 3: 0.7}), 0.5) == 3
    assert [order(*p) for p in [(1, 2), (2, 1), (3, 3), (1, None), (None, 1), (None, None)]] == [
        "length first", "accuracy first", "same step", "length only", "accuracy only", "neither"]


def test_table_over_runs_keeps_steps_as_ints(tmp_path):
    frames = {"a": frame({0: 0.7, 5: 0.5}, {0: 100.0, 5: 70.0}), "b": frame({0: 0.7, 5: 0.7}, {0: 100.0, 5: 99.0})}
    t = dynamics_table(frames)
    assert list(t.index) == ["a", "b"] and t.loc["a", "len_step"] == 5 and isinstance(t.loc["a", "lead"], int)
    assert t.loc["b", "len_step"] is None and t.loc["b", "order"] == "neither"
    assert dynamics_table({}).empty


def test_run_folder_in_verl_format_and_a_committed_verl_run(tmp_path):
    """Lab, verl and TRL runs share the reader: a metrics.jsonl of {step, data} lines, merged per step."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 0, "data": {ACC: 0.7, LEN: 100.0}}, {"step": 1, "data": {"phantom/frac/all_fail": 0.6}},
             {"step": 5, "data": {ACC: 0.55}}, {"step": 5, "data": {LEN: 60.0}}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    d = run_dynamics(run)
    assert (d["len_step"], d["acc_step"], d["all_fail_step"], d["order"]) == (5, 5, 1, "same step")
    committed = ROOT / "data" / "runs" / "verl_filter" / "verl-a-s0"  # verl 0.9.1, no filter
    df = read_metrics(committed)
    d = dynamics(df)
    acc = df[d["acc_key"]].dropna()
    assert d["acc_key"] == "val-core/phantom_lab/acc/mean@1" and d["len_key"] == LEN
    expect = next(int(s) for s, v in acc.iloc[1:].items() if v <= acc.iloc[0] - 0.1 + 1e-9)
    assert d["acc_step"] == expect and d["acc0"] == acc.iloc[0]


def test_validated_every_reads_the_coarse_run_off_the_fine_one():
    """At every step the length falls at 3 and accuracy at 4; validated every fifth step both show at 5."""
    steps = range(0, 11)
    df = frame({s: [0.7, 0.7, 0.7, 0.68, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0][s] for s in steps},
               {s: [100.0, 95, 90, 70, 60, 50, 40, 30, 20, 10, 5][s] for s in steps},
               {s: 0.3 for s in steps})
    df["phantom/sample"] = "x"
    fine, coarse = dynamics(df), dynamics(validated_every(df, 5))
    assert (fine["len_step"], fine["acc_step"], fine["order"]) == (3, 4, "length first")
    assert (coarse["len_step"], coarse["acc_step"], coarse["order"]) == (5, 5, "same step")
    five = validated_every(df, 5)
    assert five["phantom/frac/all_fail"].equals(df["phantom/frac/all_fail"])  # training columns are kept
    assert five[ACC].dropna().index.tolist() == [0, 5, 10] and five["phantom/sample"].notna().sum() == 3
    assert validated_every(df, 1).equals(df) and len(up_to(df, 4)) == 5 and up_to(df, 4).index.max() == 4


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "5"])
def test_validated_every_rejects_a_bad_interval(bad):
    with pytest.raises(ValueError, match="allowed: a positive integer"):
        validated_every(frame({0: 0.5}, {0: 10.0}), bad)
