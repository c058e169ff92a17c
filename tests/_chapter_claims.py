"""Chapters 4 and 6-8 executed on a committed copy of the `paper` sweep: the shared step of the tests that
read which of the book's lab claims hold on another machine, warm start or setting."""

from __future__ import annotations

import re
from pathlib import Path

from phantom.book.chapters import resolve_chapter
from phantom.book.execute import execute_chapter

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ("collapse_cpu", "dose_direction_format", "estimators", "what_does_not_matter")


def lab_chapter_claims(folder: Path, out: Path) -> dict[str, list[dict]]:
    """Each lab chapter's claim rows, the chapter executed on ``folder`` (its ``sweep.yaml`` and runs)."""
    params = {"profile": "full", "sweep": str(folder / "sweep.yaml"), "runs_root": str(folder)}
    return {short: execute_chapter(resolve_chapter(short, ROOT), out / f"{short}.ipynb", params,
                                   root=ROOT, runs=folder).claims for short in CHAPTERS}


def failing_claims(folder: Path, out: Path) -> tuple[set[str], int]:
    """The keys of the claims that fail on ``folder``, and how many claims the four chapters check."""
    claims = [r for rows in lab_chapter_claims(folder, out).values() for r in rows]
    return {r["key"] for r in claims if r["status"] == "fails"}, len(claims)


def listed_failing(readme: Path) -> set[str]:
    """The claim keys a README lists as not holding on its runs (lines '- `key`: ...')."""
    return {m.group(1) for line in readme.read_text().splitlines() if (m := re.match(r"- `([a-z0-9-]+)`: ", line))}
