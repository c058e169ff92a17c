"""Benchmark: `phantom audit` on inputs from kilobytes to 50 MB, against reading the file once.

Each row runs the real command line (`python -m phantom.cli audit FILE`, a fresh process, as a user
or pre-commit would) and, as the baseline in the same run, a fresh process that only reads the file
once (`python -c "open(f,'rb').read()"`: interpreter start plus the bytes). Times are the median of
--repeats runs: wall seconds, and CPU seconds (user + system of the child, from getrusage), since on
a shared machine the wall time mostly measures waiting for a core. Inputs (generated into a temp dir):

* a 9 kB array-style verl launch script (the size of verl's largest example scripts),
* a launch script and a YAML config just under the audit's size limit (512 KiB),
* a 50 MB file (refused with exit 2 before it is read),
* a 100-file batch in one process, as pre-commit runs the hook on a repository's launch scripts and
  configs (``--skip-non-trainer``): 20 named fixtures of tests/fixtures/audit/shapes/ (verl scripts
  of every shape, YAML, TRL YAML/JSON/Python) copied five times each. Its baseline reads the same
  100 files once in one fresh process.

usage: python benchmarks/bench_audit.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phantom.audit.text import MAX_BYTES

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "tests" / "fixtures" / "audit" / "shapes"
FIXTURE = SHAPES / "arrays_gsm8k_clean.sh"
#: the batch's files: fixed by name, so that fixtures added later do not change what is timed
BATCH = ("arrays_gsm8k_clean.sh", "arrays_geo3k.sh", "arrays_append_filter_score.sh", "dict_override.sh",
         "ray_multiline_runtime_env.sh", "heredoc_config.sh", "if_branch_metric.sh", "two_commands.sh",
         "sweep_loop.sh", "function_arms.sh", "torchrun_legacy_reward.sh", "recipe_legacy_overlong.sh",
         "no_trainer.sh", "train_geo3k.slurm", "verl_merge_keys.yaml", "verl_grpo_vectorized.yaml",
         "trl_openr1_recipe.yaml", "trl_normalize_then_sum.json", "trl_single_continuous.py", "trl_async.py")


def _script(n_bytes: int) -> str:
    head = ["#!/usr/bin/env bash", "ARGS=("]
    body, size, i = [], 0, 0
    while size < n_bytes - 200:
        line = f"    actor_rollout_ref.extra.key_{i}=value_{i}"
        body.append(line)
        size += len(line) + 1
        i += 1
    return "\n".join(head + body + [")", 'python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "${ARGS[@]}"',
                                    ""])


def _yaml(n_bytes: int) -> str:
    out, size, i = ["algorithm:", "  adv_estimator: grpo"], 0, 0
    while size < n_bytes - 200:
        block = f"extra_{i}:\n  a: {i}\n  b: [1, 2]\n  c: text"
        out.append(block)
        size += len(block) + 1
        i += 1
    return "\n".join(out) + "\n"


def _run(cmd: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        inputs = {
            "launch script, 9 kB": FIXTURE.read_text() * 1,
            f"launch script, {MAX_BYTES // 1024} KiB": _script(MAX_BYTES - 1024),
            f"verl YAML, {MAX_BYTES // 1024} KiB": _yaml(MAX_BYTES - 1024),
        }
        paths = {}
        for i, (name, text) in enumerate(inputs.items()):
            p = t / (f"in{i}.sh" if "script" in name else f"in{i}.yaml")
            p.write_text(text if "9 kB" not in name else text + "\n" * (9000 - len(text)))
            paths[name] = p
        huge = t / "huge.sh"
        with huge.open("wb") as fh:
            fh.write(b"#!/bin/bash\n" + b"# padding\n" * (50 * 1024 * 1024 // 10))
        paths["50 MB file"] = huge
        batch_dir = t / "batch"
        batch_dir.mkdir()
        batch = []
        for copy in range(5):
            for name in BATCH:
                dst = batch_dir / f"c{copy}_{name}"
                dst.write_bytes((SHAPES / name).read_bytes())
                batch.append(str(dst))
        rows = []
        for name, p in [*paths.items(), ("100-file batch, one process", batch_dir)]:
            files = batch if p == batch_dir else [str(p)]
            audit_cmd = [sys.executable, "-m", "phantom.cli", "audit", *files] + (
                ["--skip-non-trainer"] if p == batch_dir else [])
            read_cmd = [sys.executable, "-c", f"for f in {files!r}: open(f, 'rb').read()"]
            a = [_run(audit_cmd) for _ in range(args.repeats)]
            b = [_run(read_cmd) for _ in range(args.repeats)]
            med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
            size = sum(Path(f).stat().st_size for f in files)
            rows.append((name, size, a[0][2], med(a, 0), med(a, 1), med(b, 0), med(b, 1)))
    load = os.getloadavg()[0]
    print(f"phantom audit, median of {args.repeats} fresh processes (load average {load:.1f} on {os.cpu_count()} "
          "cores)\n")
    print("| input | bytes | exit | audit wall s | audit CPU s | read-once wall s | read-once CPU s | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, size, rc, aw, ac, bw, bc in rows:
        print(f"| {name} | {size:,} | {rc} | {aw:.2f} | {ac:.2f} | {bw:.2f} | {bc:.2f} | {ac / max(bc, 1e-3):.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
