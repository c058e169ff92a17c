"""The built book: strict build (quick profile), then every page in Debian's headless Chromium.

The session fixture runs the real pipeline (`phantom book build --profile quick`) into
`_build/test/`, so `make test` always checks a book built from the current sources; executed
chapters come from the content-addressed cache when nothing changed, so a warm run costs seconds.
Screenshots of every page land in `_build/screens/` (CI keeps that folder as an artifact).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "_build" / "test"
HTML = OUT / "_build" / "html"
SCREENS = ROOT / "_build" / "screens"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built_book() -> Path:
    """Build the book with the quick profile (strict) and return the HTML folder."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "phantom.cli", "book", "build", "--profile", "quick",
                           "--out", str(OUT)], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        pytest.fail(f"phantom book build failed (rc {proc.returncode}, {took:.0f} s):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    print(f"\n[book] quick build took {took:.1f} s", file=sys.stderr)
    return HTML


def _toc_pages() -> list[str]:
    from phantom.book.chapters import toc_files

    return [f"{entry}.html" for entry in toc_files(ROOT)]


def test_strict_build_has_every_toc_page(built_book: Path) -> None:
    status = json.loads((OUT / "_build" / "phantom" / "last_build.json").read_text())
    assert status["status"] == "ok" and status["profile"] == "quick"
    assert (built_book / "index.html").is_file()
    for page in _toc_pages():
        assert (built_book / page).is_file(), f"{page} missing from the built book"


def test_no_page_references_an_outside_script_or_stylesheet(built_book: Path) -> None:
    """Scripts, stylesheets and fonts must come from _static; links to papers/issues are fine."""
    bad = re.compile(r"""<(?:script[^>]*\ssrc|link[^>]*\shref)=["'](?:https?:)?//""", re.IGNORECASE)
    for page in built_book.rglob("*.html"):
        hits = [m.group(0) for m in bad.finditer(page.read_text(errors="replace"))
                if "rel=\"canonical\"" not in m.group(0)]
        assert not hits, f"{page.relative_to(built_book)} loads from outside: {hits[:3]}"
    vendor = built_book / "_static" / "vendor"
    for f in ("plotly.min.js", "require.js", "html-manager/embed-amd.js", "mathjax/tex-mml-chtml.js"):
        assert (vendor / f).is_file(), f"vendored {f} missing from the site"


def test_executed_chapters_have_no_errors(built_book: Path) -> None:
    import nbformat

    stage = OUT / "_build" / "phantom" / "src" / "book" / "chapters"
    notebooks = sorted(stage.glob("*.ipynb"))
    assert notebooks, "no executed chapters in the staging tree"
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{path.name} has error outputs"
        tags = [c.metadata.get("tags", []) for c in nb.cells if c.cell_type == "code"]
        assert sum("parameters" in t for t in tags) == 1, f"{path.name} needs exactly one parameters cell"


# --------------------------------------------------------------------------------------------
# the browser
# --------------------------------------------------------------------------------------------
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def site(built_book: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(built_book)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing; scripts/setup_env.sh installs Debian's chromium")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield b
        b.close()


class PageLog:
    """Console errors, uncaught exceptions and requests to hosts other than the local server."""

    def __init__(self, context, page) -> None:
        self.errors: list[str] = []
        self.outside: list[str] = []

        def route(r):
            url = urlparse(r.request.url)
            if url.scheme in ("http", "https", "ws", "wss") and url.hostname != "127.0.0.1":
                self.outside.append(r.request.url)
                return r.abort()
            return r.continue_()

        context.route("**/*", route)
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} ({r.failure})")
                if "127.0.0.1" in r.url else None)


def _open(browser, url: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    page = context.new_page()
    log = PageLog(context, page)
    # generous limits: on a shared 2-core machine under `nice` a heavy page can take a minute to load
    page.goto(url, wait_until="load", timeout=180_000)
    page.wait_for_load_state("networkidle", timeout=60_000)
    page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise ? MathJax.startup.promise : null")
    page.wait_for_timeout(300)
    return context, page, log


_FIGURES_JS = """() => Array.from(document.querySelectorAll('.plotly-graph-div')).map(gd => {
  const fl = gd._fullLayout;
  const axes = fl ? Object.keys(fl).filter(k => /^[xy]axis\\d*$/.test(k) && fl[k].visible !== false && !fl[k].matches) : [];
  const fig = gd.closest('figure.phantom-figure');
  return {
    id: gd.id,
    drawn: !!fl && !!gd.querySelector('.main-svg') && gd.data.length > 0,
    traces: gd.querySelectorAll('.trace, .point').length,
    caption: fig && fig.querySelector('figcaption') ? fig.querySelector('figcaption').innerText.trim() : '',
    untitled_axes: axes.filter(k => !(fl[k].title && fl[k].title.text)),
  };
})"""


@pytest.mark.browser
def test_every_page_renders_offline_without_errors(browser, site: str, built_book: Path) -> None:
    SCREENS.mkdir(parents=True, exist_ok=True)
    pages = sorted(p.relative_to(built_book).as_posix() for p in built_book.rglob("*.html")
                   if not p.relative_to(built_book).parts[0].startswith("_"))
    assert {p for p in _toc_pages()} <= set(pages)
    problems: list[str] = []
    figure_count = 0
    for rel in pages:
        context, page, log = _open(browser, f"{site}/{rel}")
        try:
            figs = page.evaluate(_FIGURES_JS)
            figure_count += len(figs)
            for f in figs:
                if not f["drawn"] or f["traces"] == 0:
                    problems.append(f"{rel}: figure {f['id']} not drawn")
                if not f["caption"].startswith("Figure"):
                    problems.append(f"{rel}: figure {f['id']} has no caption")
                if f["untitled_axes"]:
                    problems.append(f"{rel}: figure {f['id']} axes without a title: {f['untitled_axes']}")
            page.screenshot(path=str(SCREENS / (rel.replace("/", "__").removesuffix(".html") + ".png")), full_page=True)
            problems += [f"{rel}: {e}" for e in log.errors]
            problems += [f"{rel}: request to an outside host {u}" for u in log.outside]
        finally:
            context.close()
    assert figure_count >= 10, f"only {figure_count} figures in the whole book"
    assert not problems, "\n".join(problems)


@pytest.mark.browser
def test_chapter2_lambda_slider_changes_the_plotted_data(browser, site: str) -> None:
    context, page, log = _open(browser, f"{site}/book/chapters/02_phantom_advantage.html")
    try:
        gd = page.locator("#fig-lambda-slider")
        gd.scroll_into_view_if_needed()
        read = "() => { const g = document.getElementById('fig-lambda-slider'); return {" \
               "y: g._fullData.map(t => Array.from(t.y)), title: g.layout.title.text, active: g.layout.sliders[0].active}; }"
        before = page.evaluate(read)
        rail = gd.locator(".slider-rail-touch-rect").first
        box = rail.bounding_box()
        assert box is not None, "the λ slider has no rail on the page"
        page.mouse.click(box["x"] + 0.01 * box["width"], box["y"] + box["height"] / 2)  # leftmost step
        page.wait_for_timeout(800)
        after = page.evaluate(read)
        SCREENS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENS / "chapter2_after_slider.png"), full_page=False)
    finally:
        context.close()
    assert after["active"] != before["active"], "clicking the rail did not move the slider"
    assert after["y"] != before["y"], "moving the slider did not change the plotted data"
    assert "λ = 0.01" in after["title"] and after["title"] != before["title"]
    # the chapter's claim, checked on the page itself: GRPO's all-fail bars do not move with λ,
    # Dr. GRPO's shrink with it (traces: GRPO all-fail, GRPO mixed, Dr. GRPO all-fail, Dr. GRPO mixed)
    assert max(abs(a - b) for a, b in zip(before["y"][0], after["y"][0])) < 1e-3
    assert max(map(abs, after["y"][2])) < 0.1 * max(map(abs, before["y"][2]))
    assert not log.errors and not log.outside, (log.errors, log.outside)


# --------------------------------------------------------------------------------------------
# solutions, the glossary, the "run it yourself" box, claims
# --------------------------------------------------------------------------------------------
def test_the_quick_build_records_claims_and_shows_no_failed_one(built_book: Path) -> None:
    recorded = json.loads((OUT / "_build" / "phantom" / "claims.json").read_text())
    assert recorded["profile"] == "quick"
    statuses = [r["status"] for recs in recorded["chapters"].values() for r in recs]
    assert statuses.count("holds") >= 20, "chapters 1-3 check their claims in every profile"
    assert "fails" not in statuses, [r for recs in recorded["chapters"].values() for r in recs if r["status"] == "fails"]
    for page in built_book.rglob("*.html"):
        assert "phantom-claim-failed" not in page.read_text(errors="replace"), page


@pytest.mark.browser
def test_a_solution_is_folded_and_opens_on_its_executed_output(browser, site: str) -> None:
    context, page, log = _open(browser, f"{site}/book/chapters/02_phantom_advantage.html")
    try:
        solutions = page.locator("div.solution.dropdown")
        assert solutions.count() >= 5, "every exercise of chapter 2 has a solution"
        first = solutions.first
        body = first.locator("section")
        first.scroll_into_view_if_needed()
        assert not body.first.is_visible(), "solutions start folded"
        toggle = first.locator("button.toggle-button")
        (toggle if toggle.count() else first.locator(".admonition-title")).first.click()
        page.wait_for_timeout(600)
        assert body.first.is_visible(), "clicking the title unfolds the solution"
        text = first.inner_text()
        assert "max |A' − A|" in text, "the solution shows the output its code produced at build time"
        SCREENS.mkdir(parents=True, exist_ok=True)
        first.screenshot(path=str(SCREENS / "chapter2_solution_open.png"))
        stars = page.locator("div.exercise .admonition-title").all_inner_texts()
        assert stars and all("★" in t for t in stars), stars
    finally:
        context.close()
    assert not log.errors and not log.outside, (log.errors, log.outside)


@pytest.mark.browser
def test_glossary_terms_are_linked_from_first_uses(browser, site: str) -> None:
    context, page, log = _open(browser, f"{site}/book/chapters/02_phantom_advantage.html")
    SCREENS.mkdir(parents=True, exist_ok=True)
    try:
        link = page.locator('a[href*="glossary.html#term-phantom-group"]').first
        assert link.count() == 1, "chapter 2 links 'phantom group' to the glossary"
        link.click()
        page.wait_for_load_state("load")
        assert page.url.split("#")[0].endswith("/book/glossary.html")
        term = page.locator("dl.glossary dt#term-phantom-group")
        assert term.is_visible() and "phantom group" in term.inner_text()
        terms = page.locator("dl.glossary dt").all_inner_texts()
        for needed in ("EM", "arm", "cell", "profile", "sweep", "GateStats", "live_frac", "V1 trainer",
                       "replay buffer", "Hydra overrides", "dose", "exposure"):
            assert any(t.strip().startswith(needed) for t in terms), f"glossary lacks {needed!r}"
        page.screenshot(path=str(SCREENS / "glossary.png"), full_page=False)
    finally:
        context.close()
    assert not log.errors and not log.outside, (log.errors, log.outside)


def test_every_chapter_offers_its_executed_notebook_and_command(built_book: Path) -> None:
    import nbformat

    from phantom.book.chapters import find_chapters

    for ch in find_chapters(ROOT):
        html = (built_book / "book" / "chapters" / f"{ch.stem}.html").read_text()
        assert "phantom-rerun" in html, f"{ch.stem}: no 'run this page yourself' box"
        assert f"phantom chapter run {ch.short}" in re.sub(r"<[^>]+>", "", html), ch.stem
        href = f'href="../../_sources/book/chapters/{ch.stem}.ipynb"'
        assert href in html, f"{ch.stem}: no link to its executed notebook"
        nb = nbformat.read(built_book / "_sources" / "book" / "chapters" / f"{ch.stem}.ipynb", as_version=4)
        assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{ch.stem}: the notebook is not executed"
        assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
