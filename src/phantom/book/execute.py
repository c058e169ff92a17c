"""Execute one chapter with papermill, behind a content-addressed cache.

Jupyter Book renders the chapters with ``execute_notebooks: "off"``, so execution happens here,
where papermill can inject parameters and where a content hash lets an unchanged chapter skip its
kernel entirely. The hash covers what determines the executed notebook: the source, the
parameters, the phantom modules the chapter imports (followed transitively), the inputs its front
matter declares, finished run folders when it reads runs, and library versions.

Cache layout: ``_build/.cache/chapters/<stem>-<hash>.ipynb`` (shared by every output root).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantom.book.chapters import ENV_BOOK, ENV_PROFILE, ENV_ROOT, ENV_RUNS, Chapter, parameters_of, repo_root
from phantom.book.claims import read_claims
from phantom.proc.kernels import batch_kernel_env

__all__ = ["ChapterError", "ExecResult", "build_params", "cache_key", "phantom_modules", "postprocess", "chapter_env",
           "execute_chapter", "environ", "copy_if_changed", "log"]

_CACHE_VERSION = "phantom-book-1"
_KEEP_PER_CHAPTER = 4  # executed copies kept per chapter in the content-addressed cache
#: The phantom package's source root (``src/phantom``).
_PKG = Path(__file__).resolve().parents[1]
#: Book plumbing whose own (lazy) imports are not chapter content: the lab sweep a build starts
#: does not change what an executed chapter shows.
_PLUMBING = frozenset({__name__, "phantom.book.build"})


class ChapterError(RuntimeError):
    """A chapter failed to execute (the message names the chapter and the failing cell)."""


def log(msg: str) -> None:
    print(f"[phantom book] {msg}", file=sys.stderr, flush=True)


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
    base = _PKG.joinpath(*parts[1:])
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
    todo |= {"phantom", "phantom.book", "phantom.figures", __name__}
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen or not name.startswith("phantom"):
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        if name not in _PLUMBING:
            todo |= _imported(path.read_text(), name)
        parent = name.rpartition(".")[0]
        if parent:
            todo.add(parent)  # importing phantom.a.b runs phantom/a/__init__.py
    return set(seen.values())


def chapter_runs(params: Mapping[str, Any], root: Path, runs: Path | None = None) -> Path:
    """The runs folder a chapter's kernel reads: ``runs`` if given, else a ``runs_root`` parameter (relative
    to the repository root, as the chapter resolves it), else ``$PHANTOM_RUNS`` or ``runs/``. The cache key
    and the kernel's environment both take it from here, so they cannot name different folders."""
    from phantom.runs import runs_root

    given = params.get("runs_root")
    return runs or ((root / str(given)).resolve() if given else runs_root())


def cache_key(chapter: Chapter, params: Mapping[str, Any], *, root: Path, runs: Path | None = None) -> str:
    """Content hash of what determines a chapter's executed notebook.

    Covers the chapter source, the parameters, the phantom package's source (chapters compute with
    it), the inputs the chapter declares, the sweep file a ``sweep`` parameter names, the finished run
    folders when it reads runs (the runs root for ``reads_runs``/``lab_sweep``, however it is given; the
    folder a ``run_root`` parameter names; any other folder a parameter names instead of a committed
    one, with its sweep copies), and the versions of the libraries that shape its outputs.
    """
    from importlib import metadata

    h = hashlib.sha256(_CACHE_VERSION.encode())
    _hash_file(h, chapter.path, "source")
    h.update(json.dumps(dict(params), sort_keys=True, default=repr).encode())
    nb = chapter.notebook()
    for py in sorted(phantom_modules(nb)):
        _hash_file(h, py, str(py.relative_to(_PKG)))
    meta = dict(nb.metadata.get("phantom") or {})
    if params.get("sweep"):  # `-p sweep NAME|FILE`: the cells it defines (a bad value fails at the run)
        with contextlib.suppress(ImportError, ValueError):
            from phantom.lab.sweep import sweep_file

            h.update(b"sweep:" + sweep_file(str(params["sweep"]), root).read_bytes())
    for pattern in meta.get("inputs", []) or []:
        matches = sorted(root.glob(pattern))
        if not matches:
            h.update(f"missing:{pattern}".encode())
        for path in matches:
            _hash_file(h, path, str(path.relative_to(root)))
    bases: list[tuple[str, Path]] = []
    if meta.get("reads_runs") or meta.get("lab_sweep"):
        bases.append(("run", chapter_runs(params, root, runs)))
    if "run_root" in chapter.parameters():  # a chapter that reads the run folders under a parameter
        bases.append(("run_root", (root / str(params.get("run_root", chapter.parameters()["run_root"]))).resolve()))
    for name, value in sorted(params.items()):  # `-p warmstarts DIR` etc.: a committed folder given instead
        folder = root / str(value) if isinstance(value, str) and value and name not in ("runs_root", "run_root") else None
        if folder is not None and folder.is_dir():
            bases.append((f"param:{name}", folder.resolve()))
            for sweep_copy in sorted(folder.glob("**/sweep.yaml")):  # the copies' cells (lab_paper_amd)
                _hash_file(h, sweep_copy, f"param:{name}:{sweep_copy.relative_to(folder)}")
    for tag, base in bases:
        for run in _run_folders(base):
            _hash_file(h, run / "manifest.json", f"{tag}:{run.relative_to(base)}")
            _hash_file(h, run / "metrics.jsonl", f"{tag}-metrics:{run.relative_to(base)}")
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
    #: the chapter's claim records (:func:`phantom.book.claims.read_claims`)
    claims: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
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
    """Hide papermill's plumbing, collect the chapter's claims, drop widget state no cell needs.

    The injected-parameters cell gets ``hide-input`` (the reader can unfold it to see what differed
    from the defaults). Claim records (:mod:`phantom.book.claims`) move from the outputs into
    ``metadata.phantom_claims``; only a failed claim keeps an output (its box). A hidden cell
    (``remove-input``) left without outputs is removed from the page. Widget state makes myst-nb
    load the 3.6 MB widget manager on the page, so it is kept only when a cell that the book shows
    still has a widget view.
    """
    from phantom.book.claims import META_KEY, MIME

    visible_widget = False
    records: list[dict[str, Any]] = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags:
            _add_tags(cell, "hide-input")
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if MIME in data:
                rec = dict(data[MIME])
                records.append(rec)
                if rec.get("status") != "fails":
                    continue  # nothing to show: the prose stands
                del data[MIME]
            kept.append(out)
        cell["outputs"] = kept
        if not kept and "remove-input" in tags and "parameters" not in tags:
            _add_tags(cell, "remove-cell")
        if not {"remove-cell", "remove-output"} & set(cell.metadata.get("tags", [])):
            for out in kept:
                if "application/vnd.jupyter.widget-view+json" in out.get("data", {}):
                    visible_widget = True
    if records or META_KEY in nb.metadata:
        nb.metadata[META_KEY] = {"claims": records}
    if not visible_widget:
        nb.metadata.pop("widgets", None)
    return nb


def _cache_dir(root: Path) -> Path:
    return root / "_build" / ".cache" / "chapters"


def _prune(cache: Path, stem: str, keep: Path) -> None:
    olds = sorted((p for p in cache.glob(f"{stem}-*.ipynb") if p != keep), key=lambda p: p.stat().st_mtime)
    for p in olds[: max(0, len(olds) - (_KEEP_PER_CHAPTER - 1))]:
        p.unlink(missing_ok=True)


def copy_if_changed(src: Path, dst: Path) -> bool:
    """Copy only when the bytes differ, so Sphinx sees an unchanged mtime and skips the page."""
    if dst.is_file() and dst.read_bytes() == src.read_bytes():
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return True


def takes_profile(chapter: Chapter) -> bool:
    """Does the build's lab profile reach this chapter? Only a chapter that runs a lab sweep (``lab_sweep``)
    reads the runs the profile makes; one that reads committed runs keeps its own ``profile`` parameter
    (the committed sweep's, ``full``), so a quick book checks the same claims as a full one."""
    return bool(chapter.meta().get("lab_sweep")) and "profile" in chapter.parameters()


def build_params(chapter: Chapter, profile: str) -> dict[str, Any]:
    """The parameters a book build executes ``chapter`` with: the lab profile where it takes one."""
    return {"profile": profile} if takes_profile(chapter) else {}


def chapter_env(root: Path, profile: str, runs: Path) -> dict[str, str]:
    """What a chapter's kernel sees: offline figures on, the repository, profile and runs folder, and the
    batch kernels' IPython start-up (:mod:`phantom.proc.kernels`)."""
    return {ENV_BOOK: "1", ENV_ROOT: str(root), ENV_PROFILE: profile, ENV_RUNS: str(runs),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            **batch_kernel_env(_cache_dir(root))}


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

    root = root or repo_root()
    params = dict(params or {})
    runs = chapter_runs(params, root, runs)
    start = time.perf_counter()
    key = cache_key(chapter, params, root=root, runs=runs)
    cache = _cache_dir(root)
    cached = cache / f"{chapter.stem}-{key[:16]}.ipynb"
    if cached.is_file() and not force:
        copy_if_changed(cached, out)
        return ExecResult(chapter.stem, out, True, time.perf_counter() - start, params, read_claims(cached))

    nb = chapter.notebook()
    parameters_of(nb, where=str(chapter.path))  # fail early on a malformed parameters cell
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{chapter.stem}.{os.getpid()}.running.ipynb"
    env = chapter_env(root, profile, runs)
    log(f"executing {chapter.stem} {params or ''}".rstrip())
    try:
        with environ(env):
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
    copy_if_changed(cached, out)
    return ExecResult(chapter.stem, out, False, time.perf_counter() - start, params, read_claims(result))
