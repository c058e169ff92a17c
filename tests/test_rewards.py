"""phantom.rewards: answer extraction, shaped-reward families, verifier noise, input validation."""

from __future__ import annotations

import builtins
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phantom import rewards as R

# --------------------------------------------------------------------------------------------
# extraction
# --------------------------------------------------------------------------------------------
EXTRACT_CASES = [
    ("Natalia sold 48 clips ... #### 72", "72"),
    ("#### 1,234", "1234"),
    ("####-17", "-17"),
    ("#### \u221217", "-17"),  # unicode minus
    ("#### $3,000.50", "3000.50"),
    ("steps 1+2=3 #### 3 then #### 4", "4"),  # the last marker wins
    ("so the result is \\boxed{42}.", "42"),
    ("\\boxed{-3.5} and later \\boxed{7}", "7"),
    ("\\boxed{x} \\boxed{12}", "12"),
    ("The answer is 17.", "17"),
    ("the answer is: -2,500", "-2500"),
    ("I think 12 apples, then 15, finally 20 left", "20"),
    ("#### 5 but \\boxed{6}", "5"),  # marker beats boxed
    ("\\boxed{6}; the answer is 9", "6"),  # boxed beats 'the answer is'
    ("the answer is 9 and 10 more", "9"),  # 'the answer is' beats the last number
    ("\u0664\u0662", "42"),  # Arabic-Indic digits
    ("#### \u0661\u0662\u0663", "123"),
    ("no digits here at all", None),
    ("", None),
    ("1,2,3", "3"),  # not a thousands group: three numbers
    ("42.", "42"),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT_CASES)
def test_extract_answer_cases(text, expected):
    assert R.extract_answer(text) == expected


def test_extract_strict_accepts_only_the_marker():
    assert R.extract_answer("1+2=3;3+4=7", strict=True) is None
    assert R.extract_answer("1+2=3;3+4=7", strict=False) == "7"
    assert R.extract_answer("1+2=3;3+4=7####7", strict=True) == "7"


@pytest.mark.parametrize("bad", [None, 42, b"#### 1", ["#### 1"]])
def test_extract_non_string_is_none(bad):
    assert R.extract_answer(bad) is None


def test_huge_and_long_inputs_do_not_raise():
    huge = "9" * 10_000
    assert R.extract_answer(f"#### {huge}") == huge
    assert R.is_correct(f"#### {huge}", huge)
    assert not R.is_correct(f"#### {huge}", huge[:-1] + "8")
    assert R.extract_answer("x" * 10_000) is None
    long_mixed = ("ab 1,234,5 \\boxed{ " * 600)[:10_000]
    R.extract_answer(long_mixed)  # must terminate quickly without raising
    assert R.extract_answer("#" * 10_000) is None


def test_no_eval_or_exec(monkeypatch):
    def forbidden(*_a, **_k):
        raise AssertionError("eval/exec must never be called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    payload = "__import__('os').system('echo pwned') #### 2+2"
    assert R.extract_answer(payload) == "2"
    assert R.is_correct("#### 4", "2*2") is False  # the gold is not evaluated either
    assert R.extract_answer("1e309") == "309"


@given(st.text(max_size=400))
@settings(max_examples=300, deadline=None)
def test_extract_never_raises(text):
    out = R.extract_answer(text)
    if out is not None:
        from decimal import Decimal

        assert Decimal(out).is_finite()


@pytest.mark.parametrize(
    ("text", "gold", "ok"),
    [
        ("#### 42", 42, True),
        ("#### 42.0", "42", True),
        ("#### 42", 42.0, True),
        ("#### 1,234", "1234", True),
        ("the answer is 7", "Janet has ... #### 7", True),
        ("#### 7", "#### 8", False),
        ("#### -3", 3, False),
        ("nothing", 3, False),
        ("#### 3", None, False),
        ("#### 3", float("nan"), False),
        ("#### 0.1", 0.1, True),
    ],
)
def test_is_correct(text, gold, ok):
    assert R.is_correct(text, gold) is ok


def test_has_answer_marker():
    assert R.has_answer_marker("a=1####1")
    assert not R.has_answer_marker("a=1###1")
    assert not R.has_answer_marker(None)


# --------------------------------------------------------------------------------------------
# shaped families
# --------------------------------------------------------------------------------------------
def test_length_short_values_and_scalar_type():
    r = R.length_short(0, 256, lam=0.3)
    assert isinstance(r, float) and math.isclose(r, -0.15)
    assert R.length_short(1, 10_000, lam=0.3) == pytest.approx(0.7)  # saturates at cap
    arr = R.length_short(np.array([0, 0, 1]), np.array([0, 512, 512]), lam=0.5)
    np.testing.assert_allclose(arr, [0.0, -0.5, 0.5])


def test_length_short_prefers_the_shortest_failure_and_long_the_longest():
    lens = np.array([10, 100, 400])
    short = R.length_short(np.zeros(3), lens, lam=0.3)
    long_ = R.length_long(np.zeros(3), lens, lam=0.3)
    assert np.argmax(short) == 0 and np.argmax(long_) == 2
    # reversed family differs from the additive bonus outcome + lam*len/cap only by a constant
    np.testing.assert_allclose(long_ - 0.3 * lens / 512, -0.3)


def test_format_family():
    r = R.format_reward(np.array([0, 0, 1, 1]), np.array([True, False, True, False]), lam=0.2)
    np.testing.assert_allclose(r, [0.0, -0.2, 1.0, 1.0])


def test_overlong_penalty_piecewise():
    pen = R.overlong_penalty(np.array([0, 3000, 3072, 3584, 4096, 5000]), l_max=4096, l_cache=1024)
    np.testing.assert_allclose(pen, [0, 0, 0, -0.5, -1, -1])
    assert R.dapo_overlong(1, 3584, 4096, 1024) == pytest.approx(0.5)


@given(
    kind=st.sampled_from(R.KINDS),
    outcome=st.integers(0, 1),
    length=st.integers(0, 5000),
    lam=st.floats(0, 0.999),
    marker=st.booleans(),
)
def test_outcome_is_recoverable_from_the_sign(kind, outcome, length, lam, marker):
    """For 0 <= lam < 1 every family puts failures in [-lam, 0] and passes in [1-lam, 1]."""
    r = R.shaped_reward(kind, outcome, length, lam=lam, has_marker=marker, l_max=4096, l_cache=1024)
    if outcome:
        assert 1 - lam - 1e-12 <= r <= 1
    else:
        assert -lam - 1e-12 <= r <= 0
    assert (r > 0) == bool(outcome)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: R.length_short(0, 1, lam=-0.1), "lam=-0.1"),
        (lambda: R.length_short(0, 1, lam=float("nan")), "lam=nan"),
        (lambda: R.length_long(0, 1, lam=float("inf")), "lam=inf"),
        (lambda: R.length_short(0, -3, lam=0.3), "length=-3.0"),
        (lambda: R.length_short(0.5, 3, lam=0.3), "outcome=0.5"),
        (lambda: R.length_short(0, 3, lam=0.3, cap=0), "cap=0"),
        (lambda: R.shaped_reward("length_medium", 0, 1), "length_medium"),
        (lambda: R.shaped_reward("format", 0, 1), "has_marker"),
        (lambda: R.overlong_penalty(10, l_max=100, l_cache=200), "l_cache=200"),
        (lambda: R.flip_mask([1, 2], p=0.5), "p=0.5"),
        (lambda: R.flip_mask([1, 2], p=-0.01), "p=-0.01"),
        (lambda: R.denoise(0.3, p=0.7), "p=0.7"),
        (lambda: R.check_lam(1.0, upper=1.0), "0 <= lam < 1.0"),
    ],
)
def test_bad_input_names_value_and_range(call, needle):
    with pytest.raises(ValueError) as err:
        call()
    assert needle in str(err.value)
    assert "allowed" in str(err.value) or "needs" in str(err.value)


def test_unknown_kind_lists_allowed():
    with pytest.raises(ValueError, match="length_short, length_long, format, overlong"):
        R.shaped_reward("bogus", 0, 1)


# --------------------------------------------------------------------------------------------
# verifier noise
# --------------------------------------------------------------------------------------------
def test_flip_mask_is_deterministic_and_has_rate_p():
    ids = [f"sample-{i}" for i in range(20_000)]
    a = R.flip_mask(ids, p=0.15, seed=7)
    b = R.flip_mask(ids, p=0.15, seed=7)
    c = R.flip_mask(ids, p=0.15, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # binomial sd at n=20000, p=0.15 is 0.0025; 5 sd
    assert abs(a.mean() - 0.15) < 0.0125
    assert R.flip_mask("sample-3", p=0.15, seed=7) == bool(a[3])
    assert not R.flip_mask(ids, p=0.0).any()


def test_noise_and_denoise_recover_true_accuracy():
    rng = np.random.default_rng(0)
    truth = (rng.random(50_000) < 0.7).astype(float)
    ids = np.arange(truth.size)
    for p in (0.05, 0.15, 0.3):
        observed = R.noisy_outcome(truth, ids, p=p, seed=1)
        assert set(np.unique(observed)) <= {0.0, 1.0}
        assert abs(R.denoise(observed.mean(), p) - truth.mean()) < 0.02
        assert not np.array_equal(observed, truth)


def test_denoise_formula():
    assert R.denoise(0.5, 0.0) == 0.5
    assert R.denoise(0.15, 0.15) == pytest.approx(0.0)
    assert R.denoise(0.85, 0.15) == pytest.approx(1.0)
    np.testing.assert_allclose(R.denoise(np.array([0.15, 0.5]), 0.15), [0.0, 0.5])


def test_noisy_outcome_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        R.noisy_outcome(np.zeros(3), [1, 2], p=0.1)
