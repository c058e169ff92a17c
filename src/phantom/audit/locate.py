"""Find a file a config names (a reward module, a base config) without running anything.

Launch scripts name files relative to the folder they are run from, which is usually the
repository root, not the script's folder: ``reward.custom_reward_function.path=recipe/x/reward.py``,
EasyR1's ``config=examples/config.yaml``, NeMo-RL's ``defaults: ../../grpo_math_1B.yaml``. The audit
tries, in order: the path as given (absolute, or relative to the current folder), the input's
folder and up to three of its parents; a path inside verl's own package (``verl/utils/...``) is
also looked up in the installed verl, located without importing it.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

__all__ = ["locate"]


@lru_cache(maxsize=1)
def _verl_root() -> Path | None:
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent.parent if spec is not None and spec.origin else None


def locate(name: str, near: str | None = None) -> Path | None:
    """The file ``name`` most likely refers to, or None."""
    name = name.strip().strip("'\"")
    if not name or "$" in name or "\n" in name or len(name) > 1024:
        return None
    for prefix in ("file://", "pkg://"):
        if name.startswith(prefix):
            return None if prefix == "pkg://" else locate(name[len(prefix):], near)
    p = Path(name).expanduser()
    cands = [p] if p.is_absolute() else [Path.cwd() / p]
    if near is not None and not p.is_absolute():
        base = Path(near).resolve().parent
        cands += [d / p for d in [base, *list(base.parents)[:3]]]
    if "verl/" in name and _verl_root() is not None:
        cands.append(_verl_root() / name[name.index("verl/"):])
    for c in cands:
        try:
            if c.is_file():
                return c
        except OSError:
            continue
    return None
