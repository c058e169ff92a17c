"""Read a verl launch script (bash) without running it.

Launch scripts such as verl-recipe's ``run_dapo_qwen2.5_32b.sh`` set shell variables
(``filter_groups_metric=acc``, ``gen_prompt_bsz=$((train_prompt_bsz * 3))``) and pass them to
``python3 -m verl.trainer.main_ppo`` or ``-m recipe.dapo.main_dapo`` as Hydra overrides spread
over ``\\``-continued lines. This module expands the variables it can (plain assignments,
``${VAR:-default}``, integer ``$((...))``) and keeps what it cannot (``$(cmd)``, positional
arguments, unset variables) as :class:`~phantom.audit.model.Unresolved` values, so a rule can say
"unknown" instead of guessing. Nothing is executed.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex

from phantom.audit.model import ConfigDoc, InputError
from phantom.audit.overrides import parse_override

__all__ = ["read_shell", "expand"]

#: A command that starts a verl trainer (core or verl-recipe).
_TRAINER = re.compile(r"(?:^|[\s/])(?:-m\s+)?(verl\.trainer\.main_\w+|recipe\.[\w.]*main_\w+|main_(?:ppo|dapo)\w*(?:\.py)?)\b")
_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_]\w*)=(.*)$", re.S)
_NAME = re.compile(r"[A-Za-z_]\w*")
_PLACEHOLDER = "\x00"  # marks text that came from something the audit could not resolve

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _arith(expr: str) -> int | None:
    """Bash integer arithmetic on literals (``/`` is integer division); None if not that."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        raise ValueError(node)

    try:
        return int(ev(tree))
    except (ValueError, ZeroDivisionError, TypeError):
        return None


def _matching(s: str, start: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one opened just before ``start`` (-1 if none)."""
    depth = 1
    i = start
    while i < len(s):
        if s.startswith(open_, i):
            depth += 1
            i += len(open_)
            continue
        if s.startswith(close, i):
            depth -= 1
            if depth == 0:
                return i
            i += len(close)
            continue
        i += 1
    return -1


def expand(text: str, env: dict[str, str | None]) -> str:
    """Expand ``$var``, ``${var}``, ``${var:-default}``, ``$((expr))``; strip ``# comments``.

    Single-quoted text is left alone, as bash does. Anything unresolvable is kept as written,
    prefixed with a NUL marker so callers can tell a resolved value from a guess.
    """
    out: list[str] = []
    i, n = 0, len(text)
    single = double = False
    while i < n:
        c = text[i]
        if c == "\\" and not single and i + 1 < n:
            out.append(text[i:i + 2])
            i += 2
            continue
        if c == "'" and not double:
            single = not single
        elif c == '"' and not single:
            double = not double
        elif c == "#" and not single and not double and (i == 0 or text[i - 1].isspace()):
            break  # a comment runs to the end of the line
        elif c == "$" and not single and i + 1 < n:
            if text.startswith("$((", i):
                end = _matching(text, i + 3, "((", "))")
                if end > 0:
                    inner = expand(text[i + 3:end], env)
                    inner = _NAME.sub(lambda m: str(env.get(m.group(0)) or 0) if env.get(m.group(0)) is not None
                                      else _PLACEHOLDER + m.group(0), inner)
                    value = None if _PLACEHOLDER in inner else _arith(inner)
                    out.append(str(value) if value is not None else _PLACEHOLDER + text[i:end + 2])
                    i = end + 2
                    continue
            if text.startswith("$(", i):
                end = _matching(text, i + 2, "(", ")")
                end = n - 1 if end < 0 else end
                out.append(_PLACEHOLDER + text[i:end + 1])
                i = end + 1
                continue
            if text[i + 1] == "{":
                end = _matching(text, i + 2, "{", "}")
                if end > 0:
                    out.append(_brace(text[i + 2:end], env, text[i:end + 1]))
                    i = end + 1
                    continue
            m = _NAME.match(text, i + 1)
            if m:
                value = env.get(m.group(0))
                out.append(value if value is not None else _PLACEHOLDER + m.group(0).join("${}"))
                i = m.end()
                continue
            if text[i + 1] in "@*#?0123456789":
                out.append(_PLACEHOLDER + text[i:i + 2])
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _brace(body: str, env: dict[str, str | None], whole: str) -> str:
    m = re.fullmatch(r"([A-Za-z_]\w*)(?:(:?[-=])(.*))?", body, re.S)
    if not m:
        return _PLACEHOLDER + whole
    name, op, default = m.groups()
    value = env.get(name)
    if op is not None and (value is None or (op.startswith(":") and value == "")):
        return expand(default, env)
    return value if value is not None else _PLACEHOLDER + whole


def _logical_lines(text: str) -> list[list[tuple[int, str]]]:
    """Physical lines grouped into commands joined by trailing backslashes."""
    groups: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    for no, line in enumerate(text.splitlines(), start=1):
        body = line.rstrip()
        cont = body.endswith("\\") and not body.endswith("\\\\")
        current.append((no, body[:-1] if cont else body))
        if not cont:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def _split(path: str, line: int, text: str) -> list[str]:
    try:
        return shlex.split(text, comments=False, posix=True)
    except ValueError as exc:
        raise InputError(path, f"cannot split this shell line ({exc}); check its quotes", line) from None


def _assignment_value(path: str, line: int, raw: str, env: dict[str, str | None]) -> str | None:
    words = _split(path, line, expand(raw, env))
    if len(words) > 1:
        return None
    value = words[0] if words else ""
    return None if _PLACEHOLDER in value else value


def read_shell(path: str, text: str) -> ConfigDoc:
    """Hydra overrides passed to the verl trainer command(s) of a launch script."""
    env: dict[str, str | None] = {}
    doc = ConfigDoc(path, "verl", "shell")
    found = False
    for group in _logical_lines(text):
        joined = " ".join(seg for _, seg in group)
        head = joined.strip()
        if not head or head.startswith("#"):
            continue
        trainer = _TRAINER.search(expand(joined, env).replace(_PLACEHOLDER, ""))
        if trainer is None:
            m = _ASSIGN.match(joined)
            if m and not m.group(2).lstrip().startswith("("):  # skip bash arrays
                env[m.group(1)] = _assignment_value(path, group[0][0], m.group(2), env)
            continue
        found = True
        module = trainer.group(1)
        doc.entrypoint = "recipe" if ("recipe" in module or "dapo" in module) else "main_ppo"
        for line, seg in _tokens_by_line(path, group, env):
            for word in seg:
                entry = parse_override(word.replace(_PLACEHOLDER, ""), path, line, trusted=_PLACEHOLDER not in word,
                                       strict=False)
                if entry is not None:
                    doc.set(entry)
    if not found:
        raise InputError(path, "no verl trainer command found (looked for `python -m verl.trainer.main_ppo` "
                               "or a verl-recipe `main_dapo`); pass the override list instead")
    return doc


def _tokens_by_line(path: str, group: list[tuple[int, str]], env: dict[str, str | None]) -> list[tuple[int, list[str]]]:
    """Words of a command with the physical line each starts on."""
    try:
        return [(no, shlex.split(expand(seg, env), posix=True)) for no, seg in group]
    except ValueError:
        # a quoted word spans lines: split the whole command and credit its first line
        joined = " ".join(seg for _, seg in group)
        return [(group[0][0], _split(path, group[0][0], expand(joined, env)))]

