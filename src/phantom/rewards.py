"""Answer checking, shaped rewards and verifier noise.

Everything that turns a model's text into a number lives here, so the book, the CPU lab and the
verl reward function score a response identically. Shaped rewards keep the binary outcome
recoverable: for every family and any ``0 <= lam < 1`` a failure scores in ``[-lam, 0]`` and a
pass in ``[1 - lam, 1]``, hence ``outcome == (reward > 0)`` exactly. The verl estimators rely on it.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

__all__ = [
    "KINDS",
    "DEFAULT_CAP",
    "extract_answer",
    "has_answer_marker",
    "is_correct",
    "length_short",
    "length_long",
    "format_reward",
    "overlong_penalty",
    "dapo_overlong",
    "shaped_reward",
    "flip_mask",
    "noisy_outcome",
    "denoise",
    "check_lam",
    "check_noise_p",
]

#: Shaped-reward families understood by :func:`shaped_reward`.
KINDS: tuple[str, ...] = ("length_short", "length_long", "format", "overlong")
#: Length (characters) at which the paper's length term saturates.
DEFAULT_CAP = 512

# --------------------------------------------------------------------------------------------
# Answer extraction
# --------------------------------------------------------------------------------------------
# One number: optional sign (ASCII or unicode minus), optional currency sign, an integer part
# with or without thousands separators, an optional decimal part. Every piece is bounded or
# possessive-free and linear, so 10,000-character inputs cannot backtrack catastrophically.
_NUM = r"[-+\u2212]?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUM_RE = re.compile(_NUM)
_MARKER_RE = re.compile(r"####\s*(" + _NUM + r")")
_BOXED_RE = re.compile(r"\\boxed\s*\{([^{}]{0,200})\}")
_ANSWER_IS_RE = re.compile(r"answer\s+is\s*:?\s*(" + _NUM + r")", re.IGNORECASE)


def _canonical(token: str) -> str | None:
    """Canonical decimal string of one matched number ("−1,234.50" -> "-1234.50")."""
    t = token.replace(",", "").replace("$", "").replace(" ", "").replace("\u2212", "-")
    # Unicode decimal digits (e.g. Arabic-Indic) become ASCII so Decimal sees one alphabet.
    t = "".join(str(unicodedata.decimal(c, c)) if not c.isascii() else c for c in t)
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    return t.lstrip("+")


def _last(pattern: re.Pattern[str], text: str, group: int = 0) -> str | None:
    last = None
    for m in pattern.finditer(text):
        last = m.group(group)
    return last


def extract_answer(text: Any, *, strict: bool = False) -> str | None:
    """The final numeric answer in a GSM8K-style response, as a canonical decimal string.

    Precedence (first rule that matches wins, the last occurrence within a rule):
    ``#### n``, then ``\\boxed{n}``, then "the answer is n", then the last number in the text.
    ``strict=True`` accepts only the ``#### n`` marker (the lab's task, and verl's strict GSM8K).
    Returns ``None`` when there is no number. Never evaluates the text.
    """
    if not isinstance(text, str):
        return None
    found = _last(_MARKER_RE, text, 1)
    if found is None and not strict:
        for boxed in reversed(_BOXED_RE.findall(text)):
            found = _last(_NUM_RE, boxed)
            if found is not None:
                break
        if found is None:
            found = _last(_ANSWER_IS_RE, text, 1)
        if found is None:
            found = _last(_NUM_RE, text)
    return None if found is None else _canonical(found)


def has_answer_marker(text: Any) -> bool:
    """Whether the response carries a well-formed ``#### <number>`` marker (the format family)."""
    return isinstance(text, str) and _MARKER_RE.search(text) is not None


def _gold_decimal(gold: Any) -> Decimal | None:
    if isinstance(gold, bool) or gold is None:
        return None
    if isinstance(gold, (int, np.integer)):
        return Decimal(int(gold))
    if isinstance(gold, (float, np.floating)):
        return Decimal(repr(float(gold))) if math.isfinite(gold) else None
    s = str(gold)
    canon = _canonical(s.strip()) if _NUM_RE.fullmatch(s.strip()) else extract_answer(s)
    return None if canon is None else Decimal(canon)


def is_correct(text: Any, gold: Any, *, strict: bool = False) -> bool:
    """Numeric comparison of the extracted answer with the gold answer (``42 == 42.0``).

    ``gold`` may be an int, a float, or a string such as ``"1,234"`` or ``"... #### 1234"``.
    Comparison is exact in decimal arithmetic, so huge integers compare correctly.
    """
    answer = extract_answer(text, strict=strict)
    target = _gold_decimal(gold)
    if answer is None or target is None:
        return False
    return Decimal(answer) == target


# --------------------------------------------------------------------------------------------
# Validation helpers (shared with the lab, the verl reward and the launcher)
# --------------------------------------------------------------------------------------------
def check_lam(lam: float, *, name: str = "lam", upper: float | None = None) -> float:
    """Validate a shaping coefficient: finite and >= 0 (and < ``upper`` when given)."""
    try:
        value = float(lam)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={lam!r} is not a number; allowed: a finite value >= 0") from None
    if not math.isfinite(value) or value < 0 or (upper is not None and value >= upper):
        allowed = f"0 <= {name} < {upper}" if upper is not None else f"a finite {name} >= 0"
        raise ValueError(f"{name}={lam!r} is out of range; allowed: {allowed}")
    return value


def check_noise_p(p: float) -> float:
    """Validate a verifier flip probability: ``0 <= p < 0.5`` (0.5 makes the verifier pure noise)."""
    try:
        value = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"p={p!r} is not a number; allowed: 0 <= p < 0.5") from None
    if not (0.0 <= value < 0.5):
        raise ValueError(f"p={p!r} is out of range; allowed: 0 <= p < 0.5")
    return value


def _as_outcome(outcome: Any) -> np.ndarray:
    o = np.asarray(outcome, dtype=np.float64)
    bad = ~((o == 0.0) | (o == 1.0))
    if np.any(bad):
        raise ValueError(f"outcome={np.asarray(outcome)[bad].ravel()[0].item()!r} is not binary; allowed: 0 or 1")
    return o


def _as_length(length: Any, name: str = "length") -> np.ndarray:
    n = np.asarray(length, dtype=np.float64)
    bad = ~np.isfinite(n) | (n < 0)
    if np.any(bad):
        raise ValueError(f"{name}={n[bad].ravel()[0].item()!r} is invalid; allowed: a finite length >= 0")
    return n


def _check_cap(cap: float) -> float:
    value = float(cap)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"cap={cap!r} is invalid; allowed: a finite cap > 0")
    return value


def _out(x: np.ndarray, *inputs: Any) -> Any:
    """Scalars in, float out; arrays in, array out."""
    return float(x) if all(np.ndim(i) == 0 for i in inputs) else x


# --------------------------------------------------------------------------------------------
# Shaped-reward families. outcome in {0, 1}; length in characters (or tokens for DAPO's term).
# --------------------------------------------------------------------------------------------
def length_short(outcome: Any, length: Any, lam: float = 0.3, cap: float = DEFAULT_CAP) -> Any:
    """The paper's phantom: ``outcome - lam * min(len/cap, 1)``; the shortest failure scores best."""
    lam = check_lam(lam)
    o, n, c = _as_outcome(outcome), _as_length(length), _check_cap(cap)
    return _out(o - lam * np.minimum(n / c, 1.0), outcome, length)


def length_long(outcome: Any, length: Any, lam: float = 0.3, cap: float = DEFAULT_CAP) -> Any:
    """Reversed phantom: ``outcome - lam * (1 - min(len/cap, 1))``; the longest failure scores best.

    Written as a penalty on shortness (rather than a bonus on length) so failures stay in
    ``[-lam, 0]``; within a group it differs from ``outcome + lam*len/cap`` only by a constant.
    """
    lam = check_lam(lam)
    o, n, c = _as_outcome(outcome), _as_length(length), _check_cap(cap)
    return _out(o - lam * (1.0 - np.minimum(n / c, 1.0)), outcome, length)


def format_reward(outcome: Any, has_marker: Any, lam: float = 0.3) -> Any:
    """Format phantom: a failure without a ``#### n`` marker costs ``lam``; passes score 1."""
    lam = check_lam(lam)
    o = _as_outcome(outcome)
    m = np.asarray(has_marker, dtype=bool)
    return _out(o - lam * (1.0 - o) * (~m), outcome, has_marker)


def overlong_penalty(length: Any, l_max: int, l_cache: int) -> Any:
    """DAPO's soft overlong punishment (DAPO seed, Overlong Reward Shaping), in ``[-1, 0]``.

    0 up to ``l_max - l_cache`` tokens, then a linear ramp to -1 at ``l_max``, -1 beyond.
    """
    if not (0 < int(l_cache) <= int(l_max)):
        raise ValueError(f"l_cache={l_cache!r}, l_max={l_max!r} are invalid; allowed: 0 < l_cache <= l_max")
    n = _as_length(length)
    start = l_max - l_cache
    pen = np.where(n <= start, 0.0, np.where(n <= l_max, (start - n) / l_cache, -1.0))
    return _out(pen, length)


def dapo_overlong(outcome: Any, length: Any, l_max: int, l_cache: int, lam: float = 1.0) -> Any:
    """Outcome plus ``lam`` times DAPO's soft overlong punishment."""
    lam = check_lam(lam)
    o = _as_outcome(outcome)
    return _out(o + lam * np.asarray(overlong_penalty(length, l_max, l_cache)), outcome, length)


def shaped_reward(
    kind: str,
    outcome: Any,
    length: Any = 0,
    *,
    lam: float = 0.3,
    cap: float = DEFAULT_CAP,
    has_marker: Any = None,
    l_max: int | None = None,
    l_cache: int | None = None,
) -> Any:
    """Dispatch to one shaped-reward family by name (see :data:`KINDS`)."""
    if kind == "length_short":
        return length_short(outcome, length, lam, cap)
    if kind == "length_long":
        return length_long(outcome, length, lam, cap)
    if kind == "format":
        if has_marker is None:
            raise ValueError("kind='format' needs has_marker (whether each response has '#### n')")
        return format_reward(outcome, has_marker, lam)
    if kind == "overlong":
        if l_max is None or l_cache is None:
            raise ValueError("kind='overlong' needs l_max and l_cache (tokens)")
        return dapo_overlong(outcome, length, l_max, l_cache, lam)
    raise ValueError(f"kind={kind!r} is unknown; allowed: {', '.join(KINDS)}")


# --------------------------------------------------------------------------------------------
# Verifier noise
# --------------------------------------------------------------------------------------------
def _unit_hash(sample_id: Any, seed: int) -> float:
    digest = hashlib.blake2b(f"{seed}\x1f{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def flip_mask(sample_ids: Iterable[Any] | Any, p: float, seed: int = 0) -> Any:
    """Which samples a verifier with flip probability ``p`` gets wrong.

    Deterministic per (sample id, seed) through a stable hash (not Python's salted ``hash``), so
    a sample flips identically in every process, run and re-run.
    """
    p = check_noise_p(p)
    if np.ndim(sample_ids) == 0 and not isinstance(sample_ids, (list, tuple)):
        return _unit_hash(sample_ids, seed) < p
    return np.fromiter((_unit_hash(s, seed) < p for s in sample_ids), dtype=bool)


def noisy_outcome(outcome: Any, sample_ids: Any, p: float, seed: int = 0) -> Any:
    """The outcome a noisy verifier reports: the true outcome XOR a deterministic flip."""
    o = _as_outcome(outcome)
    flips = np.asarray(flip_mask(sample_ids, p, seed), dtype=bool)
    if flips.shape != o.shape:
        raise ValueError(f"outcome has shape {o.shape} but sample_ids gives {flips.shape}")
    return _out(np.where(flips, 1.0 - o, o), outcome)


def denoise(observed: Any, p: float) -> Any:
    """Unbiased true accuracy from an accuracy measured through the noisy verifier.

    ``E[obs] = true*(1-p) + (1-true)*p``, so ``true = (obs - p) / (1 - 2p)``. Not clipped: a
    finite sample can land slightly outside [0, 1].
    """
    p = check_noise_p(p)
    obs = np.asarray(observed, dtype=np.float64)
    return _out((obs - p) / (1.0 - 2.0 * p), observed)
