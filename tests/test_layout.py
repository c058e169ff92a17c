"""The package's shape: ARCHITECTURE.md's layout table names every module, no import circle exists,
pillars import the core and only the pillars the table allows, and modules stay short."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "phantom"
CORE = {"phantom", "phantom.paths", "phantom.rewards", "phantom.advantages", "phantom.feedback", "phantom.dynamics", "phantom.runs",
        "phantom.figures", "phantom.proc", "phantom.proc.kernels", "phantom.proc.malloc", "phantom.proc.zygote",
        "phantom.proc.zygote_serve", "phantom.cli", "phantom.playground"}
#: pillar -> the other pillars it may import (ARCHITECTURE.md, "Layout")
ALLOWED = {"lab": set(), "verl": {"lab"}, "book": {"lab"}, "audit": set(), "trl": {"lab"}}
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> phantom modules it imports anywhere in its body (lazy imports count too)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {_resolve(a.name, mods) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps.add(full if full in mods else _resolve(base, mods))
        # importing phantom.a.b runs phantom/a/__init__.py first: that is not an edge back to the parent
        graph[name] = {d for d in deps if d and d != name and not name.startswith(d + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_pillars_import_the_core_and_only_the_pillars_allowed():
    bad = []
    for name, deps in import_graph().items():
        if name in CORE:
            bad += [(name, d) for d in deps if d not in CORE]
            continue
        pillar = name.split(".")[1]
        assert pillar in ALLOWED, f"{name}: a new top-level module or pillar; add it to ARCHITECTURE.md"
        for d in deps:
            other = d.split(".")[1] if d not in CORE else None
            if other and other != pillar and other not in ALLOWED[pillar]:
                bad.append((name, d))
    assert not bad, bad


def test_modules_stay_short():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_architecture_layout_table_matches_the_tree():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text[text.index("## Layout"):text.index("\n## ", text.index("## Layout") + 5)]
    rows = [line for line in table.splitlines() if line.startswith("| `src/phantom/")]
    named: set[str] = set()
    for row in rows:
        first, what = row.split("|")[1:3]
        folder = re.findall(r"`src/phantom/([^`]*)`", first)[0]
        assert (PKG / folder).exists(), f"ARCHITECTURE.md names src/phantom/{folder}, which does not exist"
        if folder.endswith(".py"):
            named.add(folder)
        else:
            for ref in re.findall(r"`([\w/*.]+\.(?:py|yaml))`", what):
                if "*" in ref:
                    assert list((PKG / folder).glob(ref)), f"{folder}{ref} matches nothing"
                else:
                    assert (PKG / folder / ref).is_file(), f"ARCHITECTURE.md names {folder}{ref}, which does not exist"
                    named.add(folder + ref)
    actual = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p.name != "__init__.py"}
    assert actual - named == set(), f"modules missing from ARCHITECTURE.md's layout table: {sorted(actual - named)}"
    folders = {str(p.parent.relative_to(PKG)) + "/" for p in PKG.rglob("__init__.py") if p.parent != PKG}
    listed = {re.findall(r"`src/phantom/([^`]*)`", r.split("|")[1])[0] for r in rows}
    assert folders <= listed, f"packages without a row: {sorted(folders - listed)}"
