"""Benchmark: what the Playground page costs the built book, in bytes and in the reader's wait.

* Bytes: every file the page adds to the built site (Pyodide's files under ``_static/vendor/pyodide``,
  the page's script, worker, stylesheet and Python under ``_static/playground``, the page and its
  source), against the rest of the site (the baseline: the book without the playground).
* Time, in Debian's headless Chromium against the site served by ``http.server`` on 127.0.0.1: from
  the start of the navigation to the first result on the page (``window.phantomPlayground``'s
  ``firstResultMs``: Pyodide loaded in the worker, ``phantom.playground`` imported, the opening group
  computed and drawn), beside the page's own ``load`` event and, as the baseline measured in the same
  round, the ``load`` event of the book's intro page (no Python). Each round starts a new browser
  (cold: nothing cached, as a first visit), then reloads the playground in the same browser (warm:
  files in the HTTP cache, the compiled wasm maybe in V8's code cache). Rounds alternate the pages,
  so a change in the machine's load hits all of them alike; the machine's load average is printed,
  since on a shared 2-core machine it sets the wait more than anything the page does. So each visit
  also counts the CPU seconds all of Chromium's processes spent on it (psutil; a process that exits
  before the count is missed), which the machine's load does not change much: on an idle machine the
  wait is at least the CPU time of the longest thread, at most the total.

usage: python benchmarks/bench_playground.py [--html _build/html] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import statistics
import sys
import threading
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
PAGE, INTRO = "book/playground.html", "book/intro.html"
#: the page's own files (relative to the site); everything under a folder counts
PARTS = {"Pyodide 314.0.7 (vendor/pyodide)": ["_static/vendor/pyodide"],
         "script, worker, CSS, Python (_static/playground)": ["_static/playground"],
         "the page and its source": [PAGE, "_sources/book/playground.md"]}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def bytes_table(html: Path) -> None:
    total = _size(html)
    parts = {name: sum(_size(html / p) for p in paths) for name, paths in PARTS.items()}
    added = sum(parts.values())
    base = total - added
    print(f"\nbytes: the built book {total / 1e6:.2f} MB; without the playground (baseline) {base / 1e6:.2f} MB")
    print(f"{'part':<52} {'MB':>8} {'x baseline':>11}")
    for name, size in parts.items():
        print(f"{name:<52} {size / 1e6:8.2f} {size / base:11.3f}")
    print(f"{'added by the playground':<52} {added / 1e6:8.2f} {added / base:11.3f}")
    pyodide = html / "_static" / "vendor" / "pyodide"
    for f in sorted(pyodide.iterdir()) if pyodide.is_dir() else []:
        print(f"    {f.name:<48} {f.stat().st_size / 1e6:8.2f}")


def _tree_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of every process below this one: the Playwright driver, Chromium."""
    import psutil

    out: dict[int, float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = t.user + t.system
    return out


def _cpu_since(before: dict[int, float]) -> float:
    return sum(v - before.get(pid, 0.0) for pid, v in _tree_cpu().items())


_READ = """() => ({load: performance.getEntriesByType('navigation')[0].loadEventEnd,
  ...(window.phantomPlayground || {})})"""


def _visit(page, url: str, playground: bool, timeout_ms: int) -> dict:
    page.goto(url, wait_until="load", timeout=timeout_ms)
    if playground:
        page.wait_for_function("() => window.phantomPlayground && window.phantomPlayground.firstResultMs !== null",
                               timeout=timeout_ms)
        page.wait_for_function("() => document.querySelectorAll('td.pg-adv').length === 5", timeout=timeout_ms)
    else:
        page.wait_for_function("() => performance.getEntriesByType('navigation')[0].loadEventEnd > 0",
                               timeout=timeout_ms)
    return page.evaluate(_READ)


def time_rounds(site: str, rounds: int, timeout_ms: int) -> None:
    from playwright.sync_api import sync_playwright

    names = ("intro load (baseline)", "playground load event", "Python ready", "first result (cold)",
             "first result (warm reload)")
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in ("intro load (baseline)", "first result (cold)",
                                                    "first result (warm reload)")}
    loads = []
    with sync_playwright() as p:
        for r in range(rounds):
            loads.append(os.getloadavg()[0])
            order = (True, False) if r % 2 == 0 else (False, True)
            for playground in order:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
                try:
                    page = browser.new_context(service_workers="block").new_page()
                    before = _tree_cpu()
                    if playground:
                        got = _visit(page, f"{site}/{PAGE}", True, timeout_ms)
                        cpu["first result (cold)"].append(1000 * _cpu_since(before))
                        wall["playground load event"].append(got["load"])
                        wall["Python ready"].append(got["loadMs"])
                        wall["first result (cold)"].append(got["firstResultMs"])
                        before = _tree_cpu()
                        warm = _visit(page, f"{site}/{PAGE}", True, timeout_ms)
                        cpu["first result (warm reload)"].append(1000 * _cpu_since(before))
                        wall["first result (warm reload)"].append(warm["firstResultMs"])
                    else:
                        wall["intro load (baseline)"].append(_visit(page, f"{site}/{INTRO}", False, timeout_ms)["load"])
                        cpu["intro load (baseline)"].append(1000 * _cpu_since(before))
                finally:
                    browser.close()
            print(f"round {r + 1} (load average {loads[-1]:.1f}): "
                  + ", ".join(f"{k} {v[-1] / 1000:.2f} s" for k, v in wall.items())
                  + "; CPU " + ", ".join(f"{k} {v[-1] / 1000:.2f} s" for k, v in cpu.items()), flush=True)
    print(f"\nmedian of {rounds} rounds (load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs)")
    for title, rows in (("wall time from the start of navigation", wall), ("CPU time of all Chromium processes", cpu)):
        base = statistics.median(rows["intro load (baseline)"])
        print(f"\n{title}:")
        print(f"{'event':<30} {'median s':>9} {'min s':>7} {'max s':>7} {'x baseline':>11}")
        for name, values in rows.items():
            m = statistics.median(values)
            print(f"{name:<30} {m / 1000:9.2f} {min(values) / 1000:7.2f} {max(values) / 1000:7.2f} {m / base:11.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", default=None,
                    help="the built site (default: _build/html, else _build/test/_build/html, the test build)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one page")
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    candidates = [Path(a.html)] if a.html else [root / "_build" / "html", root / "_build" / "test" / "_build" / "html"]
    html = next((c for c in candidates if (c / PAGE).is_file()), None)
    if html is None:
        print(f"bench_playground: no built book with {PAGE} in {', '.join(map(str, candidates))}; "
              "build one with `phantom book build --profile quick`", file=sys.stderr)
        return 2
    if a.rounds < 1:
        print(f"bench_playground: --rounds={a.rounds} is invalid; allowed: >= 1", file=sys.stderr)
        return 2
    if not CHROMIUM.is_file():
        print(f"bench_playground: {CHROMIUM} is missing (scripts/setup_env.sh installs Debian's chromium)",
              file=sys.stderr)
        return 2
    print(f"site: {html}")
    bytes_table(html)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        time_rounds(f"http://127.0.0.1:{server.server_address[1]}", a.rounds, int(a.timeout * 1000))
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
