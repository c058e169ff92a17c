"""The ``phantom`` command line.

Each subcommand lives in its own module as ``main(argv) -> int`` and is imported only when used,
so ``phantom --help`` stays instant and ``phantom audit`` never imports torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

#: command -> ("module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "lab": ("phantom.lab.cli:main", "CPU lab: build the task and model, SFT, RL arms, papermill sweeps"),
    "verl": ("phantom.verl.launch:main", "launch real verl 0.9.1 runs (CPU here, GPU for users)"),
    "trl": ("phantom.trl.sweep:main", "TRL's GRPOTrainer on the CPU lab: the three-arm sweep, its endpoints"),
    "data": ("phantom.verl.data:main", "build verl parquet: GSM8K, MATH, the lab task"),
    "chapter": ("phantom.book.build:chapter_main", "execute one book chapter with papermill (-p key value)"),
    "book": ("phantom.book.build:book_main", "execute the chapters and build the HTML book"),
    "audit": ("phantom.audit:main", "check a verl/TRL config or launch script for phantom-prone settings"),
    "exposure": ("phantom.audit.exposure:main", "all-fail / phantom fractions of a rollout dump"),
    "watch": ("phantom.audit.watch:main", "follow a metrics.jsonl and warn on the leading indicators"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: phantom COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `phantom COMMAND --help` for a command's options."]
    return "\n".join(lines)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set key=value`` arguments (values parsed as YAML) of `phantom lab run` and `phantom verl`."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r} is invalid; allowed: key=value (value parsed as YAML)")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from phantom import __version__

        print(f"phantom {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"phantom: unknown command {command!r}; allowed: {', '.join(COMMANDS)}", file=sys.stderr)
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
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
