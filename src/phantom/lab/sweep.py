"""Sweeps: many lab arms, each executed as a real papermill run of ``notebooks/lab_arm.py``.

A sweep file (``src/phantom/lab/sweeps/<name>.yaml``) names a ``base`` spec, ``profiles`` (``full``,
``quick``) that override it (``base``; ``seeds``; ``groups``: which groups run; ``set``: per-group
fields that override the group's own ``set`` and grid), and ``groups`` of cells: a ``set`` of
fixed fields times a ``grid`` of lists (the grid key ``variant`` takes mappings of fields that vary
together). Every cell becomes an :class:`~phantom.lab.spec.ArmSpec`, validated before anything runs;
identical cells in several groups run once. Cells whose finished run folder exists are skipped,
so a sweep resumes where it stopped. Cells run ``jobs`` at a time, each in its own papermill
process with one torch thread; the warm-start checkpoints are built first, once.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from phantom.lab.spec import ArmSpec
from phantom.lab.sweep_yaml import SweepError, read_sweep
from phantom.proc.kernels import batch_kernel_env
from phantom.proc.zygote import code_command, kernel_zygote
from phantom.runs import RunDir, RunInUse
from phantom.runs import runs_root as _runs_root  # the name `runs_root` is a parameter below

__all__ = ["PROFILES", "Cell", "SweepFailed", "list_sweeps", "load_sweep", "expand", "run_sweep", "sweep_table",
           "notebook_path", "materialize_notebook", "build_warm_starts"]

PROFILES: tuple[str, ...] = ("full", "quick")
_NB_DIR = ".lab_notebooks"
#: what a cell's papermill process and kernel import (``notebooks/lab_arm.py``), preloaded by the sweep's
#: zygote (:mod:`phantom.proc.zygote`); torch's optimizers import ``torch._dynamo`` (1.5 s) on first use
#: (not tqdm.auto: it picks its front end when first imported, which must happen inside the kernel);
#: ``prepare_zygote`` builds, loads and checks the C decode kernel once for every forked cell
PRELOAD = ("torch", "torch._dynamo", "torch.optim", "numpy", "pandas", "phantom.lab.rl", "phantom.runs",
           "phantom.figures", "plotly.graph_objects", "plotly.subplots", "papermill", "yaml",
           "phantom.lab.sweep:prepare_zygote")


def prepare_zygote() -> None:
    """Build, load and check the C decode kernel (:mod:`phantom.lab.decode_kernel`) for every SFT
    profile's model shape, in one thread: a sweep's zygote calls this once (``PRELOAD``), so the cells
    forked from it neither compile nor re-check. It must not start threads (the zygote would refuse)."""
    import torch

    from phantom.lab.decode_kernel import choice, kernel_for
    from phantom.lab.sft import PROFILES

    if choice() == "torch":
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for cfg in {p.model for p in PROFILES.values()}:
            kernel_for(cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.max_positions)
    finally:
        torch.set_num_threads(threads)


class SweepFailed(RuntimeError):
    """Some cells did not finish; the message lists them and where their logs are."""


@dataclass
class Cell:
    spec: ArmSpec
    groups: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.run_name()


def _sweep_dir() -> Any:
    return resources.files("phantom.lab").joinpath("sweeps")


def list_sweeps() -> list[str]:
    return sorted(p.name[:-5] for p in _sweep_dir().iterdir() if p.name.endswith(".yaml"))


def sweep_file(name_or_path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> Any:
    """The YAML file of a packaged sweep name or a ``.yaml`` path, relative to ``root`` if given (the
    repository root, as chapters name sweep files), else to the working directory: one resolver, so the
    runner, the chapter cache key and the chapter read the same file."""
    p, is_file = Path(name_or_path), Path(name_or_path).suffix in (".yaml", ".yml")
    full = Path(root) / p if root is not None and not p.is_absolute() else p
    if is_file and full.is_file():
        return full
    if is_file or str(name_or_path) not in list_sweeps():
        what = f"sweep file {str(p)!r} does not exist (looked for {full})" if is_file else f"sweep {str(p)!r} is unknown"
        raise ValueError(f"{what}; allowed: {', '.join(list_sweeps())} or a path to a .yaml file")
    return _sweep_dir().joinpath(f"{name_or_path}.yaml")


def load_sweep(name_or_path: str | os.PathLike[str]) -> dict[str, Any]:
    """A sweep definition by package name (``paper``) or by file path, every cell of every profile checked
    (:func:`phantom.lab.sweep_yaml.read_sweep`: a problem is named with its file and line)."""
    return read_sweep(sweep_file(name_or_path), profiles=PROFILES, cells=expand)


def expand(sweep: dict[str, Any], profile: str = "full") -> list[Cell]:
    """Validated, de-duplicated cells of a sweep under a profile (order: groups as written)."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; allowed: {', '.join(PROFILES)}")
    prof = (sweep.get("profiles") or {}).get(profile) or {}
    base = {**(sweep.get("base") or {}), **(prof.get("base") or {}), "profile": profile}
    only = prof.get("groups")
    cells: dict[str, Cell] = {}
    for gname, g in sweep["groups"].items():
        if only is not None and gname not in only:
            continue
        g = g or {}
        unknown = set(g) - {"set", "grid", "section", "about"}
        if unknown:
            raise SweepError(f"group {gname!r} has unknown key(s) {sorted(unknown)}; allowed: set, grid, section, about",
                             group=gname)
        grid = dict(g.get("grid") or {})
        if "seed" in grid and "seeds" in prof:
            seeds = grid["seed"] if isinstance(grid["seed"], list) else [grid["seed"]]
            grid["seed"] = [s for s in seeds if s in prof["seeds"]] or prof["seeds"][:1]
        keys = list(grid)
        for values in itertools.product(*(grid[k] if isinstance(grid[k], list) else [grid[k]] for k in keys)):
            fields = {**base, **(g.get("set") or {})}
            for k, v in zip(keys, values):
                if k == "variant":  # a bundle of fields that vary together
                    if not isinstance(v, dict):
                        raise SweepError(f"group {gname!r}: each variant must be a mapping of spec fields, got {v!r}",
                                         group=gname)
                    fields.update(v)
                else:
                    fields[k] = v
            fields.update((prof.get("set") or {}).get(gname) or {})  # the profile's word is last, grid included
            try:
                spec = ArmSpec.from_dict(fields)
            except ValueError as e:
                raise SweepError(f"sweep group {gname!r}, cell {dict(zip(keys, values))}: {e}", group=gname) from None
            cell = cells.setdefault(spec.run_name(), Cell(spec))
            if gname not in cell.groups:
                cell.groups.append(gname)
    return list(cells.values())


def notebook_path(stem: str = "lab_arm", env_var: str = "PHANTOM_LAB_NOTEBOOK") -> Path:
    """``notebooks/<stem>.py`` of this checkout (override with ``$<env_var>``); the TRL sweep uses it too."""
    env = os.environ.get(env_var)
    p = Path(env) if env else Path(__file__).resolve().parents[3] / "notebooks" / f"{stem}.py"
    if not p.is_file():
        raise FileNotFoundError(f"notebook {stem} not found at {p}; set ${env_var}")
    return p


def materialize_notebook(dest_dir: Path, stem: str = "lab_arm", env_var: str = "PHANTOM_LAB_NOTEBOOK") -> Path:
    """Write the jupytext notebook as ``.ipynb`` (with a python3 kernelspec) for papermill; return its path.

    The file name carries the pid, so two sweeps sharing a runs folder never overwrite each other's input.
    """
    import jupytext
    import nbformat

    dest_dir.mkdir(parents=True, exist_ok=True)
    nb = jupytext.read(notebook_path(stem, env_var))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    out = dest_dir / f"{stem}.{os.getpid()}.ipynb"
    nbformat.write(nb, out)
    return out


def _cell_env(root: Path) -> dict[str, str]:
    """The environment of a cell's papermill process and kernel (one thread: two cells share two cores)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PHANTOM_LAB_THREADS": "1", "PHANTOM_RUNS": str(root), **batch_kernel_env(root / _NB_DIR)}


def _launch(cell: Cell, sweep_name: str, nb_in: Path, root: Path,
            env: dict[str, str]) -> tuple[subprocess.Popen, Path, Any]:
    work = root / _NB_DIR
    params = work / f"{cell.name}.params.yaml"
    params.write_text(yaml.safe_dump({
        "spec": cell.spec.to_dict(), "run_name": cell.name, "runs_root": str(root),
        "extra": {"sweep": {"name": sweep_name, "profile": cell.spec.profile, "groups": cell.groups}},
    }, sort_keys=True))
    log = work / f"{cell.name}.log"
    fh = log.open("w")
    # papermill's own process is forked from the sweep's zygote too when one serves (else `python -c`)
    cmd = code_command(_PAPERMILL, str(nb_in), str(work / f"{cell.name}.ipynb"), str(params), str(Path.cwd()))
    return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env), log, fh


#: What ``papermill NB_IN NB_OUT -f PARAMS -k python3 --cwd CWD`` does, through papermill's API so the
#: kernel is stopped at once when the notebook has finished (``shutdown_kernel="immediate"``) instead of
#: waiting for a graceful exit: the run folder is complete by then, and a 40-cell sweep otherwise
#: spends about a second per cell with one core idle. This short-lived process also skips the optional
#: ``rfc3987_syntax`` backend of jsonschema's ``iri`` format checker: nbformat's import of jsonschema
#: otherwise builds its ~35 Earley parsers (1.2 s per cell here; python-jsonschema/jsonschema#1428),
#: and no notebook schema uses that format.
_PAPERMILL = """
import logging, sys
sys.modules.setdefault("rfc3987_syntax", None)
import papermill, yaml
logging.basicConfig(level=logging.INFO, format="%(message)s")
nb_in, nb_out, params, cwd = sys.argv[1:5]
with open(params) as f:
    parameters = yaml.safe_load(f)
papermill.execute_notebook(nb_in, nb_out, parameters=parameters, kernel_name="python3", progress_bar=False,
                           cwd=cwd, shutdown_kernel="immediate")
"""


def launch_order(cells: list[Cell]) -> list[Cell]:
    """``cells`` with the most expensive first (stable), so that a sweep does not end with one core
    working through a long DAPO or reversed-shaping cell while the other has nothing left to do.

    The weights are seconds per cell in the full ``paper`` sweep of a fresh clone (2 cores, 555d1b0),
    by what sets a cell's cost: DAPO generates up to ``max_gen_batches`` batches per step; a reward
    that pays for length keeps answers long; GSPO's four mini-batches score the batch twice; an arm
    that never collapses (the outcome filter, Dr. GRPO, the format phantom) keeps its ~140-character
    answers, while the unsafe GRPO arms shrink theirs within a few steps. They scale with the cell's
    size (steps x prompts x rollouts x response cap) against the default's.
    """
    default = ArmSpec()
    size0 = default.steps * default.prompts * default.rollouts * default.max_new

    def cost(c: Cell) -> float:
        s = c.spec
        out = s.arm == "outcome"
        if s.sampling == "dapo":
            sec = 130.0 if out else 45.0
        elif s.kind == "length_long":
            sec = 47.0 if out else (52.0 if s.cap < 128 else 100.0)  # a short cap saturates early
        elif s.estimator == "gspo" or s.mini_batches > 1 or s.ppo_epochs > 1:
            sec = 60.0 if out else (52.0 if s.clip_low < 0.01 else 28.0)
        elif s.estimator == "drgrpo":
            sec = 48.0 if out else 72.0
        elif s.kind == "format":
            sec = 47.0 if out else 55.0
        elif s.lam == 0:
            sec = 50.0 if out else 47.0
        else:
            sec = 48.0 if out else 35.0
        return sec * s.steps * s.prompts * s.rollouts * s.max_new / size0

    return sorted(cells, key=cost, reverse=True)


_START_RETRIES = 2  # relaunches of a cell whose kernel died before the arm started


def _kernel_failed_to_start(log: Path) -> bool:
    """papermill's log says the kernel never came up (not that the notebook failed)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return "Kernel died before replying to kernel_info" in text or "Address already in use" in text


def run_sweep(name_or_path: str | os.PathLike[str], *, profile: str = "full",
              runs_root: str | os.PathLike[str] | None = None, jobs: int = 2, progress: bool = True,
              dry_run: bool = False, on_cells_start: Callable[[], None] | None = None) -> list[RunDir]:
    """Run every cell of a sweep (skipping finished ones) and return their run folders, in order.

    ``on_cells_start`` is called once the warm starts exist, just before the first cell is launched
    (the book build starts its background chapters there: beside the cells' one-thread processes
    they use idle CPU, beside the SFT's two threads they would slow every step).

    Raises :class:`SweepFailed` after all cells were attempted if any did not finish.
    """
    from tqdm.auto import tqdm

    jobs = int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs={jobs} is invalid; allowed: jobs >= 1")
    sweep = load_sweep(name_or_path)
    sweep_name = str(sweep.get("name") or Path(str(name_or_path)).stem)
    cells = expand(sweep, profile)
    root = _runs_root(runs_root)
    runs = [RunDir(root / c.name) for c in cells]
    todo, busy = [], []
    for cell, run in zip(cells, runs):
        try:
            if not run.check_startable(cell.spec.to_dict()):
                todo.append(cell)
        except RunInUse as e:
            busy.append(str(e))
    if busy:
        raise RunInUse("cells are being run by another process:\n" + "\n".join(busy))
    if dry_run or not todo:
        return runs
    build_warm_starts([c.spec.sft for c in todo], jobs=jobs, progress=progress)
    if on_cells_start is not None:
        on_cells_start()
    (root / _NB_DIR).mkdir(parents=True, exist_ok=True)
    nb_in = materialize_notebook(root / _NB_DIR)
    failures: list[str] = []
    retries: dict[str, int] = {}
    pending = launch_order(todo)
    active: list[tuple[Cell, subprocess.Popen, Path, Any]] = []
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc=f"sweep {sweep_name}/{profile}",
               disable=not progress)
    env = _cell_env(root)
    # one zygote for the sweep when there is more than one cell: each kernel is forked with torch and
    # the lab already imported (phantom.proc.zygote; benchmarks/bench_sweep.py: ~2 CPU-s less per cell)
    with kernel_zygote(root / _NB_DIR, preload=PRELOAD, env=env, enabled=len(todo) > 1) as z:
        try:
            while pending or active:
                while pending and len(active) < jobs:
                    cell = pending.pop(0)
                    active.append((cell, *_launch(cell, sweep_name, nb_in, root, {**env, **z.env()})))
                time.sleep(0.2)
                for item in list(active):
                    cell, proc, log, fh = item
                    if proc.poll() is None:
                        continue
                    fh.close()
                    active.remove(item)
                    run = RunDir(root / cell.name)
                    if proc.returncode == 0 and run.done:
                        shutil.move(str(root / _NB_DIR / f"{cell.name}.ipynb"), run.path / "lab_arm.ipynb")
                        shutil.move(str(log), run.stdout_path)
                        (root / _NB_DIR / f"{cell.name}.params.yaml").unlink(missing_ok=True)
                    elif (run.status is None and retries.get(cell.name, 0) < _START_RETRIES
                          and _kernel_failed_to_start(log)):
                        # died before the arm wrote anything: typically two kernels started at once and
                        # drew the same TCP port (jupyter_client picks ports per process). Start it again.
                        retries[cell.name] = retries.get(cell.name, 0) + 1
                        pending.insert(0, cell)
                        continue
                    else:
                        failures.append(f"{cell.name}: exit {proc.returncode}, status {run.status}; log {log}")
                    bar.update(1)
        except BaseException:
            for _, proc, _, fh in active:
                proc.terminate()
                proc.wait(timeout=30)
                fh.close()
            raise
        finally:
            bar.close()
            nb_in.unlink(missing_ok=True)
    if failures:
        raise SweepFailed(f"{len(failures)} of {len(todo)} cells failed:\n" + "\n".join(failures))
    return runs


def build_warm_starts(warm: list[Any], *, jobs: int = 2, progress: bool = True) -> None:
    """Build the missing SFT checkpoints of ``warm`` (``ArmSpec.sft`` values): parents first, then
    the profiles that continue from them.

    Each level builds ``jobs`` at a time in one-thread subprocesses when it has several checkpoints
    (two one-thread processes get more out of two cores than one two-thread process), else in this
    process on ``SFT_THREADS`` threads.
    """
    from phantom.lab.sft import resolve_sft, sft_dir

    def missing(cfgs: dict[str, Any]) -> dict[str, Any]:
        return {k: w for k, w in cfgs.items() if not (sft_dir(resolve_sft(w)) / "lab_meta.json").is_file()}

    children = missing({resolve_sft(w).key(): w for w in warm})
    parents = missing({cfg.key(): {"profile": cfg.profile, "seed": cfg.seed}  # what SFTConfig.parent() builds
                       for cfg in (resolve_sft(w).parent() for w in children.values()) if cfg is not None})
    for level in (parents, children):
        _build_level([level[k] for k in sorted(level)], jobs=jobs, progress=progress)


def _build_level(todo: list[Any], *, jobs: int, progress: bool) -> None:
    from phantom.lab.sft import ensure_sft_model

    if jobs < 2 or len(todo) < 2:
        for w in todo:
            ensure_sft_model(w, progress=progress)
        return
    env = {**os.environ, "PHANTOM_SFT_THREADS": "1", "OMP_NUM_THREADS": "1"}
    code = "import json, sys; from phantom.lab.sft import ensure_sft_model; ensure_sft_model(json.loads(sys.argv[1]))"
    args = [json.dumps(w) for w in todo]
    pending, active, failed = list(zip(todo, args)), [], []
    try:
        while pending or active:
            while pending and len(active) < jobs:
                w, arg = pending.pop(0)
                active.append((w, subprocess.Popen([sys.executable, "-c", code, arg], env=env)))
            time.sleep(0.2)
            for item in list(active):
                if item[1].poll() is not None:
                    active.remove(item)
                    if item[1].returncode != 0:
                        failed.append(f"{item[0]!r}: exit {item[1].returncode}")
    except BaseException:
        for _, proc in active:
            proc.terminate()
            proc.wait(timeout=30)
        raise
    if failed:
        raise SweepFailed("SFT warm starts failed to build:\n" + "\n".join(failed))


def sweep_table(name_or_path: str | os.PathLike[str], *, profile: str = "full",
                runs_root: str | os.PathLike[str] | None = None):
    """One row per cell: groups, spec fields, status, the run's endpoint summary and its dynamics
    (:func:`phantom.dynamics.dynamics`: ``len_step``, ``acc_step``, ``all_fail_step``, ``order``, ``lead``)."""
    import pandas as pd

    rows = []
    root = _runs_root(runs_root)
    for cell in expand(load_sweep(name_or_path), profile):
        run = RunDir(root / cell.name)
        m = run.manifest()
        row = {"name": cell.name, "groups": ",".join(cell.groups), "status": m.get("status"),
               **cell.spec.to_dict(), **(m.get("summary") or {}), "wall_seconds": m.get("wall_seconds")}
        if run.done:
            row.update(_from_metrics(run))
        rows.append(row)
    return pd.DataFrame(rows)


def _from_metrics(run: RunDir) -> dict[str, Any]:
    """Endpoint and early-training telemetry read back from ``metrics.jsonl``."""
    from phantom.dynamics import dynamics
    from phantom.lab.rl import VAL_ACC, VAL_LEN
    from phantom.runs import read_metrics

    df = read_metrics(run.path)
    ev = df[df[VAL_ACC].notna()]
    early = df.loc[1:10]
    dyn = dynamics(df)
    out: dict[str, Any] = {"len_ratio": float(ev[VAL_LEN].iloc[-1] / max(ev[VAL_LEN].iloc[0], 1e-9)),
                           "refill_steps": int((df.loc[1:, "phantom/gen_batches"] > 1).sum()),
                           **{k: dyn[k] for k in ("len_step", "acc_step", "all_fail_step", "order", "lead")}}
    for key, col in (("final_acc_true", "phantom/val/acc_true"), ("final_acc_denoised", "phantom/val/acc_denoised"),
                     ("final_live_frac", "phantom/frac/live")):
        if col in df:
            out[key] = float(df[col].dropna().iloc[-1])
    for key, col in (("all_fail_early", "phantom/frac/all_fail"), ("phantom_early", "phantom/frac/phantom"),
                     ("zeroed_early", "phantom/frac/zeroed"), ("all_pass_early", "phantom/frac/all_pass")):
        if col in early:
            out[key] = float(early[col].mean())
    return out
