"""Benchmark: the lab before and after a change, in one run, each against its own matmul baseline.

Runs ``benchmarks/bench_lab.py`` three times in fresh processes, one after the other on the same
machine, and prints the three tables:

1. **before**: the benchmark of another checkout (``--before DIR``, e.g. a ``git worktree`` of an
   older commit) on that checkout's own default lab model;
2. **after, same model**: this checkout's code on the *before* checkpoint and its task (``--before-ckpt``,
   ``--before-task``), so the code's speed is compared on identical work;
3. **after, new default**: this checkout's code on its own default lab model (the richer worked answers
   cost more tokens per step).

Every table carries its own fp32 matmul baseline measured in that process, so the ``x matmul`` column
is comparable across the three even when the machine's load changes between them.

usage: python benchmarks/bench_lab_versions.py --before ../old --before-ckpt DIR
           [--before-task '{"terms": [2, 5], "style": "terse"}'] [--before-max-new 80] [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(cmd: list[str], cwd: Path, src: Path, artifacts: str | None) -> str:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    if artifacts:
        env["PHANTOM_ARTIFACTS"] = artifacts
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd} (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout[out.stdout.find("CPU lab benchmark"):]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, type=Path, help="checkout of the older code")
    ap.add_argument("--before-artifacts", default=None, help="PHANTOM_ARTIFACTS of the older checkout")
    ap.add_argument("--before-ckpt", required=True, help="the older default lab checkpoint folder")
    ap.add_argument("--before-task", default='{"terms": [2, 5], "style": "terse"}',
                    help="TaskConfig fields of the older lab task, in this checkout's schema")
    ap.add_argument("--before-max-new", type=int, default=80)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    before = args.before.resolve()
    if not (before / "benchmarks" / "bench_lab.py").is_file():
        raise SystemExit(f"--before {before}: no benchmarks/bench_lab.py there")
    if not Path(args.before_ckpt, "config.json").is_file():
        raise SystemExit(f"--before-ckpt {args.before_ckpt}: not a checkpoint folder (no config.json)")
    py, steps = sys.executable, ["--steps", str(args.steps)]
    root = HERE.parent
    tables = [
        ("before (older code, its lab model)",
         _run([py, "benchmarks/bench_lab.py", *steps], before, before / "src", args.before_artifacts)),
        ("after, same model (this code, older checkpoint and task)",
         _run([py, "benchmarks/bench_lab.py", *steps, "--checkpoint", args.before_ckpt,
               "--set", f"task={args.before_task}", "--set", f"max_new={args.before_max_new}"],
              root, root / "src", None)),
        ("after, new default (this code, its lab model)",
         _run([py, "benchmarks/bench_lab.py", *steps], root, root / "src", None)),
    ]
    for title, table in tables:
        print(f"## {title}\n\n```\n{table.strip()}\n```\n")


if __name__ == "__main__":
    main()
