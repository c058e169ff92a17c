"""``phantom lab ...``: the CPU lab from the command line.

    phantom lab task  [--split val] [--n 5] [--terms 4 6] [--style terse]     show problems (default: the lab task)
    phantom lab sft   [--profile lab_graded] [--seed 1]                        build / locate the warm start
    phantom lab run   --arm score --seed 1 [--set key=value ...] [--threads 2] one arm, in this process
    phantom lab sweep paper [--profile quick] [--jobs 2] [--dry-run]           papermill sweep
    phantom lab summary paper [--profile quick]                                endpoints and dynamics of a sweep
    phantom lab list                                                           known sweeps

`task`, `sft` and `run` default to the book's main setting: the `base` of the `paper` sweep (its SFT
profile, learning rate, steps and lambda), so that `phantom lab run --arm none --seed 3` is a fourth seed
of the book's no-filter cell. ArmSpec's own defaults are older (the worked style at lr 2.5e-3) and stay,
because committed sweeps rely on them.

Bad input exits with status 2 and a message naming the value and the allowed ones.
"""

from __future__ import annotations

import argparse
import json
import sys

from phantom.cli import parse_sets

__all__ = ["main"]


def main_setting() -> dict:
    """The book's main setting: the `paper` sweep's base spec fields (model, lr, steps, lam)."""
    from phantom.lab.sweep import load_sweep

    return dict(load_sweep("paper").get("base") or {})


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="phantom lab", description="The CPU lab (see `phantom lab COMMAND -h`).")
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("task", help="print problems of the lab task")
    t.add_argument("--split", default="val")
    t.add_argument("--n", type=int, default=5)
    t.add_argument("--start", type=int, default=0)
    t.add_argument("--terms", type=int, nargs=2, default=None, help="default: the lab profile's task")
    t.add_argument("--max-operand", type=int, default=None)
    t.add_argument("--wording", default=None)
    t.add_argument("--style", default=None, help="worked (prose around the steps), graded (the same, each kind at its own rate) or terse")
    t.add_argument("--slack", type=float, default=None, help="worked style: share of removable prose, 0..1")
    t.add_argument("--profile", default=None, help="SFT profile whose task gives the defaults (default: the "
                   "main setting's, the paper sweep's model)")

    s = sub.add_parser("sft", help="train the SFT warm start from scratch (cached) and compare it with the shipped one",
                       description="Train (or reuse a cached build of) a warm start from scratch, ignoring the copy "
                                   "shipped under data/warmstart/, and say whether the build is bit-identical to "
                                   "it. This is how to test the SFT itself; lab runs start from the shipped copy.")
    s.add_argument("--profile", default=None, help="SFT profile (default: the main setting's)")
    s.add_argument("--seed", type=int, default=None, help="SFT seed (another checkpoint of the same profile)")
    s.add_argument("--ship", action="store_true",
                   help="copy the build into data/warmstart/ and record its recipe (maintainers)")

    r = sub.add_parser("run", help="run one arm in this process")
    r.add_argument("--arm", default="outcome")
    r.add_argument("--estimator", default="grpo")
    r.add_argument("--kind", default="length_short")
    r.add_argument("--lam", type=float, default=None, help="default: the main setting's (0.3)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--steps", type=int, default=None, help="default: the main setting's (40)")
    r.add_argument("--model", default=None, help="SFT profile (default: the main setting's); the learning "
                   "rate stays the main setting's unless --set lr=...")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="any other ArmSpec field, e.g. --set kl_coef=0.001 --set sampling=dapo")
    r.add_argument("--name", default=None)
    r.add_argument("--runs-dir", default=None)
    r.add_argument("--threads", default=None, metavar="N|auto",
                   help="torch threads (default: $PHANTOM_LAB_THREADS, else auto = the CPUs this process may "
                        "use, at most 2); kept only where they change no number (phantom.lab.threads)")

    w = sub.add_parser("sweep", help="run a sweep with papermill (skips finished cells)")
    w.add_argument("sweep")
    w.add_argument("--profile", default="full")
    w.add_argument("--runs-dir", default=None)
    w.add_argument("--jobs", type=int, default=2)
    w.add_argument("--dry-run", action="store_true", help="validate and list the cells, run nothing")

    m = sub.add_parser("summary", help="endpoint table of a sweep's runs")
    m.add_argument("sweep")
    m.add_argument("--profile", default="full")
    m.add_argument("--runs-dir", default=None)
    m.add_argument("--csv", default=None, help="also write the full table here")

    c = sub.add_parser("criteria", help="the main setting's acceptance criteria per warm start of a sweep's runs")
    c.add_argument("sweep", help="a multi-warm-start sweep (no-filter, outcome and Dr. GRPO arms per SFT seed)")
    c.add_argument("--runs-dir", default=None)
    c.add_argument("--step", type=int, default=None, help="read the runs as if they had stopped after this step")

    sub.add_parser("list", help="list the packaged sweeps")
    return ap


def _criteria(args: argparse.Namespace) -> int:
    import pandas as pd

    from phantom.lab.acceptance import UNSAFE, acceptance, at_step, passing, warmstart_runs
    from phantom.runs import runs_root

    if args.step is not None and args.step < 1:
        raise ValueError(f"--step={args.step} is invalid; allowed: a step >= 1")
    table, frames = warmstart_runs(args.sweep, runs_root(args.runs_dir))
    if not len(table):
        raise ValueError(f"no finished run of {args.sweep} under {runs_root(args.runs_dir)}")
    if args.step is not None:
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

    df = sweep_table(args.sweep, profile=args.profile, runs_root=args.runs_dir)
    if args.csv:
        df.to_csv(args.csv, index=False)
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
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd in ("task", "sft") and args.profile is None:
            args.profile = main_setting().get("model", "lab")
        if args.cmd == "task":
            from phantom.lab.sft import resolve_sft
            from phantom.lab.task import TaskConfig, make_split

            given = {"terms": tuple(args.terms) if args.terms else None, "max_operand": args.max_operand,
                     "wording": args.wording, "style": args.style, "slack": args.slack}
            cfg = TaskConfig.from_dict({**resolve_sft(args.profile).task.to_dict(),
                                        **{k: v for k, v in given.items() if v is not None}})
            for p in make_split(cfg, args.split, args.n, start=args.start):
                print(json.dumps({"index": p.index, "prompt": p.prompt, "solution": p.solution, "answer": p.answer}))
            return 0
        if args.cmd == "sft":
            from phantom.lab.sft import ensure_sft_model, resolve_sft, sft_threads

            which = args.profile if args.seed is None else {"profile": args.profile, "seed": args.seed}
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
            from phantom.lab.rl import run_arm
            from phantom.lab.spec import ArmSpec
            from phantom.lab.threads import lab_threads, parse_threads

            threads = parse_threads(args.threads, what="--threads") if args.threads else lab_threads(
                default=parse_threads("auto"))
            given = {"lam": args.lam, "steps": args.steps, "model": args.model}
            spec = ArmSpec.from_dict({**main_setting(), "arm": args.arm, "estimator": args.estimator,
                                      "kind": args.kind, "seed": args.seed,
                                      **{k: v for k, v in given.items() if v is not None}, **parse_sets(args.sets)})
            run = run_arm(spec, name=args.name, root=args.runs_dir, threads=threads)
            print(run.path)
            print(json.dumps(run.manifest().get("summary"), indent=2))
            return 0
        if args.cmd == "sweep":
            from phantom.lab.sweep import expand, load_sweep, run_sweep

            if args.dry_run:
                for c in expand(load_sweep(args.sweep), args.profile):
                    print(c.name, ",".join(c.groups))
            runs = run_sweep(args.sweep, profile=args.profile, runs_root=args.runs_dir, jobs=args.jobs,
                             dry_run=args.dry_run)
            if not args.dry_run:
                print(f"{len(runs)} runs finished under {runs[0].path.parent if runs else args.runs_dir}")
            return 0
        if args.cmd == "summary":
            return _summary(args)
        if args.cmd == "criteria":
            return _criteria(args)
        if args.cmd == "list":
            from phantom.lab.sweep import list_sweeps

            print("\n".join(list_sweeps()))
            return 0
    except ValueError as e:
        print(f"phantom lab {args.cmd}: {e}", file=sys.stderr)
        return 2
    return 2
