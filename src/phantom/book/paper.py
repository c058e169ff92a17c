"""Numbers the papers report, each with the label the book prints beside it.

The book shows them beside its own results, never as its own: every row of
``data/paper_reported.csv`` carries its section, and :func:`reported_label` turns it into
"reported by the paper (§N)".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phantom.book.chapters import repo_root

__all__ = ["reported_label", "paper_reported"]


def reported_label(section: Any, source: str = "paper") -> str:
    """The label every reported number carries: ``reported by the paper (§9)``.

    ``source="dapo"`` labels DAPO's own numbers, cited by the section of the DAPO deep dive that
    states them: ``reported by the DAPO paper (deep dive §12)``.
    """
    sec = str(section).strip()
    if source == "dapo":
        return f"reported by the DAPO paper (deep dive §{sec})" if sec else "reported by the DAPO paper"
    if source != "paper":
        raise ValueError(f"source={source!r} is unknown; allowed: paper, dapo")
    return f"reported by the paper (§{sec})" if sec else "reported by the paper"


def paper_reported(root: Path | None = None, **filters: Any) -> Any:
    """Rows of ``data/paper_reported.csv`` matching ``filters`` (column=value), with a ``label`` column.

    These are numbers *reported* by the papers (the phantom-advantage paper, or DAPO for rows whose
    ``source`` is ``dapo``); the book shows them beside its own results, never as its own.
    """
    import pandas as pd

    root = root or repo_root()
    df = pd.read_csv(root / "data" / "paper_reported.csv", dtype={"section": str})
    for col, value in filters.items():
        if col not in df.columns:
            raise ValueError(f"column {col!r} is unknown; allowed: {', '.join(df.columns)}")
        df = df[df[col] == value]
    df = df.copy()
    df["label"] = [reported_label(s, src) for s, src in zip(df["section"], df["source"])]
    return df.reset_index(drop=True)
