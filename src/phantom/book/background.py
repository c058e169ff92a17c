"""Execute the chapters that read no lab runs while the lab sweep runs, at the lowest CPU priority.

A full build spends most of its time in the lab (SFT, then the sweep's two one-thread processes), and
half of the chapters read nothing the lab makes. Executing them only after the lab leaves both
cores to chapters for ~40 s at the end; executing them beside the sweep's cells at ``nice 19``
hands them the CPU time the cells leave idle (a kernel starting and stopping, the launcher polling)
and little more, so the chapters are done when the sweep is. They start only once the SFT warm
start exists: beside SFT's two threads, which wait for each other at every op, the same chapters
made one fresh-clone SFT 65 s slower (205 s against 140 s).

The background process only fills the chapter cache of :mod:`phantom.book.execute` (same cache
keys, same kernel environment as the build's own pass), so the build then finds those chapters
cached; whatever it did not finish, or failed, the build executes and reports as always.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from phantom.book.chapters import Chapter, find_chapters, repo_root
from phantom.book.execute import ChapterError, build_params, chapter_env, environ, execute_chapter, log

__all__ = ["Warmup", "free_chapters", "start_warmup"]


def free_chapters(chapters: Sequence[Chapter]) -> list[Chapter]:
    """The chapters whose results cannot depend on the lab runs: no ``lab_sweep``, no ``reads_runs``."""
    return [ch for ch in chapters if not ch.meta().get("lab_sweep") and not ch.meta().get("reads_runs")]


@dataclass
class Warmup:
    """The background process and its log."""

    proc: subprocess.Popen
    log_path: Path
    stems: list[str]
    executed: int = 0  # chapters it executed (not found cached), known after :meth:`wait`

    def wait(self) -> int:
        """Wait for it (it is normally done long before the lab), replay its log, return its exit status."""
        rc = self.proc.wait()
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("[phantom book]"):
                log(line.removeprefix("[phantom book] ").strip())
                self.executed += "executed in the background" in line
        return rc


def start_warmup(root: Path, chapters: Sequence[Chapter], profile: str, jobs: int, runs: Path,
                 work: Path) -> Warmup | None:
    """Start executing :func:`free_chapters` in a ``nice 19`` process; None when there are none."""
    stems = [ch.stem for ch in free_chapters(chapters)]
    if not stems:
        return None
    log_path = work / "background.log"
    cmd = [sys.executable, "-m", "phantom.book.background", profile, str(jobs), str(runs), str(work), *stems]
    try:
        work.mkdir(parents=True, exist_ok=True)
        with log_path.open("w") as fh:
            proc = subprocess.Popen(cmd, cwd=root, stdout=fh, stderr=subprocess.STDOUT)
    except OSError as exc:  # the build's own pass executes these chapters as always
        log(f"could not start the background chapters ({exc}); they run after the lab")
        return None
    log(f"executing {', '.join(stems)} in the background (nice 19) while the lab runs")
    return Warmup(proc, log_path, stems)


def main(argv: Sequence[str]) -> int:
    """``python -m phantom.book.background PROFILE JOBS RUNS WORK STEM...`` (what :func:`start_warmup` runs)."""
    profile, jobs, runs, work, *stems = argv
    os.nice(19)  # here, not in a preexec_fn (the parent has threads); the kernels inherit it
    root = repo_root()
    by_stem = {ch.stem: ch for ch in find_chapters(root)}
    todo = [by_stem[s] for s in stems]

    def run(ch: Chapter) -> str:
        try:
            res = execute_chapter(ch, Path(work) / f"{ch.stem}.ipynb", build_params(ch, profile), root=root,
                                  profile=profile, runs=Path(runs))
        except ChapterError as exc:  # the build's own pass executes it again and reports the error
            return f"{ch.stem}: failed in the background ({str(exc).splitlines()[0]})"
        return f"{ch.stem}: {'cached' if res.cached else f'executed in the background in {res.seconds:.1f} s'}"

    with environ(chapter_env(root, profile, Path(runs))), \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        for line in pool.map(run, todo):
            print(f"[phantom book] {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
