"""phantom.playground, the Python the book's Playground page runs in Pyodide.

The property-based test is the contract: on random groups, gates, norms and eps the page's plain-Python
estimator gives exactly (bit for bit) what phantom.advantages.group_advantages gives, and that one is
tested equal to verl 0.9.1's estimators in tests/test_advantages.py.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phantom import playground as pg
from phantom.advantages import group_advantages
from phantom.rewards import length_short

SOURCE = Path(pg.__file__)

# scores: a few repeated values (flat groups, exact ties) and arbitrary finite floats
score = st.one_of(st.sampled_from([0.0, 1.0, -0.3, 0.7, 1e-7]),
                  st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False))
group = st.lists(st.tuples(score, st.integers(0, 1)), min_size=1, max_size=9)


@settings(max_examples=400, deadline=None)
@given(groups=st.lists(group, min_size=1, max_size=6), gate=st.sampled_from(pg.GATES),
       norm=st.sampled_from(sorted(pg.ESTIMATORS.values())),
       eps=st.sampled_from([0.0, 1e-6, 1e-4, 0.05, 0.5]))
def test_equals_group_advantages_bit_for_bit(groups, gate, norm, eps):
    scores = np.array([s for g in groups for s, _ in g], dtype=np.float64)
    outcomes = np.array([o for g in groups for _, o in g], dtype=np.float64)
    index = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    want, stats = group_advantages(scores, index, outcomes=outcomes, gate=gate, norm=norm, eps=eps)
    got, infos = [], []
    for g in groups:
        adv, info = pg.group_advantages([s for s, _ in g], [o for _, o in g], gate=gate, norm=norm, eps=eps)
        got += adv
        infos.append(info)
    assert np.array_equal(np.array(got, dtype=np.float64), want, equal_nan=True), (got, want.tolist())
    # the page's group verdicts count what GateStats counts
    assert sum(i["zeroed"] for i in infos) == stats.zeroed
    assert sum(i["all_fail"] for i in infos) == stats.all_fail
    assert sum(i["all_pass"] for i in infos) == stats.all_pass
    assert sum(i["phantom"] for i in infos) == stats.phantom
    assert sum(i["single"] for i in infos) == stats.singletons


def test_left_to_right_sums_not_pythons_compensated_sum():
    """Python >= 3.12's sum() compensates rounding; numpy does not. The estimator must add like numpy."""
    values = [1e16, 1.0, -1e16, 1.0, 3.0]
    out = np.zeros(1)
    np.add.at(out, np.zeros(len(values), dtype=np.int64), np.array(values))
    assert pg._total(values) == out[0] == 4.0  # a compensated sum gives 5.0


def test_the_opening_example_is_the_readmes():
    res = pg.run({})
    assert res["ok"], res
    (g,) = res["groups"]
    assert [round(a, 2) for a in g["advantages"]] == [1.11, 0.64, 0.17, -0.47, -1.46]
    lengths = [40, 120, 200, 310, 480]
    assert g["rewards"] == length_short(np.zeros(5), lengths, lam=0.3).tolist()
    assert g["phantom"] and g["all_fail"] and not g["zeroed"]
    assert g["verdict"].startswith("score gate: kept")
    assert res["batch"]["phantom_frac"] == 1.0 and res["batch"]["phantom_live"] == 1


@pytest.mark.parametrize(("preset", "check"), [
    ("allfail-outcome", lambda g: g["zeroed"] and g["advantages"] == [0.0] * 5),
    ("allfail-drgrpo", lambda g: not g["zeroed"] and 0 < max(map(abs, g["advantages"])) < 0.3),
    ("mixed-grpo", lambda g: not g["phantom"] and {round(a, 3) for a in g["advantages"]} == {1.208, -0.725}),
])
def test_the_presets_the_chapters_link_to(preset, check):
    res = pg.run({"preset": preset})
    assert res["ok"], res
    assert check(res["groups"][0]), res["groups"][0]


def test_the_preset_names_chapters_link_to_stay():
    """Chapters link to playground.html#preset=NAME; renaming one would break a published link."""
    assert {"allfail-score", "mixed-grpo", "allfail-outcome", "allfail-drgrpo", "batch"} <= set(pg.PRESETS)
    assert pg.DEFAULT_PRESET == "allfail-score" and set(pg.PRESET_TITLES) == set(pg.PRESETS)
    for fields in pg.PRESETS.values():
        assert set(fields) == set(pg.FIELDS)


def test_every_link_into_the_playground_resolves():
    """Links in the book's pages (`<a href="../playground.html#preset=NAME&lam=0.1">`, raw HTML, which
    Sphinx does not check) name presets and fields the page knows, and the page computes them."""
    root = SOURCE.parents[2]
    link = re.compile(r"""href=["'](?:[./]*playground\.html)?#([^"']*preset=[^"']*)["']""")
    found = {}
    for page in sorted((root / "book").rglob("*.md")):
        for fragment in link.findall(page.read_text()):
            found[fragment] = page.relative_to(root)
            given = pg.from_fragment(fragment)
            assert set(given) <= {"preset", *pg.FIELDS}, (page, fragment)
            res = pg.run(given)
            assert res["ok"], (page, fragment, res)
    assert {f"preset={name}" for name in pg.PRESETS} <= set(found), found  # the page links every preset


def test_batch_fractions():
    res = pg.run({"preset": "batch"})
    b = res["batch"]
    assert (b["groups"], b["all_fail"], b["all_pass"], b["mixed"]) == (6, 3, 1, 2)
    # of the three all-fail groups only the first spreads: the third has equal lengths, the sixth's
    # lengths are all past the 512-character cap, so both are flat and no phantom
    assert b["phantom"] == 1 and b["phantom_frac"] == pytest.approx(1 / 6)
    res = pg.run({"preset": "batch", "gate": "outcome"})
    assert res["batch"]["zeroed"] == 4 and res["batch"]["phantom_live"] == 0


def test_dropping_the_length_term_zeroes_the_all_fail_group():
    res = pg.run({"code": "def reward(outcome, length):\n    return outcome\n"})
    assert res["ok"] and res["groups"][0]["advantages"] == [0.0] * 5


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"code": "def reward(outcome, length)\n    return 1\n"}, "code", "SyntaxError: expected ':' (line 1)"),
    ({"code": "def reward(outcome, length):\n    return 1 / 0\n"}, "code",
     "reward(0, 40) raised ZeroDivisionError: division by zero (line 2)"),
    ({"code": "x = 1\n"}, "code", "defines no function reward(outcome, length)"),
    ({"code": "def reward(outcome, length):\n    return 'a'\n"}, "code", "returned 'a' (a str), not a number"),
    ({"code": "def reward(outcome, length):\n    return None\n"}, "code", "returned None (a NoneType)"),
    ({"code": "def reward(outcome, length):\n    return float('nan')\n"}, "code", "returned nan; a reward must be"),
    ({"code": "def reward(outcome, length):\n    return length > 100\n"}, "code", "(a bool), not a number"),
    ({"code": "import sys\ndef reward(outcome, length):\n    sys.exit(3)\n"}, "code", "raised SystemExit"),
    ({"code": "raise KeyError('k')\n"}, "code", "KeyError: 'k' (line 1)"),
    ({"eps": "0", "len": "5 5 5 5 5", "gate": "none"}, "eps", "group 1: its rewards are all equal and ε = 0"),
    ({"code": "def reward(outcome, length):\n    return 1e200 * length\n"}, "code", "too large to square"),
    ({"o": "0 0 2"}, "o", "outcome '2' is invalid; allowed: 0 or 1"),
    ({"o": "0 0", "len": "1 2 3"}, "len", "group 1 has 2 outcome(s) but 3 length(s)"),
    ({"o": "0 0\n1 1", "len": "1 2"}, "len", "2 line(s) of outcomes but 1 of lengths"),
    ({"len": "40 120 x 310 480"}, "len", "length 'x' is invalid; allowed: a number >= 0"),
    ({"len": "40 120 -1 310 480"}, "len", "length '-1' is invalid"),
    ({"o": " "}, "o", "no outcomes"),
    ({"lam": "nan"}, "lam", "λ = 'nan' is invalid; allowed: a finite number >= 0"),
    ({"eps": "-1"}, "eps", "ε = '-1' is invalid"),
    ({"gate": "acc"}, "gate", "gate 'acc' is unknown; allowed: none, score, outcome"),
    ({"est": "ppo"}, "est", "estimator 'ppo' is unknown; allowed: grpo, drgrpo"),
    ({"preset": "ch9"}, "preset", "preset 'ch9' is unknown; allowed: allfail-score"),
])
def test_bad_inputs_are_named(fields, field, message):
    res = pg.run(fields)
    assert not res["ok"] and res["field"] == field
    assert message in res["error"], res["error"]


def test_fragment_round_trip_as_the_share_link_writes_it():
    fields = {**pg.PRESETS["batch"], "code": "def reward(outcome, length):\n    return outcome - lam * (length > 100) # ü&=#"}
    # the page writes its share link with URLSearchParams, which is application/x-www-form-urlencoded
    assert pg.from_fragment("#" + urlencode(fields)) == fields
    assert pg.resolve(pg.from_fragment("#preset=allfail-outcome&lam=0.5")) == {
        **pg.PRESETS["allfail-outcome"], "lam": "0.5"}


def test_results_are_json_for_the_page():
    res = pg.run({"preset": "batch"})
    assert json.loads(json.dumps(res, allow_nan=False)) == res


def test_lengths_past_the_cap_and_fractional_lengths():
    res = pg.run({"o": "0 0 0", "len": "512 1000 2.5"})
    r = res["groups"][0]["rewards"]
    assert r[0] == r[1] == -0.3 and math.isclose(r[2], -0.3 * 2.5 / 512)
    assert res["groups"][0]["lengths"] == [512, 1000, 2.5]


def test_the_module_imports_the_standard_library_only():
    """Pyodide's npm package has the standard library only; nothing else may be imported."""
    tree = ast.parse(SOURCE.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert names - {"__future__"} <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)
