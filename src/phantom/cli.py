"""The ``phantom`` command line: the dispatcher and the one error policy every command shares.

Each subcommand lives in its own module as ``main(argv) -> int`` and is imported only when used,
so ``phantom --help`` stays instant and ``phantom audit`` never imports torch. This module is stdlib
only for the same reason; it also holds what every command's ``--help`` shares (:func:`command_parser`:
a description, examples and the exit codes) so that all screens read alike.

The error policy (:func:`run_command`), the same for every command, so none shows a user a traceback
for something the user can fix:

- bad input is ``ValueError`` (the project's convention: the message names the value and the allowed
  ones), :class:`~phantom.runs.RunInUse` / :class:`~phantom.runs.RunConflict`, or an ``OSError`` on a
  path (a file where a folder should be, a read-only folder, a missing parent): one line, exit 2;
- a missing optional dependency names the extra to install: exit 2;
- Ctrl-C: one line (naming the run folder it marked ``interrupted``, if any), exit 130;
- a closed output pipe (``phantom lab summary paper | head``): no message, exit 141 as for SIGPIPE;
- anything else is a bug: the traceback, then a line saying so, exit 3.

``PHANTOM_TRACEBACK=1`` prints the traceback for the handled cases too.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: command -> ("module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "lab": ("phantom.lab.cli:main", "CPU lab: the task, the warm start, RL arms, papermill sweeps, their tables"),
    "verl": ("phantom.verl.launch:main", "launch real verl 0.9.1 runs (CPU here, GPU for users)"),
    "trl": ("phantom.trl.sweep:main", "TRL's GRPOTrainer on the CPU lab: the three-arm sweep, its endpoints"),
    "data": ("phantom.verl.data:main", "build verl parquet: GSM8K, MATH, the lab task"),
    "chapter": ("phantom.book.build:chapter_main", "execute one book chapter with papermill (-p key value)"),
    "book": ("phantom.book.build:book_main", "execute the chapters and build the HTML book"),
    "audit": ("phantom.audit:main", "check a launch script or config (verl and its recipes, EasyR1, TRL, OpenRLHF, ms-swift, NeMo-RL, oat) for phantom-prone settings"),
    "exposure": ("phantom.audit.exposure:main", "all-fail / phantom fractions of a rollout dump"),
    "watch": ("phantom.audit.watch:main", "follow a metrics.jsonl and warn on the leading indicators"),
}

EXAMPLES: tuple[str, ...] = (
    "phantom lab run --arm none --seed 0          # one no-filter arm of the book's main setting",
    "phantom lab summary paper --profile quick    # endpoints and dynamics of a sweep's runs",
    "phantom watch --once runs/<run>/metrics.jsonl",
    "phantom audit my_verl_config.yaml",
)

#: exit codes every command shares; a command's own meaning of 1 is added by :func:`exit_codes`
EXIT_CODES: dict[int, str] = {
    0: "success",
    2: "bad input (the message names the value and the allowed ones); nothing was started",
    3: "a bug in phantom (a traceback is shown; please report it)",
    130: "interrupted (Ctrl-C); a run folder in progress is marked interrupted",
    141: "the output pipe was closed (e.g. `| head`)",
}

#: optional modules -> the extra that installs them (``pip install 'phantom[EXTRA]'``, or `make setup`)
EXTRAS: dict[str, str] = {
    "torch": "lab", "transformers": "lab", "tokenizers": "lab", "safetensors": "lab",
    "verl": "verl", "ray": "verl", "peft": "verl", "trl": "trl", "datasets": "trl",
    "papermill": "book", "nbformat": "book", "jupyter_book": "book", "jupytext": "book", "myst_nb": "book",
    "tree_sitter": "audit", "tree_sitter_bash": "audit",
}
#: OSError numbers that describe the user's paths, not phantom: reported in one line, exit 2
PATH_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS,
                         errno.ENOSPC, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP, errno.EDQUOT, errno.ENOTEMPTY,
                         errno.EXDEV, errno.EBUSY, errno.ETXTBSY})
BUG_LINE = ("phantom {command}: this is a bug in phantom {version}, not a mistake of yours; please report it to the "
            "project's issue tracker with the command line above and this traceback")


class UsageError(ValueError):
    """Bad input found by a command line (exit 2); the message names the value and the allowed ones."""


# ------------------------------------------------------------------------------------------------
# Help screens: every command and subcommand has a description, examples and its exit codes
# ------------------------------------------------------------------------------------------------
def exit_codes(one: str | None = None, **more: str) -> dict[int, str]:
    """The shared exit codes plus this command's meaning of 1 (``one``) and any others (``c4="..."``)."""
    codes = dict(EXIT_CODES)
    if one:
        codes[1] = one
    codes.update({int(k.lstrip("c")): v for k, v in more.items()})
    return dict(sorted(codes.items()))


def epilog(examples: Sequence[str], codes: Mapping[int, str] | None = None, notes: str = "") -> str:
    """The end of a help screen: notes, examples (each a full command line) and exit codes."""
    lines = [notes.rstrip(), ""] if notes else []
    lines += ["examples:", *(f"  {e}" for e in examples), "", "exit codes:"]
    lines += [f"  {code:<4} {text}" for code, text in (codes or EXIT_CODES).items()]
    return "\n".join(lines)


class ArgTypes:
    """``type=`` functions for argparse whose messages name the value and the allowed ones."""

    @staticmethod
    def _int(text: str, lo: int, hi: int | None = None) -> int:
        allowed = f"an integer >= {lo}" if hi is None else f"an integer, {lo}..{hi}"
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; allowed: {allowed}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; allowed: {allowed}")
        return v

    @staticmethod
    def _float(text: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
        import math

        lo_s = f"{'>' if lo_open else '>='} {lo:g}" if lo is not None else ""
        allowed = "a finite number" + (f" {lo_s}" if lo_s else "") + (f" and <= {hi:g}" if hi is not None else "")
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; allowed: {allowed}") from None
        if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {allowed}")
        return v

    @classmethod
    def count(cls, text: str) -> int:
        """An integer >= 1 (steps, jobs, sizes)."""
        return cls._int(text, 1)

    @classmethod
    def index(cls, text: str) -> int:
        """An integer >= 0 (seeds, start indices)."""
        return cls._int(text, 0)

    @classmethod
    def fraction(cls, text: str) -> float:
        """A finite number in [0, 1]."""
        return cls._float(text, 0.0, 1.0)

    @classmethod
    def finite(cls, text: str) -> float:
        """Any finite number (no nan, no inf)."""
        return cls._float(text)

    @classmethod
    def positive(cls, text: str) -> float:
        """A finite number > 0 (seconds, intervals)."""
        return cls._float(text, 0.0, lo_open=True)

    @classmethod
    def nonnegative(cls, text: str) -> float:
        """A finite number >= 0."""
        return cls._float(text, 0.0)


class Parser(argparse.ArgumentParser):
    """argparse, whose errors say "allowed:" as the rest of phantom's messages do, and exit 2."""

    def error(self, message: str) -> Any:
        message = re.sub(r"invalid choice: (.*?) \(choose from (.*)\)$", r"\1 is not allowed; allowed: \2", message)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` shows the options and examples)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and the epilog's line breaks (examples), wraps the options' help."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=min(110, max(80, _columns())))


def _columns() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 100


def command_parser(prog: str, description: str, examples: Sequence[str], codes: Mapping[int, str] | None = None,
                   notes: str = "") -> argparse.ArgumentParser:
    """An ``ArgumentParser`` whose help screen has the description, the examples and the exit codes."""
    return Parser(prog=prog, description=description, epilog=epilog(examples, codes, notes),
                  formatter_class=HelpFormatter)


def add_command(sub: Any, name: str, *, help: str, description: str | None = None, examples: Sequence[str],
                codes: Mapping[int, str] | None = None, notes: str = "") -> argparse.ArgumentParser:
    """A subcommand (``sub`` from ``add_subparsers``) with the same kind of help screen."""
    return sub.add_parser(name, help=help, description=description or help[:1].upper() + help[1:] + ".",
                          epilog=epilog(examples, codes, notes), formatter_class=HelpFormatter)


def subcommands(ap: argparse.ArgumentParser, dest: str = "cmd") -> Any:
    """``add_subparsers`` whose usage line reads ``COMMAND`` (see :func:`parse_args` for a bare call)."""
    return ap.add_subparsers(dest=dest, metavar="COMMAND", title="commands")


def parse_args(ap: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``ap.parse_args``, except that a bare ``phantom lab`` says what to do instead of "required: cmd"."""
    args = list(sys.argv[1:] if argv is None else argv)
    actions = [a for a in ap._actions if isinstance(a, argparse._SubParsersAction)]
    if actions and not [a for a in args if not a.startswith("-")] and not {"-h", "--help"} & set(args):
        names = ", ".join(actions[0].choices)
        ap.print_usage(sys.stderr)
        print(f"{ap.prog}: say which command; allowed: {names}. `{ap.prog} --help` shows what each does, "
              f"`{ap.prog} COMMAND --help` its options and examples", file=sys.stderr)
        raise SystemExit(2)
    return ap.parse_args(args)


def exit_code_of(main: Callable[..., int]) -> Callable[..., int]:
    """``main(argv) -> int`` also when argparse exits (``--help``: 0, a bad flag: 2): callers in Python
    (tests, notebooks) get the code back instead of a ``SystemExit``."""
    import functools

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)

    return wrapper


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: phantom COMMAND [ARGS...]", "",
             "Phantom advantages in group-relative RL: the CPU lab, verl and TRL runs, the book, and the",
             "practitioner's checks (audit, exposure, watch).", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `phantom COMMAND --help` for a command's options and examples.", "", epilog(EXAMPLES)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# --set key=value
# ------------------------------------------------------------------------------------------------
def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set key=value`` arguments (values parsed as YAML) of `phantom lab run` and `phantom verl`.

    A key given twice is an error: which one was meant cannot be told.
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"--set {item!r} is invalid; allowed: key=value (value parsed as YAML)")
        key, value = item.split("=", 1)
        key = key.strip()
        if key in out:
            raise ValueError(f"--set {key}= is given twice ({out[key]!r} and {value!r}); allowed: once per key")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ValueError(f"--set {item!r}: the value is not valid YAML ({str(e).splitlines()[0]})") from None
    return out


# ------------------------------------------------------------------------------------------------
# The error policy
# ------------------------------------------------------------------------------------------------
def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the interpreter's final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def user_error(exc: BaseException) -> str | None:
    """The one-line message for an exception that is the user's to fix, or None for a bug."""
    runs = sys.modules.get("phantom.runs")  # imported by whatever could raise its errors
    if runs is not None and isinstance(exc, (runs.RunInUse, runs.RunConflict)):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top in EXTRAS:
            return (f"this command needs {top}, which is not installed; install the {EXTRAS[top]!r} extra: "
                    f"pip install 'phantom[{EXTRAS[top]}]' (or `make setup` in a checkout)")
        return None
    if isinstance(exc, OSError) and exc.errno in PATH_ERRNOS:
        what = os.strerror(exc.errno) if exc.errno else str(exc)
        where = exc.filename if exc.filename is not None else None
        if where is None:
            return f"{what} ({exc})"
        two = f" -> {exc.filename2}" if exc.filename2 is not None else ""
        return f"{where}{two}: {what}"
    if isinstance(exc, ValueError):  # the project's bad-input convention (ARCHITECTURE.md, "Conventions")
        return str(exc) or type(exc).__name__
    return None


def _forget_unhandled_interrupt() -> None:
    """Make the interpreter exit with the code we return (130), not by re-raising SIGINT on itself.

    Why: CPython marks an interrupt "unhandled" whenever a KeyboardInterrupt leaves code run by
    ``exec``/``eval`` of a *string* (``PyRun_String``: dataclasses and namedtuples build their methods
    that way, and any library may), even if an outer ``except`` handles it; at exit the mark makes the
    process kill itself with SIGINT (returncode -2), whatever ``sys.exit`` said. Each string execution
    clears the mark first, so running an empty one resets it. CI met this once: the SFT Ctrl-C test's
    ``phantom lab sft`` printed its line and then ended by signal.
    """
    exec("pass")  # noqa: S102 -- a constant string: see the docstring


def run_command(command: str, func: Callable[[list[str]], Any], rest: list[str]) -> int:
    """Run one command's ``main`` under the error policy (module docstring) and return its exit code."""
    show = os.environ.get("PHANTOM_TRACEBACK", "") not in ("", "0")
    try:
        code = int(func(rest) or 0)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt as e:
        if show:
            traceback.print_exc()
        notes = "; ".join(getattr(e, "__notes__", None) or [])
        print(f"phantom {command}: interrupted" + (f" ({notes})" if notes else ""), file=sys.stderr)
        _forget_unhandled_interrupt()
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except SystemExit:
        raise
    except Exception as e:
        message = user_error(e)
        if message is None:
            from phantom import __version__

            traceback.print_exc()
            print(BUG_LINE.format(command=command, version=__version__), file=sys.stderr)
            return 3
        if show:
            traceback.print_exc()
        print(f"phantom {command}: {message}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from phantom import __version__

        print(f"phantom {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"phantom: unknown command {command!r}; allowed: {', '.join(COMMANDS)} "
              "(`phantom --help` says what each does)", file=sys.stderr)
        return 2
    if argv is None:  # the console script, not a call from Python: the lab's processes get tcmalloc
        from phantom.proc.malloc import reexec_with_allocator

        try:
            reexec_with_allocator(command, args)
        except ValueError as e:
            print(f"phantom: {e}", file=sys.stderr)
            return 2
    target, _ = COMMANDS[command]
    module_name, func_name = target.split(":")

    def call(rest: list[str]) -> Any:
        return getattr(importlib.import_module(module_name), func_name)(rest)

    return run_command(command, call, rest)


if __name__ == "__main__":
    sys.exit(main())
