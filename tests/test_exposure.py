"""phantom exposure: group counts, phantom advantage sizes and the refill arithmetic.

The rollout fixtures are constructed (tests/fixtures/audit/make_fixtures.py) with a known plan of
correct answers per group, so every count below is known in advance.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phantom.audit.exposure import RolloutError, exposure, load_rollouts, main, refill_estimate
from phantom.rewards import length_short

FIX = Path(__file__).parent / "fixtures" / "audit"


# ------------------------------------------------------------------------------------------------
# Refill arithmetic
# ------------------------------------------------------------------------------------------------
def test_refill_closed_forms():
    # one group per batch, one needed: N is geometric, E[N] = 1/p and P(N > m) = f^m
    r = refill_estimate(0.75, train_batch=1, gen_batch=1, max_batches=3)
    assert r.expected == pytest.approx(4.0, rel=1e-9)
    assert r.p_exceed == pytest.approx(0.75**3, rel=1e-9)
    none_dropped = refill_estimate(0.0, train_batch=32, gen_batch=96, max_batches=1)
    assert none_dropped.expected == pytest.approx(1.0) and none_dropped.p_exceed == 0.0
    all_dropped = refill_estimate(1.0, train_batch=32, gen_batch=96, max_batches=10)
    assert math.isinf(all_dropped.expected) and all_dropped.p_exceed == 1.0
    assert refill_estimate(0.5, train_batch=32, gen_batch=32).prompts_v1 == pytest.approx(64.0)


def test_refill_matches_simulation():
    f, tb, gb, cap = 0.7, 32, 96, 1
    r = refill_estimate(f, train_batch=tb, gen_batch=gb, max_batches=cap)
    rng = np.random.default_rng(0)
    kept = rng.binomial(gb, 1 - f, size=(20000, 12)).cumsum(axis=1)
    n = (kept < tb).sum(axis=1) + 1  # batches until the step has tb kept groups
    assert n.mean() == pytest.approx(r.expected, abs=0.02)
    assert (n > cap).mean() == pytest.approx(r.p_exceed, abs=0.015)
    assert r.suggest >= 2 and refill_estimate(f, train_batch=tb, gen_batch=gb, max_batches=r.suggest).p_exceed < 1e-4


def test_refill_rejects_bad_input():
    with pytest.raises(ValueError, match="all_same"):
        refill_estimate(1.5, train_batch=1, gen_batch=1)
    with pytest.raises(ValueError, match="train_batch"):
        refill_estimate(0.5, train_batch=0, gen_batch=1)


# ------------------------------------------------------------------------------------------------
# Measuring a dump
# ------------------------------------------------------------------------------------------------
def test_counts_on_constructed_rollouts():
    e = exposure(load_rollouts(FIX / "rollouts.jsonl"))
    # plan (correct answers of 5): step 1 [0,0,0,2,5,3,0,1], step 2 [0,0,5,4,0,2,0,5], one step-2
    # all-fail group answered with five empty strings (flat even in the shaped score)
    assert (e.groups, e.all_fail, e.all_pass, e.mixed, e.phantom) == (16, 8, 3, 5, 7)
    assert (e.drop_outcome, e.drop_score) == (11, 1)
    assert e.refill["outcome"].expected > e.refill["score"].expected  # outcome filtering needs more refill
    assert e.columns == {"group": "uid", "outcome": "acc", "score": "score", "length": "response_length"}


def test_phantom_groups_are_as_loud_as_mixed_ones_under_grpo_only():
    e = exposure(load_rollouts(FIX / "rollouts.jsonl"))
    a = e.abs_adv
    assert a["phantom/grpo"] > 0.5 * a["mixed/grpo"]  # std normalization: same speaking volume
    assert a["phantom/drgrpo"] < 0.25 * a["mixed/drgrpo"]  # Dr. GRPO: proportional to the shaping


def test_phantom_advantage_by_hand():
    # one all-fail group of three, shaped by length: A = (r - mean) / (std_unbiased + 1e-6)
    lengths = np.array([100.0, 200.0, 400.0])
    scores = length_short(np.zeros(3), lengths, lam=0.3)
    df = pd.DataFrame({"uid": "g", "acc": 0, "score": scores, "len": lengths})
    expected = np.abs((scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)).mean()
    e = exposure(df)
    assert e.phantom == 1 and e.abs_adv["phantom/grpo"] == pytest.approx(expected)
    assert e.abs_adv["phantom/drgrpo"] == pytest.approx(np.abs(scores - scores.mean()).mean())
    assert e.abs_adv["mixed/grpo"] is None


def test_lambda_cancels_under_std_but_not_without():
    """The paper's point in numbers: lowering lambda does not quiet a phantom group under GRPO."""
    rng = np.random.default_rng(1)
    n, g = 5, 40
    lengths = rng.integers(50, 500, n * g).astype(float)  # below the 512 cap: the term stays linear

    def measure(lam: float) -> dict:
        df = pd.DataFrame({"uid": np.repeat(np.arange(g), n), "acc": 0,
                           "score": length_short(np.zeros(n * g), lengths, lam=lam), "len": lengths})
        return exposure(df).abs_adv

    small, large = measure(0.05), measure(0.5)
    assert small["phantom/grpo"] == pytest.approx(large["phantom/grpo"], rel=1e-3)
    assert small["phantom/grpo"] > 0.5
    assert large["phantom/drgrpo"] == pytest.approx(10 * small["phantom/drgrpo"], rel=1e-9)


def test_jsonl_and_parquet_agree():
    a = exposure(load_rollouts(FIX / "rollouts.jsonl")).to_dict()
    b = exposure(load_rollouts(FIX / "rollouts.parquet")).to_dict()
    for d in (a, b):
        d.pop("source")
    assert a == b


def test_verl_v1_dump_folder():
    df = load_rollouts(FIX / "rollouts_v1")  # {step}.jsonl files; uid = <prompt>_<rollout>_<output>
    e = exposure(df, grade=True)
    assert e.groups == 8 and (e.all_fail, e.all_pass, e.mixed) == (4, 2, 2)
    assert any("suffix" in n for n in e.notes) and e.columns["length"] == "len(output) chars"
    t = exposure(df, outcome_threshold=0.0)  # phantom rewards: outcome = score > 0 for 0 <= lam < 1
    assert (t.all_fail, t.all_pass, t.mixed, t.phantom) == (e.all_fail, e.all_pass, e.mixed, e.phantom)


def test_fixture_files_match_their_generator(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", FIX / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write(tmp_path)
    for name in ("rollouts.jsonl", "rollouts_v1/1.jsonl", "rollouts_v1/2.jsonl", "metrics_collapse.jsonl",
                 "metrics_healthy.jsonl"):
        assert (tmp_path / name).read_text() == (FIX / name).read_text(), name
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "rollouts.parquet"),
                                  pd.read_parquet(FIX / "rollouts.parquet"))


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def test_cli_text_and_json(capsys):
    assert main([str(FIX / "rollouts.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "phantom (all-fail with spread)" in text and "refill" in text
    assert main([str(FIX / "rollouts.parquet"), "--format", "json", "--train-batch-size", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["phantom"] == 7 and out["fractions"]["all_fail"] == pytest.approx(0.5)
    assert out["refill"]["outcome"]["train_batch"] == 16


def test_cli_all_dropped_gives_null_not_infinity(tmp_path, capsys):
    p = tmp_path / "dead.jsonl"
    p.write_text("".join(json.dumps({"uid": i // 2, "acc": 0, "score": 0.0}) + "\n" for i in range(4)))
    assert main([str(p), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)  # json.loads rejects nothing here: no Infinity
    assert out["refill"]["outcome"]["expected"] is None


@pytest.mark.parametrize("content, needle", [
    ('{"uid": 1, "acc": 1, "score": 1.0}\n{"uid": 1, "acc": ', "bad.jsonl:2: invalid JSON"),
    ('{"uid": 1, "score": 1.0}\n', "no outcome column"),
    ('{"uid": 1, "acc": 0.5, "score": 1.0}\n', "is not binary"),
    ('{"acc": 1, "score": 1.0}\n', "no group column"),
])
def test_cli_bad_dumps_exit_2(tmp_path, capsys, content, needle):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    assert main([str(p)]) == 2
    assert needle in capsys.readouterr().err


def test_missing_dump_and_unknown_column(capsys):
    assert main(["/nonexistent/rollouts.jsonl"]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(RolloutError, match="--outcome-col 'nope' is not a column"):
        exposure(load_rollouts(FIX / "rollouts.jsonl"), outcome_col="nope")
