"""The reward playground's Python: what the book's Playground page runs in the reader's browser.

The page (``book/playground.md``) runs this very file in Pyodide, CPython compiled to WebAssembly,
inside a Web Worker; the book's Sphinx extension copies it next to the page at build time. Pyodide's
npm package ships the interpreter and the standard library only (no numpy wheel can be had offline),
so this module uses nothing else, and re-implements :func:`phantom.advantages.group_advantages` in
plain Python. ``tests/test_playground.py`` checks, on random groups, gates, norms and ``eps``, that
the two agree bit for bit, so the page computes what verl's estimator computes.

Two details keep the float64 results identical to numpy's:

* sums run left to right with ``+=`` (numpy's ``np.add.at`` order). ``sum()`` would not do: from
  Python 3.12 (Pyodide 314 ships 3.14) it compensates rounding errors (Neumaier summation);
* the std is the unbiased one, ``eps`` is added outside the square root, and a one-answer group
  has mean 0 and std 1 (verl 0.9.1's ``compute_grpo_outcome_advantage``).

The page's inputs are text fields; :func:`run` takes them as they are (a mapping of field name to
text), checks them, evaluates the reader's ``reward(outcome, length)`` and returns a JSON-ready
dict. The URL fragment holds the same fields, form-urlencoded (``#gate=outcome&lam=0.5``), or a
preset name (``#preset=allfail-outcome``) that the chapters link to; :data:`PRESETS` are stable.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["GATES", "ESTIMATORS", "FIELDS", "DEFAULT_SOURCE", "PRESETS", "DEFAULT_PRESET", "PRESET_TITLES",
           "LIMIT_S", "InputError", "page_config",
           "group_advantages", "compile_reward", "parse_groups", "resolve", "from_fragment", "run"]

GATES: tuple[str, ...] = ("none", "score", "outcome")
#: estimator -> the norm of :func:`phantom.advantages.group_advantages`
ESTIMATORS: dict[str, str] = {"grpo": "std", "drgrpo": "none"}
#: the page's inputs (form field names = URL fragment keys)
FIELDS: tuple[str, ...] = ("o", "len", "code", "lam", "eps", "est", "gate")
#: the paper's length-shaped reward: the shortest failure scores best
DEFAULT_SOURCE = "def reward(outcome, length):\n    return outcome - lam * min(length / 512, 1)\n"
#: at most this many answers in a batch: the page must answer well within its time limit
MAX_ANSWERS = 20_000
MAX_SOURCE = 20_000

_README = {"o": "0 0 0 0 0", "len": "40 120 200 310 480", "code": DEFAULT_SOURCE, "lam": "0.3",
           "eps": "1e-6", "est": "grpo", "gate": "score"}
#: Named inputs the chapters link to (``playground.html#preset=NAME``). Never rename or change one:
#: a chapter's text describes what its link shows. Add a new name instead.
PRESETS: dict[str, dict[str, str]] = {
    # the README's example, what the page opens on: an all-fail group, GRPO, the score gate keeps it
    "allfail-score": dict(_README),
    # chapter 1: a group of mixed outcomes under plain GRPO, the binary reward (lambda = 0)
    "mixed-grpo": {**_README, "o": "1 0 0 1 0 0 1 0", "len": "150 90 300 210 60 420 260 180",
                   "lam": "0", "gate": "none"},
    # chapter 3: the README's group under the outcome gate (every advantage 0)...
    "allfail-outcome": {**_README, "gate": "outcome"},
    # ...and under Dr. GRPO (centred only: the phantom shrinks to the size of lambda, it does not vanish)
    "allfail-drgrpo": {**_README, "est": "drgrpo"},
    # a batch of six groups: all-fail, all-pass and mixed, to read the batch fractions
    "batch": {**_README, "gate": "none",
              "o": "0 0 0 0 0\n1 0 1 0 0\n0 0 0 0 0\n1 1 1 1 1\n0 1 0 0 0\n0 0 0 0 0",
              "len": "40 120 200 310 480\n90 260 140 380 200\n300 300 300 300 300\n120 80 160 100 140\n"
                     "220 150 510 330 60\n600 700 512 900 530"},
}
DEFAULT_PRESET = "allfail-score"
#: what the page's example menu calls each preset
PRESET_TITLES: dict[str, str] = {
    "allfail-score": "README: all-fail group, GRPO, score gate",
    "mixed-grpo": "mixed outcomes, GRPO, binary reward (chapter 1)",
    "allfail-outcome": "all-fail group, outcome gate",
    "allfail-drgrpo": "all-fail group, Dr. GRPO, score gate",
    "batch": "a batch of six groups, no gate",
}
#: seconds a run may take in the page before its worker is terminated (the reader's endless loop)
LIMIT_S = 3


class InputError(ValueError):
    """A bad input, named by its field (``o``, ``len``, ``code``, ...), with the message the page shows."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# --------------------------------------------------------------------------------------------
# the estimator: phantom.advantages.group_advantages in plain Python
# --------------------------------------------------------------------------------------------
def _total(values: Sequence[float]) -> float:
    out = 0.0
    for v in values:  # left to right, no compensation: numpy's order (see the module docstring)
        out += v
    return out


def _div(a: float, b: float) -> float:
    """``a / b`` with IEEE semantics for ``b == 0`` (numpy's nan and inf, where Python raises)."""
    if b:
        return a / b
    return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)


def group_advantages(scores: Sequence[float], outcomes: Sequence[int] | None = None, *, gate: str = "none",
                     norm: str = "std", eps: float = 1e-6) -> tuple[list[float], dict[str, Any]]:
    """One group's advantages and what the gate saw, as :func:`phantom.advantages.group_advantages`.

    Returns ``(advantages, info)``; ``info`` holds the group's ``mean`` and ``std`` (unbiased),
    ``single`` (one answer), ``flat`` (std <= eps, two or more answers), ``all_fail``/``all_pass``
    (``None`` without outcomes), ``phantom`` (all-fail, two or more answers, not flat) and
    ``zeroed`` (the gate set every advantage to 0).
    """
    if gate not in GATES:
        raise ValueError(f"gate={gate!r} is unknown; allowed: {', '.join(GATES)}")
    if norm not in ESTIMATORS.values():
        raise ValueError(f"norm={norm!r} is unknown; allowed: {', '.join(ESTIMATORS.values())}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps={eps!r} is invalid; allowed: a finite eps >= 0")
    if gate == "outcome" and outcomes is None:
        raise ValueError("gate='outcome' needs outcomes (the binary task outcome of each response)")
    s = [float(x) for x in scores]
    n = len(s)
    mean = _total(s) / max(n, 1)
    centred = [x - mean for x in s]
    std = math.sqrt(_total([c * c for c in centred]) / max(n - 1, 1))
    single = n <= 1
    if single:
        centred, std = list(s), 1.0
    adv = [_div(c, std + eps) for c in centred] if norm == "std" else list(centred)
    flat = not single and std <= eps
    all_fail = all_pass = None
    if outcomes is not None:
        if len(outcomes) != n:
            raise ValueError(f"scores has {n} entries but outcomes has {len(outcomes)}")
        passes = sum(1 for o in outcomes if o)
        all_fail, all_pass = passes == 0, passes == n
    if gate == "score":
        zeroed = flat
    elif gate == "outcome":
        zeroed = not single and bool(all_fail or all_pass)
    else:
        zeroed = False
    if zeroed:
        adv = [0.0] * n
    info = {"mean": mean, "std": std, "single": single, "flat": flat, "all_fail": all_fail,
            "all_pass": all_pass, "phantom": bool(all_fail) and not single and not flat, "zeroed": zeroed}
    return adv, info


# --------------------------------------------------------------------------------------------
# the reader's inputs
# --------------------------------------------------------------------------------------------
def _where(exc: BaseException) -> str:
    """`` (line N)`` of the deepest frame in the reader's code, else ''."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<reward>"]
    return f" (line {lines[-1]})" if lines else ""


def compile_reward(source: str, lam: float) -> Callable[[int, float], Any]:
    """The reader's ``reward(outcome, length)``, defined with ``lam`` and ``math`` in its globals.

    A syntax or runtime error becomes an :class:`InputError` of field ``code`` carrying Python's
    own message and line, which the page shows beside the editor.
    """
    if len(source) > MAX_SOURCE:
        raise InputError("code", f"the reward code has {len(source)} characters; allowed: at most {MAX_SOURCE}")
    try:
        code = compile(source, "<reward>", "exec")
    except SyntaxError as exc:
        raise InputError("code", f"SyntaxError: {exc.msg} (line {exc.lineno})") from None
    namespace: dict[str, Any] = {"lam": lam, "math": math, "__name__": "reward_code"}
    try:
        exec(code, namespace)  # noqa: S102 -- the reader's own code, in the reader's own browser
    except Exception as exc:  # noqa: BLE001 -- any error of the reader's code is shown, not raised
        raise InputError("code", f"{type(exc).__name__}: {exc}{_where(exc)}") from None
    fn = namespace.get("reward")
    if not callable(fn):
        raise InputError("code", "the code defines no function reward(outcome, length)")
    return fn


def _score(fn: Callable[[int, float], Any], outcome: int, length: float) -> float:
    call = f"reward({outcome}, {length:g})"
    try:
        value = fn(outcome, length)
    except Exception as exc:  # noqa: BLE001
        raise InputError("code", f"{call} raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: the page must survive them too
        raise InputError("code", f"{call} raised {type(exc).__name__}; a reward must return a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError("code", f"{call} returned {value!r:.60} (a {type(value).__name__}), not a number")
    value = float(value)
    if not math.isfinite(value):
        raise InputError("code", f"{call} returned {value}; a reward must be a finite number")
    return value


def _rows(text: str) -> list[list[str]]:
    return [line.replace(",", " ").split() for line in text.strip().splitlines() if line.strip()]


def parse_groups(outcomes: str, lengths: str) -> tuple[list[list[int]], list[list[float]]]:
    """One group per line: outcomes (0/1) and lengths (characters), separated by spaces or commas."""
    o_rows, l_rows = _rows(outcomes), _rows(lengths)
    if not o_rows:
        raise InputError("o", "no outcomes; allowed: 0 or 1 per answer, one line per group")
    if len(o_rows) != len(l_rows):
        raise InputError("len", f"{len(o_rows)} line(s) of outcomes but {len(l_rows)} of lengths; "
                                "allowed: one line of each per group")
    groups_o: list[list[int]] = []
    groups_l: list[list[float]] = []
    for g, (o_row, l_row) in enumerate(zip(o_rows, l_rows), start=1):
        bad = [t for t in o_row if t not in ("0", "1")]
        if bad:
            raise InputError("o", f"group {g}: outcome {bad[0]!r} is invalid; allowed: 0 or 1")
        if len(o_row) != len(l_row):
            raise InputError("len", f"group {g} has {len(o_row)} outcome(s) but {len(l_row)} length(s)")
        row: list[float] = []
        for t in l_row:
            try:
                v = float(t)
            except ValueError:
                v = math.nan
            if not (math.isfinite(v) and v >= 0):
                raise InputError("len", f"group {g}: length {t!r} is invalid; allowed: a number >= 0")
            row.append(int(v) if v.is_integer() else v)
        groups_o.append([int(t) for t in o_row])
        groups_l.append(row)
    if sum(map(len, groups_o)) > MAX_ANSWERS:
        raise InputError("o", f"{sum(map(len, groups_o))} answers; allowed: at most {MAX_ANSWERS}")
    return groups_o, groups_l


def _number(fields: Mapping[str, str], key: str, label: str, low: float) -> float:
    text = str(fields.get(key, "")).strip()
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= low):
        raise InputError(key, f"{label} = {text!r} is invalid; allowed: a finite number >= {low:g}")
    return v


def from_fragment(fragment: str) -> dict[str, str]:
    """The fields a URL fragment names (form-urlencoded, as the page's share link writes them)."""
    return {k: v for k, v in parse_qsl(fragment.lstrip("#"), keep_blank_values=True)}


def resolve(given: Mapping[str, str]) -> dict[str, str]:
    """Every field: the named ``preset`` (default :data:`DEFAULT_PRESET`), then the fields given."""
    name = given.get("preset") or DEFAULT_PRESET
    if name not in PRESETS:
        raise InputError("preset", f"preset {name!r} is unknown; allowed: {', '.join(PRESETS)}")
    return {**PRESETS[name], **{k: str(v) for k, v in given.items() if k in FIELDS}}


def _check(fields: Mapping[str, str]) -> tuple[str, str, float, float]:
    est, gate = str(fields.get("est", "")), str(fields.get("gate", ""))
    if est not in ESTIMATORS:
        raise InputError("est", f"estimator {est!r} is unknown; allowed: {', '.join(ESTIMATORS)}")
    if gate not in GATES:
        raise InputError("gate", f"gate {gate!r} is unknown; allowed: {', '.join(GATES)}")
    return est, gate, _number(fields, "lam", "λ", 0.0), _number(fields, "eps", "ε", 0.0)


def _verdict(info: Mapping[str, Any], gate: str, eps: float) -> str:
    if info["single"]:
        return "one answer: never gated (verl's DAPO filter keeps single-answer groups)"
    if gate == "none":
        return "no gate: kept"
    if gate == "score":
        why = f"reward std {info['std']:.4g} {'<=' if info['flat'] else '>'} ε = {eps:g}"
        return f"score gate: {'zeroed' if info['zeroed'] else 'kept'} ({why})"
    kind = "all fail" if info["all_fail"] else "all pass" if info["all_pass"] else "outcomes differ"
    return f"outcome gate: {'zeroed' if info['zeroed'] else 'kept'} ({kind})"


def page_config() -> dict[str, Any]:
    """What the page's script needs before Python has loaded: presets, field names, the time limit."""
    return {"presets": {name: {"title": PRESET_TITLES[name], "fields": fields} for name, fields in PRESETS.items()},
            "default": DEFAULT_PRESET, "fields": list(FIELDS), "limit_s": LIMIT_S}


def run(given: Mapping[str, str]) -> dict[str, Any]:
    """Everything the page shows for its inputs; ``{"ok": False, "field", "error"}`` for a bad one."""
    try:
        fields = resolve(given)
        est, gate, lam, eps = _check(fields)
        groups_o, groups_l = parse_groups(fields["o"], fields["len"])
        fn = compile_reward(fields["code"], lam)
        groups = []
        for outs, lens in zip(groups_o, groups_l):
            rewards = [_score(fn, o, n) for o, n in zip(outs, lens)]
            adv, info = group_advantages(rewards, outs, gate=gate, norm=ESTIMATORS[est], eps=eps)
            if not all(map(math.isfinite, [*adv, info["std"]])):
                g = len(groups) + 1
                if info["std"] == 0:
                    raise InputError("eps", f"group {g}: its rewards are all equal and ε = 0, so GRPO divides "
                                            "0 by 0; allowed: ε > 0 (verl uses 1e-6)")
                raise InputError("code", f"group {g}: its rewards are too large to square in float64 "
                                         f"(largest {max(map(abs, rewards)):.3g}); allowed: |reward| < 1e150")
            groups.append({"outcomes": outs, "lengths": lens, "rewards": rewards, "advantages": adv,
                           **info, "verdict": _verdict(info, gate, eps)})
    except InputError as exc:
        return {"ok": False, "field": exc.field, "error": exc.message}
    n = len(groups)
    count = {k: sum(1 for g in groups if g[k]) for k in ("all_fail", "all_pass", "phantom", "zeroed", "single")}
    phantom_live = sum(1 for g in groups if g["phantom"] and not g["zeroed"])
    return {"ok": True, "fields": fields, "groups": groups,
            "batch": {"groups": n, "answers": sum(len(g["outcomes"]) for g in groups), **count,
                      "mixed": n - count["all_fail"] - count["all_pass"], "phantom_live": phantom_live,
                      **{f"{k}_frac": count[k] / n for k in ("all_fail", "phantom", "zeroed")},
                      "phantom_live_frac": phantom_live / n}}
