"""phantom.lab.task: deterministic, disjoint splits; solutions that the reward code accepts."""

from __future__ import annotations

import pytest

from phantom.lab.task import (
    TaskConfig,
    core_lines,
    iter_split,
    make_split,
    problem,
    sample_solution,
    solution_text,
    worked_solution,
)
from phantom.rewards import extract_answer, is_correct


def test_problems_are_deterministic_and_independent_of_batching():
    cfg = TaskConfig()
    a = make_split(cfg, "train", 50)
    b = make_split(cfg, "train", 30, start=20)
    assert a[20:] == b[:30]
    assert a == make_split(TaskConfig(), "train", 50)
    assert problem(cfg, "val", 7) == make_split(cfg, "val", 8)[7]
    stream = iter_split(cfg, "val", start=3)
    assert [next(stream) for _ in range(3)] == make_split(cfg, "val", 3, start=3)


def test_splits_are_disjoint_by_operands():
    cfg = TaskConfig(terms=(2, 2))  # the smallest problem space: collisions would show here
    train = {p.operands for p in make_split(cfg, "train", 3000)}
    val = {p.operands for p in make_split(cfg, "val", 300)}
    assert train.isdisjoint(val)
    assert len(val) > 250  # and not degenerate


@pytest.mark.parametrize("wording", ["symbolic", "words", "mixed"])
def test_solution_format_and_answer(wording):
    cfg = TaskConfig(terms=(2, 6), wording=wording, style="terse")
    for p in make_split(cfg, "val", 100):
        lo, hi = cfg.terms
        assert lo <= len(p.operands) <= hi
        assert all(1 <= x <= 99 for x in p.operands)
        assert p.answer == sum(p.operands)
        lines = p.solution.split("\n")
        assert len(lines) == len(p.operands)  # one line per addition plus the answer line
        assert lines[-1] == f"#### {p.answer}"
        assert is_correct(p.solution, p.answer, strict=True)
        assert extract_answer(p.solution, strict=True) == str(p.answer)
        assert p.prompt.endswith("\n")
        assert all(str(x) in p.prompt for x in p.operands)
    if wording == "mixed":
        assert {p.wording for p in make_split(cfg, "val", 100)} == {"symbolic", "words"}


def test_truncated_reasoning_is_wrong():
    """Dropping the steps or the answer line loses the marker: the phantom's shortcut fails."""
    sol = solution_text((38, 7, 91))
    assert sol == "38+7=45\n45+91=136\n#### 136"
    assert not is_correct(sol.rsplit("\n", 1)[0], 136, strict=True)
    assert not is_correct("", 136, strict=True)
    assert not is_correct("38+7=45\n45+91=136\n###", 136, strict=True)


def test_difficulty_knob_changes_terms():
    easy = make_split(TaskConfig(terms=(2, 3)), "val", 200)
    hard = make_split(TaskConfig(terms=(5, 6)), "val", 200)
    assert max(len(p.operands) for p in easy) <= 3 < min(len(p.operands) for p in hard)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(terms=(1, 3)), "terms"), (dict(terms=(4, 3)), "terms"), (dict(max_operand=3), "max_operand"),
    (dict(wording="latin"), "wording"), (dict(style="verbose"), "style"), (dict(slack=1.5), "slack"),
    (dict(slack="lots"), "slack"),
])
def test_bad_config_fails_fast(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TaskConfig(**kwargs)


def test_bad_split_and_fields():
    with pytest.raises(ValueError, match="allowed: train, val"):
        problem(TaskConfig(), "test", 0)
    with pytest.raises(ValueError, match="unknown field"):
        TaskConfig.from_dict({"terms": [2, 3], "digits": 2})


def test_styles_change_length_not_answer():
    import random

    from phantom.lab.task import styled_solution

    ops = (56, 85, 42, 12)
    rng = random.Random(0)
    sols = {styled_solution(ops, rng, 0.5, 0.5) for _ in range(200)}
    assert len({len(s) for s in sols}) >= 5  # sampled styles spread in length
    for s in sols:
        assert is_correct(s, sum(ops), strict=True)
        assert s.endswith(f"#### {sum(ops)}")
    assert solution_text(ops, spaced=(True, False, False), recap=True) == \
        "56 + 85 = 141\n141+42=183\n183+12=195\nTotal: 195\n#### 195"


def test_worked_solutions_keep_the_steps_and_answer_under_removable_prose():
    """The worked style: prose around unchanged steps; every draw is correct; slack 0 is the bare steps."""
    import random

    ops = (56, 85, 42, 12)
    rng = random.Random(0)
    draws = [worked_solution(ops, rng, 0.6) for _ in range(300)]
    for d in draws:
        assert is_correct(d, sum(ops), strict=True) and d.endswith(f"#### {sum(ops)}")
        pos = [d.index(c) for c in core_lines(ops)]  # every step, in order
        assert pos == sorted(pos)
    bare = "\n".join(core_lines(ops)) + f"\n#### {sum(ops)}"
    assert worked_solution(ops, rng, 0.0) == bare
    lengths = sorted({len(d) for d in draws})
    assert len(lengths) >= 30 and lengths[0] < len(bare) + 30 < lengths[-1]  # graded, not two lengths
    full = [len(worked_solution(ops, rng, 1.0)) for _ in range(100)]
    low = [len(worked_solution(ops, rng, 0.3)) for _ in range(100)]
    assert sum(low) < sum(len(d) for d in draws[:100]) < sum(full)  # the knob sets how much prose


def test_graded_solutions_keep_each_kind_at_its_own_rate():
    """The graded style: the same invariants as worked, one wording per piece, each kind at its own rate."""
    import random

    from phantom.lab.task import GRADES, graded_probabilities, graded_solution

    ops = (56, 85, 42, 12)
    rng = random.Random(0)
    draws = [graded_solution(ops, rng, 0.6) for _ in range(2000)]
    for d in draws[:300]:
        assert is_correct(d, sum(ops), strict=True) and d.endswith(f"#### {sum(ops)}")
        pos = [d.index(c) for c in core_lines(ops)]
        assert pos == sorted(pos)
    assert graded_solution(ops, rng, 1.0) == ("We add 4 numbers.\nFirst, 56+85=141, so we have 141.\n"
                                              "Then 141+42=183, so we have 183.\nThen 183+12=195, so we have 195.\n"
                                              "So the total is 195.\n#### 195")
    pr = graded_probabilities(0.6)
    assert pr == {"opening": 0.6, "lead": 0.65, "closing": 0.7, "tail": 0.9}
    assert graded_probabilities(0.9)["tail"] == 1.0 and set(pr) == set(GRADES)
    n = len(draws)
    seen = {"opening": sum(d.startswith("We add 4 numbers.") for d in draws) / n,
            "closing": sum("So the total is 195." in d for d in draws) / n,
            "tail": sum(d.count(", so we have") for d in draws) / (3 * n),
            "lead": sum(d.count("First, ") + d.count("Then ") for d in draws) / (3 * n)}
    for kind, rate in seen.items():  # each kind present at its own probability (4 standard errors)
        assert abs(rate - pr[kind]) < 4 * (pr[kind] * (1 - pr[kind]) / n) ** 0.5 + 1e-9, (kind, rate)
    graded = TaskConfig(style="graded")
    a = make_split(graded, "val", 20)
    assert a == make_split(graded, "val", 20) and [p.prompt for p in a] == [p.prompt for p in make_split(TaskConfig(), "val", 20)]
    assert all(p.solution.endswith(f"#### {p.answer}") for p in a)
    assert sample_solution(graded, ops, random.Random(3)) == graded_solution(ops, random.Random(3), graded.slack)


def test_problem_solution_follows_the_style_and_is_deterministic():
    worked, terse = TaskConfig(), TaskConfig(style="terse")
    a, b = make_split(worked, "val", 20), make_split(terse, "val", 20)
    assert [p.prompt for p in a] == [p.prompt for p in b]  # the style changes the answer, not the problem
    assert all(p.solution == solution_text(p.operands) for p in b)
    assert a == make_split(TaskConfig(), "val", 20)
    assert sum(len(p.solution) for p in a) > 1.8 * sum(len(p.solution) for p in b)
    import random

    rng = random.Random(1)
    assert sample_solution(terse, (3, 4), rng, p_spaced=0.0, p_recap=0.0) == "3+4=7\n#### 7"
    assert TaskConfig.from_dict(worked.to_dict()) == worked
