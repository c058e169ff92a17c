"""Benchmark: one 40-step lab arm under glibc's malloc (the baseline) and under tcmalloc, side by side.

Each round starts the same arm twice at once through the ``phantom`` console script, once with
``PHANTOM_MALLOC=system`` and once with the default (tcmalloc preloaded), one torch thread each, so the
two share the machine's two cores and whatever else it is doing at that moment; this machine's speed
drifts by ~10% between runs minutes apart, which would swamp a ~5% effect measured one after the other.
Reports each run's own wall time (``wall_seconds`` in its manifest), the ratio to the baseline of the
same round, and whether the two runs logged the same values (they must: an allocator does no arithmetic).

usage: PHANTOM_ARTIFACTS=<artifacts with the lab warm start> python benchmarks/bench_malloc.py
                                                     [--arms outcome,none] [--rounds 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from phantom.proc.malloc import tcmalloc_path


def _values(run: Path) -> list:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith("timing_s/")}) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="outcome,none")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    lib = tcmalloc_path()
    if lib is None:
        sys.exit("no tcmalloc library on this machine; scripts/setup_env.sh installs Debian's libtcmalloc-minimal4")
    exe = shutil.which("phantom", path=str(Path(sys.executable).parent)) or "phantom"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    load = os.getloadavg()
    print(f"lab allocator benchmark: {a.steps}-step arms, model 'lab', 1 torch thread each, two at once, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\ntcmalloc: {lib}\n")
    print(f"{'arm':<9}{'round':>6}{'system s':>10}{'tcmalloc s':>12}{'ratio':>8}  same values")
    print("-" * 58)
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in a.arms.split(","):
            for r in range(1, a.rounds + 1):
                root = Path(tmp) / f"{arm}-{r}"
                procs = {m: subprocess.Popen([exe, "lab", "run", "--arm", arm, "--seed", "0", "--steps", str(a.steps),
                                              "--runs-dir", str(root), "--name", m],
                                             env={**env, "PHANTOM_MALLOC": m}, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True)
                         for m in ("system", "tcmalloc")}
                for m, p in procs.items():
                    _, err = p.communicate()
                    if p.returncode:
                        sys.exit(f"{m} run failed:\n{err[-2000:]}")
                man = {m: json.loads((root / m / "manifest.json").read_text()) for m in procs}
                bad = [m for m in procs if man[m]["malloc"] != m]
                if bad:
                    sys.exit(f"run(s) {bad} did not get the allocator asked for: {[man[m]['malloc'] for m in bad]}")
                base, new = man["system"]["wall_seconds"], man["tcmalloc"]["wall_seconds"]
                same = _values(root / "system") == _values(root / "tcmalloc")
                ratios.setdefault(arm, []).append(new / base)
                print(f"{arm:<9}{r:>6}{base:>10.1f}{new:>12.1f}{new / base:>8.3f}  {'yes' if same else 'NO'}")
    print()
    for arm, rs in ratios.items():
        print(f"{arm}: tcmalloc / system wall, mean over {len(rs)} rounds: {statistics.mean(rs):.3f}")


if __name__ == "__main__":
    main()
