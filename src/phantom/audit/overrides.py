"""Hydra override words (``key=value``, ``+key=value``, ``++key=value``, ``~key``).

verl runs are configured by Hydra overrides on the command line; Hydra saves them to
``.hydra/overrides.yaml`` and people keep them in text files. Values are typed the way Hydra
types them (``True`` is a bool, ``[console,file]`` a list, ``1e-6`` a float).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from phantom.audit.model import DELETE, ConfigDoc, Entry, InputError, Unresolved

__all__ = ["parse_override", "parse_value", "read_override_lines", "looks_like_overrides"]

_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?:@[\w.\-]+)?(?:=(.*))?$", re.S)
_FLOAT = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_INTERP = re.compile(r"\$\{[^}]*\}")
#: values YAML would read the same way, parsed without it (PyYAML's pure-Python loader is most of a batch's time)
_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
_PLAIN = re.compile(r"^[A-Za-z_/.][\w./:@+-]*$")
_YAML_WORDS = frozenset({"yes", "no", "on", "off", "y", "n", "null", "true", "false", "nan", "inf"})
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


def parse_value(text: str) -> Any:
    """A Hydra override value as Python: bools, null, numbers, lists, dicts, else the string."""
    s = text.strip()
    if s == "":
        return ""
    if _INTERP.search(s):
        return s  # an interpolation; the schema resolves ${a.b} references it can
    if s in _BOOLS:
        return _BOOLS[s]
    if s in ("null", "Null", "NULL", "~"):
        return None
    if _INT.match(s):
        return int(s)
    if _PLAIN.match(s) and s.lower().lstrip(".") not in _YAML_WORDS and not _FLOAT.match(s):
        return s
    try:
        value = yaml.safe_load(s)
    except yaml.YAMLError:
        return s
    if isinstance(value, str) and _FLOAT.match(value):
        return float(value)  # YAML 1.1 reads "1e-6" as a string; Hydra reads a float
    return value


def parse_override(word: str, path: str, line: int | None, *, trusted: bool = True,
                   strict: bool = True) -> Entry | None:
    """One override word as an :class:`Entry`; ``None`` for a non-override word when not strict.

    ``trusted=False`` marks a value built from something unresolved (a shell variable): it is kept
    as :class:`Unresolved`, never guessed.
    """
    w = word.strip()
    m = _OVERRIDE.match(w)
    if m is None or (m.group(3) is None and m.group(1) != "~"):
        if strict:
            raise InputError(path, f"{w!r} is not a Hydra override; allowed: key=value, +key=value, "
                                   "++key=value, ~key", line)
        return None
    prefix, key, raw = m.groups()
    if prefix == "~":
        return Entry(key, DELETE, path, line, w)
    value: Any = parse_value(raw or "") if trusted else Unresolved(raw or "")
    return Entry(key, value, path, line, w)


def looks_like_overrides(lines: list[str]) -> bool:
    """True when every non-blank, non-comment line is one override word."""
    body = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return bool(body) and all(_OVERRIDE.match(b) and ("=" in b or b.startswith("~")) and " " not in b.split("=")[0]
                              for b in body)


def read_override_lines(path: str, lines: list[tuple[int | None, str]]) -> ConfigDoc:
    """An override list: ``(line number, word)`` pairs from a text file or a YAML list."""
    doc = ConfigDoc(path, "verl", "overrides")
    for no, word in lines:
        if not word.strip() or word.lstrip().startswith("#"):
            continue
        entry = parse_override(word, path, no)
        if entry is not None:
            doc.set(entry)
    if not doc.entries:
        raise InputError(path, "the override list is empty")
    return doc
