"""Launch real verl 0.9.1 runs: ``phantom verl run ...`` and :func:`launch` (used by ``notebooks/verl_arm.py``).

One call = one run folder ``runs/<name>/`` (see ``phantom.runs``)::

    manifest.json   spec, overrides, command, versions, git commit, status running|done|failed, times
    metrics.jsonl   verl's file logger (VERL_FILE_LOGGER_PATH, fresh per run) + the merged gate lines
    gate.jsonl      raw per-step GateStats written by the phantom estimators in the TaskRunner
    rollout.jsonl   CPU backend: one line per generated batch of the hf rollout server
    sync.jsonl      CPU backend: one line per weight update (full | base | adapter)
    stdout.log      everything verl printed

Order of work, so that bad input fails before Ray starts and leaves nothing behind: validate the
spec (arm, estimator, lambda, files, model) -> refuse a folder a live run holds -> reuse a finished
run of the same spec -> make the run's plan once (:mod:`phantom.verl.plan`: on a GPU the machine
decides attention, micro-batches and vLLM's memory share) -> build the overrides from it, compose
verl's config and run verl's ``validate_config`` -> check the group filter against the trainer and
the reward (:mod:`phantom.verl.filters`) -> on a GPU, the doctor's checks on the same plan
(:mod:`phantom.verl.doctor`: CUDA, driver, vLLM, data, model, disk) -> check in a fresh interpreter,
with the run's environment, that ``import verl`` registers the phantom estimators (and loads the CPU
backend) -> only then create the folder and start ``python -m verl.trainer.main_ppo`` with an
argument list.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from phantom.advantages import GateStats
from phantom.cli import parse_sets
from phantom.runs import RunConflict, RunDir, RunInUse, pid_alive, read_metrics, runs_root, spec_hash
from phantom.verl.cluster import term_as_interrupt
from phantom.verl.doctor import run_env
from phantom.verl.filters import check_filter
from phantom.verl.plan import make_plan
from phantom.verl.spec import VerlSpec, compose, load_preset, make_spec, presets, to_overrides
from phantom.verl.starve import RefillGuard, Starved, check_bound, val_rows

__all__ = ["launch", "preflight", "run_env", "command", "check_name", "shell_command", "gate_metrics",
           "read_run_metrics", "main"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PROGRESS_KEYS = ("val-core", "critic/score/mean", "response_length/mean", "phantom/frac/zeroed")


def default_name(spec: VerlSpec) -> str:
    dapo = f"-dapo_{spec.dapo_metric}" if spec.dapo else ""
    return f"verl-{spec.estimator}-{spec.arm}{dapo}-lam{spec.lam:g}-s{spec.seed}-{spec_hash(spec.to_dict())[:6]}"


def command(spec: VerlSpec, overrides: list[str], run: Path) -> tuple[list[str], Path]:
    """The verl command line (an argument list) and its working directory."""
    hydra = [f"hydra.run.dir={run / 'hydra'}", "hydra.job.chdir=False"]
    if spec.trainer == "recipe_dapo":
        return [sys.executable, "-m", "recipe.dapo.main_dapo", *overrides, *hydra], Path(spec.recipe_path or ".")
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, *hydra], run


#: A sweep points this at a file in its work folder: the probe then runs once per sweep, not once per cell.
PREFLIGHT_CACHE_ENV = "PHANTOM_VERL_PREFLIGHT_CACHE"
_PROBE_ENV = ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS", "VERL_PLATFORM", "PYTHONPATH",
              "VERL_ENGINE_DEVICE", "CUDA_VISIBLE_DEVICES")


def _probe(env: dict[str, str]) -> tuple[Any, dict[str, Any] | None]:
    """``plugin_check`` in a fresh interpreter, or its result for the same interpreter and plugin environment
    from ``$PHANTOM_VERL_PREFLIGHT_CACHE`` (a sweep: every cell has the same)."""
    import hashlib

    from phantom.verl.doctor import plugin_check

    cache = os.environ.get(PREFLIGHT_CACHE_ENV)
    key = hashlib.sha256(json.dumps([sys.executable, *(env.get(k) for k in _PROBE_ENV)]).encode()).hexdigest()
    if cache and Path(cache).is_file():
        try:
            rec = json.loads(Path(cache).read_text())
            if rec.get("key") == key:
                return None, rec["info"]
        except (OSError, ValueError, KeyError):
            pass
    check, info = plugin_check(env)
    if cache and info is not None and len(info.get("estimators", [])) >= 3:
        Path(cache).write_text(json.dumps({"key": key, "info": info}))
    return check, info


def preflight(spec: VerlSpec, env: dict[str, str]) -> dict[str, Any]:
    """In a fresh interpreter with the run's environment: ``import verl`` must register the estimators.

    verl swallows entry-point import errors (logged at DEBUG), so without this check a broken
    install would surface only as "unknown advantage estimator" deep inside a Ray actor.
    (``phantom.verl.doctor.plugin_check``; the doctor runs the same probe.)
    """
    check, info = _probe(env)
    if info is None:
        raise RuntimeError(f"`import verl` failed in the run's environment: {check.found}")
    if spec.estimator_name not in info["estimators"]:
        raise RuntimeError(
            f"verl {info['verl']} does not register {spec.estimator_name} on import (found {info['estimators']}): "
            "is phantom installed in this interpreter (`pip install -e .`), and VERL_USE_EXTERNAL_PLUGINS not 'none'?")
    if spec.backend == "cpu" and (info["device"] != "cpu" or "hf" not in info["rollouts"]):
        raise RuntimeError(f"the CPU backend did not load: verl picked device {info['device']!r}, "
                           f"rollout backends {info['rollouts']}")
    return info


def gate_metrics(path: str | os.PathLike[str], train_batch_size: int | None = None) -> dict[int, dict[str, float]]:
    """Per-step ``phantom/...`` metrics from a gate log (several estimator calls of one step are summed)."""
    p = Path(path)
    if not p.is_file():
        return {}
    acc: dict[int, dict[str, Any]] = defaultdict(lambda: {"stats": None, "rows": 0, "abs": 0.0, "acc": 0.0, "acc_n": 0})
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a run still writing
        a = acc[int(rec["step"])]
        st = rec["stats"]
        if a["stats"] is None:
            a["stats"] = dict(st)
        else:
            for k, v in st.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and a["stats"].get(k) is not None:
                    a["stats"][k] += v
        a["rows"] += rec["rows"]
        a["abs"] += rec["abs_adv_sum"]
        if rec.get("acc_sum") is not None:
            a["acc"] += rec["acc_sum"]
            a["acc_n"] += rec["rows"]
    out: dict[int, dict[str, float]] = {}
    for step, a in acc.items():
        m = GateStats(**a["stats"]).to_metrics()
        m["phantom/adv/abs_mean"] = a["abs"] / max(a["rows"], 1)
        if a["acc_n"]:
            m["phantom/acc/mean"] = a["acc"] / a["acc_n"]
        out[step] = m
    return out


def _dapo_metrics(metrics_path: Path, spec: VerlSpec) -> dict[int, dict[str, float]]:
    """Prompts generated per step and the generation-batch equivalent (V1 refill telemetry)."""
    if not spec.dapo or not metrics_path.is_file():
        return {}
    df = read_metrics(metrics_path)

    def value(row: Any, key: str) -> float:  # verl omits a counter in steps where it is 0
        v = row.get(key)
        return 0.0 if v is None or v != v else float(v)

    out = {}
    for step, row in df.iterrows():
        if step == 0 or "timing_s/step" not in row or row["timing_s/step"] != row["timing_s/step"]:
            continue  # not a training step
        if value(row, "train/num_gen_batches") > 0:  # the recipe trainer counts them itself
            out[int(step)] = {"phantom/gen_batches": value(row, "train/num_gen_batches")}
            continue
        evicted = value(row, "training/filter_groups/evicted_samples")
        prompts = spec.train_batch_size + evicted + value(row, "training/filter_groups/discarded_surplus_samples")
        out[int(step)] = {"phantom/prompts_generated": prompts, "phantom/gen_batches": prompts / spec.train_batch_size,
                          "phantom/refilled": float(evicted > 0)}
    return out


def read_run_metrics(run: str | os.PathLike[str]):
    """A run's metrics (``phantom.runs.read_metrics``) with the gate log overlaid: works on a live run too."""
    run = Path(run)
    df = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else None
    gates = gate_metrics(run / "gate.jsonl")
    import pandas as pd

    if gates:
        g = pd.DataFrame.from_dict(gates, orient="index")
        df = g if df is None else df.combine_first(g)
        df.index.name = "step"
    return df if df is not None else pd.DataFrame()


def _merge(run: RunDir, spec: VerlSpec) -> int:
    """Append the gate and DAPO metrics to metrics.jsonl as extra lines of their steps (verl has exited)."""
    per_step: dict[int, dict[str, float]] = defaultdict(dict)
    for source in (gate_metrics(run.path / "gate.jsonl"), _dapo_metrics(run.metrics_path, spec)):
        for step, m in source.items():
            per_step[step].update(m)
    for step in sorted(per_step):
        run.log(step, per_step[step])
    return len(per_step)


def _short(key: str) -> str:
    return "val_acc" if key.startswith("val-core") else key.split("/")[-2] if key.count("/") >= 2 else key


def _progress(run: RunDir, proc: subprocess.Popen, spec: VerlSpec, show: bool, timeout: float | None,
              guard: RefillGuard | None = None) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=spec.steps, desc=run.name, unit="step", disable=not show, file=sys.stderr)
    start, seen = time.time(), -1
    while proc.poll() is None:
        time.sleep(1.0)
        if timeout is not None and time.time() - start > timeout:
            _stop(proc)
            raise TimeoutError(f"run {run.name} exceeded {timeout:.0f} s")
        if guard is not None:
            guard.check()  # Starved: the filter evicts every group and V1 refills without end
        try:
            df = read_metrics(run.metrics_path) if run.metrics_path.is_file() else None
        except (OSError, ValueError):
            continue
        if df is None or df.empty or int(df.index.max()) == seen:
            continue
        seen = int(df.index.max())
        last = df.loc[seen]
        post = {_short(k): f"{last[k]:.3g}" for k in last.index
                if k.startswith(PROGRESS_KEYS) and isinstance(last[k], (int, float)) and last[k] == last[k]}
        bar.set_postfix(post, refresh=False)
        bar.update(max(0, seen - bar.n))
    bar.close()


def _stop(proc: subprocess.Popen) -> None:
    """Stop verl and everything it started: it runs in its own process group (Ray's raylet, GCS, workers)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                os.killpg(proc.pid, 0)  # anyone left in the group?
            except ProcessLookupError:
                proc.poll()
                return
            proc.poll()
            time.sleep(0.5)


def launch(spec: VerlSpec, name: str | None = None, *, runs_dir: str | os.PathLike[str] | None = None,
           timeout: float | None = None, progress: bool = True, echo: bool = False,
           manifest: dict[str, Any] | None = None, starve_batches: int | None = None) -> RunDir:
    """Run ``spec`` to completion (or reuse its finished folder); returns the run folder.

    ``manifest``: more manifest fields (a sweep records its name and cell), not part of the spec.
    ``starve_batches``: with the group filter on the CPU backend, stop a step that has generated more than
    this many generation batches (:mod:`phantom.verl.starve`); the folder is then marked ``starved``
    (a finished outcome, returned, not raised). None: no bound (verl's V1 behaviour).

    Raises ``ValueError`` / ``FileNotFoundError`` / ``RunInUse`` / ``RunConflict`` / ``RuntimeError``
    before anything is written; a run that starts but fails is marked ``failed`` and raises ``RuntimeError``.
    """
    name = check_name(name or default_name(spec))
    run = RunDir(runs_root(runs_dir) / name)
    spec_dict = spec.to_dict()
    child = run.manifest().get("child_pid")
    if run.status == "running" and isinstance(child, int) and pid_alive(child):
        raise RunInUse(f"run {run.path} is still being written by verl (pid {child}) although its launcher is gone; "
                       "stop that process or wait for it")
    if run.check_startable(spec_dict):  # RunInUse for a live run, RunConflict for another spec
        return run
    check_bound(starve_batches)  # before anything is written
    plan = make_plan(spec)  # the machine's choices, once: the command and the doctor both read this plan
    overrides = to_overrides(spec, run.path, name, plan)
    notes: list[str] = []
    cfg = compose(overrides, spec.trainer, spec.recipe_path, notes=notes)
    env = run_env(spec, run.path)
    filter_groups, warnings = check_filter(cfg, overrides, spec.trainer, env)
    for line in warnings:
        print(f"phantom verl: warning: {line}", file=sys.stderr)
    if spec.backend == "gpu":  # the doctor's table first (no CUDA, no vLLM, missing data: fails with the fixes)
        from phantom.verl.doctor import preflight_gpu

        preflight_gpu(spec, env, plan, echo=progress)
    versions = preflight(spec, env)
    argv, cwd = command(spec, overrides, run.path)
    run = RunDir.start(name, spec_dict, kind="verl", root=runs_dir,
                       extra={"overrides": overrides, "command": argv, "backend": spec.backend, "preset": spec.preset,
                              "preflight": versions, "compose_notes": notes + warnings,
                              "filter_groups": filter_groups, **plan.manifest(), **(manifest or {}),
                              **({"starve_batches": starve_batches} if starve_batches else {})})
    guard = None
    if starve_batches and spec.dapo and spec.backend == "cpu":
        per_batch = spec.train_batch_size * spec.rollout_n
        guard = RefillGuard(run.path / "rollout.jsonl", starve_batches, per_batch,
                            val_rows(spec.val_files, spec.val_max_samples))
    cwd = cwd if spec.trainer == "recipe_dapo" else run.path
    with run.stdout_path.open("w") as log:
        try:  # its own session, so that _stop can end verl and every Ray process it started
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1, start_new_session=True)
        except OSError as exc:
            run.finish("failed", error=f"{type(exc).__name__}: {exc}")
            raise RuntimeError(f"could not start verl: {exc}") from exc
        run.update(child_pid=proc.pid)

        def pump() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                if echo:
                    sys.stdout.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            with term_as_interrupt():  # `kill` stops verl and marks the folder, as Ctrl-C does
                _progress(run, proc, spec, progress, timeout, guard)
        except Starved as exc:
            _stop(proc)
            reader.join(timeout=10)
            merged = _merge(run, spec)
            run.finish("starved", returncode=proc.poll(), last_step=_last_step(run), merged_steps=merged,
                       starved={"step": exc.step, "sequences": exc.sequences, "limit": exc.limit})
            print(f"phantom verl: {run.name} starved: {exc}", file=sys.stderr)
            return run
        except BaseException as exc:
            _stop(proc)
            reader.join(timeout=10)
            run.finish("failed", error=f"{type(exc).__name__}: {exc}", returncode=proc.poll())
            raise
        rc = proc.wait()
        _stop(proc)  # a clean exit shuts Ray down; this only reaps stragglers of the process group
        reader.join(timeout=30)
    last = _last_step(run)
    if rc != 0 or last < spec.steps:
        tail = run.stdout_path.read_text()[-3000:]
        run.finish("failed", returncode=rc, last_step=last)
        raise RuntimeError(f"verl run {name} failed (exit {rc}, last logged step {last} of {spec.steps}); "
                           f"see {run.stdout_path}\n{tail}")
    merged = _merge(run, spec)
    run.finish("done", returncode=rc, last_step=last, merged_steps=merged)
    return run


def _last_step(run: RunDir) -> int:
    """The last step verl logged (-1 when nothing was)."""
    df = read_metrics(run.metrics_path) if run.metrics_path.is_file() else None
    return int(df.index.max()) if df is not None and not df.empty else -1


def check_name(name: str) -> str:
    """A run name that is one folder under the runs root; ``ValueError`` naming it otherwise."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"name={name!r} is invalid; allowed: letters, digits, '.', '_', '-' (max 100), "
                         "starting with a letter or digit")
    return name


def shell_command(argv: list[str]) -> str:
    """``argv`` as one shell command (``shlex``-quoted), one argument per continuation line."""
    return " \\\n    ".join(shlex.quote(a) for a in argv)


def gib(text: str) -> float:
    """``--gpu-memory``: a finite number of GiB > 0 (argparse's ``float`` takes ``nan`` and ``inf``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"--gpu-memory {text!r} is invalid; allowed: a finite number of GiB > 0")
    return value


def _print_overrides(args: argparse.Namespace) -> int:
    """``phantom verl overrides``: the full command, whether or not its data and model exist yet."""
    from phantom.verl import gpu
    from phantom.verl.spec import inputs_status

    spec = make_spec(args.preset, check_inputs=False, **parse_sets(args.set))
    name = check_name(args.name or default_name(spec))
    run_path = runs_root(args.runs_dir) / name
    hw = None
    if spec.backend == "gpu" and args.gpu_memory is not None:
        hw = gpu.Hardware(gpus=(("assumed", args.gpu_memory),))
    plan = make_plan(spec, hw)
    if spec.backend == "gpu":
        for line in plan.why:
            print(f"# {line}", file=sys.stderr)
    print(shell_command(command(spec, to_overrides(spec, run_path, name, plan), run_path)[0]))
    missing = [i for i in inputs_status(spec) if i["state"] == "missing"]
    for item in missing:
        print(f"# missing {item['input']}: {item['path']} ({item['fix']})", file=sys.stderr)
    if not missing:
        print("# every input exists (or is a Hub id verl downloads)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="phantom verl", description="real verl 0.9.1 runs (CPU here, GPU for users)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("presets", help="list presets and their settings")
    sub.add_parser("doctor", help="check this machine for a run (one table; each failed line says the fix)",
                   add_help=False)
    sub.add_parser("smoke", help="the first GPU run: gpu_smoke for all three arms, with checks", add_help=False)
    sub.add_parser("sweep", help="verl's filter and the project's gates, arms x seeds on the CPU lab", add_help=False)
    for cmd in ("run", "overrides"):
        p = sub.add_parser(cmd, help="launch a run" if cmd == "run" else "print the overrides a run would use")
        p.add_argument("--preset", default="cpu_tiny")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="spec field, e.g. --set arm=score --set lam=0.5 (repeatable)")
        p.add_argument("--name", default=None)
        p.add_argument("--runs-dir", default=None)
        if cmd == "run":
            p.add_argument("--timeout", type=float, default=None, help="seconds before the run is stopped")
            p.add_argument("--echo", action="store_true", help="copy verl's output to this terminal")
            p.add_argument("--starve-batches", type=int, default=None, metavar="N",
                           help="with the group filter (CPU backend): stop a step after N generation batches "
                                "and mark the run starved, exit 4 (default: no bound, as verl's V1 trainer)")
        else:
            p.add_argument("--gpu-memory", type=gib, default=None, metavar="GIB",
                           help="GPU memory to pick the memory row for (default: this machine's GPU)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["doctor"], ["smoke"], ["sweep"]):  # their own parsers (full --help)
        from importlib import import_module

        return int(import_module(f"phantom.verl.{argv[0]}").main(argv[1:]))
    args = parser.parse_args(argv)
    if args.cmd == "presets":
        for p in presets():
            print(f"{p}: {json.dumps(load_preset(p))}")
        return 0
    try:
        if args.cmd == "overrides":
            return _print_overrides(args)
        check_bound(args.starve_batches)  # before the spec builds any input
        spec = make_spec(args.preset, **parse_sets(args.set))
        run = launch(spec, args.name, runs_dir=args.runs_dir, timeout=args.timeout, echo=args.echo,
                     starve_batches=args.starve_batches)
    except (ValueError, FileNotFoundError, RunInUse, RunConflict) as exc:
        print(f"phantom verl: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as exc:
        print(f"phantom verl: {exc}", file=sys.stderr)
        return 1
    print(f"{run.status}: {run.path}")
    return 0 if run.status == "done" else 4  # starved: the group filter found no batch within --starve-batches
