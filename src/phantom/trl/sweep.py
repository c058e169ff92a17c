"""The TRL sweep: the three arms x seeds, each a papermill execution of ``notebooks/trl_arm.py``.

Profiles: ``full`` (the lab's setting on the book's warm start, three seeds, 40 steps) and ``quick`` (a few
steps on a small batch, what the tests run). ``model`` is the lab SFT profile (its task comes with it)::

    nice -n 10 phantom trl sweep --profile full --runs-dir runs/trl
    phantom trl table --runs-dir runs/trl

Cells run one at a time (TRL runs are heavier than lab runs; the CPU is shared), each in its own
papermill process with one torch thread; finished cells are skipped, so a sweep resumes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from phantom.cli import exit_code_of as _exit_code
from phantom.lab import sweep as lab_sweep
from phantom.runs import RunDir, RunInUse, runs_root
from phantom.trl.lab import ARMS, TrlArmSpec

__all__ = ["PROFILES", "SweepFailed", "expand", "run_sweep", "notebook_path", "endpoints"]

PROFILES: dict[str, dict[str, Any]] = {
    "full": {"seeds": [0, 1, 2], "base": {}},
    "quick": {"seeds": [0], "base": {"steps": 2, "prompts": 4, "rollouts": 4, "eval_n": 16, "eval_every": 1,
                                     "max_new": 48}},
}
_NB_DIR = ".trl_notebooks"


class SweepFailed(RuntimeError):
    """Some cells did not finish; the message lists them and their logs."""


def expand(profile: str = "full", *, model: str | None = None, arms: Sequence[str] | None = None,
           seeds: Sequence[int] | None = None) -> list[TrlArmSpec]:
    """The cells of a profile, validated (``model``: lab SFT profile, default ``lab_graded``; ``quick``: ``tiny``)."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; allowed: {', '.join(PROFILES)}")
    prof = PROFILES[profile]
    arms = list(arms or ARMS)
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise ValueError(f"arms {bad} are unknown; allowed: {', '.join(ARMS)}")
    model = model or ("lab_graded" if profile == "full" else "tiny")
    return [TrlArmSpec(**{**prof["base"], "arm": a, "seed": int(s), "model": model, "profile": profile})
            for s in (seeds if seeds is not None else prof["seeds"]) for a in arms]


def notebook_path() -> Path:
    """``notebooks/trl_arm.py`` of this checkout (override with ``$PHANTOM_TRL_NOTEBOOK``)."""
    return lab_sweep.notebook_path("trl_arm", "PHANTOM_TRL_NOTEBOOK")


def run_sweep(profile: str = "full", *, model: str | None = None, arms: Sequence[str] | None = None,
              seeds: Sequence[int] | None = None, runs_dir: str | os.PathLike[str] | None = None,
              dry_run: bool = False, progress: bool = True) -> list[RunDir]:
    """Run every unfinished cell (one at a time) and return all the cells' run folders, in order."""
    from tqdm.auto import tqdm

    from phantom.lab.sft import ensure_sft_model

    cells = expand(profile, model=model, arms=arms, seeds=seeds)
    root = runs_root(runs_dir)
    runs = [RunDir(root / c.run_name()) for c in cells]
    todo, busy = [], []
    for cell, run in zip(cells, runs):
        try:
            if not run.check_startable(cell.to_dict()):
                todo.append(cell)
        except RunInUse as e:
            busy.append(str(e))
    if busy:
        raise RunInUse("cells are being run by another process:\n" + "\n".join(busy))
    if dry_run or not todo:
        return runs
    ensure_sft_model(todo[0].model, progress=progress)
    work = root / _NB_DIR
    nb_in = lab_sweep.materialize_notebook(work, "trl_arm", "PHANTOM_TRL_NOTEBOOK")
    failures = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PHANTOM_RUNS": str(root), "TRL_EXPERIMENTAL_SILENCE": "1", "WANDB_MODE": "disabled"}
    try:
        for cell in tqdm(todo, desc=f"trl sweep {profile}", disable=not progress):
            name = cell.run_name()
            params = work / f"{name}.params.yaml"
            params.write_text(yaml.safe_dump({"spec": cell.to_dict(), "run_name": name, "runs_root": str(root),
                                              "extra": {"sweep": {"name": "trl", "profile": profile}}}))
            log = work / f"{name}.log"
            cmd = [sys.executable, "-m", "papermill", str(nb_in), str(work / f"{name}.ipynb"), "-f", str(params),
                   "-k", "python3", "--no-progress-bar", "--cwd", str(Path.cwd())]
            with log.open("w") as fh:
                rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
            run = RunDir(root / name)
            if rc != 0 or not run.done:
                failures.append(f"{name}: papermill exit {rc}, status {run.status}; log {log}")
            elif (work / f"{name}.ipynb").is_file():
                os.replace(work / f"{name}.ipynb", run.path / "trl_arm.ipynb")
                os.replace(log, run.path / "stdout.log")
    finally:
        nb_in.unlink(missing_ok=True)
    if failures:
        raise SweepFailed("TRL sweep cells failed:\n" + "\n".join(failures))
    return runs


def endpoints(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One row per finished TRL run under ``root``: arm, seed, start -> final accuracy and length."""
    from phantom.runs import iter_runs

    rows = []
    for run in iter_runs(root):
        m = run.manifest()
        if m.get("kind") != "trl":
            continue
        s, summ = m.get("spec", {}), m.get("summary") or {}
        rows.append({"name": run.name, "arm": s.get("arm"), "seed": s.get("seed"), "model": s.get("model"),
                     **{k: summ.get(k) for k in ("start_acc", "final_acc", "min_acc", "start_len", "final_len",
                                                 "first_step_acc_below_0.1", "seconds_per_step",
                                                 "phantom_groups_total", "zeroed_groups_total")},
                     "wall_seconds": m.get("wall_seconds")})
    return sorted(rows, key=lambda r: (list(ARMS).index(r["arm"]) if r["arm"] in ARMS else 9, r["seed"]))


def _seeds(text: str) -> list[int]:
    """``--seeds 0,1,2``: integers >= 0, named when one is not."""
    out = []
    for part in text.split(","):
        if not part.strip().isdigit():
            raise ValueError(f"--seeds {text!r}: {part.strip()!r} is not a seed; allowed: integers >= 0, comma-separated")
        out.append(int(part))
    return out


@_exit_code
def main(argv: list[str] | None = None) -> int:
    """``phantom trl sweep|table``."""
    from phantom import cli

    codes = cli.exit_codes("some cells of the sweep failed; their logs are named")
    ap = cli.command_parser("phantom trl", "TRL's GRPOTrainer on the CPU lab (phantom.trl): the three arms (no "
                            "filter, shaped-score filter, outcome gate) x seeds, and their endpoints.",
                            ["phantom trl sweep --profile quick --runs-dir /tmp/trl",
                             "phantom trl table --runs-dir runs/trl"], codes)
    sub = cli.subcommands(ap)
    sw = cli.add_command(sub, "sweep", help="run the three arms x seeds (notebooks/trl_arm.py via papermill)",
                         examples=["phantom trl sweep --profile quick --runs-dir /tmp/trl",
                                   "phantom trl sweep --profile full --arms none,outcome --seeds 0 --dry-run"],
                         codes=codes)
    sw.add_argument("--profile", default="full", choices=list(PROFILES), help="full or quick (default: full)")
    sw.add_argument("--model", default=None, help="lab SFT profile (default: lab_graded for full, tiny for quick)")
    sw.add_argument("--arms", default=None, help=f"comma list of {', '.join(ARMS)} (default: all)")
    sw.add_argument("--seeds", default=None, help="comma list of seeds (default: the profile's)")
    sw.add_argument("--runs-dir", default=None, help="default: $PHANTOM_RUNS, else ./runs")
    sw.add_argument("--dry-run", action="store_true", help="list the cells and whether they are finished")
    tb = cli.add_command(sub, "table", help="endpoints of the finished TRL runs under a folder (exit 2 when none)",
                         examples=["phantom trl table", "phantom trl table --runs-dir /tmp/trl"],
                         codes=cli.exit_codes())
    tb.add_argument("--runs-dir", default=None, help="default: $PHANTOM_RUNS, else ./runs")
    a = cli.parse_args(ap, argv)
    try:
        if a.cmd == "sweep":
            seeds = _seeds(a.seeds) if a.seeds else None
            arms = a.arms.split(",") if a.arms else None
            expand(a.profile, model=a.model, arms=arms, seeds=seeds)  # every cell checked before any work
            if not a.dry_run:
                from phantom.runs import check_writable_dir

                check_writable_dir(a.runs_dir)
            runs = run_sweep(a.profile, model=a.model, arms=arms, seeds=seeds, runs_dir=a.runs_dir,
                             dry_run=a.dry_run)
            for r in runs:
                print(f"{r.status or 'todo':8s} {r.path}")
            return 0
        rows = endpoints(a.runs_dir)
        if not rows:
            where = runs_root(a.runs_dir)
            raise ValueError(f"no finished TRL run under {where}" + ("" if where.is_dir() else " (no such folder)")
                             + "; allowed: a folder `phantom trl sweep --runs-dir` wrote into")
        for r in rows:
            print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        return 0
    except (ValueError, FileNotFoundError) as e:
        print(f"phantom trl {a.cmd}: {e}", file=sys.stderr)
        return 2
    except SweepFailed as e:
        print(f"phantom trl {a.cmd}: {e}", file=sys.stderr)
        return 1
