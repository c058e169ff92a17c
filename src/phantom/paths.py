"""Where phantom keeps what it builds and what it ships, independent of the current folder.

A newcomer runs ``phantom lab run`` from wherever their shell happens to be. Caching the warm starts
and compiled kernels under ``./artifacts`` made every new folder rebuild them (20-37 minutes of SFT on
a 2-core machine), so the cache is found the same way from anywhere:

1. an explicit ``root`` argument, else ``$PHANTOM_ARTIFACTS``;
2. else the ``artifacts/`` folder of the source checkout this package runs from (an editable install,
   as ``make setup`` makes);
3. else ``$XDG_CACHE_HOME/phantom`` (default ``~/.cache/phantom``) for an installed wheel.

The checkout also ships data that is not a cache: the book's warm start under ``data/warmstart/``
(:mod:`phantom.lab.sft` reads it before it would build anything).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_ARTIFACTS", "checkout", "artifacts_base", "shipped_warmstarts"]

ENV_ARTIFACTS = "PHANTOM_ARTIFACTS"


def checkout() -> Path | None:
    """The source checkout this package runs from (``src/phantom`` inside a folder with ``_toc.yml``),
    or None when the package is installed from a wheel."""
    top = Path(__file__).resolve().parents[2]
    return top if (top / "_toc.yml").is_file() and (top / "src" / "phantom").is_dir() else None


def artifacts_base(root: str | os.PathLike[str] | None = None) -> Path:
    """The artifacts cache: ``root``, else ``$PHANTOM_ARTIFACTS``, else the checkout's ``artifacts/``,
    else the user's cache folder (never the current folder)."""
    if root:
        return Path(root).expanduser().resolve()
    env = os.environ.get(ENV_ARTIFACTS, "").strip()
    if env:
        return Path(env).expanduser().resolve()
    top = checkout()
    if top is not None:
        return top / "artifacts"
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache).expanduser().resolve() / "phantom"


def shipped_warmstarts() -> Path | None:
    """The checkout's ``data/warmstart/`` (the committed warm starts), or None outside a checkout."""
    top = checkout()
    return top / "data" / "warmstart" if top is not None else None
