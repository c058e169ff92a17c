"""``phantom verl sweep``: verl's own filter and the project's gates on verl's trainer, arms x seeds on the CPU lab.

Each cell is one papermill execution of ``notebooks/verl_arm.py`` (which calls
:func:`phantom.verl.launch.launch`), one at a time, under one Ray head shared by the whole sweep
(:mod:`phantom.verl.cluster`); a finished cell is reused, so a stopped sweep resumes where it stopped.
The cells (``CELLS``), all from the ``cpu_lab`` preset (the lab's warm start and setting), with the
project's ``phantom_grpo_none`` estimator (verl's GRPO, tested equal, plus per-step group counts) unless
the cell gates itself:

* ``a``: no filter; ``b``: ``algorithm.filter_groups.enable=True`` and no metric (verl 0.9.1's default,
  ``reward``: the summed shaped score); ``c``: the same with ``metric=acc`` (the reward's binary outcome);
  ``d``: Dr. GRPO (``norm_adv_by_std_in_grpo=False``) with the default-metric filter;
* ``outcome``: the project's outcome gate (``phantom_grpo_outcome``), no filter; ``drgrpo``: Dr. GRPO, no filter.

Run folders land in ``--runs-dir``; ``--slim`` then deletes from each finished folder what is not
committed (``stdout.log``, the executed notebook, Hydra's folder), keeping ``manifest.json``,
``metrics.jsonl`` and the small telemetry files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["CELLS", "LABELS", "PROFILES", "Cell", "cells", "cell_of", "endpoints", "run_sweep", "slim", "KEEP", "main"]

#: cell -> spec fields on top of the profile's preset
CELLS: dict[str, dict[str, Any]] = {
    "a": {"arm": "none"},
    "b": {"arm": "none", "dapo": True, "dapo_metric": "default"},
    "c": {"arm": "none", "dapo": True, "dapo_metric": "acc"},
    "d": {"arm": "none", "estimator": "drgrpo", "dapo": True, "dapo_metric": "default"},
    "outcome": {"arm": "outcome"},
    "drgrpo": {"arm": "none", "estimator": "drgrpo"},
}
#: what each cell is, in the book's words
LABELS: dict[str, str] = {
    "a": "no filter", "b": "filter, verl's default metric (reward)", "c": "filter, metric=acc",
    "d": "Dr. GRPO, filter with verl's default metric", "outcome": "outcome gate, no filter",
    "drgrpo": "Dr. GRPO, no filter",
}
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"preset": "cpu_lab", "seeds": [0, 1, 2], "set": {}},
    # what the tests run: the same code path on the tiny random model, two steps
    "quick": {"preset": "cpu_tiny", "seeds": [0], "set": {"val_freq": 1}},
}
#: files of a run folder that are committed (everything else is regenerated or large)
#: the refill bound of filtered cells, in generation batches per step: the paper's max_num_gen_batches (§8)
STARVE_BATCHES = 10
KEEP = ("manifest.json", "metrics.jsonl", "gate.jsonl", "rollout.jsonl", "sync.jsonl")
_NB_DIR = ".verl_notebooks"


class Cell(dict):
    """One cell: ``name`` (``verl-<cell>-s<seed>``), ``cell``, ``seed`` and ``fields`` (spec fields)."""


def cells(profile: str = "full", *, only: list[str] | None = None, seeds: list[int] | None = None) -> list[Cell]:
    """The cells of a profile, seed-major (every arm of seed 0 first), validated without building anything."""
    from phantom.verl.spec import make_spec

    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; allowed: {', '.join(PROFILES)}")
    names = list(only or CELLS)
    bad = [c for c in names if c not in CELLS]
    if bad or not names:
        raise ValueError(f"cells {bad or names} are unknown; allowed: {', '.join(CELLS)}")
    prof = PROFILES[profile]
    out = []
    for seed in (seeds if seeds is not None else prof["seeds"]):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} is invalid; allowed: an integer >= 0")
        for c in names:
            fields = {**prof["set"], **CELLS[c], "seed": seed}
            make_spec(prof["preset"], check_inputs=False, **fields)  # every field checked, nothing built
            out.append(Cell(name=f"verl-{c}-s{seed}", cell=c, seed=seed, preset=prof["preset"], fields=fields))
    return out


def cell_of(spec: dict[str, Any]) -> str | None:
    """The cell a run's spec belongs to (its manifest ``spec``), or None for anything else."""
    filt = spec.get("dapo_metric") if spec.get("dapo") else None
    key = (spec.get("arm"), spec.get("estimator", "grpo"), filt)
    for name, f in CELLS.items():
        want = (f["arm"], f.get("estimator", "grpo"), f.get("dapo_metric") if f.get("dapo") else None)
        if key == want:
            return name
    return None


def endpoints(root: str | os.PathLike[str], collapse_acc: float = 0.05, early_steps: int = 10) -> Any:
    """One row per finished verl run under ``root`` that belongs to a cell: held-out accuracy and length at
    the first and last validation, the first validation below ``collapse_acc``, the filter's refill
    telemetry, and the trained groups' all-fail and phantom shares over steps 1..``early_steps``.

    ``status`` is ``done`` (all steps) or ``starved`` (stopped by the refill bound at step ``starved_at``;
    its last validation is then the last one before that step)."""
    import pandas as pd

    from phantom.runs import iter_runs
    from phantom.verl.launch import read_run_metrics

    rows = []
    for run in iter_runs(root, status=None):
        m = run.manifest()
        cell = cell_of(m.get("spec", {})) if m.get("kind") == "verl" else None
        if cell is None or not run.finished:
            continue
        df = read_run_metrics(run.path)
        acc_key = next(c for c in df.columns if c.startswith("val-core/") and c.endswith("/acc/mean@1"))
        acc, length = df[acc_key].dropna(), df[acc_key.replace("val-core/", "val-aux/").replace("/acc/", "/len_chars/")].dropna()
        train = df.loc[1:]
        below = acc[acc < collapse_acc]

        def mean(key: str, frame: Any = train, default: float = float("nan")) -> float:
            return float(frame[key].fillna(0).mean()) if key in frame else default

        early = train.loc[:early_steps]
        b = int(m["spec"]["train_batch_size"])
        rows.append({
            "name": run.name, "cell": cell, "seed": m["spec"]["seed"], "label": LABELS[cell], "status": m["status"],
            "starved_at": (m.get("starved") or {}).get("step"),
            "acc0": float(acc.iloc[0]), "acc_end": float(acc.iloc[-1]), "acc_min": float(acc.min()),
            "collapse": int(below.index[0]) if len(below) else None,
            "len0": float(length.iloc[0]), "len_end": float(length.iloc[-1]),
            "tok0": float(train["response_length/mean"].iloc[0]), "tok_end": float(train["response_length/mean"].iloc[-1]),
            "filter": (m.get("filter_groups") or {}).get("metric") if (m.get("filter_groups") or {}).get("enable") else None,
            "refill_frac": mean("phantom/refilled") if m["spec"].get("dapo") else 0.0,
            "evicted": float(train.get("training/filter_groups/evicted_samples", pd.Series(dtype=float)).fillna(0).sum()),
            "prompts_per_trained": (mean("phantom/prompts_generated") / b) if m["spec"].get("dapo") else 1.0,
            "all_fail_early": mean("phantom/frac/all_fail", early), "phantom_early": mean("phantom/frac/phantom", early),
            "steps": int(train.index.max()), "minutes": (m["finished"] - m["started"]) / 60,
        })
    order = list(CELLS)
    return pd.DataFrame(rows).sort_values(["cell", "seed"], key=lambda c: c.map(order.index) if c.name == "cell" else c,
                                          ignore_index=True) if rows else pd.DataFrame()


def slim(run: Path) -> list[str]:
    """Delete from a finished run folder everything but :data:`KEEP`; returns what was removed."""
    removed = []
    for p in sorted(run.iterdir()):
        if p.name in KEEP:
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        removed.append(p.name)
    return removed


def _notebook_params(cell: Cell, root: Path, profile: str, starve_batches: int | None = None) -> dict[str, Any]:
    f = dict(cell["fields"])
    known = ("arm", "estimator", "dapo", "dapo_metric", "seed")
    return {"preset": cell["preset"], **{k: f.pop(k) for k in known if k in f}, "extra": f, "name": cell["name"],
            "runs_dir": str(root), "sweep": {"name": "verl", "profile": profile, "cell": cell["cell"]},
            **({"starve_batches": starve_batches} if starve_batches and cell["fields"].get("dapo") else {})}


def run_sweep(profile: str = "full", *, only: list[str] | None = None, seeds: list[int] | None = None,
              runs_dir: str | os.PathLike[str] | None = None, dry_run: bool = False, progress: bool = True,
              shared_ray: bool = True, keep: bool = True, starve_batches: int | None = STARVE_BATCHES) -> list[Any]:
    """Run every unfinished cell, one at a time; return the cells' run folders in order.

    ``starve_batches``: a filtered cell whose step generates more than this many generation batches stops
    and is marked ``starved`` (:mod:`phantom.verl.starve`; verl-recipe's DAPO trainer stops at its
    ``max_num_gen_batches``, 10 in the paper's §8 runs); None: V1's unbounded refill.

    ``shared_ray``: one Ray head for all cells (``phantom.verl.cluster``); ``keep=False`` slims each
    finished folder to :data:`KEEP`. Raises ``RuntimeError`` listing the cells that failed.
    """
    from phantom.lab import sweep as lab_sweep
    from phantom.runs import RunDir, runs_root
    from phantom.verl.cluster import term_as_interrupt
    from phantom.verl.spec import make_spec

    todo_cells = cells(profile, only=only, seeds=seeds)
    root = runs_root(runs_dir)
    runs = [RunDir(root / c["name"]) for c in todo_cells]
    todo = [c for c, r in zip(todo_cells, runs) if not r.finished]
    if dry_run or not todo:
        return runs
    first = make_spec(todo[0]["preset"], **todo[0]["fields"])  # builds the warm start and data once, before Ray
    work = root / _NB_DIR
    nb_in = lab_sweep.materialize_notebook(work, "verl_arm", "PHANTOM_VERL_NOTEBOOK")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PHANTOM_RUNS": str(root),
           "PHANTOM_VERL_PREFLIGHT_CACHE": str(work / f"preflight.{os.getpid()}.json")}
    with term_as_interrupt():  # `kill` of the sweep stops its Ray head, as Ctrl-C does
        failures = _run_cells(todo, root, profile, work, nb_in, env, first, shared_ray, progress, keep, starve_batches)
    if failures:
        raise RuntimeError("verl sweep cells failed:\n" + "\n".join(failures))
    return runs


def _run_cells(todo: list[Cell], root: Path, profile: str, work: Path, nb_in: Path, env: dict[str, str], first: Any,
               shared_ray: bool, progress: bool, keep: bool, starve_batches: int | None) -> list[str]:
    """The cells one at a time under the sweep's Ray head (started here, stopped however this ends); returns a
    line per cell that failed."""
    import yaml
    from tqdm.auto import tqdm

    from phantom.runs import RunDir
    from phantom.verl.doctor import run_env

    head, failures = None, []
    try:
        if shared_ray and not env.get("RAY_ADDRESS"):  # a head the caller started ($RAY_ADDRESS) is joined as is
            from phantom.verl.cluster import RayHead

            head = RayHead(run_env(first, root), echo=progress)
            head.start()
            env.update(head.run_env())
        elif not shared_ray:
            env.pop("RAY_ADDRESS", None)
        for cell in tqdm(todo, desc=f"verl sweep {profile}", unit="run", disable=not progress):
            params = work / f"{cell['name']}.params.yaml"
            params.write_text(yaml.safe_dump(_notebook_params(cell, root, profile, starve_batches)))
            log, out_nb = work / f"{cell['name']}.log", work / f"{cell['name']}.ipynb"
            cmd = [sys.executable, "-m", "papermill", str(nb_in), str(out_nb), "-f", str(params), "-k", "python3",
                   "--no-progress-bar", "--cwd", str(Path.cwd())]
            with log.open("w") as fh:
                rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
            run = RunDir(root / cell["name"])
            if rc != 0 or not run.finished:
                failures.append(f"{cell['name']}: papermill exit {rc}, status {run.status}; log {log}")
                continue
            if keep:
                os.replace(out_nb, run.path / "verl_arm.ipynb")
                os.replace(log, run.path / "notebook.log")
            else:
                slim(run.path)
                out_nb.unlink(missing_ok=True)
                log.unlink(missing_ok=True)
    finally:
        nb_in.unlink(missing_ok=True)
        Path(env["PHANTOM_VERL_PREFLIGHT_CACHE"]).unlink(missing_ok=True)
        if head is not None:
            head.stop()
    return failures


def main(argv: list[str] | None = None) -> int:
    """``phantom verl sweep``."""
    ap = argparse.ArgumentParser(
        prog="phantom verl sweep", description="verl's filter and the project's gates on verl's trainer, arms x "
        "seeds (notebooks/verl_arm.py via papermill; finished cells are reused)",
        epilog="example: phantom verl sweep --cells b,c --seeds 0 --runs-dir runs/verl_filter\n"
               "exit codes: 0 done, 1 a cell failed, 2 bad input", formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="full", choices=list(PROFILES), help="full: cpu_lab, seeds 0-2; quick: tiny")
    ap.add_argument("--cells", default=None, help=f"comma list of {', '.join(CELLS)} (default: all)")
    ap.add_argument("--seeds", default=None, help="comma list of seeds (default: the profile's)")
    ap.add_argument("--runs-dir", default=None, help="where the run folders go (default: $PHANTOM_RUNS or ./runs)")
    ap.add_argument("--dry-run", action="store_true", help="list the cells and whether they are finished")
    ap.add_argument("--slim", action="store_true", help="keep only " + ", ".join(KEEP) + " in finished folders")
    ap.add_argument("--own-ray", action="store_true", help="let each run start its own Ray cluster")
    ap.add_argument("--starve-batches", type=int, default=STARVE_BATCHES, metavar="N",
                    help="stop a filtered cell's step after N generation batches and mark the run starved "
                         f"(default {STARVE_BATCHES}, the paper's max_num_gen_batches; 0: no bound)")
    a = ap.parse_args(argv)
    try:
        if a.starve_batches < 0:
            raise ValueError(f"--starve-batches {a.starve_batches} is invalid; allowed: an integer >= 1, or 0 for no bound")
        only = [c.strip() for c in a.cells.split(",") if c.strip()] if a.cells else None
        try:
            seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else None
        except ValueError:
            raise ValueError(f"--seeds {a.seeds!r} is invalid; allowed: a comma list of integers >= 0") from None
        runs = run_sweep(a.profile, only=only, seeds=seeds, runs_dir=a.runs_dir, dry_run=a.dry_run,
                         shared_ray=not a.own_ray, keep=not a.slim, starve_batches=a.starve_batches or None)
    except (ValueError, FileNotFoundError) as exc:
        print(f"phantom verl sweep: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"phantom verl sweep: {exc}", file=sys.stderr)
        return 1
    for r in runs:
        print(f"{r.status or 'todo':8s} {r.path}")
    return 0
