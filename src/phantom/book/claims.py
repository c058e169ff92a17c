"""Checked claims: a chapter states each result once, in fixed prose; a hidden cell checks it.

A result paragraph never branches on the data. It states the claim the book stands behind, with
its numbers glued from the data (``{glue:text}``), and right after it a hidden cell
(``:tags: [remove-input]``) checks the claim::

    claims = Claims()                                  # once, in the chapter's hidden setup cell
    claims.notice()                                    # a hidden cell under the opening box
    ...
    claims.check("outcome-holds", end >= start - 0.02,
                 claim="the outcome arm keeps its starting accuracy",
                 data={"val acc, step 0": start, "val acc, last step": end})

What the reader sees:

* the claim holds: nothing (the hidden cell is removed from the page);
* a checked claim fails: a prominent "Not reproduced in this build" box in place, with the data,
  and ``phantom book build`` / ``phantom chapter run`` exit non-zero once the whole book is built;
* the claim is not checked (``Claims()`` under the quick lab profile, whose runs are too short to
  carry the full build's claims): no box anywhere; :meth:`Claims.notice` puts one notice at the top
  of the chapter saying so. The prose is the same in every profile.

Chapters whose claims do not depend on lab runs (pure arithmetic, installed wheels) use
``Claims(checked=True)``: their claims are checked in every profile.

Each check emits one output with the record under :data:`MIME`. After execution,
:func:`phantom.book.execute.postprocess` moves the records into the notebook's metadata
(``metadata.phantom_claims``), drops the outputs of claims that need no box, and removes hidden
cells left without output; :func:`read_claims` gives the build the records back.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping
from typing import Any

from phantom.book.chapters import ENV_PROFILE, PROFILES

__all__ = ["MIME", "META_KEY", "STATUSES", "Claims", "read_claims", "failed_claims", "claims_report"]

#: Mime type of the record each check emits (moved into notebook metadata after execution).
MIME = "application/vnd.phantom.claim+json"
#: Notebook metadata key holding the chapter's claim records.
META_KEY = "phantom_claims"
#: ``holds``: checked and supported; ``fails``: checked and not supported (a box, a non-zero exit);
#: ``unchecked``: not checked in this profile; ``skipped``: the evidence is not available here
#: (e.g. an optional package is not installed), with a reason.
STATUSES: tuple[str, ...] = ("holds", "fails", "unchecked", "skipped")


def _jsonable(value: Any) -> Any:
    """Plain JSON values for the record: numpy scalars to Python numbers, NaN to None."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        seq = value.tolist() if hasattr(value, "tolist") else value
        return [_jsonable(v) for v in seq]
    return repr(value)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def _data_record(data: Any) -> dict[str, Any]:
    """``data`` as ``{"columns": [...], "rows": [[...], ...]}``: a mapping or a DataFrame."""
    if data is None:
        return {"columns": [], "rows": []}
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        frame = data.reset_index()
        return {"columns": [str(c) for c in frame.columns],
                "rows": [[_jsonable(v) for v in row] for row in frame.itertuples(index=False)]}
    if isinstance(data, Mapping):
        return {"columns": ["quantity", "value in this build"],
                "rows": [[str(k), _jsonable(v)] for k, v in data.items()]}
    raise TypeError(f"data must be a mapping or a DataFrame, not {type(data).__name__}")


def _box_html(rec: Mapping[str, Any]) -> str:
    data = rec["data"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in data["columns"])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
                   for row in data["rows"])
    table = f'<table class="phantom-claim-data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>' \
        if data["rows"] else ""
    return (
        f'<div class="admonition error phantom-claim-failed" role="alert" data-claim="{html.escape(rec["key"])}">'
        '<p class="admonition-title">Not reproduced in this build</p>'
        f'<p>The text above states that {html.escape(rec["claim"])}. The data of this build do not '
        f'support it (claim <code>{html.escape(rec["key"])}</code>, profile {html.escape(rec["profile"])}):</p>'
        f"{table}"
        "<p>The prose is what the book's full build reproduces; this box flags the disagreement, and "
        "the build that made this page exits with an error.</p></div>"
    )


def _notice_html(profile: str) -> str:
    return (
        '<div class="admonition note phantom-claims-unchecked">'
        "<p class=\"admonition-title\">The claims on this page are not checked in this build</p>"
        f"<p>This page was built with the <code>{html.escape(profile)}</code> lab profile, whose runs are "
        "shorter and fewer than the full build's. The prose states what the full build "
        "(<code>phantom book build --profile full</code>) checks against its data; the numbers and "
        "figures on this page come from the quick runs and may disagree with it.</p></div>"
    )


class Claims:
    """The claims of one executing chapter.

    Args:
        profile: the lab profile (``quick`` or ``full``); default ``$PHANTOM_PROFILE``, else ``full``.
        checked: ``True`` checks in every profile (claims that no lab run can change); the default
            ``None`` checks unless the profile is ``quick``.
    """

    def __init__(self, profile: str = "", *, checked: bool | None = None) -> None:
        prof = profile or os.environ.get(ENV_PROFILE) or "full"
        if prof not in PROFILES:
            raise ValueError(f"profile={prof!r} is unknown; allowed: {', '.join(PROFILES)}")
        self.profile = prof
        self.checked = (prof != "quick") if checked is None else bool(checked)
        self.records: list[dict[str, Any]] = []

    # ---------------------------------------------------------------------------------------
    def notice(self) -> None:
        """Under a profile whose claims are not checked, show one notice (call it near the top)."""
        if not self.checked:
            self._display({"text/html": _notice_html(self.profile),
                           "text/plain": f"Claims on this page are not checked ({self.profile} profile)."})

    def check(self, key: str, holds: Any, *, claim: str, data: Any = None) -> None:
        """Record whether the data support ``claim``; show the box if a checked claim fails.

        Args:
            key: a short identifier, unique within the chapter (``outcome-holds``).
            holds: the condition, evaluated on this build's data (anything ``bool()`` accepts).
            claim: what the prose states, as a clause ("the outcome arm keeps its accuracy").
            data: what the claim was checked on, shown in the box: a mapping or a DataFrame.

        Returns nothing, so a check as a cell's last line prints nothing (the record is in
        ``self.records``).
        """
        ok = bool(holds)
        status = ("holds" if ok else "fails") if self.checked else "unchecked"
        rec = self._record(key, claim, status, ok, data)
        bundle: dict[str, Any] = {MIME: rec, "text/plain": f"claim {key!r}: {status} — {claim}"}
        if status == "fails":
            bundle["text/html"] = _box_html(rec)
        self._display(bundle)

    def skip(self, key: str, reason: str, *, claim: str, data: Any = None) -> None:
        """Record a claim whose evidence is not available here (say why); no box, no failure."""
        if not reason:
            raise ValueError(f"claim {key!r}: skip() needs a reason")
        rec = self._record(key, claim, "skipped", None, data, reason=reason)
        self._display({MIME: rec, "text/plain": f"claim {key!r}: skipped ({reason}) — {claim}"})

    # ---------------------------------------------------------------------------------------
    def _record(self, key: str, claim: str, status: str, holds: bool | None, data: Any,
                reason: str | None = None) -> dict[str, Any]:
        if not key or not isinstance(key, str):
            raise ValueError(f"claim key {key!r} is invalid; allowed: a non-empty string")
        if any(r["key"] == key for r in self.records):
            raise ValueError(f"claim {key!r} is checked twice in this chapter; keys must be unique")
        if not claim or not isinstance(claim, str):
            raise ValueError(f"claim {key!r}: `claim` must state what the prose says")
        rec = {"key": key, "claim": claim, "status": status, "holds": holds, "checked": self.checked,
               "profile": self.profile, "data": _data_record(data), "reason": reason}
        self.records.append(rec)
        return rec

    @staticmethod
    def _display(bundle: dict[str, Any]) -> None:
        try:
            from IPython.display import display
        except ImportError:  # plain Python: the text is all there is
            print(bundle.get("text/plain", ""))
            return
        display(bundle, raw=True)


# --------------------------------------------------------------------------------------------
# Reading claims back (the build)
# --------------------------------------------------------------------------------------------
def read_claims(nb: Any) -> list[dict[str, Any]]:
    """The claim records of an executed chapter (a notebook node or a path to an ``.ipynb``)."""
    if not hasattr(nb, "metadata"):
        import nbformat

        nb = nbformat.read(os.fspath(nb), as_version=4)
    return [dict(r) for r in (nb.metadata.get(META_KEY) or {}).get("claims", [])]


def failed_claims(records: Mapping[str, list[dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``(chapter, record)`` for every checked claim that failed."""
    return [(ch, r) for ch, recs in records.items() for r in recs if r.get("status") == "fails"]


def claims_report(records: Mapping[str, list[dict[str, Any]]]) -> str:
    """One line of counts, then one line per failed claim with its data."""
    counts = {s: 0 for s in STATUSES}
    for recs in records.values():
        for r in recs:
            counts[r.get("status", "fails")] = counts.get(r.get("status", "fails"), 0) + 1
    lines = ["claims: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    for ch, r in failed_claims(records):
        data = "; ".join(" ".join(_fmt(v) for v in row) for row in r["data"]["rows"])
        lines.append(f"  NOT REPRODUCED {ch}: {r['key']}: {r['claim']}" + (f" [{data}]" if data else ""))
    return "\n".join(lines)
