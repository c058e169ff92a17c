"""Pre-0.9 reward keys: which verl 0.9.1 rejects, which it accepts and ignores, and the fix that works.

verl 0.9.x moved the reward settings under ``reward.*``. Its Hydra config still *defines* the old
top-level keys (``trainer/config/legacy_reward_impl.yaml``), so overriding one of them is accepted;
but ``main_ppo`` no longer calls ``migrate_legacy_reward_impl``, so the value is dropped and the run
uses the defaults (verl-recipe's mains and the fully-async main still migrate). Keys that file does
not define - ``reward_model.overlong_buffer.*`` from older DAPO scripts, ``reward_model.reward_kwargs.*``
- are rejected at start ("Key ... is not in struct") unless prefixed with ``+``, and the migration
never reads ``overlong_buffer``. ``reward.reward_kwargs`` is not in ``ppo_trainer.yaml`` either, so
on ``main_ppo`` its keys need ``+`` (verl-recipe's ``dapo_trainer.yaml`` defines them).

All repeated findings of one migration become one finding, with every key and one fix list; each
fix is composed against verl 0.9.1's Hydra config in ``tests/test_audit_fixes.py``.
"""

from __future__ import annotations

from typing import Any

from phantom.audit.model import Entry, Finding, Unresolved, chapter
from phantom.audit.schema import Settings
from phantom.audit.verl_keys import key_set_for

__all__ = ["LEGACY_KEYS", "RECIPE_REWARD_KEYS", "legacy_findings", "prefix_of"]

#: Every key of verl 0.9.1's legacy_reward_impl.yaml (checked against the wheel in the tests).
LEGACY_KEYS = frozenset(
    ["custom_reward_function.name", "custom_reward_function.path", "sandbox_fusion.url",
     "sandbox_fusion.max_concurrent", "sandbox_fusion.memory_limit_mb"]
    + [f"reward_model.{k}" for k in ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes", "num_workers",
                                     "reward_loop_class_name", "reward_loop_module_path", "reward_loop_source",
                                     "reward_manager", "model.path", "model.external_lib", "model.trust_remote_code")]
    + [f"reward_model.rollout.{k}" for k in (
        "cudagraph_capture_sizes", "data_parallel_size", "disable_log_stats", "dtype", "enable_chunked_prefill",
        "enable_prefix_caching", "enforce_eager", "engine_kwargs", "expert_parallel_size", "free_cache_engine",
        "gpu_memory_utilization", "limit_images", "load_format", "max_model_len", "max_num_batched_tokens",
        "max_num_seqs", "name", "prompt_length", "response_length", "skip_tokenizer_init",
        "tensor_model_parallel_size")])
#: reward.reward_kwargs keys verl-recipe's dapo_trainer.yaml defines (so the recipe needs no ``+``)
RECIPE_REWARD_KEYS = frozenset({"reward.reward_kwargs.overlong_buffer_cfg.enable",
                                "reward.reward_kwargs.overlong_buffer_cfg.len",
                                "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor",
                                "reward.reward_kwargs.overlong_buffer_cfg.log", "reward.reward_kwargs.max_resp_len"})
_SECTIONS = ("custom_reward_function.", "reward_model.", "sandbox_fusion.")
_MOVES = (  # old prefix -> new prefix (longest first)
    ("reward_model.overlong_buffer.", "reward.reward_kwargs.overlong_buffer_cfg."),
    ("custom_reward_function.overlong_buffer.", "reward.reward_kwargs.overlong_buffer_cfg."),
    ("reward_model.reward_kwargs.", "reward.reward_kwargs."),
    ("custom_reward_function.reward_kwargs.", "reward.custom_reward_function.reward_kwargs."),
    ("custom_reward_function.", "reward.custom_reward_function."),
    ("reward_model.reward_manager", "reward.reward_manager.name"),
    ("reward_model.model.path", "reward.reward_model.model_path"),
    ("reward_model.rollout.", "reward.reward_model.rollout."),
    ("reward_model.num_workers", "reward.num_workers"),
    ("reward_model.", "reward.reward_model."),
    ("sandbox_fusion.", "reward.sandbox_fusion."),
)


def prefix_of(e: Entry) -> str:
    """The Hydra prefix an override was written with (``+``, ``++``, ``~`` or "")."""
    raw = (e.raw or "").lstrip()
    for p in ("++", "+", "~"):
        if raw.startswith(p):
            return p
    return ""


def _is_override(e: Entry) -> bool:
    """Was this value given as a Hydra override word (where struct mode applies), not in a YAML file?"""
    return e.raw is not None and e.raw.lstrip().lstrip("+~").startswith(e.key + "=")


def _new_key(key: str) -> str:
    if key.startswith("reward."):
        return key
    for old, new in _MOVES:
        if key == old or (old.endswith(".") and key.startswith(old)):
            return new + key[len(old):] if old.endswith(".") else new
    return "reward." + key


def _needs_plus(key: str, s: Settings) -> bool:
    """Does the live key need ``+`` on this trainer (it is not in the config its entry point composes)?"""
    ks = key_set_for(s)
    if ks is not None and key.startswith("reward."):
        return not ks.has(key)
    if key.startswith("reward.custom_reward_function.reward_kwargs."):
        return True
    if key.startswith("reward.reward_kwargs."):
        return not (s.trainer == "recipe" and key in RECIPE_REWARD_KEYS)
    return False


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, list):
        return "[" + ",".join(map(_text, v)) + "]"
    return str(v)


def _fix_for(s: Settings, keys: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Overrides that set what ``keys`` meant, on this trainer, and what they must compose to."""
    fixes: list[str] = []
    expect: dict[str, Any] = {}
    enables_overlong = False
    for key in keys:
        e = s.doc.entries[key]
        new = _new_key(key)
        value = e.value
        plus = "+" if _needs_plus(new, s) else ""
        fixes.append(f"{plus}{new}={_text(value)}")
        if not isinstance(value, Unresolved):
            expect[new] = value
        if new == "reward.reward_kwargs.overlong_buffer_cfg.enable" and value is not False:
            enables_overlong = True
    have = {f.split("=", 1)[0].lstrip("+") for f in fixes}
    if enables_overlong:
        if "reward.reward_kwargs.max_resp_len" not in have and not s.doc.has("reward.reward_kwargs.max_resp_len"):
            n = s.value("data.max_response_length")
            n = n if isinstance(n, int) and not isinstance(n, bool) else "<data.max_response_length>"
            plus = "+" if _needs_plus("reward.reward_kwargs.max_resp_len", s) else ""
            fixes.append(f"{plus}reward.reward_kwargs.max_resp_len={n}")
            if isinstance(n, int):
                expect["reward.reward_kwargs.max_resp_len"] = n
        if "reward.reward_manager.name" not in have and s.value("reward.reward_manager.name") != "dapo":
            fixes.append("reward.reward_manager.name=dapo")
            expect["reward.reward_manager.name"] = "dapo"
    return fixes, expect


def _finding(rule: str, name: str, sev: str, s: Settings, keys: list[str], message: str, why: str,
             fix_note: str = "") -> Finding:
    fixes, expect = _fix_for(s, keys)
    first = s.doc.entries[keys[0]]
    fix = " ".join(fixes) + (f" ({fix_note})" if fix_note else "")
    return Finding(rule, name, sev, keys[0], message, why, fix, chapter("verl_ref"), first.file, first.line,
                   fix_overrides=tuple(fixes), fix_expect=expect, keys=tuple(keys))


def _important(key: str) -> bool:
    return key in ("custom_reward_function.path", "reward_model.reward_manager") or "overlong" in key \
        or "reward_kwargs" in key


def _live(s: Settings, key: str) -> bool:
    """Is this "legacy" key what the trainer really reads (the entropy recipe's reward_model.overlong_buffer)?"""
    if key.startswith(s.spec.own_sections) and s.spec.own_sections:
        return True
    canonical = _new_key(key)
    return s.live_key(canonical) == key


def legacy_findings(s: Settings) -> list[Finding]:
    """PH040 (accepted, ignored), PH042 (rejected at start), PH043 (a live key that needs ``+``)."""
    if not s.spec.modelled and not s.spec.name.startswith("unknown:"):
        return []  # a recipe with its own reward_model section (PRIME, ...): PH062 says the rules may not apply
    ks = key_set_for(s)
    rejected, ignored, plus = [], [], []
    for key, e in s.doc.entries.items():
        overrides = _is_override(e)
        if key.startswith(_SECTIONS):
            if e.value is None or e.value == {} or e.value == []:
                continue  # a composed config (.hydra/config.yaml) carries every legacy key as null
            if _live(s, key):
                continue
            if ks is not None:
                defined = ks.has(key)
            else:
                defined = key in LEGACY_KEYS or any(key.startswith(k + ".") for k in LEGACY_KEYS)
            if overrides and not defined and prefix_of(e) == "":
                rejected.append(key)
            elif not s.spec.migrates or "overlong_buffer" in key:
                ignored.append(key)  # not migrated; the migration itself never reads overlong_buffer
        elif overrides and _needs_plus(key, s) and prefix_of(e) == "" and key.startswith(
                ("reward.reward_kwargs.", "reward.custom_reward_function.reward_kwargs.")):
            plus.append(key)
    out = []
    trainer = s.spec.label
    if rejected:
        out.append(_finding(
            "PH042", "legacy-key-rejected", "error", s, rejected,
            f"{', '.join(f'`{k}`' for k in rejected)}: {'these keys are' if len(rejected) > 1 else 'this key is'} "
            f"not in the config {trainer} composes (verl {s.version}), so it refuses to start (Hydra: \"Key ... is not "
            "in struct\")",
            "older DAPO scripts set reward_model.overlong_buffer.* and reward_model.reward_kwargs.*; 0.9.x reads "
            "the overlong penalty from reward.reward_kwargs.overlong_buffer_cfg of the `dapo` reward manager"))
    if ignored:
        assumed = " (assuming verl 0.9.x main_ppo runs it)" if s.entrypoint_assumed else ""
        sev = "error" if any(_important(k) for k in ignored) and not s.entrypoint_assumed and s.spec.modelled \
            else "warning"
        why = (f"{trainer} does not call migrate_legacy_reward_impl, so the run silently uses the default reward "
               "settings instead; the other findings judge the run as these keys meant it" if not s.spec.migrates else
               "migrate_legacy_reward_impl copies reward_model.reward_kwargs but never reads overlong_buffer")
        out.append(_finding(
            "PH040", "legacy-reward-key-ignored", sev, s, ignored,
            f"{', '.join(f'`{k}`' for k in ignored)}: legacy reward key(s) that {trainer} accepts and then "
            f"ignores{assumed}", why))
    if plus:
        out.append(_finding(
            "PH043", "key-needs-plus", "error", s, plus,
            f"{', '.join(f'`{k}`' for k in plus)}: not in {trainer}'s config, so Hydra rejects the override "
            "without a leading `+`", "reward.reward_kwargs and reward.custom_reward_function.reward_kwargs are not "
            "in ppo_trainer.yaml; `+` adds the key (verl-recipe's dapo_trainer.yaml defines reward.reward_kwargs)"))
    return out
