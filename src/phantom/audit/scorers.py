"""verl 0.9.1's built-in reward scorers, by ``data_source``, and what each means for the phantom.

With no ``reward.custom_reward_function.path``, verl scores each response with
``verl.utils.reward_score.default_compute_score(data_source, ...)``, which dispatches on the
dataset's ``data_source`` column. Not every built-in is binary: ``hiyouga/geometry3k`` returns
``0.9*acc + 0.1*format`` (a well-formatted wrong answer scores 0.1), the code scorers return the
fraction of test cases passed, and verl's reward managers then set ``acc = score`` for a float
result. This table was written from reading the 0.9.1 wheel's ``reward_score/__init__.py`` and the
modules it dispatches to; ``tests/test_audit_scorers.py`` calls the real functions on probe answers
and checks each row. A data source not listed raises ``NotImplementedError`` in verl 0.9.1.

``failure_spread`` is the question the phantom asks: do different *wrong* answers get different
scores? ``acc_binary``: is the ``acc`` verl records (the DAPO filter's ``metric=acc``) the 0/1 outcome?
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Scorer", "BUILTIN", "EXTERNAL", "scorer_for", "sources_from_files"]


@dataclass(frozen=True)
class Scorer:
    sources: tuple[str, ...]  # exact data_source values ("aime*": any value starting with aime)
    module: str  # verl.utils.reward_score.<module>
    returns: str  # "float" or "dict", as default_compute_score returns it
    semantics: str  # binary | format-credit | partial-credit | binary-failures
    failure_spread: bool  # different wrong answers get different scores
    acc_binary: bool  # the `acc` verl records is the 0/1 outcome
    note: str

    def matches(self, source: str) -> bool:
        return any(source == s or (s.endswith("*") and source.startswith(s[:-1])) for s in self.sources)


BUILTIN: tuple[Scorer, ...] = (
    Scorer(("openai/gsm8k",), "gsm8k", "float", "binary", False, True,
           "1.0 for the right `#### n` answer, else 0 (default_compute_score passes no format_score)"),
    Scorer(("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"), "math_reward", "float",
           "binary", False, True, "1.0 when the last \\boxed{} is equivalent to the answer, else 0"),
    Scorer(("math_dapo", "math", "math_dapo_reasoning", "aime*"), "math_dapo", "dict", "binary", False, True,
           "dict: score +1/-1 and a boolean `acc` (DAPO-Math)"),
    Scorer(("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12",
            "numina_olympiads"), "prime_math", "float", "binary", False, True,
           "the correctness flag of prime_math's (correct, format, answer) tuple"),
    Scorer(("codecontests", "apps", "codeforces", "taco"), "prime_code", "float", "partial-credit", True, False,
           "continuous=True: the fraction of (up to 10) test cases passed, so failing programs differ"),
    Scorer(("hiyouga/geometry3k",), "geo3k", "float", "format-credit", True, False,
           "0.9*accuracy + 0.1*format (<think>...</think> then \\boxed{}): a well-formatted wrong answer gets 0.1"),
    Scorer(("searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa", "searchR1_2wikimultihopqa",
            "searchR1_musique", "searchR1_bamboogle"), "search_r1_like_qa_em", "float", "binary-failures", False,
           False, "exact match: wrong answers 0; a right answer with more than 10 answer tags gets 0.25 instead of 1"),
)
#: Scorers of forks and recipes that people run with verl-style scripts but that verl 0.9.1 lacks.
EXTERNAL: tuple[Scorer, ...] = (
    Scorer(("countdown*",), "countdown (TinyZero's fork)", "float", "format-credit", True, False,
           "TinyZero's countdown: 0.1 for a well-formed wrong equation (format_score=0.1), 1 for a right one; "
           "verl 0.9.1 has no countdown scorer and raises NotImplementedError without a custom reward function"),
)

#: data_source of the parquet files verl's examples/data_preprocess scripts write, by folder name
_PATH_SOURCES: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(p, re.I), s) for p, s in (
    (r"(^|[/_\-])gsm8k([/_\-.]|$)", "openai/gsm8k"),
    (r"(^|[/_\-])geo(metry)?3k([/_\-.]|$)", "hiyouga/geometry3k"),
    (r"dapo[-_]?math|math[-_]?dapo", "math_dapo"),
    (r"(^|[/_\-])aime[-_\d]*", "aime"),
    (r"(^|/)math(500|[-_]500)?(/|[-_.]|$)|math[-_]lighteval", "DigitalLearningGmbH/MATH-lighteval"),
    (r"countdown", "countdown"),
    (r"(^|[/_\-])(nq|hotpotqa|triviaqa|popqa|musique|bamboogle|2wiki)[\w\-]*", "searchR1_nq"),
    (r"codecontests", "codecontests"), (r"(^|/)apps(/|$)", "apps"), (r"codeforces", "codeforces"), (r"taco", "taco"),
    (r"numina", "numina_olympiads"),
))


def scorer_for(source: str) -> Scorer | None:
    """The built-in (or known fork) scorer for a data_source; None when neither table knows it."""
    for sc in BUILTIN + EXTERNAL:
        if sc.matches(source):
            return sc
    return None


def sources_from_files(value: Any) -> list[tuple[str, str]]:
    """``(path, data_source)`` for each training file whose folder names a known dataset.

    verl's preprocessing scripts write ``~/data/<dataset>/train.parquet`` with a fixed
    ``data_source`` column; the path is the only trace of it in a launch script. A path that names
    no known dataset is returned with ``""``.
    """
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        s = str(value).strip()
        items = [x.strip().strip("'\"") for x in s.strip("[]").split(",")] if s.startswith("[") else [s]
    out = []
    for item in items:
        if not item:
            continue
        src = next((s for pat, s in _PATH_SOURCES if pat.search(item)), "")
        out.append((item, src))
    return out
