"""The lab's task: running sums with worked steps, ending in ``#### <int>``.

A problem adds 2..N two-digit numbers. The reference solution writes one partial sum per line and
then the GSM8K-style answer line::

    prompt    "Q: 38+7+91\\n"
    solution  "38+7=45\\n45+91=136\\n#### 136"
    answer    136

A tiny model cannot add five numbers in one shot, so the worked steps carry the answer: a response
that drops them (the phantom's "give up fast" shortcut) loses correctness. The number of terms is
the difficulty knob; it sets how often a whole rollout group fails (the paper's exposure, §7).
``wording="words"`` renders the same problem as a GSM8K-like sentence.

Public API (used by the lab and by the verl data builder):

* ``TaskConfig(terms=(2, 5), max_operand=99, wording="symbolic")``; ``wording`` is ``"symbolic"``,
  ``"words"`` or ``"mixed"`` (each problem picks one from its own seed).
* ``problem(cfg, split, index) -> Problem``: problem number ``index`` of a split, a pure function
  of its arguments (no global RNG state).
* ``make_split(cfg, split, n, start=0) -> list[Problem]``: problems ``start..start+n-1``.
* ``Problem``: ``prompt``, ``solution``, ``answer`` (int), ``operands``, ``split``, ``index``,
  ``wording``; ``Problem.target`` is ``solution`` (what the model must emit before EOS).
* ``DATA_SOURCE = "phantom_lab"``: the data-source name in metric keys (``val-core/phantom_lab/...``).

Splits are disjoint by construction: a problem belongs to ``val`` exactly when a stable hash of its
operand tuple falls in one bucket of ten, so no wording, index or configuration can leak a held-out
problem into training.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass

__all__ = ["DATA_SOURCE", "SPLITS", "WORDINGS", "TaskConfig", "Problem", "problem", "make_split", "iter_split",
           "solution_text", "styled_solution"]

DATA_SOURCE = "phantom_lab"
SPLITS: tuple[str, ...] = ("train", "val")
WORDINGS: tuple[str, ...] = ("symbolic", "words", "mixed")
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

    def __post_init__(self) -> None:
        terms = tuple(int(t) for t in self.terms)
        object.__setattr__(self, "terms", terms)
        if len(terms) != 2 or not (2 <= terms[0] <= terms[1] <= 12):
            raise ValueError(f"terms={self.terms!r} is invalid; allowed: (lo, hi) with 2 <= lo <= hi <= 12")
        if not (9 <= int(self.max_operand) <= 9999):
            raise ValueError(f"max_operand={self.max_operand!r} is invalid; allowed: 9 <= max_operand <= 9999")
        if self.wording not in WORDINGS:
            raise ValueError(f"wording={self.wording!r} is unknown; allowed: {', '.join(WORDINGS)}")

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
        unknown = set(d) - {"terms", "max_operand", "wording"}
        if unknown:
            raise ValueError(f"task has unknown field(s) {sorted(unknown)}; allowed: terms, max_operand, wording")
        return cls(**{k: (tuple(v) if k == "terms" else v) for k, v in d.items()})


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
    """A solution in a randomly drawn style (what SFT imitates, so sampling varies the length)."""
    spaced = tuple(rng.random() < p_spaced for _ in operands[1:])
    return solution_text(operands, spaced=spaced, recap=rng.random() < p_recap)


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
    return Problem(prompt=prompt, solution=solution_text(ops), answer=sum(ops), operands=ops, split=split,
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
