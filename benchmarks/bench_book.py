"""`make book` from a fresh clone, phase by phase: this checkout against a baseline commit, in one run.

    python benchmarks/bench_book.py [--baseline 89e826b] [--ref HEAD] [--keep DIR]

Each ref is cloned into a temporary folder and built with `make book` exactly as a new user would (its
own .venv, from the wheels and caches this machine already has; no warm start or run folder is shared
between the two clones: `PHANTOM_ARTIFACTS` and `PHANTOM_RUNS` point inside each clone). The phases come
from the build's own record (`_build/phantom/last_build.json`) and the set-up time from the wall clock
around `make setup`. The lab's one-second probe (`phantom.lab.eta.probe_seconds`, this checkout's) is measured
before each build, so a reader can tell a slower machine from a slower build, and the CPU seconds of each phase's
process tree beside its wall time (other work on the machine inflates wall time, hardly CPU time); the
last column is after / before.
Results: benchmarks/results_book.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    """User + system CPU seconds of every finished child process so far (the builds' process trees):
    a measure of the work that other load on the machine does not inflate as it does wall time."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(ref: str, where: Path) -> dict[str, float]:
    """Clone ``ref`` into ``where`` and time `make setup` and `make book` there."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", ref], check=True)
    env = {**os.environ, "PHANTOM_ARTIFACTS": str(where / "artifacts"), "PHANTOM_RUNS": str(where / "runs")}
    env.pop("VIRTUAL_ENV", None)
    t, cpu = time.perf_counter(), _children_cpu()
    subprocess.run(["make", "-C", str(where), "setup", "SETUP_BROWSER=0"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    setup, setup_cpu = time.perf_counter() - t, _children_cpu() - cpu
    from phantom.lab.eta import probe_seconds  # this checkout's probe: the same measure for both builds

    probe = probe_seconds()
    t, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(["make", "-C", str(where), "book"], env=env, capture_output=True, text=True)
    total, total_cpu = time.perf_counter() - t, _children_cpu() - cpu
    record = json.loads((where / "_build" / "phantom" / "last_build.json").read_text())
    out = {"setup": setup, **{k: float(v) for k, v in record.get("timings_s", {}).items()},
           "make book (after set-up)": total, "CPU seconds: set-up": setup_cpu,
           "CPU seconds: make book (after set-up)": total_cpu, "exit code": float(proc.returncode),
           "claims failed": float(record.get("claims_failed", -1))}
    out["probe before the build (s)"] = probe
    return out


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="89e826b", help="the commit to compare with (default: 89e826b)")
    ap.add_argument("--ref", default="HEAD", help="the commit measured (default: HEAD)")
    ap.add_argument("--keep", default=None, help="build in this folder and keep the clones")
    ap.add_argument("--only", choices=("before", "after"), default=None,
                    help="build one of the two (for a machine busy with other work at one time of the day)")
    args = ap.parse_args(argv)
    base = Path(args.keep or tempfile.mkdtemp(prefix="bench_book_"))
    rows = {}
    for label, ref in (("before", args.baseline), ("after", args.ref)):
        if args.only not in (None, label):
            rows[label] = {}
            continue
        print(f"[bench_book] {label}: make book at {ref} in {base / label}", file=sys.stderr, flush=True)
        rows[label] = build(ref, base / label)
    keys = list(dict.fromkeys([*rows["before"], *rows["after"]]))
    print(f"| phase (s) | before ({args.baseline}) | after ({args.ref}) | after / before |")
    print("|---|---|---|---|")
    for k in keys:
        b, a = rows["before"].get(k), rows["after"].get(k)
        ratio = f"{a / b:.2f}" if a is not None and b else ""
        print(f"| {k} | {_fmt(b)} | {_fmt(a)} | {ratio} |")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; cores: {os.cpu_count()}")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
