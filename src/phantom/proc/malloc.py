"""The memory allocator of the lab's processes: gperftools' tcmalloc where the system has it.

The CPU lab's model is so small (0.35M parameters) that a training step is thousands of short tensor
ops, each of which allocates and frees its output; glibc's ``malloc`` returns large blocks to the
operating system and takes them back again, tcmalloc keeps them in per-thread caches. Preloading
tcmalloc makes a 40-step arm ~2-5% faster here (``benchmarks/bench_malloc.py``) and changes no number: an
allocator hands out memory, it does not reorder arithmetic (``tests/test_malloc.py`` compares two runs
metric for metric).

``phantom book``, ``phantom lab`` and ``phantom chapter`` re-execute themselves once with ``LD_PRELOAD`` set, so the SFT
and every papermill process and kernel of a sweep inherit it. ``PHANTOM_MALLOC=system`` keeps glibc's.
``scripts/setup_env.sh`` installs Debian's ``libtcmalloc-minimal4``; without it nothing changes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CHOICES", "COMMANDS", "choice", "tcmalloc_path", "preload_env", "in_use", "reexec_with_allocator"]

CHOICES: tuple[str, ...] = ("tcmalloc", "system")
#: where Debian/Ubuntu (multiarch) and Fedora-like systems put the library
_CANDIDATES = tuple(f"/usr/lib/{arch}-linux-gnu/libtcmalloc_minimal.so.4" for arch in ("x86_64", "aarch64")) + (
    "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc_minimal.so.4")
#: the commands whose processes run the lab's model (verl's Ray workers and the audit are left alone)
COMMANDS: tuple[str, ...] = ("book", "lab", "chapter")


def choice(env: Mapping[str, str] | None = None) -> str:
    """``$PHANTOM_MALLOC`` (default ``tcmalloc``); an unknown value raises naming the allowed ones."""
    value = (os.environ if env is None else env).get("PHANTOM_MALLOC", "tcmalloc").strip().lower() or "tcmalloc"
    if value not in CHOICES:
        raise ValueError(f"PHANTOM_MALLOC={value!r} is unknown; allowed: {', '.join(CHOICES)}")
    return value


def tcmalloc_path() -> str | None:
    """The first tcmalloc shared library found on this system, or None (not Linux, or not installed)."""
    if not sys.platform.startswith("linux"):
        return None
    return next((p for p in _CANDIDATES if Path(p).is_file()), None)


def preload_env(env: Mapping[str, str] | None = None, lib: str | None = None) -> dict[str, str] | None:
    """``env`` with tcmalloc added to ``LD_PRELOAD``; None when nothing is to change (already there,
    ``PHANTOM_MALLOC=system``, or no library)."""
    env = dict(os.environ if env is None else env)
    if choice(env) == "system":
        return None
    lib = lib or tcmalloc_path()
    current = env.get("LD_PRELOAD", "")
    if lib is None or lib in current.replace(":", " ").split():
        return None
    env["LD_PRELOAD"] = f"{lib} {current}".strip()
    return env


def in_use() -> str:
    """Which allocator this process has mapped: ``tcmalloc`` or ``system`` (for run manifests)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return "tcmalloc" if "libtcmalloc" in maps else "system"


def reexec_with_allocator(command: str, argv: list[str]) -> None:
    """Replace this process by the same command line under tcmalloc, if that applies; else return.

    Called by the console script before anything heavy is imported. The new process finds the library
    in ``LD_PRELOAD`` and does not re-execute again, even if the loader could not preload it.
    """
    if command not in COMMANDS:
        return
    env = preload_env()
    if env is None:
        return
    script = sys.argv[0]
    # the console script again, exactly as it was run (its folder first on sys.path); `python -m` otherwise
    cmd = [script] if Path(script).name == "phantom" and Path(script).is_file() else ["-m", "phantom.cli"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *cmd, *argv], env)
