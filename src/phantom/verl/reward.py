"""The shaped reward as verl sees it: ``reward.custom_reward_function.path=pkg://phantom.verl.reward``.

verl calls :func:`compute_score` once per response inside its ``RewardLoopWorker`` actors. The dict
it returns is the whole contract with the trainer:

* ``score`` (mandatory for a dict result) is the shaped scalar the advantage estimator sees;
* ``acc`` is the *binary* outcome, so ``algorithm.filter_groups.metric=acc`` and the validation
  headline ``val-core/<ds>/acc/mean@N`` are the outcome, never the shaped score (verl falls back to
  ``acc = score`` when a reward returns a float, which is exactly the trap this project is about);
* ``outcome`` (same value as ``acc``, named for readers) and ``len_chars`` go to ``val-aux``;
* with verifier noise, ``true_acc`` holds the outcome before the flip.

Settings come from ``+reward.custom_reward_function.reward_kwargs.<key>=<value>`` (see
:data:`DEFAULTS`). They are checked once per process; a bad value raises ``ValueError`` on the first
call, which fails the run. The launcher calls :func:`check_reward_kwargs` before Ray starts, so a bad
value normally never gets that far.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from phantom import rewards

__all__ = ["DEFAULTS", "CHECKERS", "MATH_SOURCES", "check_reward_kwargs", "compute_score", "outcome_of"]

#: Every reward kwarg and its default. ``lam`` is the paper's phantom strength; ``cap`` the length
#: (characters) where the length term saturates; ``noise_p`` flips the verifier on training rows.
DEFAULTS: dict[str, Any] = {
    "lam": 0.3,
    "kind": "length_short",
    "cap": rewards.DEFAULT_CAP,
    "noise_p": 0.0,
    "noise_seed": 0,
    "checker": "auto",
    "l_max": None,    # kind="overlong": characters (the reward sees text, not tokens)
    "l_cache": None,
}
#: How a response is checked: ``numeric`` (GSM8K-style, ``phantom.rewards.is_correct``), ``strict``
#: (only a ``#### n`` marker counts: the lab task), ``math`` (verl's own boxed-answer equivalence for
#: MATH), ``auto`` (``math`` for MATH data sources, ``strict`` for the lab, else ``numeric``).
CHECKERS: tuple[str, ...] = ("auto", "numeric", "strict", "math")
MATH_SOURCES: frozenset[str] = frozenset(
    {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"}
)
LAB_SOURCE = "phantom_lab"


def check_reward_kwargs(kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate reward kwargs and fill in defaults; raise ``ValueError`` naming the bad key or value."""
    given = dict(kwargs or {})
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown reward kwarg(s) {unknown}; allowed: {', '.join(DEFAULTS)}")
    cfg = {**DEFAULTS, **given}
    if cfg["kind"] not in rewards.KINDS:
        raise ValueError(f"kind={cfg['kind']!r} is unknown; allowed: {', '.join(rewards.KINDS)}")
    if cfg["checker"] not in CHECKERS:
        raise ValueError(f"checker={cfg['checker']!r} is unknown; allowed: {', '.join(CHECKERS)}")
    # lam < 1 keeps outcome == (score > 0) exactly, which the gated estimators rely on.
    cfg["lam"] = rewards.check_lam(cfg["lam"], upper=1.0)
    cfg["noise_p"] = rewards.check_noise_p(cfg["noise_p"])
    cap = float(cfg["cap"])
    if not cap > 0:
        raise ValueError(f"cap={cfg['cap']!r} is invalid; allowed: a length > 0 (characters)")
    cfg["cap"] = cap
    try:
        cfg["noise_seed"] = int(cfg["noise_seed"])
    except (TypeError, ValueError):
        raise ValueError(f"noise_seed={cfg['noise_seed']!r} is invalid; allowed: an integer") from None
    if cfg["kind"] == "overlong":
        try:
            l_max, l_cache = int(cfg["l_max"]), int(cfg["l_cache"])
        except (TypeError, ValueError):
            raise ValueError("kind='overlong' needs integer l_max and l_cache (characters)") from None
        if not 0 < l_cache <= l_max:
            raise ValueError(f"l_cache={l_cache}, l_max={l_max} are invalid; allowed: 0 < l_cache <= l_max")
        cfg["l_max"], cfg["l_cache"] = l_max, l_cache
    return cfg


@functools.lru_cache(maxsize=64)
def _checked(frozen: str) -> dict[str, Any]:
    return check_reward_kwargs(json.loads(frozen))


def _math_equal(text: str, gold: Any) -> bool:
    """verl's MATH checker: the last ``\\boxed{}`` answer, string-normalized (``math_reward.is_equiv``)."""
    from verl.utils.reward_score import math_reward

    boxed = math_reward.last_boxed_only_string(text)
    if boxed is None:
        return False
    try:
        answer = math_reward.remove_boxed(boxed)
    except (AssertionError, IndexError):
        return False
    if math_reward.is_equiv(answer, str(gold)):
        return True
    # "1,000" vs "1000", "3.0" vs "3": compare numerically, but only when both are plain numbers.
    plain = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
    return bool(plain.fullmatch(answer.strip()) and plain.fullmatch(str(gold).strip())
                and rewards.is_correct(f"#### {answer.strip()}", str(gold).strip(), strict=True))


def outcome_of(text: str, gold: Any, data_source: str = "", checker: str = "auto") -> float:
    """The binary outcome (1.0 / 0.0) of one response under the chosen checker."""
    if checker == "auto":
        checker = "math" if data_source in MATH_SOURCES else "strict" if data_source == LAB_SOURCE else "numeric"
    if checker == "math":
        return float(_math_equal(text, gold))
    return float(rewards.is_correct(text, gold, strict=checker == "strict"))


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None,
                  **kwargs: Any) -> dict[str, float]:
    """Score one response (verl's custom reward signature); see the module docstring for the keys."""
    kwargs.pop("reward_router_address", None)  # verl adds these only for model-based rewards
    kwargs.pop("reward_model_tokenizer", None)
    cfg = _checked(json.dumps(kwargs, sort_keys=True, default=str))
    text = solution_str if isinstance(solution_str, str) else ""
    info = dict(extra_info or {})
    true_outcome = outcome_of(text, ground_truth, data_source, cfg["checker"])
    outcome = true_outcome
    if cfg["noise_p"] > 0 and info.get("split") == "train":
        # A noisy verifier on training rows only: held-out accuracy stays the true outcome.
        sample_id = f"{info.get('index')}\x1f{text}"
        outcome = float(rewards.noisy_outcome(true_outcome, sample_id, cfg["noise_p"], cfg["noise_seed"]))
    n = len(text)
    score = rewards.shaped_reward(
        cfg["kind"], outcome, n, lam=cfg["lam"], cap=cfg["cap"], has_marker=rewards.has_answer_marker(text),
        l_max=cfg["l_max"], l_cache=cfg["l_cache"],
    )
    out = {"score": float(score), "acc": outcome, "outcome": outcome, "len_chars": float(n)}
    if cfg["noise_p"] > 0:
        out["true_acc"] = true_outcome  # same key set on every row, as verl requires
    return out
