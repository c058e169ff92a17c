"""Which keys exist in the config a verl entry point composes, so Hydra's rules can be applied without Hydra.

Hydra 1.3 composes verl's config in struct mode: an override ``key=value`` of a key the composed
config does not have is refused ("Key 'x' is not in struct"), and ``+key=value`` of a key it does
have is refused too ("Could not append to config. An item is already at 'key'"); either way the run
never starts. ``++key=value`` always works, ``~key`` needs the key. Config *groups* are selected
with ``group=option`` (``model_engine=megatron``).

The key sets are the dotted paths (nodes and leaves) of verl 0.9.1's configs as Hydra composes
them: ``ppo_trainer``, ``ppo_megatron_trainer`` and the fully-async trainer's config, kept in
``verl_keys.json`` next to this module (``ppo_megatron_trainer`` and ``fully_async_ppo_trainer`` as
differences from ``ppo_trainer``). ``python -m phantom.audit.verl_keys --write`` regenerates the file
from the installed wheel; ``tests/test_audit_hydra.py`` checks it against the wheel and checks the
rules against Hydra itself. The file is read once, lazily: the audit never imports verl or Hydra.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["DATA", "KeySet", "key_set", "key_set_for", "generate"]
_KNOWN_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer", "fully_async_ppo_trainer")

DATA = Path(__file__).with_name("verl_keys.json")
#: config name -> its folder inside the verl package
_CONFIGS = {"ppo_trainer": "trainer/config", "ppo_megatron_trainer": "trainer/config",
            "fully_async_ppo_trainer": "experimental/fully_async_policy/config"}


class KeySet:
    """The keys of one composed config (plus a trainer's own additions) and verl's config groups."""

    def __init__(self, keys: frozenset[str], groups: frozenset[str], name: str):
        self.keys, self.groups, self.name = keys, groups, name

    def with_extra(self, extra: frozenset[str]) -> KeySet:
        if not extra:
            return self
        parents = {".".join(k.split(".")[:i]) for k in extra for i in range(1, k.count(".") + 1)}
        return KeySet(self.keys | extra | parents, self.groups, self.name)

    def has(self, key: str) -> bool:
        return key in self.keys

    def is_group(self, key: str) -> bool:
        """``model_engine`` or ``actor@actor_rollout_ref.actor``: a config-group selection, not a key."""
        return key.split("@", 1)[0] in self.groups and "." not in key.split("@", 1)[0]

    def nearest(self, key: str) -> str | None:
        """The existing key a typo most likely meant (same parent first), for the fix."""
        import difflib

        parent = key.rsplit(".", 1)[0] if "." in key else ""
        siblings = [k for k in self.keys if k.rsplit(".", 1)[0] == parent] if parent else []
        for pool in (siblings, list(self.keys)):
            hit = difflib.get_close_matches(key, pool, n=1, cutoff=0.8)
            if hit:
                return hit[0]
        return None

    def deepest_parent(self, key: str) -> str | None:
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            p = ".".join(parts[:i])
            if p in self.keys:
                return p
        return None


def key_set_for(s: Any) -> KeySet | None:
    """The keys the command's config has (``s``: a :class:`phantom.audit.schema.Settings`), or None when unknown.

    The entry point's config (its registry entry's key set plus what its own config adds), or the one a
    ``--config-name`` names when the audit has it; a model-engine group selection (``model_engine=megatron``)
    adds that engine's keys.
    """
    if s.doc.kind != "verl":
        return None
    name = s.doc.config_name
    if name is not None:
        base = key_set(name) if name in _KNOWN_CONFIGS else None
    else:
        base = key_set(s.spec.keys) if s.spec.keys else None
    if base is None:
        return None
    ks = base.with_extra(s.spec.extra_keys)
    groups = [e for k, e in s.doc.entries.items() if ks.is_group(k) and (e.raw or '').lstrip('+~').startswith(k + '=')]
    if any(str(e.value) not in ("dp", "fsdp") for e in groups):  # another model engine: its keys too
        other = key_set("ppo_megatron_trainer")
        if other is not None:
            ks = KeySet(ks.keys | other.keys, ks.groups, ks.name + "+groups")
    return ks


@lru_cache(maxsize=8)
def _data() -> dict | None:
    try:
        return json.loads(DATA.read_text())
    except (OSError, ValueError):
        return None


@lru_cache(maxsize=16)
def key_set(name: str) -> KeySet | None:
    """The key set of a composed config (None when the data file is missing or the name unknown)."""
    data = _data()
    if data is None or name not in data["configs"]:
        return None
    base = set(data["configs"]["ppo_trainer"])
    entry = data["configs"][name]
    keys = base if name == "ppo_trainer" else (base - set(entry["removed"])) | set(entry["added"])
    return KeySet(frozenset(keys), frozenset(data["groups"]), name)


def _flatten(node: object, prefix: str, out: set[str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            out.add(key)
            _flatten(v, key + ".", out)


def _compose(name: str, folder: Path) -> set[str]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(folder), version_base=None):
            cfg = compose(config_name=name)
    finally:
        GlobalHydra.instance().clear()
    out: set[str] = set()
    _flatten(OmegaConf.to_container(cfg, resolve=False), "", out)
    return out


def generate() -> dict:
    """The key sets from the installed verl (composed by Hydra; needs verl and hydra-core)."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None, "verl is not installed"
    root = Path(spec.origin).parent
    groups = sorted(p.name for p in (root / "trainer" / "config").iterdir() if p.is_dir() and not p.name.startswith("_"))
    sets = {name: _compose(name, root / folder) for name, folder in _CONFIGS.items()}
    base = sets["ppo_trainer"]
    configs: dict = {"ppo_trainer": sorted(base)}
    for name, keys in sets.items():
        if name != "ppo_trainer":
            configs[name] = {"added": sorted(keys - base), "removed": sorted(base - keys)}
    return {"verl": importlib.metadata.version("verl"), "groups": groups, "configs": configs}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    data = generate()
    text = json.dumps(data, indent=0, sort_keys=True) + "\n"
    if "--write" in args:
        DATA.write_text(text)
        print(f"wrote {DATA} (verl {data['verl']}: {len(data['configs']['ppo_trainer'])} keys in ppo_trainer)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
