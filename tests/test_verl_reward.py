"""phantom.verl.reward: the dict verl receives (score shaped, acc binary), kwargs checks, noise."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phantom import rewards
from phantom.verl.reward import DEFAULTS, check_reward_kwargs, compute_score, outcome_of

KEYS = {"score", "acc", "outcome", "len_chars"}


def test_dict_keys_and_values_pass_and_fail():
    ok = compute_score("openai/gsm8k", "3 + 4 = 7 #### 7", "7")
    bad = compute_score("openai/gsm8k", "3 + 4 = 8 #### 8", "7")
    assert set(ok) == set(bad) == KEYS
    assert ok["acc"] == ok["outcome"] == 1.0 and bad["acc"] == bad["outcome"] == 0.0
    n = len("3 + 4 = 7 #### 7")
    assert ok["len_chars"] == n
    assert ok["score"] == pytest.approx(1.0 - 0.3 * n / 512)
    assert bad["score"] == pytest.approx(-0.3 * n / 512)


def test_acc_is_the_outcome_not_the_score():
    # A long correct answer and a short wrong one: acc stays binary whatever the shaping does.
    long_right = compute_score("openai/gsm8k", "x" * 600 + " #### 12", "12", lam=0.9)
    short_wrong = compute_score("openai/gsm8k", "#### 1", "12", lam=0.9)
    assert long_right["acc"] == 1.0 and long_right["score"] == pytest.approx(0.1)
    assert short_wrong["acc"] == 0.0 and short_wrong["score"] < 0


@pytest.mark.parametrize("kind", rewards.KINDS)
@given(text=st.text(max_size=700), lam=st.floats(0.0, 0.999), right=st.booleans())
@settings(max_examples=40, deadline=None)
def test_outcome_decodable_from_score_for_every_kind(kind, text, lam, right):
    """score > 0 exactly when acc == 1, for every shaping family and 0 <= lam < 1."""
    extra = {"l_max": 400, "l_cache": 100} if kind == "overlong" else {}
    response = text + (" #### 5" if right else "")
    out = compute_score("openai/gsm8k", response, "5", kind=kind, lam=lam, **extra)
    assert (out["score"] > 0) == (out["acc"] == 1.0)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"lam": 1.0}, "0 <= lam < 1"),
        ({"lam": -0.1}, "lam=-0.1"),
        ({"lam": "abc"}, "not a number"),
        ({"kind": "lenght_short"}, "allowed: length_short"),
        ({"noise_p": 0.5}, "0 <= p < 0.5"),
        ({"checker": "fuzzy"}, "allowed: auto"),
        ({"lamda": 0.3}, "unknown reward kwarg"),
        ({"kind": "overlong"}, "needs integer l_max"),
        ({"cap": 0}, "cap=0"),
    ],
)
def test_bad_kwargs_fail_clearly(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("+", r"\+")):
        check_reward_kwargs(kwargs)
    with pytest.raises(ValueError):
        compute_score("openai/gsm8k", "#### 1", "1", **kwargs)


def test_defaults_are_valid():
    assert check_reward_kwargs({})["lam"] == DEFAULTS["lam"]


def test_noise_flips_train_rows_only_and_reports_the_truth():
    flips_train = flips_test = 0
    for i in range(400):
        info = {"index": i}
        train = compute_score("openai/gsm8k", f"answer {i} #### 7", "7", {**info, "split": "train"}, noise_p=0.25)
        test = compute_score("openai/gsm8k", f"answer {i} #### 7", "7", {**info, "split": "test"}, noise_p=0.25)
        assert set(train) == set(test) == KEYS | {"true_acc"}
        assert train["true_acc"] == test["true_acc"] == 1.0
        flips_train += train["acc"] == 0.0
        flips_test += test["acc"] == 0.0
        assert (train["score"] > 0) == (train["acc"] == 1.0)  # the gate sees what the verifier reported
    assert flips_test == 0
    assert 0.15 < flips_train / 400 < 0.35
    again = compute_score("openai/gsm8k", "answer 3 #### 7", "7", {"index": 3, "split": "train"}, noise_p=0.25)
    first = compute_score("openai/gsm8k", "answer 3 #### 7", "7", {"index": 3, "split": "train"}, noise_p=0.25)
    assert again == first  # deterministic per sample


def test_checkers():
    assert outcome_of("the answer is 42", "42", "openai/gsm8k") == 1.0
    assert outcome_of("the answer is 42", "42", "phantom_lab") == 0.0  # the lab needs the marker
    assert outcome_of("1+2=3;3+4=7####7", "7", "phantom_lab") == 1.0
    math_source = "DigitalLearningGmbH/MATH-lighteval"
    assert outcome_of("so \\boxed{\\frac{1}{2}}", "\\frac12", math_source) == 1.0
    assert outcome_of("so \\boxed{0.5}", "\\frac{1}{2}", math_source) == 1.0  # verl's normalizer knows 0.5
    assert outcome_of("so \\boxed{0.25}", "\\frac{1}{4}", math_source) == 0.0  # ...but it is no CAS
    assert outcome_of("so \\boxed{12}", "12", math_source) == 1.0
    assert outcome_of("no box 12", "12", math_source) == 0.0
    assert outcome_of("so \\boxed{1,000}", "1000", math_source) == 1.0
    assert outcome_of("so \\boxed{4}", "\\frac{1}{4}", math_source) == 0.0  # no digit-picking from LaTeX


def test_format_kind_rewards_the_marker_among_failures():
    with_marker = compute_score("openai/gsm8k", "#### 3", "4", kind="format", lam=0.3)
    without = compute_score("openai/gsm8k", "3", "4", kind="format", lam=0.3)
    assert with_marker["score"] == 0.0 and without["score"] == pytest.approx(-0.3)


def test_non_string_response_scores_as_empty():
    out = compute_score("openai/gsm8k", None, "4")
    assert out == {"score": 0.0, "acc": 0.0, "outcome": 0.0, "len_chars": 0.0}
    assert np.isfinite(out["score"])
