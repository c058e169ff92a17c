"""Benchmark: what a lab sweep spends per cell outside the arm's own training loop.

A sweep cell is a papermill execution of ``notebooks/lab_arm.py`` in a fresh kernel: the launcher
process, the kernel's start, its imports (torch, phantom, plotly), the step-0 evaluation and the
run's figure all come on top of the training steps. This runs one small sweep (``--cells`` cells of
``--steps`` RL steps on the lab model, ``--jobs`` at a time) once per configuration, in the same
process tree:

* ``baseline``: batch kernels off (``PHANTOM_BATCH_KERNELS=0``), the step-0 evaluation cache off
  (``PHANTOM_EVAL0_CACHE=0``) and the kernel zygote off (``PHANTOM_ZYGOTE=0``), i.e. every cell starts
  as before those three changes;
* ``no-zygote``: the first two on, the zygote off (round 4's ``after``);
* ``after``: all three on (the defaults).

and reports per configuration the sweep's wall time, the cells' own time (``manifest.json``:
created -> finished), and the overhead per cell: ``(wall x jobs - cells' time) / cells``, the
CPU-seconds per cell that are not the arm's training. The runs go to a temporary folder; the
default ``lab`` warm start must exist (``phantom lab sft --model lab``) or is built first.

usage: python benchmarks/bench_sweep.py [--cells 8] [--steps 2] [--jobs 2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from phantom.lab.sft import ensure_sft_model
from phantom.lab.sweep import run_sweep

CONFIGS = {"baseline": {"PHANTOM_BATCH_KERNELS": "0", "PHANTOM_EVAL0_CACHE": "0", "PHANTOM_ZYGOTE": "0"},
           "no-zygote": {"PHANTOM_BATCH_KERNELS": "1", "PHANTOM_EVAL0_CACHE": "1", "PHANTOM_ZYGOTE": "0"},
           "after": {"PHANTOM_BATCH_KERNELS": "1", "PHANTOM_EVAL0_CACHE": "1", "PHANTOM_ZYGOTE": "1"}}


def sweep_file(folder: Path, cells: int, steps: int) -> Path:
    """A sweep of ``cells`` default-model cells (two arms x seeds), ``steps`` steps, one evaluation at the end."""
    seeds = list(range(cells // 2))
    doc = {"name": "bench", "base": {"steps": steps, "model": "lab", "eval_every": steps},
           "profiles": {"full": {}}, "groups": {"g": {"grid": {"arm": ["none", "outcome"], "seed": seeds}}}}
    p = folder / "bench.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def one(config: str, sweep: Path, root: Path, jobs: int, ckpt: Path) -> dict[str, float]:
    shutil.rmtree(ckpt / "eval0", ignore_errors=True)  # the first cell of a sweep fills the cache
    old = {k: os.environ.get(k) for k in CONFIGS[config]}
    os.environ.update(CONFIGS[config])
    try:
        t0 = time.perf_counter()
        runs = run_sweep(sweep, runs_root=root, jobs=jobs, progress=False)
        wall = time.perf_counter() - t0
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    own = 0.0
    for r in runs:
        m = json.loads((r.path / "manifest.json").read_text())
        own += m["finished"] - m["created"]
    return {"wall": wall, "own": own, "cells": len(runs), "overhead": (wall * jobs - own) / len(runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="repeat the configurations this many times, alternating their order")
    args = ap.parse_args()
    if args.cells < 2 or args.cells % 2:
        ap.error(f"--cells={args.cells} is invalid; allowed: an even number >= 2 (two arms x seeds)")
    ckpt = Path(ensure_sft_model("lab"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="phantom-bench-sweep-") as tmp:
        sweep = sweep_file(Path(tmp), args.cells, args.steps)
        for rnd in range(args.rounds):
            order = list(CONFIGS) if rnd % 2 == 0 else list(reversed(CONFIGS))
            for config in order:
                r = one(config, sweep, Path(tmp) / f"runs-{config}-{rnd}", args.jobs, ckpt)
                rows.append((config, r))
    print(f"lab sweep overhead: {args.cells} cells x {args.steps} steps (model 'lab'), {args.jobs} jobs, "
          f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(f"{'config':<10} {'sweep wall s':>12} {'cells own s':>12} {'overhead s/cell':>16}")
    print("-" * 54)
    for config, r in rows:
        print(f"{config:<10} {r['wall']:>12.1f} {r['own']:>12.1f} {r['overhead']:>16.2f}")

    def mean(config: str, key: str) -> float:
        vals = [r[key] for c, r in rows if c == config]
        return sum(vals) / len(vals)

    base = mean("baseline", "wall")
    print("\nmean over rounds (ratio: sweep wall / baseline's)")
    for config in CONFIGS:
        print(f"{config:<10} wall {mean(config, 'wall'):6.1f} s  ratio {mean(config, 'wall') / base:.2f}  "
              f"overhead {mean(config, 'overhead'):.2f} s/cell")
    print("(overhead: CPU-seconds per cell outside the run folder's own time; the step-0 evaluation is inside it)")


if __name__ == "__main__":
    main()
