"""Sphinx tweaks for the phantom book (loaded through _config.yml `sphinx.local_extensions`).

Jupyter Book 1 always loads sphinx-thebe. Its 0.3.1 release adds its inline configuration script
twice per page under Sphinx 7.4 ("Identifier 'THEBE_JS_URL' has already been declared", a console
error on every page), and that script names an unpkg.com URL. Thebe is off in this book, so the
page-context hook below removes sphinx-thebe's scripts and stylesheet from every page.
"""

from __future__ import annotations

from typing import Any


def _is_thebe(asset: Any) -> bool:
    name = str(getattr(asset, "filename", asset) or "")
    body = str((getattr(asset, "attributes", None) or {}).get("body", ""))
    return "sphinx-thebe" in name or "THEBE_JS_URL" in body or "thebe@" in name


def _drop_thebe(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [a for a in context[key] if not _is_thebe(a)]


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
