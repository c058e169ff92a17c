"""phantom.feedback: the toy feedback loop behind chapter 2's "Why it collapses"."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phantom.feedback import TRACE_KEYS, LoopSpec, allfail_push, simulate_loop


def test_trace_has_every_key_per_step_and_is_deterministic():
    a = simulate_loop(steps=12, seed=3)
    b = simulate_loop(LoopSpec(steps=12, seed=3))
    assert set(a) == set(TRACE_KEYS)
    assert all(len(v) == 12 for v in a.values())
    for k in TRACE_KEYS:
        np.testing.assert_array_equal(a[k], b[k])
    assert a["median_len"][0] == pytest.approx(260.0)
    assert not np.array_equal(a["acc"], simulate_loop(steps=12, seed=4)["acc"])


def test_allfail_push_matches_the_closed_form():
    # c4(5) = 0.9400: the mean sample std of five standard normals
    assert allfail_push(5) == pytest.approx(-4 / 5 * 0.939986, abs=1e-5)
    assert allfail_push(2) == pytest.approx(-0.5 * math.sqrt(2 / math.pi), abs=1e-9)  # c4(2) = sqrt(2/pi)
    with pytest.raises(ValueError, match="group_size"):
        allfail_push(1)


def test_an_all_fail_batch_pushes_at_the_closed_form_whatever_lambda():
    """No skill: every group fails. GRPO's push is -(G-1) c4 / G at any λ; Dr. GRPO's scales with λ."""
    base = dict(skill=1e-6, concentration=1e-3, steps=40, lr=0.0, sigma=0.05, prompts=64, seed=1)
    for lam in (0.05, 0.3, 0.9):
        tr = simulate_loop(lam=lam, **base)
        assert tr["dose"].min() == 1.0
        assert tr["push"].mean() == pytest.approx(allfail_push(5), rel=0.05)
        np.testing.assert_allclose(tr["push_allfail"], tr["push"])
    small = simulate_loop(lam=0.05, norm="none", **base)["push"].mean()
    large = simulate_loop(lam=0.5, norm="none", **base)["push"].mean()
    assert large == pytest.approx(10 * small, rel=1e-6) and abs(large) < 0.05 * abs(allfail_push(5))


def test_the_outcome_gate_removes_the_all_fail_push():
    tr = simulate_loop(gate="outcome", steps=30)
    assert np.all(tr["push_allfail"] == 0.0)
    assert np.all(tr["zeroed_frac"] >= tr["dose"])


def test_the_loop_collapses_without_a_gate_and_holds_with_one():
    """The chapter's claim: none and score collapse (length, accuracy), outcome and Dr. GRPO do not."""
    end = {}
    for arm, norm in (("none", "std"), ("score", "std"), ("outcome", "std"), ("none", "none")):
        runs = [simulate_loop(gate=arm, norm=norm, seed=s) for s in range(3)]
        end[arm, norm] = (np.mean([r["median_len"][-1] for r in runs]), np.mean([r["acc"][-10:].mean() for r in runs]),
                          np.mean([r["dose"][-10:].mean() for r in runs]))
    assert end["none", "std"][0] < 80 and end["none", "std"][2] > 0.45
    assert end["score", "std"] == end["none", "std"], "flat shaped-score groups already have zero advantage"
    for safe in (("outcome", "std"), ("none", "none")):
        assert end[safe][0] > 250 and end[safe][1] > 2 * end["none", "std"][1]


def test_the_dose_grows_as_the_length_falls():
    tr = simulate_loop(steps=80)
    first, last = tr["dose"][:20].mean(), tr["dose"][-20:].mean()
    assert last > 2 * first
    assert tr["push_allfail"][-20:].mean() < 2 * tr["push_allfail"][:20].mean()  # more negative: the loop


@pytest.mark.parametrize(("field", "value"), [
    ("gate", "dapo"), ("norm", "batch"), ("lam", 1.0), ("group_size", 1), ("skill", 0.0), ("sigma", 0.0),
    ("lr", float("nan")), ("steps", 0),
])
def test_bad_knobs_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        LoopSpec(**{field: value})
