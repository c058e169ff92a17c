"""Shell word expansion for :mod:`phantom.audit.bash`: quotes, ``$X``, ``${X:-d}``, ``$((...))``, arrays.

A word becomes one or more :class:`Field` values, as bash would split it; a part the audit cannot
know (``$(cmd)``, a variable from the environment, positional arguments) is kept as written and
marks the field inexact, with the reason.
"""

from __future__ import annotations

import ast
import contextlib
import operator
import re
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Field", "Var", "Words"]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


@dataclass(frozen=True)
class Field:
    """One shell word after expansion.

    ``text`` is the expanded text; a part the audit cannot resolve is kept as written (``$MODEL``).
    ``exact`` is False when any part was unresolved; ``cond`` when a part depends on a branch;
    ``why`` names the first reason; ``options`` holds the values seen in different branches.
    """

    text: str
    exact: bool = True
    cond: bool = False
    why: str = ""
    line: int = 0
    options: tuple[str, ...] = ()


@dataclass
class Var:
    fields: list[Field]
    array: bool = False
    line: int = 0

    @property
    def scalar(self) -> Field:
        if not self.fields:
            return Field("", line=self.line)
        if len(self.fields) == 1:
            return self.fields[0]
        f = self.fields
        return Field(" ".join(x.text for x in f), all(x.exact for x in f), any(x.cond for x in f),
                     next((x.why for x in f if x.why), ""), f[0].line)



def _arith(expr: str) -> int | None:
    """Bash integer arithmetic on literals (``/`` is integer division); None if not that."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(ev(node.right)) > 64:
                raise ValueError(node)
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        raise ValueError(node)

    try:
        return int(ev(tree))
    except (ValueError, ZeroDivisionError, TypeError, OverflowError):
        return None


@dataclass
class _Part:
    text: str
    split: bool  # an unquoted expansion: bash splits it on whitespace
    exact: bool = True
    cond: bool = False
    why: str = ""
    options: tuple[str, ...] = ()
    fields: list[Field] | None = None  # "${A[@]}": already separate words
    line: int = 0  # where an array element was written (0: where the word is)


def _join(parts: list[_Part], line: int) -> list[Field]:
    """Concatenate parts into words, splitting unquoted expansions on whitespace."""
    out: list[Field] = []
    cur: list[_Part] = []
    started = False

    def flush() -> None:
        nonlocal cur, started
        if started:
            out.append(Field("".join(p.text for p in cur), all(p.exact for p in cur), any(p.cond for p in cur),
                             next((p.why for p in cur if p.why), ""), next((p.line for p in cur if p.line), line),
                             next((p.options for p in cur if p.options), ())))
        cur, started = [], False

    for p in parts:
        if p.fields is not None:
            for i, f in enumerate(p.fields):
                if i:
                    flush()
                cur.append(_Part(f.text, False, f.exact, f.cond, f.why, f.options, line=f.line))
                started = True
            continue
        if not p.split:
            cur.append(p)
            started = True
            continue
        pieces = p.text.split() if p.exact else _split_placeholders(p.text)
        if not pieces:
            continue
        if p.text[:1].isspace():
            flush()
        for i, piece in enumerate(pieces):
            if i:
                flush()
            cur.append(replace(p, text=piece))
            started = True
        if p.text[-1:].isspace():
            flush()
    flush()
    return out


def _split_placeholders(text: str) -> list[str]:
    """Split on whitespace outside ``$(...)`` / ``${...}`` kept as written (their output is one word)."""
    out, cur, depth, i = [], [], 0, 0
    while i < len(text):
        c = text[i]
        if text.startswith(("$(", "${"), i):
            depth += 1
            cur.append(text[i:i + 2])
            i += 2
            continue
        if c in ")}" and depth:
            depth -= 1
        elif c == "(" and depth:
            depth += 1
        if c.isspace() and not depth:
            if cur:
                out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        out.append("".join(cur))
    return out


class Words:
    """Expands word nodes against ``self.env`` (name -> :class:`Var`) and ``self.positional``."""

    src: bytes
    env: dict[str, Var]
    positional: list[Field] | None
    _caller: bool

    def word(self, node: Any, line: int | None = None) -> list[Field]:
        line = line or node.start_point[0] + 1
        return _join(self.parts(node, quoted=False), line)

    def one(self, node: Any) -> Field:
        """A word that bash does not split (assignment values, ``${X:-default}`` defaults)."""
        parts = self.parts(node, quoted=True)
        return _join([replace(p, split=False) for p in parts], node.start_point[0] + 1)[0] if parts else Field(
            "", line=node.start_point[0] + 1)

    def text(self, node: Any) -> str:
        return self.src[node.start_byte:node.end_byte].decode("utf-8", errors="replace")

    def parts(self, node: Any, quoted: bool) -> list[_Part]:
        t = node.type
        if t in ("word", "number", "string_content", "extglob_pattern", "regex", "heredoc_content"):
            raw = self.text(node)
            if t == "string_content":  # inside double quotes only \$ \` \" \\ and a line break are escapes
                return [_Part(re.sub(r"\\([$`\"\\\n])", r"\1", raw).replace("\\\n", ""), False)]
            return [_Part(re.sub(r"\\(.)", r"\1", raw, flags=re.S), False)]
        if t == "raw_string":
            return [_Part(self.text(node)[1:-1], False)]
        if t == "ansi_c_string":
            body = self.text(node)[2:-1]
            with contextlib.suppress(UnicodeDecodeError):
                body = body.encode("latin-1", "backslashreplace").decode("unicode_escape")
            return [_Part(body, False)]
        if t in ("string", "translated_string"):
            out: list[_Part] = []
            for c in node.named_children:
                out += [replace(p, split=False) for p in self.parts(c, quoted=True)]
            # text between named children (plain characters) is in string_content nodes
            return out or [_Part("", False)]
        if t == "concatenation":
            out = []
            for c in node.children:
                out += self.parts(c, quoted)
            return out
        if t == "simple_expansion":
            name = self.text(node)[1:]
            return [self.lookup(name, quoted, node)]
        if t == "expansion":
            return [self.expansion(node, quoted)]
        if t == "command_substitution":
            return [_Part(self.text(node), not quoted, False, why=f"the output of {self.text(node)[:40]}")]
        if t == "process_substitution":
            return [_Part(self.text(node), False, False, why="a process substitution")]
        if t == "arithmetic_expansion":
            return [self.arith(node)]
        if t == "brace_expression":
            return [_Part(self.text(node), False)]
        return [_Part(self.text(node), False)]

    def lookup(self, name: str, quoted: bool, node: Any) -> _Part:
        if name in ("@", "*"):
            if self.positional is not None:
                return _Part("", False, fields=list(self.positional)) if quoted or name == "@" else _Part(
                    " ".join(f.text for f in self.positional), True)
            self._caller = True
            return _Part(f"${name}", False, False, why="the arguments the script is called with")
        if name.isdigit() or name in ("#", "?", "$", "!", "-", "0"):
            if self.positional is not None and name.isdigit() and name != "0":
                i = int(name) - 1
                if i < len(self.positional):
                    f = self.positional[i]
                    return _Part(f.text, not quoted, f.exact, f.cond, f.why, f.options)
            return _Part(f"${name}", False, False, why=f"${name} is set when the script runs")
        var = self.env.get(name)
        if var is None:
            return _Part(f"${{{name}}}", False, False, why=f"${name} is not set in the file (from the environment)")
        f = var.scalar if not var.array else (var.fields[0] if var.fields else Field(""))
        return _Part(f.text, not quoted, f.exact, f.cond, f.why, f.options)

    def expansion(self, node: Any, quoted: bool) -> _Part:
        kids = [c for c in node.children if c.type not in ("${", "}")]
        whole = self.text(node)
        if not kids:
            return _Part(whole, False, False, why=f"{whole} cannot be resolved")
        first = kids[0]
        if first.type == "#" and len(kids) >= 2:  # ${#X} / ${#A[@]}
            target = kids[1]
            name = target.child_by_field_name("name") if target.type == "subscript" else target
            var = self.env.get(self.text(name)) if name is not None else None
            if var is None:
                return _Part(whole, False, False, why=f"{whole} cannot be resolved")
            n = len(var.fields) if target.type == "subscript" else len(var.scalar.text)
            return _Part(str(n), False, all(f.exact for f in var.fields))
        if first.type == "subscript":
            name = self.text(first.child_by_field_name("name"))
            index = first.child_by_field_name("index")
            idx = self.text(index) if index is not None else ""
            var = self.env.get(name)
            if len(kids) > 1:
                return _Part(whole, False, False, why=f"{whole} is an array operation the audit does not evaluate")
            if var is None:
                return _Part(whole, False, False, why=f"${name} is not set in the file (from the environment)")
            if idx in ("@", "*"):
                if idx == "*" and quoted:
                    f = var.scalar
                    return _Part(f.text, False, f.exact, f.cond, f.why)
                return _Part("", False, fields=list(var.fields)) if quoted else _Part(
                    " ".join(f.text for f in var.fields), True,
                    all(f.exact for f in var.fields), any(f.cond for f in var.fields))
            if idx.isdigit() and int(idx) < len(var.fields):
                f = var.fields[int(idx)]
                return _Part(f.text, not quoted, f.exact, f.cond, f.why)
            return _Part(whole, False, False, why=f"{whole} cannot be resolved")
        if first.type not in ("variable_name", "special_variable_name"):
            return _Part(whole, False, False, why=f"{whole} cannot be resolved")
        name = self.text(first)
        if len(kids) == 1:
            return self.lookup(name, quoted, node)
        op = kids[1].type
        rest = kids[2:]
        if op not in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            return _Part(whole, False, False, why=f"{whole} is a string operation the audit does not evaluate")
        var = self.env.get(name)
        cur = None if var is None else var.scalar
        unset = cur is None or (op.startswith(":") and cur.exact and cur.text == "")
        default = _join([replace(p, split=False) for c in rest for p in self.parts(c, True)] or [_Part("", False)],
                        node.start_point[0] + 1)
        dflt = default[0] if default else Field("")
        if op in (":+", "+"):
            chosen = Field("") if unset else dflt
        elif op in (":?", "?"):
            chosen = cur if not unset else Field(whole, False, why=f"${name} must be set by the caller")
        elif unset:
            chosen = dflt
            if op in (":=", "="):
                self.env[name] = Var([dflt], line=node.start_point[0] + 1)
        else:
            chosen = cur
        assert chosen is not None
        return _Part(chosen.text, not quoted, chosen.exact, chosen.cond, chosen.why, chosen.options)

    def arith(self, node: Any) -> _Part:
        whole = self.text(node)
        inner = whole[3:-2] if whole.startswith("$((") else whole[2:-1]
        bad: list[str] = []

        def sub(m: re.Match) -> str:
            name = m.group(1) or m.group(2)
            var = self.env.get(name)
            if var is None or not var.scalar.exact:
                bad.append(name)
                return "0"
            v = var.scalar.text.strip()
            return v if re.fullmatch(r"-?\d+", v) else (bad.append(name) or "0")

        expr = re.sub(r"\$\{?([A-Za-z_]\w*)\}?|\b([A-Za-z_]\w*)\b", sub, inner)
        value = None if bad else _arith(expr)
        if value is None:
            return _Part(whole, False, False, why=f"{whole} cannot be evaluated" + (f" (${bad[0]})" if bad else ""))
        return _Part(str(value), False)
