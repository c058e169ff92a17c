"""The audit's table of verl 0.9.1 built-in scorers, checked against the real functions.

For each row of :data:`phantom.audit.scorers.BUILTIN` the test calls verl's own
``default_compute_score`` with the row's data source on the audit's probe answers (right and wrong,
formatted and not, short, long, overlong, empty) and checks what the row claims: the return type,
whether different wrong answers score differently, and whether the ``acc`` verl records is binary.
The code scorers (prime_code / sandbox_fusion) run the candidate programs in subprocesses with
timeouts and are not called here; their row is from reading the source (continuous=True).
"""

from __future__ import annotations

import importlib.util

import pytest

from phantom.audit.probe import GOLD, PROBES
from phantom.audit.scorers import BUILTIN, EXTERNAL, scorer_for, sources_from_files

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")
_GT = {"search_r1_like_qa_em": {"target": [GOLD]}}


@pytest.fixture(scope="module")
def compute():
    from verl.utils.reward_score import default_compute_score

    return default_compute_score


def _acc(result) -> float:
    """What verl's reward manager records as `acc` (a float return: acc = score)."""
    return float(result["acc"]) if isinstance(result, dict) else float(result)


def _score(result) -> float:
    return float(result["score"]) if isinstance(result, dict) else float(result)


@pytest.mark.parametrize("sc", [s for s in BUILTIN if s.module != "prime_code"], ids=lambda s: s.module)
def test_builtin_row_matches_verl(compute, sc):
    source = sc.sources[0].rstrip("*") + ("2024" if sc.sources[0].endswith("*") else "")
    gt = _GT.get(sc.module, GOLD)
    results = [(p, compute(source, p.text, gt)) for p in PROBES]
    assert {("dict" if isinstance(r, dict) else "float") for _, r in results} == {sc.returns}
    wrong = {round(_score(r), 9) for p, r in results if p.wrong}
    assert (len(wrong) > 1) is sc.failure_spread, (sc.module, wrong)
    accs = {_acc(r) for _, r in results}
    assert (accs <= {0.0, 1.0}) is sc.acc_binary or sc.semantics == "binary-failures", (sc.module, accs)
    right = [_score(r) for p, r in results if not p.wrong] + [_score(compute(source, f"<answer>{GOLD}</answer>", gt))]
    assert max(right) > max(wrong), sc.module  # some right answer beats every wrong one


def test_geo3k_format_credit_is_point_one(compute):
    fmt = next(p for p in PROBES if p.label == "wrong, tagged")
    bare = next(p for p in PROBES if p.label == "wrong, bare number")
    assert compute("hiyouga/geometry3k", fmt.text, GOLD) == pytest.approx(0.1)
    assert compute("hiyouga/geometry3k", bare.text, GOLD) == 0.0


def test_unknown_source_raises_in_verl_and_is_unknown_here(compute):
    with pytest.raises(NotImplementedError):
        compute("countdown", "7", GOLD)
    assert scorer_for("countdown").module.startswith("countdown")  # known only as TinyZero's fork
    assert scorer_for("countdown") in EXTERNAL and scorer_for("my_private_set") is None


def test_data_source_from_training_paths():
    files = "['$HOME/data/gsm8k/train.parquet', '$HOME/data/math/train.parquet']"
    assert [s for _, s in sources_from_files(files)] == ["openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval"]
    assert sources_from_files("$HOME/data/geo3k/train.parquet")[0][1] == "hiyouga/geometry3k"
    assert sources_from_files("${HOME}/verl/data/dapo-math-17k.parquet")[0][1] == "math_dapo"
    assert sources_from_files("/data/countdown/train.parquet")[0][1] == "countdown"
    assert sources_from_files("$DATA/train.parquet")[0][1] == ""
