"""Which keys exist in the config a verl entry point composes, so Hydra's rules can be applied without Hydra.

Hydra 1.3 composes verl's config in struct mode (``hydra/_internal/config_loader_impl.py``,
``_apply_overrides_to_config``): an override ``key=value`` of a key the composed config does not have
is refused ("Could not override 'key'"); ``+key=value`` of a key it has is refused too ("Could not
append to config. An item is already at 'key'") unless the key's value is null or the new value is
a list or a dict; ``~key`` is refused when the key is absent or null; ``++key=value`` always works.
Config *groups* are selected with ``group=option`` (``model_engine=megatron``), and change the keys.

The key sets are the dotted paths (nodes and leaves) of verl 0.9.1's configs as Hydra composes
them, and which of them are null: ``ppo_trainer`` with each ``model_engine`` (``ppo_trainer@megatron``,
...), ``ppo_megatron_trainer`` and the fully-async trainer's configs, kept in ``verl_keys.json``
next to this module (each variant as differences from ``ppo_trainer``). ``python -m phantom.audit.verl_keys --write`` regenerates the file
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

    def __init__(self, keys: frozenset[str], groups: frozenset[str], name: str, nulls: frozenset[str] = frozenset()):
        self.keys, self.groups, self.name, self.nulls = keys, groups, name, nulls
        self._idx: tuple[dict[str, dict[str, str]], dict[str, list[str]]] | None = None

    def with_extra(self, extra: frozenset[str]) -> KeySet:
        if not extra:
            return self
        parents = {".".join(k.split(".")[:i]) for k in extra for i in range(1, k.count(".") + 1)}
        return KeySet(self.keys | extra | parents, self.groups, self.name, self.nulls)

    def is_null(self, key: str) -> bool:
        """The key exists with a null value (Hydra then lets ``+key`` add it and refuses ``~key``)."""
        return key in self.nulls

    def has(self, key: str) -> bool:
        return key in self.keys

    def is_group(self, key: str) -> bool:
        """``model_engine`` or ``actor@actor_rollout_ref.actor``: a config-group selection, not a key."""
        return key.split("@", 1)[0] in self.groups and "." not in key.split("@", 1)[0]

    def _index(self) -> tuple[dict[str, dict[str, str]], dict[str, list[str]]]:
        """parent -> {last part: key}, and last part -> keys (built once: a script may set thousands of keys)."""
        if self._idx is None:
            by_parent: dict[str, dict[str, str]] = {}
            by_leaf: dict[str, list[str]] = {}
            for k in self.keys:
                parent, _, leaf = k.rpartition(".")
                by_parent.setdefault(parent, {})[leaf] = k
                if parent:
                    by_leaf.setdefault(leaf, []).append(k)
            self._idx = (by_parent, by_leaf)
        return self._idx

    def nearest(self, key: str) -> tuple[str, str] | None:
        """``(existing key, "typo" | "moved")``: a sibling whose last part is spelt almost the same, else the
        same last part under another section (a key that lives elsewhere, e.g. in another verl version)."""
        import difflib

        by_parent, by_leaf = self._index()
        parent, _, leaf = key.rpartition(".")
        siblings = by_parent.get(parent, {})
        hit = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.9) if siblings else []
        if hit:
            return siblings[hit[0]], "typo"
        same = sorted(by_leaf.get(leaf, ()), key=len)
        return (same[0], "moved") if same else None

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
    ``--config-name`` names when the audit has it; a ``model_engine=X`` selection picks that variant.
    """
    cached = getattr(s, "_key_set", False)
    if cached is not False:
        return cached
    s._key_set = _key_set_for(s)
    return s._key_set


def _key_set_for(s: Any) -> KeySet | None:
    if s.doc.kind != "verl":
        return None
    name = s.doc.config_name
    if name is not None:
        base = name if name in _KNOWN_CONFIGS else None
    else:
        base = s.spec.keys
    engine = next((str(e.value) for k, e in s.doc.entries.items() if k == "model_engine"
                   and (e.raw or "").lstrip("+~").startswith("model_engine=")), None)
    if base is not None and engine not in (None, "dp"):
        base = f"{base}@{engine}"
    ks = key_set(base) if base else None
    return ks.with_extra(s.spec.extra_keys) if ks is not None else None


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
    base = data["configs"]["ppo_trainer"]
    keys, nulls = set(base["keys"]), set(base["nulls"])
    if name != "ppo_trainer":
        d = data["configs"][name]
        keys = (keys - set(d["removed"])) | set(d["added"])
        nulls = (nulls - set(d["nulls_removed"])) | set(d["nulls_added"])
    return KeySet(frozenset(keys), frozenset(data["groups"]), name, frozenset(nulls))


def _flatten(node: object, prefix: str, out: set[str], nulls: set[str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            out.add(key)
            if v is None:
                nulls.add(key)
            _flatten(v, key + ".", out, nulls)


def _compose(name: str, folder: Path, overrides: list[str]) -> tuple[set[str], set[str]]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(folder), version_base=None):
            cfg = compose(config_name=name, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()
    out: set[str] = set()
    nulls: set[str] = set()
    _flatten(OmegaConf.to_container(cfg, resolve=False), "", out, nulls)
    return out, nulls


def generate() -> dict:
    """The key sets from the installed verl (composed by Hydra; needs verl and hydra-core)."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None, "verl is not installed"
    root = Path(spec.origin).parent
    cfg_dir = root / "trainer" / "config"
    groups = sorted(p.name for p in cfg_dir.iterdir() if p.is_dir() and not p.name.startswith("_"))
    engines = sorted(p.stem for p in (cfg_dir / "model_engine").glob("*.yaml"))
    sets = {name: _compose(name, root / folder, []) for name, folder in _CONFIGS.items()}
    for name in ("ppo_trainer", "fully_async_ppo_trainer"):
        for eng in engines:
            if eng != "dp":
                sets[f"{name}@{eng}"] = _compose(name, root / _CONFIGS[name], [f"model_engine={eng}"])
    keys, nulls = sets["ppo_trainer"]
    configs: dict = {"ppo_trainer": {"keys": sorted(keys), "nulls": sorted(nulls)}}
    for name, (k, n) in sorted(sets.items()):
        if name != "ppo_trainer":
            configs[name] = {"added": sorted(k - keys), "removed": sorted(keys - k),
                             "nulls_added": sorted(n - nulls), "nulls_removed": sorted(nulls - n)}
    return {"verl": importlib.metadata.version("verl"), "groups": groups, "configs": configs}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    data = generate()
    text = json.dumps(data, indent=0, sort_keys=True) + "\n"
    if "--write" in args:
        DATA.write_text(text)
        print(f"wrote {DATA} (verl {data['verl']}: {len(data['configs']['ppo_trainer']['keys'])} keys in ppo_trainer)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
