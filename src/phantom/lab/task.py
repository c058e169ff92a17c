"""The lab's task: running sums with worked steps, ending in ``#### <int>``.

A problem adds 2..N two-digit numbers. A solution writes one partial sum per step and then the
GSM8K-style answer line. Three answer styles:

* ``style="worked"`` (the default): GSM8K-like worked solutions. The partial sums (``38+7=45``) and
  the ``#### 136`` line carry correctness; around them sits removable prose - a sentence restating
  the question, a lead-in and a running-total remark per step, a closing sentence - each present
  with probability ``slack`` and worded in one of several variants of different lengths::

      prompt    "Q: 38+7+91\\n"
      solution  "We need the sum of 38, 7 and 91.\\nFirst, 38+7=45, so we have 45.\\nThen 45+91=136
                 \\nSo the total is 136.\\n#### 136"

  ``slack`` is the knob for how much removable text a solution carries (0: none, 1: every piece).
  GSM8K answers carry much such text (~266 tokens, paper §8), so shortening can remove prose before
  it removes reasoning; varied wording lets the trimming be gradual.
* ``style="graded"``: the worked style's prose with one wording per piece, each kind kept with its own
  probability (``slack`` for the opening, a little more for lead-ins and the closing, most for the
  running-total tails), so greedy trimming removes the kinds one at a time, the tails last.
* ``style="terse"``: the partial sums and the answer line only (spacing and an optional
  ``Total:`` recap are the only removable parts): ``"38+7=45\\n45+91=136\\n#### 136"``.

A tiny model cannot add five numbers in one shot, so the worked steps carry the answer: a response
that drops them (the phantom's "give up fast" shortcut) loses correctness. The number of terms is
the difficulty knob; it sets how often a whole rollout group fails (the paper's exposure, §7).
``wording="words"`` renders the same prompt as a GSM8K-like sentence.

Public API (used by the lab and by the verl data builder):

* ``TaskConfig(terms=(2, 5), max_operand=99, wording="symbolic", style="worked", slack=0.6)``;
  ``wording`` is ``"symbolic"``, ``"words"`` or ``"mixed"`` (each problem picks one from its own seed);
  ``style`` is ``"worked"``, ``"graded"`` or ``"terse"``; ``slack`` in ``[0, 1]`` (not read by terse).
* ``problem(cfg, split, index) -> Problem``: problem number ``index`` of a split, a pure function
  of its arguments (no global RNG state).
* ``make_split(cfg, split, n, start=0) -> list[Problem]``: problems ``start..start+n-1``.
* ``Problem``: ``prompt``, ``solution`` (one reference solution in the config's style, drawn from the
  problem's own seed), ``answer`` (int), ``operands``, ``split``, ``index``, ``wording``;
  ``Problem.target`` is ``solution`` (what the model must emit before EOS).
* ``sample_solution(cfg, operands, rng)``: a fresh solution in the config's style (what SFT imitates).
* ``DATA_SOURCE = "phantom_lab"``: the data-source name in metric keys (``val-core/phantom_lab/...``).

Splits are disjoint by construction: a problem belongs to ``val`` exactly when a stable hash of its
operand tuple falls in one bucket of ten, so no wording, index or configuration can leak a held-out
problem into training.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields

__all__ = ["DATA_SOURCE", "SPLITS", "WORDINGS", "STYLES", "TaskConfig", "Problem", "problem", "make_split",
           "iter_split", "solution_text", "styled_solution", "worked_solution", "graded_solution",
           "graded_probabilities", "GRADES", "sample_solution", "core_lines"]

DATA_SOURCE = "phantom_lab"
SPLITS: tuple[str, ...] = ("train", "val")
WORDINGS: tuple[str, ...] = ("symbolic", "words", "mixed")
STYLES: tuple[str, ...] = ("worked", "graded", "terse")
_VAL_BUCKETS = 10  # one bucket in ten is held out

_NAMES = ("Ada", "Ben", "Chloe", "Dev", "Ema", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena", "Mia", "Noor",
          "Omar", "Pia")
_ITEMS = ("apples", "shells", "coins", "stamps", "books", "marbles", "cards", "pens", "beads", "stones")
_VERBS = ("finds", "gets", "buys", "collects", "is given", "picks up")


@dataclass(frozen=True)
class TaskConfig:
    """Which problems to draw. ``terms`` is the inclusive range of the number of operands."""

    terms: tuple[int, int] = (2, 5)
    max_operand: int = 99
    wording: str = "symbolic"
    #: answer style: ``worked`` (GSM8K-like prose around the steps), ``graded`` (the same prose, one
    #: wording per piece, each kind of piece kept with its own probability) or ``terse`` (steps only)
    style: str = "worked"
    #: worked style: probability of each removable prose piece (0: none, 1: all); graded style: that of
    #: the least-kept kind (the others sit above it, see :data:`GRADES`); terse ignores it
    slack: float = 0.6

    def __post_init__(self) -> None:
        try:
            terms = tuple(int(t) for t in self.terms if int(t) == t)
        except (TypeError, ValueError, OverflowError):
            terms = ()
        if len(terms) != 2 or len(terms) != len(self.terms) or not (2 <= terms[0] <= terms[1] <= 12):
            raise ValueError(f"terms={self.terms!r} is invalid; allowed: (lo, hi) with 2 <= lo <= hi <= 12")
        object.__setattr__(self, "terms", terms)
        if isinstance(self.max_operand, bool) or not isinstance(self.max_operand, int) or \
                not (9 <= self.max_operand <= 9999):
            raise ValueError(f"max_operand={self.max_operand!r} is invalid; allowed: 9 <= max_operand <= 9999")
        if self.wording not in WORDINGS:
            raise ValueError(f"wording={self.wording!r} is unknown; allowed: {', '.join(WORDINGS)}")
        if self.style not in STYLES:
            raise ValueError(f"style={self.style!r} is unknown; allowed: {', '.join(STYLES)}")
        try:
            slack = float(self.slack)
        except (TypeError, ValueError):
            slack = float("nan")
        if not 0.0 <= slack <= 1.0:
            raise ValueError(f"slack={self.slack!r} is invalid; allowed: 0 <= slack <= 1")
        object.__setattr__(self, "slack", slack)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["terms"] = list(self.terms)
        return d

    @classmethod
    def from_dict(cls, d: dict | TaskConfig | None) -> TaskConfig:
        if d is None:
            return cls()
        if isinstance(d, TaskConfig):
            return d
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"task has unknown field(s) {sorted(unknown)}; allowed: "
                             f"{', '.join(f.name for f in fields(cls))}")
        return cls(**d)  # __post_init__ makes terms a tuple (and names a terms that is not a pair)


@dataclass(frozen=True)
class Problem:
    prompt: str
    solution: str
    answer: int
    operands: tuple[int, ...]
    split: str
    index: int
    wording: str

    @property
    def target(self) -> str:
        return self.solution


def _seed(*parts: object) -> int:
    blob = "\x1f".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big")


def _split_of(operands: tuple[int, ...]) -> str:
    return "val" if _seed("split", *operands) % _VAL_BUCKETS == 0 else "train"


def solution_text(operands: tuple[int, ...], *, spaced: tuple[bool, ...] | None = None, recap: bool = False) -> str:
    """Worked partial sums, one per line, then ``#### <sum>``.

    ``spaced[i]`` writes line ``i`` as ``a + b = c`` instead of ``a+b=c``; ``recap`` adds a
    ``Total: <sum>`` line before the answer. Both change only the length, never the answer: they
    give a group of sampled responses the spread in length that real reasoning traces have.
    """
    lines, acc = [], operands[0]
    for i, x in enumerate(operands[1:]):
        sep = " " if spaced is not None and spaced[i] else ""
        lines.append(f"{acc}{sep}+{sep}{x}{sep}={sep}{acc + x}")
        acc += x
    if recap:
        lines.append(f"Total: {acc}")
    lines.append(f"#### {acc}")
    return "\n".join(lines)


def styled_solution(operands: tuple[int, ...], rng: random.Random, p_spaced: float, p_recap: float) -> str:
    """A terse solution in a randomly drawn spacing/recap (sampling then varies the length a little)."""
    spaced = tuple(rng.random() < p_spaced for _ in operands[1:])
    return solution_text(operands, spaced=spaced, recap=rng.random() < p_recap)


# Removable prose of the worked style. Each piece has variants of different lengths, so a policy that
# is pushed towards shorter answers can trim gradually (a shorter variant, then no piece at all).
_OPENINGS = ("We add {n} numbers.", "Let's add them one at a time.", "We need the sum of {list}.",
             "The question asks for the total of {list}.")
_FIRST_LEADS = ("First, ", "We start with ", "Adding {b} to {a}: ")
_LEADS = ("Then ", "Next, ", "Now ", "Adding {b} gives ", "After that, ")
_TAILS = (", so we have {c}.", ", which makes {c}.", ", a running total of {c}.")
_CLOSINGS = ("The answer is {s}.", "So the total is {s}.", "In total we get {s}.",
             "Therefore, the sum of all the numbers is {s}.")


def core_lines(operands: tuple[int, ...]) -> list[str]:
    """The steps that carry correctness: ``a+b=c`` for each partial sum."""
    out, acc = [], operands[0]
    for x in operands[1:]:
        out.append(f"{acc}+{x}={acc + x}")
        acc += x
    return out


def worked_solution(operands: tuple[int, ...], rng: random.Random, slack: float) -> str:
    """A GSM8K-like worked solution: each prose piece present with probability ``slack``.

    The partial sums and the final ``#### <sum>`` line are always there and never change; only the
    prose around them (opening sentence, per-step lead-in and running-total tail, closing sentence)
    is drawn, so every draw is correct and the draws spread in length.
    """
    total = sum(operands)
    listed = ", ".join(map(str, operands[:-1])) + f" and {operands[-1]}"
    lines = []
    if rng.random() < slack:
        lines.append(rng.choice(_OPENINGS).format(n=len(operands), list=listed))
    acc = operands[0]
    for i, (x, core) in enumerate(zip(operands[1:], core_lines(operands))):
        lead = rng.choice(_FIRST_LEADS if i == 0 else _LEADS).format(a=acc, b=x) if rng.random() < slack else ""
        acc += x
        tail = rng.choice(_TAILS).format(c=acc) if rng.random() < slack else ""
        lines.append(f"{lead}{core}{tail}")
    if rng.random() < slack:
        lines.append(rng.choice(_CLOSINGS).format(s=total))
    lines.append(f"#### {total}")
    return "\n".join(lines)


#: The graded style's pieces, one wording each, and how far above ``slack`` each kind's probability sits.
#: Greedy decoding keeps a piece while its probability is above one half, so a policy pushed to shorter
#: answers drops the kinds one after another, in this order: first those that carry nothing (the opening,
#: the lead-ins, the closing sentence), last the running-total tails, which restate the partial sum the
#: next step builds on. In the worked style every tail hangs on one shared decision (", " after a step)
#: at the same margin as every other piece, so all of them flip in the same update.
GRADES: dict[str, float] = {"opening": 0.0, "lead": 0.05, "closing": 0.1, "tail": 0.3}
_G_OPENING, _G_FIRST_LEAD, _G_LEAD = "We add {n} numbers.", "First, ", "Then "
_G_TAIL, _G_CLOSING = ", so we have {c}.", "So the total is {s}."


def graded_probabilities(slack: float) -> dict[str, float]:
    """Each kind's probability of being present in the graded style (``slack`` plus its grade, at most 1)."""
    return {kind: min(1.0, round(slack + up, 9)) for kind, up in GRADES.items()}


def graded_solution(operands: tuple[int, ...], rng: random.Random, slack: float) -> str:
    """A worked solution whose removable pieces are kept with graded probabilities.

    As in :func:`worked_solution` the steps and the answer line never change; each piece has a single
    wording, so its greedy presence depends on one margin, and the kinds' margins differ.
    """
    pr, total = graded_probabilities(slack), sum(operands)
    lines = [_G_OPENING.format(n=len(operands))] if rng.random() < pr["opening"] else []
    acc = operands[0]
    for i, (x, core) in enumerate(zip(operands[1:], core_lines(operands))):
        lead = (_G_FIRST_LEAD if i == 0 else _G_LEAD) if rng.random() < pr["lead"] else ""
        acc += x
        tail = _G_TAIL.format(c=acc) if rng.random() < pr["tail"] else ""
        lines.append(f"{lead}{core}{tail}")
    if rng.random() < pr["closing"]:
        lines.append(_G_CLOSING.format(s=total))
    lines.append(f"#### {total}")
    return "\n".join(lines)


def sample_solution(cfg: TaskConfig, operands: tuple[int, ...], rng: random.Random, *, p_spaced: float = 0.5,
                    p_recap: float = 0.3) -> str:
    """A fresh solution in ``cfg``'s style (what SFT imitates); ``p_spaced``/``p_recap``: terse style only."""
    if cfg.style == "terse":
        return styled_solution(operands, rng, p_spaced, p_recap)
    if cfg.style == "graded":
        return graded_solution(operands, rng, cfg.slack)
    return worked_solution(operands, rng, cfg.slack)


def _words_prompt(ops: tuple[int, ...], rng: random.Random) -> str:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    pron = "she" if name in ("Ada", "Chloe", "Ema", "Hana", "Lena", "Mia", "Noor", "Pia") else "he"
    parts = [f"{name} has {ops[0]} {item}."]
    for i, x in enumerate(ops[1:]):
        verb = rng.choice(_VERBS)
        lead = pron.capitalize() if i == 0 else f"Then {pron}"
        parts.append(f"{lead} {verb} {x} more.")
    parts.append(f"How many {item} does {name} have now?")
    return " ".join(parts) + "\n"


def problem(cfg: TaskConfig, split: str, index: int) -> Problem:
    """Problem ``index`` of ``split``: deterministic, independent of every other call."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is unknown; allowed: {', '.join(SPLITS)}")
    if int(index) < 0:
        raise ValueError(f"index={index!r} is invalid; allowed: an integer >= 0")
    lo, hi = cfg.terms
    for attempt in range(10_000):
        rng = random.Random(_seed("problem", lo, hi, cfg.max_operand, split, index, attempt))
        n = rng.randint(lo, hi)
        ops = tuple(rng.randint(1, cfg.max_operand) for _ in range(n))
        if _split_of(ops) == split:
            break
    else:  # pragma: no cover - probability ~0.9**10000
        raise RuntimeError(f"could not draw a {split} problem for index {index}")
    wording = cfg.wording if cfg.wording != "mixed" else rng.choice(("symbolic", "words"))
    prompt = f"Q: {'+'.join(map(str, ops))}\n" if wording == "symbolic" else _words_prompt(ops, rng)
    if cfg.style == "terse":
        solution = solution_text(ops)
    else:  # one reference draw from the problem's own seed (verl data, tests); SFT draws its own
        draw = graded_solution if cfg.style == "graded" else worked_solution
        solution = draw(ops, random.Random(_seed("solution", split, index, *ops)), cfg.slack)
    return Problem(prompt=prompt, solution=solution, answer=sum(ops), operands=ops, split=split,
                   index=int(index), wording=wording)


def make_split(cfg: TaskConfig, split: str, n: int, start: int = 0) -> list[Problem]:
    """Problems ``start .. start+n-1`` of ``split`` (``val`` is the lab's held-out set)."""
    if int(n) < 0:
        raise ValueError(f"n={n!r} is invalid; allowed: n >= 0")
    return [problem(cfg, split, i) for i in range(int(start), int(start) + int(n))]


def iter_split(cfg: TaskConfig, split: str, start: int = 0) -> Iterator[Problem]:
    """An endless stream of problems of ``split`` from index ``start`` on."""
    i = int(start)
    while True:
        yield problem(cfg, split, i)
        i += 1
