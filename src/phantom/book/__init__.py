"""The book's machinery: chapters, their execution, the site build, and what result chapters share.

Modules: :mod:`.chapters` (discovery, parameters cells, typed parameter values), :mod:`.execute`
(papermill behind a content-addressed cache), :mod:`.build` (``phantom chapter`` and
``phantom book build``), :mod:`.paper` (the papers' reported numbers and their labels) and
:mod:`.results` (what the lab chapters read from sweeps) and :mod:`.claims` (checked claims).

Chapters import their helpers from here: ``from phantom.book import Claims, paper_reported, repo_root``.
"""

from __future__ import annotations

from phantom.book.chapters import repo_root
from phantom.book.claims import Claims
from phantom.book.paper import paper_reported, reported_label

__all__ = ["Claims", "repo_root", "paper_reported", "reported_label"]
