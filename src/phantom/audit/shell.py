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
from pathlib import Path

from phantom.audit.bash import Command, Field, interpret, parser_available
from phantom.audit.model import ConfigDoc, Entry, InputError, ReadInfo, Unresolved
from phantom.audit.overrides import parse_override, parse_value

__all__ = ["read_shell", "trainer_of"]

_VERL_MODULE = re.compile(r"^(?:verl\.trainer\.main_ppo(?:_v0)?|verl\.trainer\.main_ppo_sync|recipe\.[\w.]*?(?:\.main\w*|main_\w+)|"
                          r"verl\.experimental\.[\w.]*_main|[\w.]*\.main_(?:ppo|dapo)\w*)$")
_VERL_PATH = re.compile(r"(?:^|/)(?:main_ppo|main_dapo|main_ppo_v0|fully_async_main)\.py$")
_NOT_RL = re.compile(r"sft|main_generation|main_eval|model_merger|preprocess", re.I)
_TRL_SCRIPT = re.compile(r"(?:^|/)[\w.-]*grpo[\w.-]*\.py$", re.I)
_TRL_MODULE = re.compile(r"^(?:trl\.scripts\.grpo|open_r1\.grpo|[\w.]*grpo\w*)$", re.I)

Loader = Callable[[str], "ConfigDoc | None"]


def trainer_of(argv: list[Field]) -> tuple[str, str, int] | None:
    """``(kind, name, index of the first argument)`` of a trainer command, or None."""
    words = [f.text for f in argv]
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w == "-m" and _VERL_MODULE.match(nxt) and not _NOT_RL.search(nxt):
            return "verl", nxt, i + 2
        if _VERL_PATH.search(w) and not _NOT_RL.search(w):
            return "verl", w, i + 1
        if w == "trl" and nxt == "grpo":
            return "trl", "trl grpo", i + 2
        if w == "-m" and _TRL_MODULE.match(nxt) and "verl" not in nxt:
            return "trl", nxt, i + 2
        if _TRL_SCRIPT.search(w):
            return "trl", w, i + 1
    return None


def _entrypoint(name: str) -> str:
    return "recipe" if name.startswith("recipe.") or "/recipe/" in name or "main_dapo" in name else "main_ppo"


def _value_of(f: Field, text: str) -> object:
    if f.exact and not f.cond:
        return parse_value(text)
    return Unresolved(text, f.why or ("set only in an if/case branch" if f.cond else "unresolved"), f.options)


def _verl_doc(path: str, cmd: Command, name: str, start: int, info: ReadInfo, load: Loader | None) -> ConfigDoc:
    doc = ConfigDoc(path, "verl", "shell", entrypoint=_entrypoint(name))
    words = cmd.argv[start:]
    i = 0
    while i < len(words):  # Hydra's own options: --config-path/--config-name (and -cp/-cn)
        w = words[i].text
        m = re.match(r"^(--config-path|--config-name|-cp|-cn)(?:=(.*))?$", w)
        if m:
            value = m.group(2) if m.group(2) is not None else (words[i + 1].text if i + 1 < len(words) else "")
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


def _trl_doc(path: str, cmd: Command, name: str, start: int, info: ReadInfo, load: Loader | None) -> ConfigDoc:
    doc = ConfigDoc(path, "trl", "shell")
    words = cmd.argv[start:]
    flags: list[tuple[str, list[Field], int]] = []
    for f in words:
        if f.text.startswith("--") and len(f.text) > 2:
            key, eq, val = f.text[2:].partition("=")
            flags.append((key.replace("-", "_"), [Field(val, f.exact, f.cond, f.why, f.line, f.options)] if eq else [],
                          f.line or cmd.line))
        elif flags:
            flags[-1][1].append(f)
    for key, vals, line in flags:
        if key == "config" and vals:
            cfg = vals[0].text
            base = load(cfg) if (load is not None and vals[0].exact) else None
            if base is not None:
                info.notes.append(f"read the TRL config {cfg} underneath the command's flags")
                for e in base.entries.values():
                    doc.set(e)
                doc.mentions |= base.mentions
                info.overrides += len(base.entries)
            else:
                info.notes.append(f"the TRL config {cfg} was not found next to the script: audit that file too")
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
    return doc


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
        names = sorted({c.argv[0].text for c in script.commands if c.argv})[:8]
        raise InputError(path, f"no trainer command found among {len(script.commands)} command(s) "
                               f"({', '.join(names) or 'none'}); looked for verl's main_ppo / a verl-recipe main "
                               "(python -m, torchrun, ray job submit -- ...), `trl grpo` or a GRPO training script")
    docs = []
    for n, (cmd, (kind, name, start)) in enumerate(found, 1):
        label = f"command {n} of {len(found)}, line {cmd.line}" if len(found) > 1 else f"line {cmd.line}"
        info = ReadInfo(f"{label}: {_describe(cmd, name)}", commands=len(script.commands),
                        trainer_commands=len(found), caller_args=cmd.caller_args, notes=list(notes), line=cmd.line,
                        context=cmd.context + ("; inside an if/case/loop" if cmd.cond and not cmd.context else ""))
        build = _verl_doc if kind == "verl" else _trl_doc
        doc = build(path, cmd, name, start, info, load)
        doc.read = info
        doc.label = label + (f" [{cmd.context}]" if cmd.context else "") if len(found) > 1 or cmd.context else None
        if cmd.caller_args:
            info.notes.append("the command also passes the script's own arguments (\"$@\"): overrides given at "
                              "launch are not in the file")
        docs.append(doc)
    return docs


def script_dir_loader(script: str, read: Callable[[str], ConfigDoc]) -> Loader:
    """A loader for config files a command names: relative to the cwd, the script's folder or its parents."""
    base = Path(script).resolve().parent

    def load(name: str) -> ConfigDoc | None:
        cands = [Path(name)] if Path(name).is_absolute() else [Path.cwd() / name] + [
            p / name for p in [base, *list(base.parents)[:3]]]
        for c in cands:
            if c.is_file():
                try:
                    return read(str(c))
                except InputError:
                    return None
        return None

    return load
