"""A reward function's value set, read from its body (phantom.audit.reward_ast): binary, shaped, or unknown.

Each case is a small reward function written for this test in the styles people write them (verl's
compute_score returning a float or a dict, TRL's list-returning functions, EasyR1's batch of dicts,
classes with __call__); the classification is what the phantom needs: do failures score alike?
"""

from __future__ import annotations

import textwrap

import pytest

from phantom.audit.reward_ast import function_shape

CASES = [
    ("binary constants", "def f(x):\n    if x == 1:\n        return 1.0\n    return 0.0\n", "binary"),
    ("plus/minus one", "def f(x):\n    return 1.0 if x else -1.0\n", "binary"),
    ("a test as float", "def f(a, b):\n    return float(a.strip() == b)\n", "binary"),
    ("a bool", "def f(a, b):\n    return a in b\n", "binary"),
    ("affine of a test", "def f(a):\n    acc = 1.0 if a else -1.0\n    return 0.5 * (acc + 1.0)\n", "binary"),
    ("product of tests", "def f(a, b):\n    return float(a > 0) * float(b > 0)\n", "binary"),
    ("three constants", "def f(x):\n    if x == 2:\n        return 1.0\n    if x == 1:\n        return 0.1\n"
                        "    return 0.0\n", "shaped"),
    ("sum of two tests", "def f(a, b, w=0.1):\n    return (1 - w) * float(a == 1) + w * float(b == 1)\n", "shaped"),
    ("a length term", "def f(text):\n    return 1.0 - len(text) / 4096\n", "shaped"),
    ("a ratio", "def f(passed, total):\n    return passed / total\n", "shaped"),
    ("partial credit by sum", "def f(cases):\n    return sum(c.ok for c in cases) / 10\n", "shaped"),
    ("one increment", "def f(a):\n    s = 0.0\n    if a:\n        s += 1.0\n    return s\n", "binary"),
    ("increments: partial credit", "def f(a, b):\n    s = 0.0\n    if a:\n        s += 0.5\n    if b:\n"
                                   "        s += 0.5\n    return s\n", "shaped"),
    ("accumulated, three steps", "def f(a, b, c):\n    s = 0\n    s += a\n    s += b\n    return s\n", "shaped"),
    ("an argument", "def f(score):\n    return score\n", "unknown"),
    ("a library call", "def f(x):\n    return some_lib.grade_partial(x)\n", "unknown"),
    ("a known verifier", "from math_verify import verify\ndef f(a, b):\n    return float(verify(a, b))\n", "binary"),
    ("follows a helper", "def helper(x):\n    return 0.0 if x is None else 1.0\ndef f(x):\n    return helper(x)\n",
     "binary"),
    ("helper with a length", "def helper(x):\n    return len(x) / 100\ndef f(x):\n    return 1 - helper(x)\n", "shaped"),
    ("module weight", "W = 0.2\ndef f(a, b):\n    return float(a == 1) + W * float(b == 1)\n", "shaped"),
    ("a cast of an argument", "def f(a):\n    return float(a)\n", "unknown"),
    ("trl list comprehension", "def f(completions, **kw):\n    return [1.0 if 'x' in c else 0.0 for c in completions]\n",
     "binary"),
    ("trl list by append", "def f(completions, **kw):\n    out = []\n    for c in completions:\n"
                           "        out.append(min(1.0, len(c) / 100))\n    return out\n", "shaped"),
    ("a class with __call__", "class Acc:\n    def __call__(self, completions, **kw):\n"
                              "        return [float(c == 'a') for c in completions]\n", "binary"),
]


@pytest.mark.parametrize("label, src, verdict", CASES, ids=[c[0] for c in CASES])
def test_scalar_verdicts(label, src, verdict):
    name = "Acc" if "class Acc" in src else "f"
    shape = function_shape(src, name)
    assert shape is not None
    assert shape.verdict == verdict, shape.describe()
    assert shape.describe()  # always says why


def test_dict_keys_are_judged_one_by_one():
    src = textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, lam=0.3):
            ok = solution_str.strip().endswith(ground_truth)
            return {"score": float(ok) - lam * len(solution_str) / 1000, "acc": float(ok), "pred": solution_str[-10:]}
        """)
    shape = function_shape(src, "compute_score")
    assert shape.returns == "dict"
    keys = {k: v.verdict for k, v in shape.keys.items()}
    assert keys == {"score": "shaped", "acc": "binary", "pred": "unknown"}


def test_batch_of_dicts_easyr1_style():
    src = textwrap.dedent("""
        def acc(r, g):
            return 1.0 if r == g else 0.0
        def compute_score(items, format_weight: float = 0.1):
            scores = []
            for it in items:
                a = acc(it["response"], it["ground_truth"])
                fmt = 1.0 if it["response"].startswith("<think>") else 0.0
                scores.append({"overall": (1 - format_weight) * a + format_weight * fmt, "accuracy": a})
            return scores
        """)
    shape = function_shape(src, "compute_score")
    assert shape.returns == "list of dict"
    inner = shape.scalar()
    assert inner.keys["overall"].verdict == "shaped" and inner.keys["accuracy"].verdict == "binary"


def test_missing_function_and_bad_source():
    assert function_shape("def g():\n    return 1\n", "f") is None
    assert function_shape("def f(:\n", "f") is None
    deep = "def f(x):\n    return " + "(" * 200 + "x" + ")" * 200 + "\n"
    shape = function_shape(deep, "f")
    assert shape is None or shape.verdict == "unknown"
