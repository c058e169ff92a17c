"""phantom.lab.acceptance: the lab's per-warm-start criteria, on small tables built here."""

from __future__ import annotations

import pandas as pd
import pytest

from phantom.lab.acceptance import acceptance, at_step, passing, run_kind

ACC, LEN = "val-core/phantom_lab/acc/mean@1", "val-aux/phantom_lab/len_chars/mean@1"


def _runs(sft: int, *, ends_none=(0.0, 0.0, 0.0), orders=("length first",) * 3, outcome=(0.62, 0.63, 0.64),
          drgrpo=(0.55, 0.6, 0.65), acc0: float = 0.6) -> list[dict]:
    rows = [{"sft_seed": sft, "seed": i, "kind": "none", "acc0": acc0, "acc_end": e, "order": o}
            for i, (e, o) in enumerate(zip(ends_none, orders))]
    rows += [{"sft_seed": sft, "seed": i, "kind": "outcome", "acc0": acc0, "acc_end": e, "order": "neither"}
             for i, e in enumerate(outcome)]
    rows += [{"sft_seed": sft, "seed": i, "kind": "drgrpo", "acc0": acc0, "acc_end": e, "order": "neither"}
             for i, e in enumerate(drgrpo)]
    return rows


def _table(*groups: list[dict]) -> pd.DataFrame:
    rows = [r for g in groups for r in g]
    return pd.DataFrame(rows, index=[f"run{i}" for i in range(len(rows))])


def test_a_warm_start_meeting_every_criterion_passes():
    acc = acceptance(_table(_runs(0)))
    row = acc.loc[0]
    assert row["all_ok"] and row["length_first"] == 3 and row["none_max"] == 0.0
    assert row["outcome_gain"] == pytest.approx(0.03) and row["outcome_worst"] == pytest.approx(0.02)
    assert passing(acc) == [0]


@pytest.mark.parametrize("change, failed", [
    (dict(ends_none=(0.0, 0.11, 0.0)), "collapse_ok"),                      # one unsafe run above 0.10
    (dict(orders=("length first", "same step", "accuracy first")), "order_ok"),
    (dict(outcome=(0.62, 0.62, 0.62)), "outcome_ok"),                       # mean gain +0.02 < +0.03
    (dict(outcome=(0.70, 0.70, 0.54)), "outcome_ok"),                       # mean +0.047 but one run -0.06
    (dict(drgrpo=(0.6, 0.09, 0.6)), "drgrpo_ok"),                            # one Dr. GRPO run collapses
])
def test_each_criterion_fails_on_its_own(change, failed):
    row = acceptance(_table(_runs(3, **change))).loc[3]
    assert not row[failed] and not row["all_ok"]
    assert all(row[c] for c in ("collapse_ok", "order_ok", "outcome_ok", "drgrpo_ok") if c != failed)


def test_warm_starts_are_judged_apart_and_a_missing_arm_fails():
    t = _table(_runs(0), _runs(1, orders=("same step", "same step", "length first")))
    t = t[~((t["sft_seed"] == 0) & (t["kind"] == "drgrpo"))]
    acc = acceptance(t)
    assert list(acc.index) == [0, 1] and passing(acc) == []
    assert acc.loc[0, "drgrpo_n"] == 0 and not acc.loc[0, "drgrpo_ok"] and acc.loc[0, "order_ok"]
    assert acc.loc[1, "same_step"] == 2 and not acc.loc[1, "order_ok"] and acc.loc[1, "drgrpo_ok"]


def test_thresholds_are_parameters_and_bad_ones_are_named():
    t = _table(_runs(0, outcome=(0.62, 0.62, 0.62)))
    assert not acceptance(t).loc[0, "outcome_ok"] and acceptance(t, min_gain=0.02).loc[0, "outcome_ok"]
    assert not acceptance(t, min_length_first=4).loc[0, "order_ok"]
    with pytest.raises(ValueError, match="min_gain=2"):
        acceptance(t, min_gain=2)
    with pytest.raises(ValueError, match="min_length_first=0"):
        acceptance(t, min_length_first=0)
    with pytest.raises(ValueError, match=r"\['order'\]"):
        acceptance(t.drop(columns="order"))


def test_run_kind_reads_only_the_four_arms():
    assert [run_kind(e, a) for e, a in (("grpo", "none"), ("grpo", "outcome"), ("drgrpo", "none"),
                                        ("grpo", "score"), ("drgrpo", "outcome"), ("gspo", "none"))] == \
        ["none", "outcome", "drgrpo", "score", None, None]


def test_the_shaped_score_arm_is_held_to_collapse_and_order_when_asked():
    def score(sft, ends, orders):
        return [{"sft_seed": sft, "seed": i, "kind": "score", "acc0": 0.6, "acc_end": e, "order": o}
                for i, (e, o) in enumerate(zip(ends, orders))]

    lf = ("length first",) * 3
    t = _table(_runs(0), score(0, (0.0, 0.0, 0.0), lf), _runs(1), score(1, (0.0, 0.3, 0.0), lf),
               _runs(2), score(2, (0.0, 0.0, 0.0), ("accuracy first", "same step", "length first")), _runs(3))
    plain = acceptance(t)  # the default reads the no-filter arm only
    assert "score_n" not in plain.columns and passing(plain) == [0, 1, 2, 3]
    acc = acceptance(t, unsafe=("none", "score"))
    assert acc["score_n"].tolist() == [3, 3, 3, 0] and acc.loc[1, "score_max"] == 0.3
    assert acc["score_length_first"].tolist() == [3, 3, 1, 0]
    assert acc["collapse_ok"].tolist() == [True, False, True, False]  # SFT 3 has no score runs: fails
    assert acc["order_ok"].tolist() == [True, True, False, False]
    assert passing(acc) == [0]
    with pytest.raises(ValueError, match="unsafe=.*allowed"):
        acceptance(t, unsafe=("score",))


def test_at_step_reads_a_run_as_if_it_had_stopped_there():
    df = pd.DataFrame({ACC: [0.6, 0.62, 0.58, 0.3, 0.0], LEN: [100.0, 95.0, 70.0, 50.0, 40.0]},
                      index=[0, 5, 10, 15, 20])
    t = pd.DataFrame([{"sft_seed": 0, "seed": 0, "kind": "none", "acc0": 0.6, "acc_end": 0.0,
                       "order": "length first"}], index=["r"])
    cut = at_step(t, {"r": df}, 10)
    assert cut.loc["r", "acc_end"] == 0.58 and cut.loc["r", "order"] == "length only"
    full = at_step(t, {"r": df}, 20)
    assert full.loc["r", "acc_end"] == 0.0 and full.loc["r", "order"] == "length first"
    assert t.loc["r", "acc_end"] == 0.0  # the input is not changed
