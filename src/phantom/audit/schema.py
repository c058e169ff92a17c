"""What an unset key means: verl 0.9.x and TRL defaults, value checks, legacy-key migration.

The defaults are copied from verl 0.9.1's ``trainer/config/ppo_trainer.yaml`` (a test checks them
against the installed wheel), from 0.9.0 where they differ (``filter_groups.metric: null``); each
trainer's own config changes some of them (:mod:`phantom.audit.trainers`, e.g. verl-recipe's
``dapo_trainer.yaml``). A value of the wrong type is an unreadable
input (exit 2), named with its file, line and the allowed values.
"""

from __future__ import annotations

import re
from typing import Any

from phantom.audit.model import ConfigDoc, Entry, InputError, Unresolved
from phantom.audit.trainers import TRAINERS, Trainer, by_name, unknown_verl

__all__ = ["VERL_VERSIONS", "VERL_DEFAULTS", "TRL_DEFAULTS", "LAB_DEFAULTS", "ENTRYPOINTS", "Settings",
           "validate"]

VERL_VERSIONS: tuple[str, ...] = ("0.9.1", "0.9.0")
#: --entrypoint values: the verl family's registry names, and ``recipe`` (verl-recipe's DAPO main) as before
ENTRYPOINTS: tuple[str, ...] = tuple(t.name for t in TRAINERS if t.family == "verl") + ("recipe",)

_V091: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.filter_groups.enable": False,
    "algorithm.filter_groups.metric": "reward",  # PR #7792; 0.9.0 had null
    "algorithm.filter_groups.max_num_gen_batches": 0,
    "algorithm.filter_groups.max_inflight_gen_batches": 1,
    "trainer.use_v1": True,
    "trainer.total_training_steps": None,
    "data.train_batch_size": 1024,
    "data.gen_batch_size": None,
    "reward.reward_manager.name": "naive",
    "reward.custom_reward_function.path": None,
    "reward.custom_reward_function.name": "compute_score",
    "reward.reward_kwargs.overlong_buffer_cfg.enable": False,
}
VERL_DEFAULTS: dict[str, dict[str, Any]] = {
    "0.9.1": _V091,
    "0.9.0": {**_V091, "algorithm.filter_groups.metric": None},
}
TRL_DEFAULTS: dict[str, Any] = {
    "scale_rewards": "group",
    "multi_objective_aggregation": "sum_then_normalize",
    "loss_type": "dapo",
    "mask_truncated_completions": False,
    "reward_weights": None,
    "reward_funcs": None,
}

#: phantom.lab.spec.ArmSpec defaults (copied, so the audit never imports the lab and torch)
LAB_DEFAULTS: dict[str, Any] = {
    "arm": "outcome", "estimator": "grpo", "kind": "length_short", "lam": 0.3, "prompts": 32, "rollouts": 5,
    "steps": 40, "sampling": "gate", "gen_prompts": 0, "max_gen_batches": 10, "drop": "zero",
}
LAB_CHOICES: dict[str, tuple[str, ...]] = {
    "arm": ("none", "score", "outcome"), "estimator": ("grpo", "drgrpo", "gspo"), "sampling": ("gate", "dapo"),
    "drop": ("zero", "mask"),
}

_BOOL, _INT, _STR = "a boolean (True or False)", "an integer", "a string"
_VERL_TYPES: dict[str, tuple[str, bool]] = {  # key -> (type, None allowed)
    "algorithm.filter_groups.enable": (_BOOL, False),
    "algorithm.filter_groups.metric": (_STR, True),
    "algorithm.filter_groups.max_num_gen_batches": (_INT, False),
    "algorithm.filter_groups.max_inflight_gen_batches": (_INT, False),
    "algorithm.norm_adv_by_std_in_grpo": (_BOOL, False),
    "algorithm.use_kl_in_reward": (_BOOL, False),
    "algorithm.adv_estimator": (_STR, True),
    "trainer.use_v1": (_BOOL, False),
    "trainer.total_training_steps": (_INT, True),
    "data.train_batch_size": (_INT, False),
    "data.gen_batch_size": (_INT, True),
    "reward.reward_manager.name": (_STR, False),
    "reward.custom_reward_function.path": (_STR, True),
    "reward.reward_kwargs.overlong_buffer_cfg.enable": (_BOOL, False),
    "custom_reward_function.path": (_STR, True),
    "reward_model.reward_manager": (_STR, True),
}
_TRL_CHOICES: dict[str, tuple[Any, ...]] = {
    "scale_rewards": ("group", "batch", "none", True, False),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
}
_TRL_TYPES: dict[str, tuple[str, bool]] = {
    "mask_truncated_completions": (_BOOL, False),
    "loss_type": (_STR, False),
    "num_generations": (_INT, True),
}
_INTERP = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def _type_ok(value: Any, kind: str, none_ok: bool) -> bool:
    if value is None:
        return none_ok
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, str)


def _bad(e: Entry, allowed: str) -> InputError:
    return InputError(e.file, f"value {e.value!r} is invalid; allowed: {allowed}", e.line, e.key)


def validate(doc: ConfigDoc) -> ConfigDoc:
    """Raise :class:`InputError` for a known key holding a value of the wrong type."""
    if doc.kind == "lab":
        for key, choices in LAB_CHOICES.items():
            e = doc.entry(key)
            if e is not None and e.value not in choices:
                raise _bad(e, ", ".join(choices))
        e = doc.entry("lam")
        if e is not None and (isinstance(e.value, bool) or not isinstance(e.value, (int, float))):
            raise _bad(e, "a number >= 0")
        return doc
    types = _VERL_TYPES if doc.kind == "verl" else _TRL_TYPES
    for key, (kind, none_ok) in types.items():
        e = doc.entry(key)
        if e is None or isinstance(e.value, Unresolved) or (isinstance(e.value, str) and "${" in e.value):
            continue
        if not _type_ok(e.value, kind, none_ok):
            raise _bad(e, kind + (" or null" if none_ok else ""))
    if doc.kind == "trl":
        for key, choices in _TRL_CHOICES.items():
            e = doc.entry(key)
            if e is not None and not isinstance(e.value, Unresolved) and e.value not in choices:
                raise _bad(e, ", ".join(map(repr, choices)))
        e = doc.entry("reward_weights")
        if e is not None and not isinstance(e.value, Unresolved) and e.value is not None and not (
                isinstance(e.value, list) and all(isinstance(w, (int, float)) and not isinstance(w, bool)
                                                  for w in e.value)):
            raise _bad(e, "a list of numbers, one per reward function, or null")
        e = doc.entry("reward_funcs")
        if e is not None and not isinstance(e.value, (Unresolved, str, list)) and e.value is not None:
            raise _bad(e, "a reward function name or a list of them")
    return doc


#: legacy key -> the key it meant (what ``migrate_legacy_reward_impl`` copies, and the overlong buffer of
#: older DAPO scripts, which it does not copy); a trainer that does not migrate ignores the legacy key, and
#: the rules then judge the run as its author meant it (the fix of PH040/PH042 applied)
LEGACY_MEANING: tuple[tuple[str, str], ...] = (
    ("reward_model.overlong_buffer.", "reward.reward_kwargs.overlong_buffer_cfg."),
    ("reward_model.reward_kwargs.", "reward.reward_kwargs."),
    ("custom_reward_function.reward_kwargs.", "reward.custom_reward_function.reward_kwargs."),
    ("custom_reward_function.", "reward.custom_reward_function."),
    ("reward_model.reward_manager", "reward.reward_manager.name"),
)


def _swap(key: str, pairs: tuple[tuple[str, str], ...], reverse: bool = False) -> str | None:
    for a, b in pairs:
        src, dst = (b, a) if reverse else (a, b)
        if key == src or (src.endswith(".") and key.startswith(src)):
            return dst + key[len(src):] if src.endswith(".") else dst
    return None


class Settings:
    """A config's effective values: what is set, else the default of the trainer that reads it.

    ``spec`` is the trainer's registry entry (:mod:`phantom.audit.trainers`); ``trainer`` its rule
    style (``main_ppo`` or ``recipe``). A canonical key (``reward.reward_kwargs.overlong_buffer_cfg.enable``)
    is looked up where this trainer reads it (its ``aliases``), then under the legacy key that meant it.
    """

    def __init__(self, doc: ConfigDoc, *, version: str = "0.9.1", entrypoint: str | None = None):
        if version not in VERL_VERSIONS:
            raise ValueError(f"version={version!r} is unknown; allowed: {', '.join(VERL_VERSIONS)}")
        if entrypoint is not None and entrypoint not in ENTRYPOINTS:
            raise ValueError(f"entrypoint={entrypoint!r} is unknown; allowed: {', '.join(ENTRYPOINTS)}")
        self.doc, self.version = doc, version
        name = entrypoint or doc.entrypoint
        self.entrypoint_assumed = name is None and doc.kind == "verl"
        self.spec: Trainer = self._spec(name)
        self.entrypoint = self.spec.name
        if doc.kind == "trl":
            self.defaults = dict(TRL_DEFAULTS)
        elif doc.kind == "lab":
            self.defaults = dict(LAB_DEFAULTS)
        else:
            self.defaults = dict(VERL_DEFAULTS[version])
            self.defaults.update(self.spec.defaults)

    def _spec(self, name: str | None) -> Trainer:
        if name is None:
            return by_name("main_ppo")
        if name.startswith("unknown:"):
            return unknown_verl(name[len("unknown:"):])
        try:
            return by_name(name)
        except KeyError:
            return unknown_verl(name)

    @property
    def trainer(self) -> str:
        """``main_ppo`` (V1 semantics; also when assumed) or ``recipe`` (the DAPO loop)."""
        return self.spec.style

    def live_key(self, key: str) -> str:
        """Where this trainer reads a canonical key (its own section for some recipes)."""
        return _swap(key, self.spec.aliases) or key

    def legacy_source(self, key: str) -> Entry | None:
        """The legacy key that meant ``key``, when the doc sets it instead (None otherwise)."""
        for old, new in LEGACY_MEANING:
            if key == new or (new.endswith(".") and key.startswith(new)):
                src = old + key[len(new):] if new.endswith(".") else old
                if self.live_key(key) == src:
                    continue  # that "legacy" key is what this trainer reads
                e = self.doc.entry(src)
                if e is not None:
                    return e
        return None

    def entry(self, key: str) -> Entry | None:
        """Where ``key`` is set: its live key for this trainer, else the legacy key that meant it."""
        e = self.doc.entry(self.live_key(key))
        if e is None and self.doc.kind == "verl":
            e = self.legacy_source(key)
        return e

    def is_set(self, key: str) -> bool:
        return self.entry(key) is not None

    def value(self, key: str, _depth: int = 0) -> Any:
        """The effective value; ``${other.key}`` references are followed, others stay Unresolved."""
        e = self.entry(key)
        value = e.value if e is not None else self.defaults.get(self.live_key(key), self.defaults.get(key))
        if isinstance(value, str) and "${" in value:
            m = _INTERP.match(value.strip())
            if m and _depth < 8:
                return self.value(m.group(1), _depth + 1)
            return Unresolved(value)
        return value

    def flag(self, key: str) -> bool | None:
        """A boolean setting; None when it cannot be resolved statically."""
        value = self.value(key)
        return value if isinstance(value, bool) else None

    def integer(self, key: str) -> int | None:
        value = self.value(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def where(self, key: str) -> tuple[str | None, int | None]:
        e = self.entry(key)
        return (e.file, e.line) if e is not None else (self.doc.path, None)
