"""``phantom audit``'s command line: arguments checked before any work, a help screen a newcomer can use.

Every flag value is checked before an input is read or a reward function imported: a bad value is
exit 2 with a message naming it and the values allowed (``--trl-version banana``, ``--ignore PH999``,
``--probe-timeout 0``). A reader that closes the pipe (``phantom audit ... | head -1``) ends the
audit quietly with its exit code. Imports stay light: no torch, and verl/Hydra only through the
key data file (:mod:`phantom.audit.verl_keys`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import textwrap

from phantom.audit import audit
from phantom.audit.readers import KINDS
from phantom.audit.report import render_json, render_sarif, render_text
from phantom.audit.rules import RULES, AllSame
from phantom.audit.schema import ENTRYPOINTS, VERL_VERSIONS
from phantom.audit.trainers import TRAINERS
from phantom.audit.trl import version_tuple

__all__ = ["main", "parser"]

EXAMPLES = """\
examples:
  phantom audit run_dapo.sh                      # a launch script: one report per trainer command
  phantom audit config.yaml overrides.txt --merge  # a YAML with an override list on top, as one run
  phantom audit train_grpo.py --reward-fn rewards.py:format_reward --reward-fn rewards.py:accuracy_reward
  phantom audit scripts/*.sh --format json --fail-on error   # in CI
  phantom audit outputs/2026-12-01/.hydra/overrides.yaml --exposure rollouts.jsonl"""
EXIT_CODES = """\
exit codes:
  0  clean: no finding at or above --fail-on
  1  findings at or above --fail-on (default: warning)
  2  an input, a reward function or a flag value could not be used (named, with the values allowed)
  3  an internal error of the audit (the input is named; the rest of the batch is still reported)"""
#: rule ids --ignore accepts (PH000 is an unreadable input in SARIF, not a rule to ignore)
RULE_IDS = tuple(RULES)


def _trainer_lines() -> str:
    fams: dict[str, list[str]] = {}
    for t in TRAINERS:
        fams.setdefault(t.family, []).append(t.name)
    return "\n".join(f"  {fam:<9} {', '.join(names)}" for fam, names in fams.items())


def parser() -> argparse.ArgumentParser:
    rule_lines = "\n".join(f"  {rid}  {name:<31} {text}" for rid, (name, text) in RULES.items())
    ap = argparse.ArgumentParser(
        prog="phantom audit",
        description=textwrap.fill(
            "Find phantom-prone settings in a GRPO/DAPO run's config or launch script, without running it: a group "
            "filter or a std normalization that lets a shaped reward (format, length, overlong, partial credit) give "
            "full-size advantages to groups that all failed. Reads verl, verl-recipe, EasyR1, TRL, OpenRLHF, "
            "ms-swift, NeMo-RL and oat launches and configs, and phantom run folders.", width=100),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"{EXAMPLES}\n\nentry points it knows (--entrypoint takes the verl ones):\n{_trainer_lines()}\n\n"
               f"rules (--ignore takes these ids):\n{rule_lines}\n\n{EXIT_CODES}")
    ap.add_argument("configs", nargs="+", metavar="CONFIG",
                    help="a launch script (.sh/.slurm), verl/EasyR1/NeMo-RL/TRL YAML or JSON, a Hydra override list, "
                         "a TRL training script (.py, read with ast), or a phantom run folder")
    ap.add_argument("--reward-fn", action="append", default=[], metavar="PATH[:NAME]",
                    help="import this reward function (a file or pkg://module; NAME defaults to compute_score) and "
                         "call it on probe answers (right/wrong, formatted or not, short, long, overlong, empty); "
                         "repeat for several TRL reward functions. The only code the audit ever runs")
    ap.add_argument("--probe-timeout", type=float, default=20.0, metavar="S",
                    help="seconds the --reward-fn import and its probe calls may take (default: 20; a positive number)")
    shaped = ap.add_mutually_exclusive_group()
    shaped.add_argument("--shaped", dest="shaped", action="store_true", default=None,
                        help="the reward function mixes shaping into its score")
    shaped.add_argument("--no-shaped", dest="shaped", action="store_false", default=None,
                        help="it scores the outcome only")
    ap.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                    help="text (default), json (schema 3, docs/audit_json.md) or sarif (code scanning)")
    ap.add_argument("--verl-version", choices=VERL_VERSIONS, default="0.9.1",
                    help="the verl whose defaults and keys to assume (0.9.1: filter metric `reward`; 0.9.0: null)")
    ap.add_argument("--trl-version", metavar="X.Y",
                    help="the TRL version the run uses, e.g. 0.21 or 1.16 (picks the scale_rewards form a fix prints; "
                         "default: both forms)")
    ap.add_argument("--entrypoint", choices=ENTRYPOINTS, metavar="NAME",
                    help="the verl trainer, for inputs that do not name it (default: main_ppo); one of "
                         + ", ".join(ENTRYPOINTS))
    ap.add_argument("--kind", choices=KINDS, help="force the config family of YAML/JSON inputs")
    ap.add_argument("--merge", action="store_true", help="layer all CONFIGs into one run (later values win)")
    ap.add_argument("--exposure", metavar="ROLLOUTS", help="a rollout dump to measure the all-same fraction from")
    ap.add_argument("--all-same-frac", type=float, metavar="F",
                    help="measured fraction of groups the filter drops (a number in [0, 1])")
    ap.add_argument("--data-source", metavar="NAME",
                    help="the data's data_source (picks verl's built-in scorer; default: inferred from "
                         "data.train_files; also passed to a probed reward, default openai/gsm8k)")
    ap.add_argument("--fail-on", choices=("error", "warning", "info"), default="warning",
                    help="lowest severity that makes the exit code 1 (default: warning)")
    ap.add_argument("--ignore", action="append", default=[], metavar="RULE",
                    help="skip a rule id (repeatable), e.g. PH021; the ids are listed below")
    ap.add_argument("--skip-non-trainer", action="store_true",
                    help="skip shell scripts that start no trainer and YAML/JSON that is no trainer config instead "
                         "of failing (for pre-commit globs)")
    return ap


def _check(args: argparse.Namespace) -> str | None:
    """The first bad flag value, as a message naming it and what is allowed (None: all good)."""
    if args.trl_version is not None and version_tuple(args.trl_version) is None:
        return f"--trl-version {args.trl_version!r} is not a version; allowed: X.Y such as 0.21 or 1.16"
    bad = [r for r in args.ignore if r.upper() not in RULE_IDS]
    if bad:
        return f"--ignore {bad[0]!r} is not a rule id; allowed: {', '.join(RULE_IDS)}"
    if not (math.isfinite(args.probe_timeout) and args.probe_timeout > 0):
        return f"--probe-timeout {args.probe_timeout} is invalid; allowed: a positive number of seconds"
    if args.all_same_frac is not None and not (math.isfinite(args.all_same_frac) and 0.0 <= args.all_same_frac <= 1.0):
        return f"--all-same-frac {args.all_same_frac} is invalid; allowed: a fraction in [0, 1]"
    return None


def _print(text: str) -> None:
    """Print the report; a reader that left (``| head``) is not an error of the audit."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # stdout to /dev/null: the interpreter's final flush stays quiet too
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problem = _check(args)
    if problem:
        print(f"phantom audit: {problem}", file=sys.stderr)
        return 2
    measured = None
    if args.all_same_frac is not None:
        measured = AllSame(args.all_same_frac, args.all_same_frac, "from --all-same-frac")
    report = audit(args.configs, reward_fns=args.reward_fn, shaped=args.shaped, version=args.verl_version,
                   entrypoint=args.entrypoint, kind=args.kind, merge=args.merge, all_same=measured,
                   exposure=args.exposure, data_source=args.data_source, fail_on=args.fail_on,
                   ignore=[r.upper() for r in args.ignore], trl_version=args.trl_version,
                   skip_non_trainer=args.skip_non_trainer, probe_timeout=args.probe_timeout)
    render = {"json": render_json, "sarif": render_sarif}.get(args.format, render_text)
    _print(render(report))
    return report.exit_code
