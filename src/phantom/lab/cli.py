"""``phantom lab ...``: the CPU lab from the command line.

    phantom lab task  [--split val] [--n 5] [--terms 4 6] [--style terse]     show problems (default: the lab task)
    phantom lab sft   [--model lab_graded] [--seed 1]                          build / locate the warm start
    phantom lab run   --arm score --seed 1 [--set key=value ...] [--threads 2] one arm, in this process
    phantom lab sweep paper [--profile quick] [--jobs 2] [--dry-run]           papermill sweep
    phantom lab summary paper [--profile quick]                                endpoints and dynamics of a sweep
    phantom lab criteria SWEEP --runs-dir DIR [--step 40]                      the acceptance criteria per warm start
    phantom lab list                                                           known sweeps

`task`, `sft` and `run` default to the book's main setting: the `base` of the `paper` sweep (its SFT
profile, learning rate, steps and lambda), so that `phantom lab run --arm none --seed 3` is a fourth seed
of the book's no-filter cell. ArmSpec's own defaults are older (the worked style at lr 2.5e-3) and stay,
because committed sweeps rely on them.

One meaning per flag across phantom's commands: ``--model`` names an SFT profile (the warm start),
``--profile`` a run profile (``full`` or ``quick``). ``lab task/sft --profile NAME``, the old spelling
of ``--model``, still works with a deprecation note.

Every value is checked before anything is written (the run folder, the warm start): bad input exits
with status 2 and a message naming the value and the allowed ones (:mod:`phantom.cli`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from phantom import cli
from phantom.cli import ArgTypes as T  # the argparse `type=` functions, read as T.count
from phantom.cli import exit_code_of as _exit_code

__all__ = ["main"]

#: allowed values, spelled here so that the help screens import no torch (tests/test_cli_errors.py
#: checks each against its source: phantom.advantages.GATES, phantom.lab.spec.ESTIMATORS,
#: phantom.rewards.KINDS, phantom.lab.sft.PROFILES, phantom.lab.task, phantom.lab.sweep.PROFILES)
ARMS: tuple[str, ...] = ("none", "score", "outcome")
ESTIMATORS: tuple[str, ...] = ("grpo", "drgrpo", "gspo")
KINDS: tuple[str, ...] = ("length_short", "length_long", "format", "overlong")
MODELS: tuple[str, ...] = ("lab_base", "lab", "lab_slack_low", "lab_slack_high", "lab_graded", "lab_terse", "quick",
                           "tiny")
SPLITS: tuple[str, ...] = ("train", "val")
WORDINGS: tuple[str, ...] = ("symbolic", "words", "mixed")
STYLES: tuple[str, ...] = ("worked", "graded", "terse")
RUN_PROFILES: tuple[str, ...] = ("full", "quick")
#: a run folder's name: one path component, no hidden or parent folder
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=,@-]{0,199}")
#: the flags of `lab run` that are ArmSpec fields too (a `--set` of the same key is an error)
RUN_FLAGS: tuple[str, ...] = ("arm", "estimator", "kind", "lam", "seed", "steps", "model")

def main_setting() -> dict:
    """The book's main setting: the `paper` sweep's base spec fields (model, lr, steps, lam)."""
    from phantom.lab.sweep import load_sweep

    return dict(load_sweep("paper").get("base") or {})


def _model_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--model", default=None, choices=MODELS, metavar="NAME",
                   help=f"{what} (default: the main setting's, lab_graded); allowed: {', '.join(MODELS)}")
    p.add_argument("--profile", dest="old_profile", default=None, help=argparse.SUPPRESS)  # before --model


def _parser() -> argparse.ArgumentParser:
    codes = cli.exit_codes()
    ap = cli.command_parser("phantom lab", "The CPU lab: a 0.35M-parameter Qwen2 trained on sums, its SFT warm "
                            "starts, RL arms with and without the phantom, papermill sweeps and their tables.",
                            ["phantom lab run --arm none --seed 0", "phantom lab sweep paper --profile quick --dry-run",
                             "phantom lab summary paper --profile quick"],
                            cli.exit_codes("some cells of a sweep failed (`phantom lab sweep`); their logs are named"))
    sub = cli.subcommands(ap)

    t = cli.add_command(sub, "task", help="print problems of the lab task (one JSON object per line)",
                        examples=["phantom lab task --n 3", "phantom lab task --split train --terms 4 6 --style terse"],
                        codes=codes)
    t.add_argument("--split", default="val", choices=SPLITS, help="val (the held-out set) or train (default: val)")
    t.add_argument("--n", type=T.count, default=5, help="how many problems (default 5)")
    t.add_argument("--start", type=T.index, default=0, help="index of the first problem (default 0)")
    t.add_argument("--terms", type=T.count, nargs=2, default=None, metavar=("LO", "HI"),
                   help="operands per problem, 2 <= LO <= HI <= 12 (default: the SFT profile's task)")
    t.add_argument("--max-operand", type=T.count, default=None, help="largest operand, 9..9999")
    t.add_argument("--wording", default=None, choices=WORDINGS, help=f"allowed: {', '.join(WORDINGS)}")
    t.add_argument("--style", default=None, choices=STYLES,
                   help="worked (prose around the steps), graded (the same, each kind at its own rate) or terse")
    t.add_argument("--slack", type=T.fraction, default=None, help="share of removable prose, 0..1 (worked/graded)")
    _model_flag(t, "SFT profile whose task gives the defaults")

    s = cli.add_command(sub, "sft", help="train the SFT warm start from scratch (cached) and compare it with the shipped one",
                        examples=["phantom lab sft", "phantom lab sft --model lab_graded --seed 1"], codes=codes,
                        notes="Trains (or reuses a cached build of) a warm start from scratch, ignoring the copy shipped "
                              "under data/warmstart/, and says whether the build is bit-identical to it. This is how to "
                              "test the SFT itself; lab runs start from the shipped copy.")
    _model_flag(s, "SFT profile")
    s.add_argument("--seed", type=T.index, default=None, help="SFT seed: another checkpoint of the same profile")
    s.add_argument("--ship", action="store_true",
                   help="copy the build into data/warmstart/ and record its recipe (maintainers)")

    r = cli.add_command(sub, "run", help="run one arm in this process (a finished run of the same spec is reused)",
                        examples=["phantom lab run --arm none --seed 0",
                                  "phantom lab run --arm outcome --set kl_coef=0.001 --set sampling=dapo",
                                  "phantom lab run --model tiny --steps 2 --set prompts=4 --runs-dir /tmp/runs"],
                        codes=codes, notes="A flag and a --set of the same field together is an error.")
    r.add_argument("--arm", default=None, choices=ARMS, help="which groups get zero advantage (default: outcome)")
    r.add_argument("--estimator", default=None, choices=ESTIMATORS, help="default: grpo")
    r.add_argument("--kind", default=None, choices=KINDS, help="shaped-reward family (default: length_short)")
    r.add_argument("--lam", type=T.fraction, default=None, help="phantom strength, 0 <= lam < 1 (default: the main "
                   "setting's, 0.3)")
    r.add_argument("--seed", type=T.index, default=None, help="RL seed (default 0)")
    r.add_argument("--steps", type=T.count, default=None, help="default: the main setting's (40)")
    _model_flag(r, "SFT profile of the warm start; the learning rate stays the main setting's unless --set lr=...")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="any other ArmSpec field (value parsed as YAML), e.g. --set kl_coef=0.001 --set sampling=dapo")
    r.add_argument("--name", default=None, help="run folder name under --runs-dir (default: from the spec); letters, "
                   "digits and ._+=,@- only")
    r.add_argument("--runs-dir", default=None, help="where run folders go (default: $PHANTOM_RUNS, else ./runs)")
    r.add_argument("--threads", default=None, metavar="N|auto",
                   help="torch threads (default: $PHANTOM_LAB_THREADS, else auto = the CPUs this process may "
                        "use, at most 2); kept only where they change no number (phantom.lab.threads)")

    w = cli.add_command(sub, "sweep", help="run a sweep's cells with papermill (finished cells are skipped)",
                        examples=["phantom lab sweep paper --profile quick", "phantom lab sweep paper --dry-run",
                                  "phantom lab sweep data/runs/lab_graded/sweep.yaml --runs-dir data/runs/lab_graded"],
                        codes=cli.exit_codes("some cells failed; their logs are named"))
    w.add_argument("sweep", help="a packaged sweep (`phantom lab list`) or a .yaml file")
    w.add_argument("--profile", default="full", choices=RUN_PROFILES, help="full or quick (default: full)")
    w.add_argument("--runs-dir", default=None, help="default: $PHANTOM_RUNS, else ./runs")
    w.add_argument("--jobs", type=T.count, default=2, help="cells at a time (default 2)")
    w.add_argument("--dry-run", action="store_true", help="validate and list the cells, run nothing")

    m = cli.add_command(sub, "summary", help="endpoint table of a sweep's runs (exit 2 when none is found)",
                        examples=["phantom lab summary paper --profile quick",
                                  "phantom lab summary data/runs/lab_graded/sweep.yaml --runs-dir data/runs/lab_graded "
                                  "--csv /tmp/graded.csv"], codes=codes)
    m.add_argument("sweep", help="a packaged sweep (`phantom lab list`) or a .yaml file")
    m.add_argument("--profile", default="full", choices=RUN_PROFILES, help="full or quick (default: full)")
    m.add_argument("--runs-dir", default=None, help="default: $PHANTOM_RUNS, else ./runs")
    m.add_argument("--csv", default=None, help="also write the full table here (its folder must exist)")

    c = cli.add_command(sub, "criteria", help="the main setting's acceptance criteria per warm start of a sweep's runs",
                        examples=["phantom lab criteria data/runs/lab_graded_2e-3/sweep.yaml --runs-dir "
                                  "data/runs/lab_graded_2e-3", "phantom lab criteria data/runs/lab_warmstarts_long/"
                                  "sweep.yaml --runs-dir data/runs/lab_warmstarts_long --step 40"], codes=codes)
    c.add_argument("sweep", help="a multi-warm-start sweep (no-filter, outcome and Dr. GRPO arms per SFT seed)")
    c.add_argument("--runs-dir", default=None, help="default: $PHANTOM_RUNS, else ./runs")
    c.add_argument("--step", type=T.count, default=None, help="read the runs as if they had stopped after this "
                   "step (1 .. the runs' last step)")

    cli.add_command(sub, "list", help="list the packaged sweeps", examples=["phantom lab list"], codes=codes)
    return ap


def _criteria(args: argparse.Namespace) -> int:
    import pandas as pd

    from phantom.lab.acceptance import UNSAFE, acceptance, at_step, passing, warmstart_runs
    from phantom.runs import runs_root

    table, frames = warmstart_runs(args.sweep, runs_root(args.runs_dir))
    if not len(table):
        raise cli.UsageError(f"no finished run of {args.sweep} under {runs_root(args.runs_dir)}; allowed: the "
                         "--runs-dir the sweep ran into")
    if args.step is not None:
        last = max(int(f.index.max()) for f in frames.values())
        if args.step > last:
            raise cli.UsageError(f"--step {args.step} is beyond the runs' last step ({last}); allowed: 1..{last}")
        table = at_step(table, frames, args.step)
    # a sweep that ran the shaped-score filter is held to the collapse and order criteria on it too
    unsafe = UNSAFE if table["kind"].eq("score").any() else ("none",)
    acc = acceptance(table, unsafe=unsafe)
    print(f"unsafe arms read: {', '.join(unsafe)}")
    with pd.option_context("display.width", 200):
        print(acc.round(3).to_string())
    ok = passing(acc)
    print(f"every criterion holds on {len(ok)} of {len(acc)} warm starts" + (f" (SFT seeds {ok})" if ok else ""))
    return 0


def _summary(args: argparse.Namespace) -> int:
    from phantom.lab.sweep import sweep_table
    from phantom.runs import runs_root

    csv = Path(args.csv) if args.csv else None
    if csv is not None and (csv.is_dir() or not csv.resolve().parent.is_dir()):
        parent = csv.resolve().parent
        what = "is a folder" if csv.is_dir() else f"is in {parent}, which " + (
            "is not a folder" if parent.exists() else "does not exist")
        raise cli.UsageError(f"--csv {args.csv} {what}; allowed: a file in an existing folder")
    df = sweep_table(args.sweep, profile=args.profile, runs_root=args.runs_dir)
    if not df["status"].notna().any():
        raise cli.UsageError(f"no run of sweep {args.sweep!r} (profile {args.profile}) under {runs_root(args.runs_dir)}: "
                         f"none of its {len(df)} cells has a run folder there; allowed: the --runs-dir (and "
                         "--profile) the sweep ran with")
    cols = ["groups", "arm", "estimator", "kind", "lam", "seed", "noise_p", "drop", "status", "start_acc",
            "final_acc", "final_acc_denoised", "start_len", "final_len", "len_ratio", "first_step_acc_below_0.1",
            "len_step", "acc_step", "all_fail_step", "order", "all_fail_early", "phantom_early", "zeroed_early",
            "refill_steps", "gen_batches_total", "wall_seconds"]
    if "task" in df:
        cols.insert(1, "terms")
        df["terms"] = [f"{t['terms'][0]}-{t['terms'][1]}" for t in df["task"]]
    show = df[[c for c in cols if c in df]]
    with __import__("pandas").option_context("display.width", 200, "display.max_rows", 500):
        print(show.round(3).to_string(index=False))
    if csv is not None:
        df.to_csv(csv, index=False)
    return 0


def _model(args: argparse.Namespace) -> str:
    """``--model``, or the deprecated ``--profile`` of ``task``/``sft``, or the main setting's."""
    old = getattr(args, "old_profile", None)
    if old is not None:
        if old not in MODELS:
            raise cli.UsageError(f"SFT profile {old!r} is unknown; allowed: {', '.join(MODELS)}")
        if args.model not in (None, old):
            raise cli.UsageError(f"--profile {old} and --model {args.model} name two SFT profiles; allowed: --model only")
        print(f"phantom lab {args.cmd}: --profile {old} is deprecated here; use --model {old} (the SFT profile). "
              "--profile means the run profile, full or quick, in every other command", file=sys.stderr)
        return old
    return args.model or main_setting().get("model", "lab")


def _run_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The run's spec fields: the main setting, then the flags, then ``--set`` (checked: no field twice)."""
    sets = cli.parse_sets(args.sets)
    given = {k: getattr(args, k) for k in RUN_FLAGS if getattr(args, k) is not None}
    both = sorted(set(given) & set(sets))
    if both:
        k = both[0]
        raise cli.UsageError(f"--{k} {given[k]} and --set {k}={sets[k]} both set {k}; allowed: one of them")
    return {**main_setting(), "arm": "outcome", "estimator": "grpo", "kind": "length_short", "seed": 0,
            **given, **sets}


def check_name(name: str) -> str:
    """A run folder name that stays one folder under ``--runs-dir``."""
    if not RUN_NAME.fullmatch(name) or ".." in name:
        raise cli.UsageError(f"--name {name!r} is invalid; allowed: one folder name of letters, digits and ._+=,@- "
                         "(no '/', no '..', not empty, not starting with '.' or '-')")
    return name


def _run(args: argparse.Namespace) -> int:
    from phantom.lab.rl import run_arm
    from phantom.lab.spec import ArmSpec
    from phantom.lab.threads import lab_threads, parse_threads
    from phantom.runs import check_writable_dir

    if args.name is not None:
        check_name(args.name)
    threads = parse_threads(args.threads, what="--threads") if args.threads else lab_threads(
        default=parse_threads("auto"))
    spec = ArmSpec.from_dict(_run_spec(args))
    check_writable_dir(args.runs_dir, what="--runs-dir")
    run = run_arm(spec, name=args.name, root=args.runs_dir, threads=threads)
    print(run.path)
    print(json.dumps(run.manifest().get("summary"), indent=2))
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.cmd in ("task", "sft"):
        args.model = _model(args)
    if args.cmd == "task":
        from phantom.lab.sft import resolve_sft
        from phantom.lab.task import TaskConfig, make_split

        given = {"terms": tuple(args.terms) if args.terms else None, "max_operand": args.max_operand,
                 "wording": args.wording, "style": args.style, "slack": args.slack}
        cfg = TaskConfig.from_dict({**resolve_sft(args.model).task.to_dict(),
                                    **{k: v for k, v in given.items() if v is not None}})
        for p in make_split(cfg, args.split, args.n, start=args.start):
            print(json.dumps({"index": p.index, "prompt": p.prompt, "solution": p.solution, "answer": p.answer}))
        return 0
    if args.cmd == "sft":
        from phantom.lab.sft import ensure_sft_model, resolve_sft, sft_threads

        which = args.model if args.seed is None else {"profile": args.model, "seed": args.seed}
        resolve_sft(which)
        sft_threads()  # a bad $PHANTOM_SFT_THREADS fails here, before the lock and the build folder
        path = ensure_sft_model(which, rebuild=True)
        meta = json.loads((path / "lab_meta.json").read_text())
        print(path)
        print(json.dumps({k: meta.get(k) for k in ("params", "val_greedy_acc", "val_sampled_acc",
                                                   "val_greedy_len_chars", "steps_trained", "check_acc",
                                                   "train_seconds")}, indent=2))
        from phantom.lab.warmstart import compare_with_shipped, ship_warm_start

        if args.ship:
            print(f"shipped: {ship_warm_start(path)}")
        elif (cmp := compare_with_shipped(path)) is not None:
            print(("bit-identical to the shipped warm start" if cmp["identical"] else
                   "differs from the shipped warm start (another kind of CPU rounds differently; lab runs "
                   "start from the shipped one)") + f": held-out greedy accuracy {cmp['built_val_greedy_acc']:.3f} "
                  f"built here, {cmp['shipped_val_greedy_acc']:.3f} shipped")
        return 0
    if args.cmd == "run":
        return _run(args)
    if args.cmd == "sweep":
        from phantom.lab.sweep import SweepFailed, expand, load_sweep, run_sweep
        from phantom.runs import check_writable_dir

        cells = expand(load_sweep(args.sweep), args.profile)
        if args.dry_run:
            for c in cells:
                print(c.name, ",".join(c.groups))
        else:
            check_writable_dir(args.runs_dir, what="--runs-dir")
        try:
            runs = run_sweep(args.sweep, profile=args.profile, runs_root=args.runs_dir, jobs=args.jobs,
                             dry_run=args.dry_run)
        except SweepFailed as e:
            print(f"phantom lab sweep: {e}", file=sys.stderr)
            return 1
        if not args.dry_run:
            print(f"{len(runs)} runs finished under {runs[0].path.parent if runs else args.runs_dir}")
        return 0
    if args.cmd == "summary":
        return _summary(args)
    if args.cmd == "criteria":
        return _criteria(args)
    from phantom.lab.sweep import list_sweeps

    print("\n".join(list_sweeps()))
    return 0


@_exit_code
def main(argv: list[str] | None = None) -> int:
    args = cli.parse_args(_parser(), argv)
    try:
        return _dispatch(args)
    except ValueError as e:
        print(f"phantom lab {args.cmd}: {e}", file=sys.stderr)
        return 2
