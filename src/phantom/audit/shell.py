"""Read a launch script (bash) without running it: one audit per trainer command.

:mod:`phantom.audit.bash` expands the script's words; this module finds the commands that start a
trainer and turns their arguments into :class:`~phantom.audit.model.ConfigDoc` values:

* verl: ``python3 -m verl.trainer.main_ppo``, ``-m recipe.dapo.main_dapo`` (and other verl-recipe
  mains), a ``.../main_ppo.py`` path, behind ``ray job submit ... --``, ``torchrun``, ``uv run``,
  ``nohup`` or an array (``"${LAUNCH[@]}" -m ...``). Hydra overrides follow the module.
* TRL: ``trl grpo ...`` and GRPO training scripts (``accelerate launch src/open_r1/grpo.py --config
  x.yaml``), whose ``--flag value`` arguments are ``GRPOConfig`` fields; a ``--config`` YAML that
  exists next to the script is read underneath the flags.

A value set from something unknown, or only in some ``if``/``case`` branches, is kept as
:class:`~phantom.audit.model.Unresolved` with the reason, so a rule can say "depends on the
environment" instead of guessing. Every document records what was read (:class:`ReadInfo`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from phantom.audit.bash import Command, Field, interpret, parser_available
from phantom.audit.locate import locate
from phantom.audit.model import ConfigDoc, Entry, InputError, ReadInfo, Unresolved
from phantom.audit.overrides import parse_override, parse_value
from phantom.audit.trainers import EASYR1_EXAMPLE_CONFIG, match_module

__all__ = ["read_shell", "trainer_of"]

_NOT_RL = re.compile(r"sft|main_generation|main_eval|model_merger|preprocess|vllm_serve|rollout_server", re.I)
#: a verl-style entry point the registry may not know: verl.*, recipe.* or any *.main_* module
_VERLISH = re.compile(r"^(?:verl\.|recipe\.)|(?:^|\.)(?:main_\w+|\w+_main|main)$")
_VERL_PATH = re.compile(r"(?:^|/)(?:main_ppo|main_dapo|main_ppo_v0|fully_async_main|main_\w+)\.py$")
_TRL_SCRIPT = re.compile(r"(?:^|/)[\w.-]*(?:grpo|rloo)[\w.-]*\.py$", re.I)
_NEMO_SCRIPT = re.compile(r"(?:^|/)run_(?:grpo|dapo)\w*\.py$", re.I)

Loader = Callable[..., "ConfigDoc | None"]


def _hydra_style(rest: list[str]) -> bool:
    """Do the arguments look like Hydra overrides (``key=value``) rather than ``--flags``?"""
    kv = sum(1 for w in rest if "=" in w and not w.startswith("-"))
    flags = sum(1 for w in rest if w.startswith("--"))
    return kv > 0 and kv >= flags


def _module_kind(mod: str, rest: list[str]) -> tuple[str, str] | None:
    """(family, registry name or ``unknown:<module>``) for ``python -m mod ...``; None: not a trainer."""
    if _NOT_RL.search(mod):
        return None
    t = match_module(mod)
    if t is not None and not (t.family == "trl" and _hydra_style(rest)):
        return t.family, t.name
    if _VERLISH.search(mod) and (_hydra_style(rest) or mod.startswith(("verl.", "recipe."))):
        return "verl", f"unknown:{mod}"
    if re.search(r"grpo|rloo", mod, re.I):
        return ("verl", f"unknown:{mod}") if _hydra_style(rest) else ("trl", "trl.rloo" if "rloo" in mod else "trl.grpo")
    return None


def trainer_of(argv: list[Field]) -> tuple[str, str, int] | None:
    """``(family, registry name, index of the first argument)`` of a trainer command, or None."""
    words = [f.text for f in argv]
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        rest = words[i + 2:]
        if w == "-m" and nxt:
            kind = _module_kind(nxt, rest)
            if kind is not None:
                return kind[0], kind[1], i + 2
            continue
        if w in ("swift", "megatron") and nxt == "rlhf" and "grpo" in " ".join(rest):
            return "swift", "swift.grpo", i + 2
        if w == "trl" and nxt in ("grpo", "rloo"):
            return "trl", f"trl.{nxt}", i + 2
        if w.endswith(".py") and not _NOT_RL.search(w):
            rest = words[i + 1:]
            if _NEMO_SCRIPT.search(w) and any(x.startswith("--config") for x in rest):
                return "nemo", "nemo.grpo", i + 1
            if _VERL_PATH.search(w) or (_TRL_SCRIPT.search(w) and _hydra_style(rest)):
                t = match_module(w, "verl")
                return "verl", t.name if t is not None else f"unknown:{w}", i + 1
            if _TRL_SCRIPT.search(w):
                return "trl", "trl.rloo" if re.search(r"rloo", w, re.I) else "trl.grpo", i + 1
    return None


def _value_of(f: Field, text: str) -> object:
    if f.exact and not f.cond:
        return parse_value(text)
    return Unresolved(text, f.why or ("set only in an if/case branch" if f.cond else "unresolved"), f.options)


def _verl_doc(path: str, cmd: Command, name: str, start: int, info: ReadInfo, load: Loader | None) -> ConfigDoc:
    doc = ConfigDoc(path, "verl", "shell", entrypoint=name)
    words = cmd.argv[start:]
    i = 0
    while i < len(words):  # Hydra's own options: --config-path/--config-name (and -cp/-cn)
        w = words[i].text
        m = re.match(r"^(--config-path|--config-name|-cp|-cn)(?:=(.*))?$", w)
        if m:
            value = m.group(2) if m.group(2) is not None else (words[i + 1].text if i + 1 < len(words) else "")
            if m.group(1) in ("--config-name", "-cn"):
                doc.config_name = value.strip().strip("'\"").removesuffix(".yaml")
            elif doc.config_name is None:
                doc.config_name = ""
            info.notes.append(f"the command names its own Hydra config ({m.group(1)} {value}): keys it sets are "
                              "read only from the overrides here; audit that YAML too")
            i += 1 if m.group(2) is not None else 2
            continue
        entry = parse_override(w, path, words[i].line or cmd.line, trusted=True, strict=False)
        if entry is not None:
            f = words[i]
            if not f.exact or f.cond:
                raw_value = w.split("=", 1)[1] if "=" in w else ""
                entry = Entry(entry.key, _value_of(f, raw_value), path, entry.line, w)
                (info.conditional if f.cond else info.unresolved).append(entry.key)
            doc.set(entry)
            info.overrides += 1
        i += 1
    return doc


def _flags(words: list[Field], line: int) -> list[tuple[str, list[Field], int]]:
    """``--key value...`` / ``--key=value`` arguments; dots are kept (OpenRLHF's ``--algo.kl.estimator``)."""
    flags: list[tuple[str, list[Field], int]] = []
    for f in words:
        if f.text.startswith("--") and len(f.text) > 2:
            key, eq, val = f.text[2:].partition("=")
            flags.append((key.replace("-", "_"), [Field(val, f.exact, f.cond, f.why, f.line, f.options)] if eq else [],
                          f.line or line))
        elif flags:
            flags[-1][1].append(f)
    return flags


def _flag_doc(kind: str, path: str, cmd: Command, name: str, start: int, info: ReadInfo,
              load: Loader | None) -> ConfigDoc:
    """A command configured by ``--flag value`` arguments (TRL, ms-swift, OpenRLHF, oat)."""
    doc = ConfigDoc(path, kind, "shell", entrypoint=name)
    for key, vals, line in _flags(cmd.argv[start:], cmd.line):
        if key == "config" and vals and kind in ("trl", "swift"):
            cfg = vals[0].text
            base = load(cfg, kind) if (load is not None and vals[0].exact) else None
            if base is not None:
                info.notes.append(f"read the config {cfg} underneath the command's flags")
                for e in base.entries.values():
                    doc.set(e)
                doc.mentions |= base.mentions
                info.overrides += len(base.entries)
            else:
                info.notes.append(f"the config {cfg} was not found next to the script: audit that file too")
            continue
        if not vals:
            value: object = True
        elif len(vals) == 1:
            value = _value_of(vals[0], vals[0].text)
        else:
            value = [v.text for v in vals] if all(v.exact and not v.cond for v in vals) else Unresolved(
                " ".join(v.text for v in vals), "unresolved")
        if isinstance(value, Unresolved):
            (info.conditional if any(v.cond for v in vals) else info.unresolved).append(key)
        doc.set(Entry(key, value, path, line, f"--{key} " + " ".join(v.text for v in vals)))
        info.overrides += 1
    if name == "trl.rloo":
        doc.mentions.add("rloo")
    return doc


def _trl_doc(path: str, cmd: Command, name: str, start: int, info: ReadInfo, load: Loader | None) -> ConfigDoc:
    return _flag_doc("trl", path, cmd, name, start, info, load)


def _dotlist_doc(kind: str, path: str, cmd: Command, name: str, start: int, info: ReadInfo,
                 load: Loader | None) -> ConfigDoc:
    """EasyR1 (``config=x.yaml key=value``, OmegaConf.from_cli) and NeMo-RL (``--config x.yaml key=value``)."""
    doc = ConfigDoc(path, kind, "shell", entrypoint=name)
    words = cmd.argv[start:]
    cfg: Field | None = None
    overrides: list[Field] = []
    for i, f in enumerate(words):
        if kind == "easyr1" and f.text.startswith("config="):
            cfg = Field(f.text[len("config="):], f.exact, f.cond, f.why, f.line)
        elif kind == "nemo" and f.text.startswith("--config"):
            cfg = Field(f.text.split("=", 1)[1], f.exact, f.cond, f.why, f.line) if "=" in f.text else (
                words[i + 1] if i + 1 < len(words) else None)
        elif "=" in f.text and not f.text.startswith("-") and f is not cfg:
            overrides.append(f)
    if cfg is not None:
        base = load(cfg.text, kind) if (load is not None and cfg.exact) else None
        if base is not None:
            info.notes.append(f"read the config {cfg.text} underneath the command's overrides")
            for e in base.entries.values():
                doc.set(e)
            info.overrides += len(base.entries)
        elif kind == "easyr1" and cfg.text.strip("'\"").removeprefix("./") == "examples/config.yaml":
            info.notes.append(f"the config {cfg.text} was not found here: read as EasyR1's shipped example config "
                              "(grpo, no online filtering, examples/reward_function/math.py)")
            for k, v in EASYR1_EXAMPLE_CONFIG.items():
                doc.set(Entry(k, v, path, cfg.line or cmd.line, f"config={cfg.text}"))
        else:
            info.notes.append(f"the config {cfg.text} was not found next to the script: the trainer's defaults are "
                              "assumed for what it sets; audit that file too")
    for f in overrides:
        entry = parse_override(f.text, path, f.line or cmd.line, trusted=True, strict=False)
        if entry is None:
            continue
        if not f.exact or f.cond:
            entry = Entry(entry.key, _value_of(f, f.text.split("=", 1)[1]), path, entry.line, f.text)
            (info.conditional if f.cond else info.unresolved).append(entry.key)
        doc.set(entry)
        info.overrides += 1
    return doc


_BUILDERS: dict[str, Callable[..., ConfigDoc]] = {
    "verl": _verl_doc, "trl": _trl_doc,
    "swift": lambda *a: _flag_doc("swift", *a), "openrlhf": lambda *a: _flag_doc("openrlhf", *a),
    "oat": lambda *a: _flag_doc("oat", *a), "easyr1": lambda *a: _dotlist_doc("easyr1", *a),
    "nemo": lambda *a: _dotlist_doc("nemo", *a),
}


def _printable(word: str) -> str:
    """A command name as a report can show it (no control characters, at most 40 characters)."""
    word = "".join(ch if ch.isprintable() else "?" for ch in word)
    return word if len(word) <= 40 else word[:37] + "..."


def _describe(cmd: Command, name: str) -> str:
    words = [f.text for f in cmd.argv]
    head = " ".join(words[: next((i for i, w in enumerate(words) if name in w), 0) + 1])
    return head if len(head) < 100 else head[:97] + "..."


def read_shell(path: str, text: str, load: Loader | None = None) -> list[ConfigDoc]:
    """One :class:`ConfigDoc` per trainer command in the script (InputError if there is none)."""
    missing = parser_available()
    if missing:
        raise InputError(path, missing)
    script = interpret(text)
    if script.open_quote is not None:
        raise InputError(path, f"the quote opened on line {script.open_quote} never closes, so bash refuses the "
                               "script; check its quotes", script.open_quote)
    found = [(c, t) for c in script.commands if (t := trainer_of(c.argv)) is not None]
    notes = list(script.notes)
    if script.errors:
        notes.append(f"bash syntax error(s) near line {', '.join(map(str, script.errors[:5]))}; the rest was read")
    if script.heredocs:
        notes.append(f"{script.heredocs} heredoc(s) read as text, not as commands")
    if not found:
        names = sorted({_printable(c.argv[0].text) for c in script.commands if c.argv})[:8]
        raise InputError(path, f"no trainer command found among {len(script.commands)} command(s) "
                               f"({', '.join(names) or 'none'}); looked for verl's main_ppo / a verl-recipe main "
                               "(python -m, torchrun, ray job submit -- ...), EasyR1's verl.trainer.main, `trl grpo`/"
                               "`trl rloo` or a GRPO/RLOO training script, OpenRLHF's train_ppo_ray, `swift rlhf "
                               "--rlhf_type grpo`, NeMo-RL's run_grpo*.py, oat's run_math_rl")
    docs = []
    for n, (cmd, (kind, name, start)) in enumerate(found, 1):
        label = f"command {n} of {len(found)}, line {cmd.line}" if len(found) > 1 else f"line {cmd.line}"
        info = ReadInfo(f"{label}: {_describe(cmd, name)}", commands=len(script.commands),
                        trainer_commands=len(found), caller_args=cmd.caller_args, notes=list(notes), line=cmd.line,
                        context=cmd.context + ("; inside an if/case/loop" if cmd.cond and not cmd.context else ""))
        doc = _BUILDERS[kind](path, cmd, name, start, info, load)
        doc.read = info
        doc.label = label + (f" [{cmd.context}]" if cmd.context else "") if len(found) > 1 or cmd.context else None
        if cmd.caller_args:
            info.notes.append("the command also passes the script's own arguments (\"$@\"): overrides given at "
                              "launch are not in the file")
        docs.append(doc)
    return docs


def script_dir_loader(script: str, read: Callable[[str, str], ConfigDoc]) -> Loader:
    """A loader for config files a command names: relative to the cwd, the script's folder or its parents."""

    def load(name: str, kind: str = "trl") -> ConfigDoc | None:
        found = locate(name, script)
        if found is None:
            return None
        try:
            return read(str(found), kind)
        except InputError:
            return None

    return load
