"""Sphinx tweaks for the phantom book (loaded through _config.yml `sphinx.local_extensions`).

Every chapter page gets a "run it yourself" box under its title: a link to the executed notebook
(the page's own source, which Sphinx copies to ``_sources/``) and the exact ``phantom chapter run``
command that re-executes it.

Jupyter Book 1 always loads sphinx-thebe. Its 0.3.1 release adds its inline configuration script
twice per page under Sphinx 7.4 ("Identifier 'THEBE_JS_URL' has already been declared", a console
error on every page), and that script names an unpkg.com URL. Thebe is off in this book, so the
page-context hook below removes sphinx-thebe's scripts and stylesheet from every page.
"""

from __future__ import annotations

import posixpath
from typing import Any

from docutils import nodes

CHAPTERS = "book/chapters/"


def _is_thebe(asset: Any) -> bool:
    name = str(getattr(asset, "filename", asset) or "")
    body = str((getattr(asset, "attributes", None) or {}).get("body", ""))
    return "sphinx-thebe" in name or "THEBE_JS_URL" in body or "thebe@" in name


def _drop_thebe(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [a for a in context[key] if not _is_thebe(a)]


def _short(stem: str) -> str:
    """``02_phantom_advantage`` -> ``phantom_advantage`` (the name `phantom chapter run` takes)."""
    head, _, tail = stem.partition("_")
    return tail if head.isdigit() and tail else stem


def _rerun_box(app: Any, doctree: Any, docname: str) -> None:
    if not docname.startswith(CHAPTERS) or app.builder.format != "html":
        return
    source = app.env.doc2path(docname, False)
    source = str(source).replace("\\", "/")
    suffix = app.config.html_sourcelink_suffix or ""
    if not source.endswith(suffix):
        source += suffix
    href = posixpath.relpath(f"_sources/{source}", posixpath.dirname(docname))
    stem = posixpath.basename(docname)
    command = f"phantom chapter run {_short(stem)}"
    box = nodes.container(classes=["phantom-rerun"])
    para = nodes.paragraph()
    para += nodes.Text("Run this page yourself: download the executed notebook ")
    link = nodes.reference("", "", internal=False, refuri=href, classes=["phantom-notebook-download"])
    link += nodes.literal(text=f"{stem}.ipynb")
    para += link
    para += nodes.Text(" (papermill re-runs it as it is), or re-execute it from a checkout, "
                       "with -p NAME VALUE for other parameters:")
    box += para
    block = nodes.literal_block(command, command, language="bash", classes=["phantom-rerun-command"])
    block["highlight_args"] = {}
    box += block
    for section in doctree.findall(nodes.section):
        title = next(iter(section.findall(nodes.title)), None)
        section.insert(section.index(title) + 1 if title is not None else 0, box)
        return


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("doctree-resolved", _rerun_box)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
