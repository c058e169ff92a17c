"""The book's chapters: where they are, their parameters cells, and safe parameter values.

A chapter is a MyST text notebook (jupytext ``md:myst``) under ``book/chapters/`` listed in
``_toc.yml``. Its ``parameters`` cell holds literal assignments only, so this module reads the
defaults with ``ast`` (never executing the chapter) and types command-line values by them.
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PROFILES", "ENV_BOOK", "ENV_ROOT", "ENV_PROFILE", "ENV_RUNS", "Chapter", "repo_root",
           "parameters_of", "toc_files", "find_chapters", "resolve_chapter", "parse_value", "coerce_parameters"]

PROFILES: tuple[str, ...] = ("quick", "full")
#: Environment variables the chapter kernels read (set while a chapter executes).
ENV_BOOK, ENV_ROOT, ENV_PROFILE, ENV_RUNS = "PHANTOM_BOOK", "PHANTOM_ROOT", "PHANTOM_PROFILE", "PHANTOM_RUNS"


# --------------------------------------------------------------------------------------------
# Locating things
# --------------------------------------------------------------------------------------------
def repo_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The project root: ``$PHANTOM_ROOT``, else the nearest parent holding ``_toc.yml`` and ``book/``.

    Chapters run with their own folder as working directory, so they (and this module) find
    ``data/`` and ``runs/`` through this function instead of relative paths.
    """
    env = os.environ.get(ENV_ROOT)
    if env:
        return Path(env).resolve()
    candidates = [Path(start or Path.cwd()).resolve(), Path(__file__).resolve().parent]
    for base in candidates:
        for p in (base, *base.parents):
            if (p / "_toc.yml").is_file() and (p / "book").is_dir():
                return p
    raise FileNotFoundError("cannot find the phantom repository root (a folder with _toc.yml and book/); "
                            f"set ${ENV_ROOT}")


@dataclass(frozen=True)
class Chapter:
    """One chapter source, ``book/chapters/NN_name.md`` (a MyST text notebook)."""

    path: Path

    @property
    def stem(self) -> str:
        return self.path.stem

    @property
    def short(self) -> str:
        """The name without its number prefix: ``02_phantom_advantage`` -> ``phantom_advantage``."""
        head, _, tail = self.stem.partition("_")
        return tail if head.isdigit() and tail else self.stem

    @property
    def number(self) -> int | None:
        head = self.stem.partition("_")[0]
        return int(head) if head.isdigit() else None

    def notebook(self) -> Any:
        import jupytext

        return jupytext.read(self.path)

    def meta(self) -> dict[str, Any]:
        """The chapter's ``phantom:`` front-matter block (what it reads, which lab sweep it needs)."""
        return dict(self.notebook().metadata.get("phantom") or {})

    def parameters(self) -> dict[str, Any]:
        """Defaults of the ``parameters`` cell, read with ``ast`` (never executed)."""
        return parameters_of(self.notebook(), where=str(self.path))


def parameters_of(nb: Any, where: str = "notebook") -> dict[str, Any]:
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{where}: needs exactly one code cell tagged 'parameters', found {len(cells)}")
    out: dict[str, Any] = {}
    for node in ast.parse(cells[0].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring or a bare string comment
        else:
            raise ValueError(f"{where}: the parameters cell may only hold `name = literal` lines "
                             f"(line {getattr(node, 'lineno', '?')})")
        try:
            out[name] = ast.literal_eval(value)
        except ValueError:
            raise ValueError(f"{where}: parameter {name!r} must have a literal default") from None
    return out


def toc_files(root: Path) -> list[str]:
    """Every ``file:`` entry of ``_toc.yml`` (and its ``root``), in reading order, without suffix."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [str(toc["root"])]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key, []) or []:
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(toc)
    return files


def find_chapters(root: Path | None = None) -> list[Chapter]:
    """The chapters listed in the toc, in reading order."""
    root = root or repo_root()
    out = []
    for entry in toc_files(root):
        path = root / f"{entry}.md"
        if path.parent == root / "book" / "chapters":
            if not path.is_file():
                raise FileNotFoundError(f"_toc.yml lists {entry} but {path} does not exist")
            out.append(Chapter(path))
    return out


def resolve_chapter(name: str, root: Path | None = None) -> Chapter:
    """A chapter by stem (``02_phantom_advantage``), short name (``phantom_advantage``), number or path."""
    root = root or repo_root()
    chapters = {c.stem: c for c in sorted((root / "book" / "chapters").glob("*.md"), key=str) for c in [Chapter(c)]}
    p = Path(name)
    if p.suffix == ".md" and p.is_file():
        return Chapter(p.resolve())
    for ch in chapters.values():
        if name in (ch.stem, ch.short) or (name.isdigit() and ch.number == int(name)):
            return ch
    allowed = ", ".join(ch.short for ch in chapters.values())
    raise ValueError(f"chapter {name!r} is unknown; allowed: {allowed}")


# --------------------------------------------------------------------------------------------
# Parameters: typed by the chapter's defaults, parsed without eval
# --------------------------------------------------------------------------------------------
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def parse_value(text: str, default: Any = None) -> Any:
    """Turn a command-line string into a value of the default's type, safely (no ``eval``).

    bool/int/float/str defaults convert directly; list, tuple, dict and ``None`` defaults accept a
    Python literal (``ast.literal_eval`` evaluates literals only, never names or calls); with a
    ``None`` default anything that is not a literal stays a string.
    """
    if isinstance(default, bool):
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{text!r} is not a boolean; allowed: true/false")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
    if isinstance(default, float):
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{text!r} is not a finite number")
        return value
    if isinstance(default, str):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        if default is None:
            return text
        raise ValueError(f"{text!r} is not a Python literal of type {type(default).__name__}") from None
    if default is not None and not isinstance(value, type(default)):
        if isinstance(default, tuple) and isinstance(value, list):
            return tuple(value)
        raise ValueError(f"{text!r} is a {type(value).__name__}; expected {type(default).__name__}")
    return value


def coerce_parameters(pairs: Sequence[tuple[str, str]], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``-p name value`` pairs against a chapter's parameters cell."""
    out: dict[str, Any] = {}
    for name, text in pairs:
        if name not in defaults:
            allowed = ", ".join(defaults) or "(none)"
            raise ValueError(f"parameter {name!r} is unknown; allowed: {allowed}")
        try:
            out[name] = parse_value(text, defaults[name])
        except ValueError as exc:
            raise ValueError(f"parameter {name}={text!r}: {exc}") from None
    return out
