"""Sphinx tweaks for the phantom book (loaded through _config.yml `sphinx.local_extensions`).

Every chapter page gets a "run it yourself" box under its title: a link to the executed notebook
(the page's own source, which Sphinx copies to ``_sources/``) and the exact ``phantom chapter run``
command that re-executes it.

Jupyter Book 1 always loads sphinx-thebe. Its 0.3.1 release adds its inline configuration script
twice per page under Sphinx 7.4 ("Identifier 'THEBE_JS_URL' has already been declared", a console
error on every page), and that script names an unpkg.com URL. Thebe is off in this book, so the
page-context hook below removes sphinx-thebe's scripts and stylesheet from every page.

The Playground page (``book/playground``) gets its script, its stylesheet and, inline before them,
the presets of ``phantom.playground`` (so the form fills before Python has loaded). When the build
has finished, ``phantom/playground.py`` itself is copied next to the page's worker, so the Python the
reader runs is always the package's. The page is re-read on every build: its presets live in the
package, not in the page's source, and Sphinx would not notice them change.
"""

from __future__ import annotations

import json
import posixpath
import shutil
from pathlib import Path
from typing import Any

from docutils import nodes

CHAPTERS = "book/chapters/"
PLAYGROUND = "book/playground"


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


def _playground_assets(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    if pagename != PLAYGROUND:
        return
    from phantom.playground import page_config

    config = json.dumps(page_config(), ensure_ascii=False).replace("</", "<\\/")
    app.add_js_file(None, body=f"window.PHANTOM_PLAYGROUND = {config};")
    app.add_js_file("playground/playground.js")
    app.add_css_file("playground/playground.css")


def _playground_outdated(app: Any, env: Any, added: set, changed: set, removed: set) -> list[str]:
    return [PLAYGROUND] if PLAYGROUND in env.found_docs else []


def _playground_python(app: Any, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html" or PLAYGROUND not in app.env.found_docs:
        return
    import phantom.playground

    target = Path(app.outdir) / "_static" / "playground" / "phantom" / "playground.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(phantom.playground.__file__, target)


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("html-page-context", _playground_assets)
    app.connect("env-get-outdated", _playground_outdated)
    app.connect("build-finished", _playground_python)
    app.connect("doctree-resolved", _rerun_box)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
