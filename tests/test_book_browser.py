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
        self.seen: list[str] = []  # every request routed, the page's workers' included

        def route(r):
            self.seen.append(r.request.url)
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
            if rel == PLAYGROUND:  # its Python starts in a worker: the page is whole once the first result is in
                _pg_next(page, 0)
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


# --------------------------------------------------------------------------------------------
# the Playground page: Python (Pyodide) in a Web Worker, from the book's own files
# --------------------------------------------------------------------------------------------
PLAYGROUND = "book/playground.html"
_PG_STATE = "() => ({state: document.getElementById('pg-status').dataset.state, " \
            "status: document.getElementById('pg-status').innerText, ...window.phantomPlayground, " \
            "adv: Array.from(document.querySelectorAll('td.pg-adv')).map(td => [+td.dataset.adv, td.innerText]), " \
            "code_error: document.getElementById('pg-code-error').innerText, " \
            "field_error: document.getElementById('pg-field-error').innerText, " \
            "printed: document.getElementById('pg-printed').innerText, " \
            "summary: document.getElementById('pg-summary').innerText})"


def _pg_open(browser, url: str):
    """The page up to its DOM: the first result comes later, from the worker (`_pg_next`). On a shared
    2-core machine under load, Pyodide's start-up and its 13 MB from Python's http.server can hold the
    page's load event for a minute, so neither the load event nor network idleness is waited for."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    page = context.new_page()
    log = PageLog(context, page)
    page.goto(url, wait_until="domcontentloaded", timeout=300_000)
    return context, page, log


def _pg_next(page, renders: int, timeout_ms: int = 300_000) -> dict:
    """Wait for the page's next result (or error) after `renders` of them; a cold Pyodide start under a
    loaded 2-core machine can take a minute, hence the generous limit."""
    page.wait_for_function(f"() => window.phantomPlayground && window.phantomPlayground.renders > {renders}",
                           timeout=timeout_ms)
    return page.evaluate(_PG_STATE)


def test_the_built_playground_runs_the_packages_python(built_book: Path) -> None:
    from phantom import playground

    served = built_book / "_static" / "playground" / "phantom" / "playground.py"
    assert served.read_bytes() == Path(playground.__file__).read_bytes()
    for f in ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json"):
        assert (built_book / "_static" / "vendor" / "pyodide" / f).is_file(), f
    html = (built_book / PLAYGROUND).read_text()
    config = json.loads(re.search(r"window\.PHANTOM_PLAYGROUND = (\{.*?\});</script>", html).group(1))
    assert config == json.loads(json.dumps(playground.page_config()))


@pytest.mark.browser
def test_playground_opens_on_the_readme_example_and_recomputes(browser, site: str) -> None:
    from phantom import playground

    context, page, log = _pg_open(browser, f"{site}/{PLAYGROUND}")
    try:
        got = _pg_next(page, 0)
        assert got["state"] == "done", got
        assert [round(v, 2) for v, _ in got["adv"]] == [1.11, 0.64, 0.17, -0.47, -1.46]
        assert [t for _, t in got["adv"]] == ["1.11", "0.64", "0.17", "−0.47", "−1.46"]
        assert "phantom group" in got["summary"] and "score gate: kept" in got["summary"]
        chart = page.evaluate("() => { const g = document.getElementById('pg-chart'); return {n: g.data[0].y.length, "
                              "x: g._fullLayout.xaxis.title.text, y: g._fullLayout.yaxis.title.text}; }")
        assert chart["n"] == 5 and chart["x"] and chart["y"], chart
        SCREENS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENS / "playground_opening.png"), full_page=True)

        # drop the length term: the all-fail group has no spread left, so every advantage is 0
        page.fill("#pg-code", "def reward(outcome, length):\n    return outcome\n")
        got = _pg_next(page, got["renders"])
        assert got["state"] == "done" and [v for v, _ in got["adv"]] == [0.0] * 5, got
        # a syntax error is Python's own message, beside the editor
        page.fill("#pg-code", "def reward(outcome, length)\n    return outcome\n")
        got = _pg_next(page, got["renders"])
        assert got["state"] == "error" and "SyntaxError: expected ':' (line 1)" in got["code_error"], got
        # the share link carries the inputs: opened in a fresh page it shows the same state
        page.fill("#pg-code", "def reward(outcome, length):\n    print('seen', length)\n"
                              "    return outcome - lam * (length > 100)\n")
        page.fill("input[name=lam]", "0.5")
        got = _pg_next(page, got["renders"])
        assert "seen 40" in got["printed"] and "seen 480" in got["printed"], got["printed"]
        share = page.get_attribute("#pg-share", "href")
        want = playground.run(playground.from_fragment(share.split("#", 1)[1]))
        assert [v for v, _ in got["adv"]] == want["groups"][0]["advantages"], (got, want)
        # the chapters' preset links, followed on the page (the fragment changes, Python stays loaded)
        for preset in ("allfail-outcome", "allfail-drgrpo", "mixed-grpo", "batch"):
            page.evaluate(f"() => {{ window.location.hash = 'preset={preset}'; }}")
            got = _pg_next(page, got["renders"])
            want = playground.run({"preset": preset})
            assert [v for v, _ in got["adv"]] == [a for g in want["groups"] for a in g["advantages"]], preset
        assert "Batch: 6 groups" in got["summary"], got["summary"]
        page.evaluate("() => { window.location.hash = 'preset=nope&gate=acc'; }")
        got = _pg_next(page, got["renders"])
        assert got["state"] == "done", got
        assert "preset \"nope\" is unknown; allowed: allfail-score" in got["field_error"], got["field_error"]
        assert "gate \"acc\" is unknown; allowed: none, score, outcome" in got["field_error"], got["field_error"]
    finally:
        context.close()
    assert any(u.endswith("/_static/vendor/pyodide/pyodide.asm.wasm") and "127.0.0.1" in u for u in log.seen), \
        "the worker's requests are not seen by the test, so the offline check would not cover them"
    assert not log.errors and not log.outside, (log.errors, log.outside)


@pytest.mark.browser
def test_playground_stops_an_endless_loop_and_restarts_python(browser, site: str) -> None:
    context, page, log = _pg_open(browser, f"{site}/{PLAYGROUND}#preset=allfail-score")
    try:
        got = _pg_next(page, 0)
        assert got["state"] == "done", got
        page.fill("#pg-code", "def reward(outcome, length):\n    while True:\n        pass\n")
        page.wait_for_function("() => window.phantomPlayground.restarts === 1", timeout=60_000)
        got = page.evaluate(_PG_STATE)
        assert got["state"] == "stopped" and "Stopped" in got["code_error"], got
        page.wait_for_function("() => document.getElementById('pg-status').innerText.includes('restarted')",
                               timeout=300_000)
        good = "def reward(outcome, length):\n    return outcome - lam * min(length / 512, 1)\n"
        page.fill("#pg-code", good)
        got = _pg_next(page, got["renders"])
        assert got["state"] == "done" and [t for _, t in got["adv"]] == ["1.11", "0.64", "0.17", "−0.47", "−1.46"]
        # code that breaks the interpreter itself: past a raised recursion limit, Chromium's stack runs out
        # inside the wasm (Pyodide's "fatal error"); the page names it and starts a new worker. A browser
        # with a deeper stack may raise RecursionError instead, which is shown like any error; a slower
        # machine may reach the time limit first, which restarts it too.
        errors_before = len(log.errors)
        page.fill("#pg-code", "import sys\nsys.setrecursionlimit(10000)\ndef reward(outcome, length):\n"
                              "    return reward(outcome, length)\n")
        page.wait_for_function(f"() => window.phantomPlayground.restarts === 2 || "
                               f"window.phantomPlayground.renders > {got['renders']}", timeout=60_000)
        crashed = page.evaluate(_PG_STATE)
        if crashed["restarts"] == 2:
            assert crashed["code_error"].startswith(("Python itself failed", "Stopped")), crashed
            page.wait_for_function("() => document.getElementById('pg-status').innerText.includes('restarted')",
                                   timeout=300_000)
        else:
            assert "RecursionError" in crashed["code_error"], crashed
        page.fill("#pg-code", good + "\n")
        got = _pg_next(page, page.evaluate("window.phantomPlayground.renders"))
        assert got["state"] == "done" and [t for _, t in got["adv"]] == ["1.11", "0.64", "0.17", "−0.47", "−1.46"]
    finally:
        context.close()
    # nothing went wrong before the crash; after it, only Pyodide's report of its own fatal error
    assert not log.errors[:errors_before], log.errors
    assert not log.errors[errors_before:] or "fatal error" in log.errors[errors_before], log.errors
    assert not log.outside, log.outside
