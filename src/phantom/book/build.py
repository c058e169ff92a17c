"""Execute the book's chapters with papermill and build the HTML book.

``phantom chapter run NAME -p key value`` and ``phantom book build --profile quick|full``.

Chapters are MyST text notebooks (jupytext ``md:myst``) under ``book/chapters/``; the ``.ipynb`` are
build outputs. Jupyter Book renders them with ``execute_notebooks: "off"``, so execution happens here,
where papermill can inject parameters and where a content hash lets an unchanged chapter skip its
kernel entirely (a rebuild with no change stays well under a minute on two cores).

Build layout (``OUT`` is ``--out``, the repository root by default)::

    _build/.cache/chapters/<stem>-<hash>.ipynb   executed chapters, content-addressed (shared)
    OUT/_build/phantom/src/                      the tree Jupyter Book renders (toc files only)
    OUT/_build/html/                             the site (OUT/_build/.doctrees: Sphinx's state)

A chapter declares what it reads in its front matter, so the hash (and the build) know about it::

    phantom:
      inputs: [data/paper_reported.csv]   # files hashed into the cache key
      reads_runs: true                    # finished run folders are hashed too
      lab_sweep: paper                    # the build runs phantom.lab.sweep.run_sweep("paper", ...) first
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PROFILES",
    "Chapter",
    "ChapterError",
    "ExecResult",
    "repo_root",
    "find_chapters",
    "toc_files",
    "resolve_chapter",
    "parse_value",
    "coerce_parameters",
    "cache_key",
    "execute_chapter",
    "paper_reported",
    "reported_label",
    "chapter_main",
    "book_main",
]

PROFILES: tuple[str, ...] = ("quick", "full")
#: Environment variables the chapter kernels read (set while a chapter executes).
ENV_BOOK, ENV_ROOT, ENV_PROFILE, ENV_RUNS = "PHANTOM_BOOK", "PHANTOM_ROOT", "PHANTOM_PROFILE", "PHANTOM_RUNS"
_CACHE_VERSION = "phantom-book-1"
_KEEP_PER_CHAPTER = 4  # executed copies kept per chapter in the content-addressed cache


class ChapterError(RuntimeError):
    """A chapter failed to execute (the message names the chapter and the failing cell)."""


def _log(msg: str) -> None:
    print(f"[phantom book] {msg}", file=sys.stderr, flush=True)


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


# --------------------------------------------------------------------------------------------
# Cache key: source + parameters + everything the chapter reads
# --------------------------------------------------------------------------------------------
def _hash_file(h: Any, path: Path, label: str) -> None:
    h.update(label.encode() + b"\0")
    h.update(path.read_bytes() if path.is_file() else b"<missing>")
    h.update(b"\0")


def _run_folders(runs: Path) -> Iterator[Path]:
    if runs.is_dir():
        for manifest in sorted(runs.glob("**/manifest.json")):
            yield manifest.parent


def _module_file(name: str) -> Path | None:
    """``phantom.x.y`` -> its source file inside this installed package (None if not phantom's)."""
    parts = name.split(".")
    if parts[0] != "phantom":
        return None
    base = Path(__file__).resolve().parent.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imported(source: str, module: str | None) -> set[str]:
    """Absolute module names a piece of code imports (relative imports resolved against ``module``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics and the like: such a cell imports nothing we can see
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and module:
                pkg = module.split(".")
                path = _module_file(module)
                if path is None or path.name != "__init__.py":
                    pkg = pkg[:-1]  # a plain module: "." is its package
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)  # `from phantom import figures`
    return out


def phantom_modules(nb: Any) -> set[Path]:
    """Source files of every phantom module a notebook imports, followed transitively.

    The cache key hashes these, so editing the CPU lab does not re-execute a chapter that only
    does arithmetic with :mod:`phantom.advantages`, while editing that module does.
    """
    todo = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            src = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            todo |= _imported(src, None)
    todo |= {"phantom", "phantom.book", "phantom.figures"}
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen or not name.startswith("phantom"):
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        if name != __name__:  # this module's lazy imports (the lab sweep) are plumbing, not content
            todo |= _imported(path.read_text(), name)
        parent = name.rpartition(".")[0]
        if parent:
            todo.add(parent)  # importing phantom.a.b runs phantom/a/__init__.py
    return set(seen.values())


def cache_key(chapter: Chapter, params: Mapping[str, Any], *, root: Path, runs: Path | None = None) -> str:
    """Content hash of what determines a chapter's executed notebook.

    Covers the chapter source, the parameters, the phantom package's source (chapters compute with
    it), the inputs the chapter declares, the finished run folders when it reads runs, and the
    versions of the libraries that shape its outputs.
    """
    from importlib import metadata

    h = hashlib.sha256(_CACHE_VERSION.encode())
    _hash_file(h, chapter.path, "source")
    h.update(json.dumps(dict(params), sort_keys=True, default=repr).encode())
    nb = chapter.notebook()
    pkg = Path(__file__).resolve().parent
    for py in sorted(phantom_modules(nb)):
        _hash_file(h, py, str(py.relative_to(pkg)))
    meta = dict(nb.metadata.get("phantom") or {})
    for pattern in meta.get("inputs", []) or []:
        matches = sorted(root.glob(pattern))
        if not matches:
            h.update(f"missing:{pattern}".encode())
        for path in matches:
            _hash_file(h, path, str(path.relative_to(root)))
    if meta.get("reads_runs") or meta.get("lab_sweep"):
        from phantom.runs import runs_root

        base = runs or runs_root()
        for run in _run_folders(base):
            _hash_file(h, run / "manifest.json", f"run:{run.relative_to(base)}")
            _hash_file(h, run / "metrics.jsonl", f"metrics:{run.relative_to(base)}")
    for dist in ("plotly", "pandas", "numpy", "torch", "papermill", "jupytext"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            h.update(f"{dist}={metadata.version(dist)};".encode())
    h.update(sys.version.split()[0].encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Executing one chapter
# --------------------------------------------------------------------------------------------
@dataclass
class ExecResult:
    chapter: str
    path: Path
    cached: bool
    seconds: float
    parameters: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the kernel papermill starts (it inherits ours), then restore."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _add_tags(cell: Any, *tags: str) -> None:
    have = list(cell.metadata.get("tags", []))
    cell.metadata["tags"] = have + [t for t in tags if t not in have]


def postprocess(nb: Any) -> Any:
    """Hide papermill's plumbing and drop widget state no visible cell needs.

    The injected-parameters cell gets ``hide-input`` (the reader can unfold it to see what differed
    from the defaults). Widget state makes myst-nb load the 3.6 MB widget manager on the page, so it
    is kept only when a cell that the book shows still has a widget view.
    """
    visible_widget = False
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags:
            _add_tags(cell, "hide-input")
        if cell.cell_type == "code" and not {"remove-cell", "remove-output"} & set(tags):
            for out in cell.get("outputs", []):
                if "application/vnd.jupyter.widget-view+json" in out.get("data", {}):
                    visible_widget = True
    if not visible_widget:
        nb.metadata.pop("widgets", None)
    return nb


def _cache_dir(root: Path) -> Path:
    return root / "_build" / ".cache" / "chapters"


def _prune(cache: Path, stem: str, keep: Path) -> None:
    olds = sorted((p for p in cache.glob(f"{stem}-*.ipynb") if p != keep), key=lambda p: p.stat().st_mtime)
    for p in olds[: max(0, len(olds) - (_KEEP_PER_CHAPTER - 1))]:
        p.unlink(missing_ok=True)


def _copy_if_changed(src: Path, dst: Path) -> bool:
    """Copy only when the bytes differ, so Sphinx sees an unchanged mtime and skips the page."""
    if dst.is_file() and dst.read_bytes() == src.read_bytes():
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return True


def chapter_env(root: Path, profile: str, runs: Path) -> dict[str, str]:
    """What a chapter's kernel sees: offline figures on, and the repository, profile and runs folder."""
    return {ENV_BOOK: "1", ENV_ROOT: str(root), ENV_PROFILE: profile, ENV_RUNS: str(runs),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


def execute_chapter(chapter: Chapter, out: Path, params: Mapping[str, Any] | None = None, *,
                    root: Path | None = None, profile: str = "full", runs: Path | None = None,
                    force: bool = False) -> ExecResult:
    """Execute a chapter with papermill into ``out`` (``.ipynb``), reusing a cached run when possible.

    The kernel runs with the chapter's folder as working directory and with ``PHANTOM_BOOK=1`` (the
    figures emit offline HTML), ``PHANTOM_ROOT``, ``PHANTOM_PROFILE`` and ``PHANTOM_RUNS`` set.
    A failed execution raises :class:`ChapterError`; the partial notebook is kept next to ``out`` as
    ``<name>.failed.ipynb`` for inspection, and ``out`` is left untouched.
    """
    import nbformat
    import papermill

    from phantom.runs import runs_root

    root = root or repo_root()
    runs = runs or runs_root()
    params = dict(params or {})
    start = time.perf_counter()
    key = cache_key(chapter, params, root=root, runs=runs)
    cache = _cache_dir(root)
    cached = cache / f"{chapter.stem}-{key[:16]}.ipynb"
    if cached.is_file() and not force:
        _copy_if_changed(cached, out)
        return ExecResult(chapter.stem, out, True, time.perf_counter() - start, params)

    nb = chapter.notebook()
    parameters_of(nb, where=str(chapter.path))  # fail early on a malformed parameters cell
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{chapter.stem}.{os.getpid()}.running.ipynb"
    env = chapter_env(root, profile, runs)
    _log(f"executing {chapter.stem} {params or ''}".rstrip())
    try:
        with _environ(env):
            papermill.execute_notebook(nb, str(tmp), parameters=params or None, cwd=str(chapter.path.parent),
                                       kernel_name="python3", progress_bar=False, log_output=False,
                                       request_save_on_cell_execute=False, start_timeout=120)
    except Exception as exc:  # papermill raises PapermillExecutionError, nbclient its own timeouts
        failed = out.with_name(f"{out.stem}.failed.ipynb")
        if tmp.is_file():
            failed.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, failed)
        detail = str(exc).strip().splitlines()
        summary = "\n".join(detail[-12:]) if detail else type(exc).__name__
        raise ChapterError(f"chapter {chapter.stem} failed (partial notebook: {failed}):\n{summary}") from exc
    result = postprocess(nbformat.read(tmp, as_version=4))
    nbformat.write(result, tmp)
    os.replace(tmp, cached)
    _prune(cache, chapter.stem, cached)
    _copy_if_changed(cached, out)
    return ExecResult(chapter.stem, out, False, time.perf_counter() - start, params)


# --------------------------------------------------------------------------------------------
# Paper numbers
# --------------------------------------------------------------------------------------------
def reported_label(section: Any, source: str = "paper") -> str:
    """The label every reported number carries: ``reported by the paper (§9)``.

    ``source="dapo"`` labels DAPO's own numbers, cited by the section of the DAPO deep dive that
    states them: ``reported by the DAPO paper (deep dive §12)``.
    """
    sec = str(section).strip()
    if source == "dapo":
        return f"reported by the DAPO paper (deep dive §{sec})" if sec else "reported by the DAPO paper"
    if source != "paper":
        raise ValueError(f"source={source!r} is unknown; allowed: paper, dapo")
    return f"reported by the paper (§{sec})" if sec else "reported by the paper"


def paper_reported(root: Path | None = None, **filters: Any) -> Any:
    """Rows of ``data/paper_reported.csv`` matching ``filters`` (column=value), with a ``label`` column.

    These are numbers *reported* by the papers (the phantom-advantage paper, or DAPO for rows whose
    ``source`` is ``dapo``); the book shows them beside its own results, never as its own.
    """
    import pandas as pd

    root = root or repo_root()
    df = pd.read_csv(root / "data" / "paper_reported.csv", dtype={"section": str})
    for col, value in filters.items():
        if col not in df.columns:
            raise ValueError(f"column {col!r} is unknown; allowed: {', '.join(df.columns)}")
        df = df[df[col] == value]
    df = df.copy()
    df["label"] = [reported_label(s, src) for s, src in zip(df["section"], df["source"])]
    return df.reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# CLI: phantom chapter ...
# --------------------------------------------------------------------------------------------
def _chapter_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="phantom chapter", description="Execute one book chapter with papermill.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="execute a chapter (-p NAME VALUE overrides a parameter)")
    run.add_argument("name", help="chapter: short name (phantom_advantage), stem (02_phantom_advantage) or number")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    run.add_argument("-o", "--output", help="output .ipynb (default: _build/chapters/<stem>.ipynb)")
    run.add_argument("--profile", choices=PROFILES, default="full", help="lab profile for chapters that read lab runs")
    run.add_argument("--jobs", type=int, default=2, help="parallel lab runs when the chapter needs a sweep")
    run.add_argument("--force", action="store_true", help="execute even when a cached result matches")
    sub.add_parser("list", help="list the chapters and their parameters")
    return ap


def chapter_main(argv: Sequence[str] | None = None) -> int:
    """``phantom chapter run NAME -p key value ...`` and ``phantom chapter list``."""
    ap = _chapter_parser()
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        root = repo_root()
        if args.cmd == "list":
            for ch in sorted((Chapter(p) for p in (root / "book" / "chapters").glob("*.md")), key=lambda c: c.stem):
                params = ", ".join(f"{k}={v!r}" for k, v in ch.parameters().items())
                print(f"{ch.short:<24} {ch.stem}.md  {params}")
            return 0
        chapter = resolve_chapter(args.name, root)
        params = coerce_parameters([tuple(p) for p in args.parameter], chapter.parameters())
        if "profile" in chapter.parameters() and "profile" not in params:
            params["profile"] = args.profile
    except (ValueError, FileNotFoundError) as exc:
        print(f"phantom chapter: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output).resolve() if args.output else root / "_build" / "chapters" / f"{chapter.stem}.ipynb"
    if out.suffix != ".ipynb":
        print(f"phantom chapter: output {out} must end in .ipynb", file=sys.stderr)
        return 2
    try:
        sweep = chapter.meta().get("lab_sweep")
        if sweep:
            _run_lab_sweeps({str(sweep): [chapter.stem]}, args.profile, args.jobs)
        res = execute_chapter(chapter, out, params, root=root, profile=args.profile, force=args.force)
    except (ChapterError, LabMissing) as exc:
        print(f"phantom chapter: {exc}", file=sys.stderr)
        return 1
    how = "cached" if res.cached else f"executed in {res.seconds:.1f} s"
    print(f"{res.path}  ({how}; parameters {res.parameters or 'default'})")
    return 0


# --------------------------------------------------------------------------------------------
# CLI: phantom book build
# --------------------------------------------------------------------------------------------
class LabMissing(RuntimeError):
    """A chapter needs lab runs but the CPU lab (phantom.lab.sweep) cannot be imported."""


def _run_lab_sweeps(needs: Mapping[str, list[str]], profile: str, jobs: int) -> None:
    """Produce the lab runs the chapters need; refuse loudly when the lab is not available."""
    if not needs:
        return
    who = "; ".join(f"{name} (for {', '.join(chs)})" for name, chs in needs.items())
    try:
        from phantom.lab.sweep import run_sweep
    except ImportError as exc:
        raise LabMissing(
            f"chapters need lab sweeps {who}, but the CPU lab cannot be imported ({exc}). Install the lab "
            "extra (`make setup`), or remove `lab_sweep` from those chapters' front matter."
        ) from exc
    for name, chapters in needs.items():
        _log(f"lab sweep {name!r} (profile {profile}, {jobs} jobs)")
        try:
            run_sweep(name, profile=profile, jobs=jobs)
        except Exception as exc:  # SweepFailed or anything else: the chapters would show no results
            raise RuntimeError(f"lab sweep {name!r} (profile {profile}) needed by {', '.join(chapters)} "
                               f"failed: {exc}") from exc


def vendor_js(root: Path, *, check_only: bool = False) -> None:
    """Run ``scripts/vendor_js.py`` (idempotent: it returns at once when the files are in place)."""
    script = root / "scripts" / "vendor_js.py"
    cmd = [sys.executable, str(script)] + (["--check"] if check_only else [])
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"vendoring the book's JavaScript failed ({' '.join(cmd)}):\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    for line in (proc.stdout + proc.stderr).strip().splitlines()[-2:]:
        _log(line)


def _stage(root: Path, stage: Path, chapters: Sequence[Chapter]) -> dict[Chapter, Path]:
    """Mirror the toc's pages into the staging tree; chapters get an ``.ipynb`` path to be filled."""
    targets: dict[Chapter, Path] = {}
    chapter_entries = {f"book/chapters/{c.stem}" for c in chapters}
    wanted: set[Path] = set()
    for entry in toc_files(root):
        if entry in chapter_entries:
            continue
        for suffix in (".md", ".ipynb"):
            src = root / f"{entry}{suffix}"
            if src.is_file():
                dst = stage / f"{entry}{suffix}"
                _copy_if_changed(src, dst)
                wanted.add(dst)
                break
        else:
            raise FileNotFoundError(f"_toc.yml lists {entry} but neither {entry}.md nor .ipynb exists")
    for ch in chapters:
        targets[ch] = stage / "book" / "chapters" / f"{ch.stem}.ipynb"
        wanted.add(targets[ch])
    # remove pages that left the toc, so Sphinx does not warn about orphans
    for old in list(stage.glob("book/**/*.md")) + list(stage.glob("book/**/*.ipynb")):
        if old not in wanted:
            old.unlink()
    for folder in ("_static", "_ext"):  # assets and the local Sphinx extension, linked not copied
        link, src = stage / "book" / folder, root / "book" / folder
        if src.is_dir() and not link.is_symlink():
            if link.exists():
                shutil.rmtree(link)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(src, target_is_directory=True)
    return targets


def _book_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="phantom book", description="Execute every chapter and build the HTML book.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="vendor JS, run the lab sweeps chapters need, execute chapters, build HTML")
    b.add_argument("--profile", choices=PROFILES, default="full",
                   help="lab profile: full (make book) or quick (fewer lab steps and seeds; make test)")
    b.add_argument("--jobs", type=int, default=2, help="parallel lab runs and chapter kernels (2 cores: 2)")
    b.add_argument("--out", default=None,
                   help="output root: the site goes to OUT/_build/html (default: the repository root)")
    b.add_argument("--force", action="store_true", help="re-execute every chapter and rebuild every page")
    return ap


def book_main(argv: Sequence[str] | None = None) -> int:
    """``phantom book build --profile quick|full``: the whole pipeline, strict and offline."""
    args = _book_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.jobs < 1:
        print(f"phantom book: --jobs={args.jobs} is invalid; allowed: >= 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        root = repo_root()
        chapters = find_chapters(root)
        for ch in chapters:
            ch.parameters()  # malformed parameters cells fail before any work
    except (ValueError, FileNotFoundError) as exc:
        print(f"phantom book: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve() if args.out else root
    build = out / "_build"
    stage = build / "phantom" / "src"
    status_file = build / "phantom" / "last_build.json"
    timings: dict[str, float] = {}
    try:
        t = time.perf_counter()
        vendor_js(root)
        timings["vendor"] = time.perf_counter() - t

        needs: dict[str, list[str]] = {}
        for ch in chapters:
            sweep = ch.meta().get("lab_sweep")
            if sweep:
                needs.setdefault(str(sweep), []).append(ch.stem)
        t = time.perf_counter()
        _run_lab_sweeps(needs, args.profile, args.jobs)
        timings["lab"] = time.perf_counter() - t

        t = time.perf_counter()
        targets = _stage(root, stage, chapters)

        def run(item: tuple[Chapter, Path]) -> ExecResult:
            ch, target = item
            params = {"profile": args.profile} if "profile" in ch.parameters() else {}
            res = execute_chapter(ch, target, params, root=root, profile=args.profile, force=args.force)
            _log(f"{ch.stem}: {'cached' if res.cached else f'executed in {res.seconds:.1f} s'}")
            return res

        # each chapter's kernel is its own process: two at a time use both cores. The kernels inherit
        # os.environ, so the environment is set once around the pool (every chapter gets the same);
        # a per-chapter set-and-restore would race between the threads.
        from phantom.runs import runs_root

        with _environ(chapter_env(root, args.profile, runs_root())), \
                concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(run, targets.items()))
        executed = sum(not r.cached for r in results)
        timings["chapters"] = time.perf_counter() - t
    except (ChapterError, LabMissing, RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"phantom book: {exc}", file=sys.stderr)
        return 1

    # A failed strict build leaves Sphinx's environment behind; an incremental rebuild would then
    # skip the broken pages and pass. Rebuild everything after any failure.
    last_ok = False
    with contextlib.suppress(OSError, json.JSONDecodeError):
        last_ok = json.loads(status_file.read_text()).get("status") == "ok"
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(stage),
           "--config", str(root / "_config.yml"), "--toc", str(root / "_toc.yml"),
           "--path-output", str(out), "-W", "-n", "--keep-going", "-q"]
    if args.force or not last_ok:
        cmd.append("--all")
        shutil.rmtree(build / ".doctrees", ignore_errors=True)
    if not Path(cmd[0]).exists():
        cmd[0] = shutil.which("jupyter-book") or "jupyter-book"
    t = time.perf_counter()
    status_file.parent.mkdir(parents=True, exist_ok=True)
    status_file.write_text(json.dumps({"status": "building", "profile": args.profile}))
    _log("jupyter-book build (strict: -W -n --keep-going)")
    proc = subprocess.run(cmd, cwd=root, env={**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
    timings["jupyter-book"] = time.perf_counter() - t
    ok = proc.returncode == 0 and (build / "html" / "index.html").is_file()
    status_file.write_text(json.dumps({"status": "ok" if ok else "failed", "profile": args.profile,
                                       "finished": time.time(), "timings_s": timings}, indent=2))
    total = time.perf_counter() - t0
    summary = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    if not ok:
        print(f"phantom book: strict jupyter-book build failed (rc {proc.returncode}); see the warnings above",
              file=sys.stderr)
        return 1
    _log(f"done in {total:.1f} s ({summary}; {executed} of {len(chapters)} chapters executed)")
    print(build / "html" / "index.html")
    return 0
