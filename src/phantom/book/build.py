"""``phantom chapter run NAME -p key value`` and ``phantom book build --profile quick|full``.

The build vendors the book's JavaScript, runs the lab sweeps the chapters declare, executes every
chapter (:mod:`phantom.book.execute`, two kernels at a time) and renders the site with a strict
Jupyter Book build. Build layout (``OUT`` is ``--out``, the repository root by default)::

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
import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from phantom.book.background import Warmup, start_warmup
from phantom.book.chapters import (
    PROFILES,
    Chapter,
    coerce_parameters,
    find_chapters,
    repo_root,
    resolve_chapter,
    toc_files,
)
from phantom.book.claims import claims_report, failed_claims
from phantom.book.execute import (
    ChapterError,
    ExecResult,
    build_params,
    chapter_env,
    chapter_runs,
    copy_if_changed,
    environ,
    execute_chapter,
    log,
    takes_profile,
)
from phantom.cli import exit_code_of as _exit_code

__all__ = ["LabMissing", "chapter_main", "book_main", "vendor_js"]


# --------------------------------------------------------------------------------------------
# CLI: phantom chapter ...
# --------------------------------------------------------------------------------------------
def _chapter_parser() -> argparse.ArgumentParser:
    from phantom import cli

    codes = cli.exit_codes("a checked claim fails at the default parameters (or on another warm start of the same "
                           "experiment: -p sweep / -p runs_root); a chapter that fails to execute")
    ap = cli.command_parser("phantom chapter", "Execute one book chapter with papermill, its parameters set with "
                            "-p NAME VALUE (typed by the chapter's parameters cell, never evaluated).",
                            ["phantom chapter list", "phantom chapter run phantom_advantage -p group_size 8",
                             "phantom chapter run collapse_cpu --profile quick"], codes)
    sub = cli.subcommands(ap)
    run = cli.add_command(sub, "run", help="execute a chapter (-p NAME VALUE overrides a parameter)",
                          examples=["phantom chapter run phantom_advantage -p group_size 8",
                                    "phantom chapter run 04 --profile quick",
                                    "phantom chapter run estimators -p sweep data/runs/lab_paper_graded_2e-3_sft1/"
                                    "sweep.yaml -p runs_root data/runs/lab_paper_graded_2e-3_sft1"], codes=codes)
    run.add_argument("name", help="chapter: short name (phantom_advantage), stem (02_phantom_advantage) or number")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="a parameter of the chapter's parameters cell (`phantom chapter list` names them)")
    run.add_argument("-o", "--output", help="output .ipynb (default: _build/chapters/<stem>.ipynb)")
    run.add_argument("--profile", choices=PROFILES, default="full",
                     help="run profile of the lab runs a chapter reads: full or quick (default: full)")
    run.add_argument("--jobs", type=cli.ArgTypes.count, default=2,
                     help="parallel lab runs when the chapter needs a sweep (default 2)")
    run.add_argument("--force", action="store_true", help="execute even when a cached result matches")
    cli.add_command(sub, "list", help="list the chapters and their parameters", examples=["phantom chapter list"],
                    codes=cli.exit_codes())
    return ap


#: parameters that point a chapter at other data of the same experiment (the paper sweep on another warm
#: start): its fixed prose must still hold there, so a claim that fails exits 1 as in the default run;
#: any other ``-p`` explores other settings, whose results the prose does not describe
RECHECK_PARAMETERS = frozenset({"sweep", "runs_root"})


def same_experiment(declared: str, given: str, root: Path) -> bool:
    """Is sweep ``given`` the chapter's ``declared`` sweep on another warm start?

    True when both define the same cells under the full profile (the only one whose claims are checked)
    once ``sft_seed`` is set aside: e.g. your own run of ``paper`` from another warm start.
    A sweep with other settings (another lr, other groups, ``knobs``) explores, and its results may
    differ from the prose without the prose being wrong.
    """
    from phantom.lab.sweep import expand, load_sweep, sweep_file

    def cells(name: str) -> list[str]:
        return sorted(json.dumps({k: v for k, v in c.spec.to_dict().items() if k != "sft_seed"}, sort_keys=True)
                      for c in expand(load_sweep(sweep_file(name, root)), "full"))

    return cells(declared) == cells(given)


def rechecks(chapter: Chapter, params: Mapping[str, Any], given: Sequence[str], root: Path) -> bool:
    """Do ``-p`` names ``given`` still ask the chapter's claims to hold (so a failed one exits 1)?

    The chapter's experiment is the sweep it runs (``lab_sweep``) or, for a chapter that reads committed
    runs, the default of its ``sweep`` parameter (``data/runs/lab_paper/sweep.yaml``)."""
    if set(given) - RECHECK_PARAMETERS:
        return False
    declared = chapter.meta().get("lab_sweep") or chapter.parameters().get("sweep")
    if params.get("sweep") and declared and str(params["sweep"]) != declared:
        return same_experiment(str(declared), str(params["sweep"]), root)
    return True


@_exit_code
def chapter_main(argv: Sequence[str] | None = None) -> int:
    """``phantom chapter run NAME -p key value ...`` and ``phantom chapter list``."""
    from phantom.cli import parse_args

    args = parse_args(_chapter_parser(), list(sys.argv[1:] if argv is None else argv))
    try:
        root = repo_root()
        if args.cmd == "list":
            for ch in sorted((Chapter(p) for p in (root / "book" / "chapters").glob("*.md")), key=lambda c: c.stem):
                params = ", ".join(f"{k}={v!r}" for k, v in ch.parameters().items())
                print(f"{ch.short:<24} {ch.stem}.md  {params}")
            return 0
        chapter = resolve_chapter(args.name, root)
        params = coerce_parameters([tuple(p) for p in args.parameter], chapter.parameters())
        if takes_profile(chapter) and "profile" not in params:
            params["profile"] = args.profile
    except (ValueError, FileNotFoundError) as exc:
        print(f"phantom chapter: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output).resolve() if args.output else root / "_build" / "chapters" / f"{chapter.stem}.ipynb"
    if out.suffix != ".ipynb":
        print(f"phantom chapter: output {out} must end in .ipynb", file=sys.stderr)
        return 2
    try:  # before the kernel runs: a file where its folder should be, or a folder nobody may write
        from phantom.runs import check_writable_dir

        check_writable_dir(out.parent, what="the output folder of -o")
    except ValueError as exc:
        print(f"phantom chapter: {exc}", file=sys.stderr)
        return 2
    # `-p sweep FILE -p runs_root DIR` points a lab chapter at another sweep (the paper sweep on another warm
    # start): that sweep is the one run, into that folder (cells not finished there are trained there), and
    # the chapter reads it there
    runs = chapter_runs(params, root) if params.get("runs_root") else None  # absolute stays
    given = params.get("sweep")
    sweep = chapter.meta().get("lab_sweep") and (given or chapter.meta()["lab_sweep"])
    if sweep or given:  # a chapter that reads committed runs takes a sweep too: checked before it executes
        try:  # a sweep file is relative to the repository root, as the chapter reads it
            from phantom.lab.sweep import sweep_file

            found = sweep_file(str(sweep or given), root)  # a packaged name stays a name
            if sweep:
                sweep = found if Path(str(sweep)).suffix in (".yaml", ".yml") else sweep
        except ImportError:
            pass  # no lab installed: _run_lab_sweeps says so
        except ValueError as exc:
            print(f"phantom chapter: {exc}", file=sys.stderr)
            return 2
    try:
        if sweep:
            _run_lab_sweeps({str(sweep): [chapter.stem]}, args.profile, args.jobs, runs_root=runs)
        res = execute_chapter(chapter, out, params, root=root, profile=args.profile, runs=runs, force=args.force)
    except (ChapterError, LabMissing) as exc:
        refused = getattr(exc.__cause__, "ename", None) == "ValueError" and args.parameter
        if refused:  # the chapter's own check of its parameters (a ValueError naming the value): bad input
            print(f"phantom chapter: {chapter.stem} refused a -p value: {exc.__cause__.evalue}", file=sys.stderr)
            return 2
        print(f"phantom chapter: {exc}", file=sys.stderr)
        return 1
    how = "cached" if res.cached else f"executed in {res.seconds:.1f} s"
    print(f"{res.path}  ({how}; parameters {res.parameters or 'default'})")
    if res.claims:
        records = {chapter.stem: res.claims}
        log(claims_report(records))
        if failed_claims(records) and rechecks(chapter, params, [name for name, _ in args.parameter], root):
            print(f"phantom chapter: {chapter.stem} states claims its data do not support (see above and the "
                  "'Not reproduced in this build' boxes in the notebook)", file=sys.stderr)
            return 1
        if failed_claims(records):  # the prose describes the default parameters; other values may differ
            log(f"{len(failed_claims(records))} claim(s) do not hold at these parameters; the notebook shows "
                "where (the prose states the defaults' results)")
    return 0


# --------------------------------------------------------------------------------------------
# CLI: phantom book build
# --------------------------------------------------------------------------------------------
class LabMissing(RuntimeError):
    """A chapter needs lab runs but the CPU lab (phantom.lab.sweep) cannot be imported."""


def _run_lab_sweeps(needs: Mapping[str, list[str]], profile: str, jobs: int,
                    on_cells_start: Callable[[], None] | None = None, runs_root: Path | None = None) -> None:
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
        log(f"lab sweep {name!r} (profile {profile}, {jobs} jobs)")
        try:
            run_sweep(name, profile=profile, runs_root=runs_root, jobs=jobs, on_cells_start=on_cells_start)
        except Exception as exc:  # SweepFailed or anything else: the chapters would show no results
            raise RuntimeError(f"lab sweep {name!r} (profile {profile}) needed by {', '.join(chapters)} "
                               f"failed: {exc}") from exc


def _log_eta(needs: Mapping[str, list[str]], profile: str, jobs: int, root: Path, n_chapters: int) -> None:
    """Say up front how long the build should take here (:func:`phantom.lab.eta.build_message`)."""
    try:
        from phantom.lab.eta import build_message
    except ImportError:
        return
    log(build_message(needs, profile, jobs, root, n_chapters))


def vendor_js(root: Path, *, check_only: bool = False) -> None:
    """Run ``scripts/vendor_js.py`` (idempotent: it returns at once when the files are in place)."""
    script = root / "scripts" / "vendor_js.py"
    cmd = [sys.executable, str(script)] + (["--check"] if check_only else [])
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"vendoring the book's JavaScript failed ({' '.join(cmd)}):\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    for line in (proc.stdout + proc.stderr).strip().splitlines()[-2:]:
        log(line)


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
                copy_if_changed(src, dst)
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
    for bib in sorted((root / "book").glob("*.bib")):  # sphinxcontrib-bibtex reads them from the source tree
        copy_if_changed(bib, stage / "book" / bib.name)
    for folder in ("_static", "_ext"):  # assets and the local Sphinx extension, linked not copied
        link, src = stage / "book" / folder, root / "book" / folder
        if src.is_dir() and not link.is_symlink():
            if link.exists():
                shutil.rmtree(link)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(src, target_is_directory=True)
    return targets


def _write_claims(path: Path, claims: Mapping[str, list[dict]], profile: str) -> Path:
    """Every chapter's claim records in one file, for CI and for readers of the build."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"profile": profile, "chapters": claims}, indent=2))
    os.replace(tmp, path)
    return path


def _book_parser() -> argparse.ArgumentParser:
    from phantom import cli

    codes = cli.exit_codes("the book was built, but a checked claim does not hold (see the report), or a step failed")
    ap = cli.command_parser("phantom book", "Execute every chapter and build the HTML book.",
                            ["phantom book build --profile quick", "phantom book build --profile full --out /tmp/book"],
                            codes)
    sub = cli.subcommands(ap)
    b = cli.add_command(sub, "build", help="vendor JS, run the lab sweeps chapters need, execute chapters, build HTML",
                        examples=["phantom book build --profile quick", "phantom book build --force --jobs 1"],
                        codes=codes)
    b.add_argument("--profile", choices=PROFILES, default="full",
                   help="run profile: full (make book) or quick (fewer lab steps and seeds; make test)")
    b.add_argument("--jobs", type=cli.ArgTypes.count, default=2,
                   help="parallel lab runs and chapter kernels (2 cores: 2)")
    b.add_argument("--out", default=None,
                   help="output root: the site goes to OUT/_build/html (default: the repository root)")
    b.add_argument("--force", action="store_true", help="re-execute every chapter and rebuild every page")
    return ap


@_exit_code
def book_main(argv: Sequence[str] | None = None) -> int:
    """``phantom book build --profile quick|full``: the whole pipeline, strict and offline."""
    from phantom.cli import parse_args

    args = parse_args(_book_parser(), list(sys.argv[1:] if argv is None else argv))
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
        _log_eta(needs, args.profile, args.jobs, root, len(chapters))
        t = time.perf_counter()
        from phantom.runs import runs_root

        # the chapters that read no lab runs execute beside the sweep's cells, on the CPU time they
        # leave idle (not beside the SFT: its two threads wait for each other at every op)
        warm: Warmup | None = None

        def start_background() -> None:
            nonlocal warm
            if warm is None and not args.force:
                warm = start_warmup(root, chapters, args.profile, args.jobs, runs_root(),
                                    build / "phantom" / "background")

        try:
            _run_lab_sweeps(needs, args.profile, args.jobs, on_cells_start=start_background)
        except BaseException:
            if warm is not None:
                warm.proc.terminate()
                warm.wait()
            raise
        if warm is not None:
            warm.wait()
        timings["lab"] = time.perf_counter() - t

        t = time.perf_counter()
        targets = _stage(root, stage, chapters)

        def run(item: tuple[Chapter, Path]) -> ExecResult:
            ch, target = item
            res = execute_chapter(ch, target, build_params(ch, args.profile), root=root, profile=args.profile,
                                  force=args.force)
            log(f"{ch.stem}: {'cached' if res.cached else f'executed in {res.seconds:.1f} s'}")
            return res

        # each chapter's kernel is its own process: two at a time use both cores. The kernels inherit
        # os.environ, so the environment is set once around the pool (every chapter gets the same);
        # a per-chapter set-and-restore would race between the threads.
        with environ(chapter_env(root, args.profile, runs_root())), \
                concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(run, targets.items()))
        executed = sum(not r.cached for r in results)
        timings["chapters"] = time.perf_counter() - t
        claims = {r.chapter: r.claims for r in results}
        claims_file = _write_claims(build / "phantom" / "claims.json", claims, args.profile)
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
    log("jupyter-book build (strict: -W -n --keep-going)")
    proc = subprocess.run(cmd, cwd=root, env={**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
    timings["jupyter-book"] = time.perf_counter() - t
    ok = proc.returncode == 0 and (build / "html" / "index.html").is_file()
    status_file.write_text(json.dumps({"status": "ok" if ok else "failed", "profile": args.profile,
                                       "finished": time.time(), "timings_s": timings,
                                       "claims_failed": len(failed_claims(claims))}, indent=2))
    total = time.perf_counter() - t0
    summary = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    log(claims_report(claims))
    if not ok:
        print(f"phantom book: strict jupyter-book build failed (rc {proc.returncode}); see the warnings above",
              file=sys.stderr)
        return 1
    background = f", {warm.executed} of them in the background beside the lab" if warm is not None and warm.executed else ""
    log(f"done in {total:.1f} s ({summary}; {executed + (warm.executed if warm else 0)} of {len(chapters)} "
        f"chapters executed{background})")
    print(build / "html" / "index.html")
    if failed_claims(claims):
        print(f"phantom book: the book is built, but {len(failed_claims(claims))} claim(s) are not reproduced "
              f"by this build's data (listed above; boxes on the pages; {claims_file})", file=sys.stderr)
        return 1
    return 0
