"""PH044 / PH045: Hydra overrides the entry point's composed config refuses, so the run never starts.

Hydra 1.3 composes verl's configs in struct mode (checked against Hydra itself in
``tests/test_audit_hydra.py``):

* ``+key=value`` where ``key`` exists and is not null, with a value that is not a list or a dict:
  "Could not append to config. An item is already at 'key'" (PH044);
* ``key=value`` where it does not exist: "Could not override 'key'" (PH045);
* ``~key`` where it is absent or null: "Could not delete from config. 'key' does not exist" (PH045).

The key set is the one the command's entry point composes (:mod:`phantom.audit.trainers`,
:mod:`phantom.audit.verl_keys`): ``ppo_trainer`` for ``main_ppo``, plus what a recipe's own config adds.
Commands that name their own config (``--config-name``/``--config-path`` to a config the audit does
not have) and entry points whose config is not recorded are not checked. Legacy reward keys and
``reward_kwargs`` have their own rules (PH040-PH043, :mod:`phantom.audit.legacy`).
"""

from __future__ import annotations

from typing import Any

from phantom.audit.legacy import _text, prefix_of
from phantom.audit.model import DELETE, Entry, Finding, Unresolved, chapter
from phantom.audit.schema import Settings
from phantom.audit.verl_keys import key_set_for

__all__ = ["hydra_findings"]

_OWN_RULES = ("custom_reward_function.", "reward_model.", "sandbox_fusion.", "reward.reward_kwargs.",
              "reward.custom_reward_function.reward_kwargs.")


def _is_word(e: Entry) -> bool:
    """Was this value written as an override word (Hydra's rules apply), not read from a YAML file?"""
    raw = (e.raw or "").lstrip()
    return raw.lstrip("+~").startswith(e.key + "=") or raw == "~" + e.key or raw.startswith("~" + e.key + "=")


def _value_text(e: Entry) -> str:
    if isinstance(e.value, Unresolved):
        return str(e.value)
    raw = (e.raw or "").split("=", 1)
    return raw[1] if len(raw) == 2 else _text(e.value)


def hydra_findings(s: Settings) -> list[Finding]:
    ks = key_set_for(s)
    if ks is None:
        return []
    plus, missing, gone = [], [], []
    for key, e in s.doc.entries.items():
        if not _is_word(e) or key.startswith("hydra.") or key.startswith(_OWN_RULES) or ks.is_group(key):
            continue
        prefix = prefix_of(e)
        if e.value is DELETE or prefix == "~":
            if not ks.has(key) or ks.is_null(key):
                gone.append(e)
        elif prefix == "+" and ks.has(key) and not ks.is_null(key) and not isinstance(e.value, (dict, list)):
            plus.append(e)
        elif prefix == "" and not ks.has(key):
            missing.append(e)
    where = f"{s.spec.label}'s config ({'verl ' + s.version + ' ' if s.version else ''}{ks.name})"
    out = []
    if plus:
        fixes = tuple(f"{e.key}={_value_text(e)}" for e in plus)
        expect: dict[str, Any] = {e.key: e.value for e in plus if not isinstance(e.value, Unresolved)}
        out.append(_finding("PH044", "plus-on-existing-key", s, plus,
                            f"{_names(plus)}: `+` adds a key, but {where} already has "
                            f"{'it' if len(plus) == 1 else 'them'}, so Hydra refuses to start (\"Could not append to "
                            "config. An item is already at ...\")",
                            "Hydra 1.3: `+key=value` only adds; `key=value` overrides; `++key=value` does either",
                            " ".join(fixes[:8]) + (f" ... ({len(fixes) - 8} more)" if len(fixes) > 8 else "")
                            + " (drop the `+`)", fixes, expect))
    if missing or gone:
        fixes_l: list[str] = []
        expect = {}
        hints = []
        typos = 0
        for e in missing:
            found = ks.nearest(e.key)
            near = found[0] if found else None
            typos += bool(found and found[1] == "typo")
            if near is not None:
                fixes_l.append(f"{near}={_value_text(e)}")
                hints.append(f"`{e.key}` -> `{near}`")
                if not isinstance(e.value, Unresolved):
                    expect[near] = e.value
            else:
                fixes_l.append(f"+{e.key}={_value_text(e)}")
                if not isinstance(e.value, Unresolved):
                    expect[e.key] = e.value
        fix = " ".join(fixes_l[:8]) + (f" ... ({len(fixes_l) - 8} more in fix_overrides)" if len(fixes_l) > 8 else "")
        if hints:
            fix += f" (closest existing key: {', '.join(hints[:6])})"
        if any(f.startswith("+") for f in fixes_l):
            fix += "; `+` adds a key, but nothing in the trainer reads a key its config does not define: check the name"
        if gone:
            fix += ("; " if fix else "") + f"drop {', '.join('~' + e.key for e in gone)} (nothing to delete)"
        bad = missing + gone
        typo = bool(typos) or bool(gone)  # a misspelt sibling of an existing key: a mistake on any verl
        out.append(_finding("PH045", "key-not-in-config", s, bad,
                            f"{_names(bad)}: not in {where}, so Hydra refuses to start (\"Could not override ... "
                            "Key ... is not in struct\"" + (", \"Could not delete from config\"" if gone else "") + ")",
                            "Hydra composes verl's config in struct mode: an override must name a key the config "
                            "defines (a typo, or a key of another verl version or trainer), or add it with `+`"
                            + ("" if typo else "; the audit knows verl 0.9.1's keys, not those of newer releases"),
                            fix, tuple(fixes_l), expect, "error" if typo else "warning"))
    return out


def _names(entries: list[Entry]) -> str:
    shown = ", ".join(f"`{(e.raw or e.key).split('=', 1)[0]}`" for e in entries[:6])
    return shown + (f" and {len(entries) - 6} more" if len(entries) > 6 else "")


def _finding(rule: str, name: str, s: Settings, entries: list[Entry], message: str, why: str, fix: str,
             overrides: tuple[str, ...], expect: dict[str, Any], severity: str = "error") -> Finding:
    first = entries[0]
    return Finding(rule, name, severity, first.key, message, why, fix, chapter("verl_ref"), first.file, first.line,
                   fix_overrides=overrides, fix_expect=expect, keys=tuple(e.key for e in entries),
                   fix_status="composed against verl's Hydra config in tests/test_audit_hydra.py" if overrides else None)
