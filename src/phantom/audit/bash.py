"""Interpret a bash launch script's syntax tree, statically, for the subset launch scripts use.

Why a real grammar: current verl examples and recipes pass their Hydra overrides through bash
arrays (``DATA=( ... )``, ``ACTOR+=( ... )``, ``"${DATA[@]}"``), quote JSON over several lines
(``--runtime-env-json='{ ... }'``), write other files with heredocs, and set values inside
``if``/``case`` branches. A line-and-regex reader drops or misreads all of these. The parser is
`tree-sitter <https://tree-sitter.github.io>`_ with the ``tree-sitter-bash`` grammar (both wheels
on PyPI, no compiler needed, C speed): it is maintained, parses every construct above (bashlex, the
other pure-Python option, has had no release since 2023 and stops at arrays and ``case``), and
never raises on bad input: a syntax error becomes an ``ERROR`` node we can report.

What the interpreter does (nothing is executed): assignments, ``export``/``local``/``declare``,
arrays and ``+=``, ``$X``/``${X}``/``${X:-d}``/``${X:=d}``/``: ${X:=d}``, ``$((...))`` on integers,
quotes and word splitting of unquoted expansions, ``"${A[@]}"``. Values it cannot know (``$(cmd)``,
variables from the environment, positional arguments) stay in the text as written and are marked
inexact, with the reason. Branches are run on copies of the variables; a variable or array element
that differs between branches is *conditional* ("depends on the environment"), never taken as set.
``for x in a b c`` loops are unrolled (one command per iteration: sweeps), other loops run once as
conditional, functions run where they are called. Heredoc bodies are text and are ignored.
"""

from __future__ import annotations

import ast
import contextlib
import operator
import re
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Field", "Command", "Script", "interpret", "parser_available", "parse_tree"]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_NAME = re.compile(r"[A-Za-z_]\w*")
_MAX_UNROLL = 64  # loop iterations unrolled in total (sweeps); beyond, the loop variable is unresolved
_MAX_DEPTH = 8  # nested function calls
_MAX_COMMANDS = 5000
_PARSER: Any = None


def parser_available() -> str | None:
    """None when the grammar imports, else the install hint."""
    try:
        import tree_sitter  # noqa: F401
        import tree_sitter_bash  # noqa: F401
    except ImportError as exc:
        return f"the shell reader needs tree-sitter and tree-sitter-bash ({exc}); pip install 'phantom[audit]'"
    return None


def parse_tree(text: str) -> Any:
    global _PARSER
    if _PARSER is None:
        import tree_sitter_bash
        from tree_sitter import Language, Parser

        _PARSER = Parser(Language(tree_sitter_bash.language()))
    return _PARSER.parse(text.encode("utf-8"))


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


@dataclass
class Command:
    """A simple command with its expanded words (argv), where it is, and under which conditions."""

    argv: list[Field]
    line: int
    end_line: int
    cond: bool = False
    context: str = ""
    caller_args: bool = False  # "$@" / "$*" of the script itself
    env: dict[str, Field] = field(default_factory=dict)  # VAR=value prefixes


@dataclass
class Script:
    commands: list[Command] = field(default_factory=list)
    env: dict[str, Var] = field(default_factory=dict)
    errors: list[int] = field(default_factory=list)  # lines of syntax errors
    open_quote: int | None = None  # line of a quote that never closes (bash refuses the whole script)
    notes: list[str] = field(default_factory=list)
    heredocs: int = 0


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


def _join(parts: list[_Part], line: int) -> list[Field]:
    """Concatenate parts into words, splitting unquoted expansions on whitespace."""
    out: list[Field] = []
    cur: list[_Part] = []
    started = False

    def flush() -> None:
        nonlocal cur, started
        if started:
            out.append(Field("".join(p.text for p in cur), all(p.exact for p in cur), any(p.cond for p in cur),
                             next((p.why for p in cur if p.why), ""), line,
                             next((p.options for p in cur if p.options), ())))
        cur, started = [], False

    for p in parts:
        if p.fields is not None:
            for i, f in enumerate(p.fields):
                if i:
                    flush()
                cur.append(_Part(f.text, False, f.exact, f.cond, f.why, f.options))
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


class _Interp:
    def __init__(self, text: str):
        self.src = text.encode("utf-8")
        self.script = Script()
        self.env = self.script.env
        self.functions: dict[str, Any] = {}
        self.called: set[str] = set()
        self.positional: list[Field] | None = None  # None: the script's own "$@" (unknown)
        self.depth = 0
        self.unrolled = 0
        self._caller = False

    # -------------------------------------------------------------------- words
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

    # ------------------------------------------------------------- statements
    def run(self, node: Any, cond: bool = False, ctx: str = "") -> None:
        t = node.type
        if t == "ERROR" or node.is_missing:
            self.script.errors.append(node.start_point[0] + 1)
        if t in ("program", "compound_statement", "do_group", "subshell", "list", "pipeline", "negated_command"):
            for c in node.named_children:
                self.run(c, cond, ctx)
        elif t == "redirected_statement":
            for c in node.children:
                if c.type == "heredoc_redirect":
                    self.script.heredocs += 1
                elif node.field_name_for_child(list(node.children).index(c)) == "body":
                    self.run(c, cond, ctx)
        elif t == "variable_assignment":
            self.assign(node, cond)
        elif t == "variable_assignments":
            for c in node.named_children:
                self.assign(c, cond)
        elif t == "declaration_command":
            for c in node.named_children:
                if c.type == "variable_assignment":
                    self.assign(c, cond)
        elif t == "unset_command":
            for c in node.named_children:
                self.env.pop(self.text(c), None)
        elif t == "command":
            self.command(node, cond, ctx)
        elif t == "function_definition":
            name = node.child_by_field_name("name")
            if name is not None:
                self.functions[self.text(name)] = node.child_by_field_name("body")
        elif t in ("if_statement", "case_statement"):
            self.branches(node, ctx)
        elif t == "for_statement":
            self.for_loop(node, cond, ctx)
        elif t in ("while_statement", "c_style_for_statement"):
            body = node.child_by_field_name("body")
            if body is not None:
                self.branch_group([[body]], ctx, always=False)
        elif t in ("ERROR",):
            for c in node.named_children:
                self.run(c, cond, ctx)

    def assign(self, node: Any, cond: bool) -> None:
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if name_node is None:
            return
        line = node.start_point[0] + 1
        append = any(c.type == "+=" for c in node.children)
        if name_node.type == "subscript":  # A[3]=x: the audit keeps arrays as lists; an indexed set is appended
            name, append = self.text(name_node.child_by_field_name("name")), True
        else:
            name = self.text(name_node)
        if value is not None and value.type == "array":
            items: list[Field] = []
            for c in value.named_children:
                if c.type != "comment":
                    items += self.word(c)
            old = self.env.get(name)
            base = list(old.fields) if (append and old is not None) else []
            self.env[name] = Var(base + items, True, line)
            return
        f = self.one(value) if value is not None else Field("", line=line)
        old = self.env.get(name)
        if old is not None and old.array:
            fields = list(old.fields) + [f] if append else [f] + list(old.fields[1:])
            self.env[name] = Var(fields, True, line)
        elif append and old is not None:
            s = old.scalar
            self.env[name] = Var([Field(s.text + f.text, s.exact and f.exact, s.cond or f.cond, s.why or f.why,
                                        line)], line=line)
        else:
            self.env[name] = Var([f], line=line)

    def command(self, node: Any, cond: bool, ctx: str) -> None:
        prefix: dict[str, Field] = {}
        argv: list[Field] = []
        self._caller = False
        for i, c in enumerate(node.children):
            fname = node.field_name_for_child(i)
            if c.type == "variable_assignment" and fname is None:
                name = c.child_by_field_name("name")
                value = c.child_by_field_name("value")
                if name is not None:
                    prefix[self.text(name)] = self.one(value) if value is not None else Field("")
            elif fname == "name":
                argv += self.word(c.named_children[0] if c.named_children else c)
            elif fname == "argument":
                argv += self.word(c)
        if not argv:
            return
        head = argv[0].text
        if head in (":", "true"):  # ": ${X:=default}" assigned in the word expansion above
            return
        if head in (".", "source") and len(argv) > 1:
            self.script.notes.append(f"line {node.start_point[0] + 1}: `{head} {argv[1].text}` is not read; "
                                     "variables it sets are unknown here")
            return
        if head in self.functions and self.depth < _MAX_DEPTH:
            self.called.add(head)
            saved, self.positional = self.positional, argv[1:]
            self.depth += 1
            try:
                self.run(self.functions[head], cond, (ctx + "; " if ctx else "") + f"in {head}()")
            finally:
                self.depth -= 1
                self.positional = saved
            return
        if len(self.script.commands) < _MAX_COMMANDS:
            self.script.commands.append(Command(argv, node.start_point[0] + 1, node.end_point[0] + 1, cond, ctx,
                                                self._caller, prefix))

    def snapshot(self) -> dict[str, Var]:
        return {k: Var(list(v.fields), v.array, v.line) for k, v in self.env.items()}

    def branches(self, node: Any, ctx: str) -> None:
        groups: list[list[Any]] = []
        exhaustive = False
        if node.type == "if_statement":
            cur: list[Any] = []
            for i, c in enumerate(node.children):
                fname = node.field_name_for_child(i)
                if fname == "condition" or c.type in ("if", "then", "fi", ";", "\n"):
                    continue
                if c.type == "elif_clause":
                    groups.append(cur)
                    cur = [x for j, x in enumerate(c.children) if c.field_name_for_child(j) != "condition"
                           and x.type not in ("elif", "then", ";")]
                elif c.type == "else_clause":
                    groups.append(cur)
                    cur = [x for x in c.children if x.type != "else"]
                    exhaustive = True
                elif c.is_named:
                    cur.append(c)
            groups.append(cur)
        else:
            for item in node.children:
                if item.type != "case_item":
                    continue
                body = [c for j, c in enumerate(item.children) if item.field_name_for_child(j) not in ("value",)
                        and c.is_named]
                if any(self.text(c).strip() in ("*", '"*"') for j, c in enumerate(item.children)
                       if item.field_name_for_child(j) == "value"):
                    exhaustive = True
                groups.append(body)
        self.branch_group(groups, ctx, always=exhaustive)

    def branch_group(self, groups: list[list[Any]], ctx: str, always: bool) -> None:
        """Run each branch on a copy of the variables and merge: what differs is conditional."""
        before = self.snapshot()
        results = []
        for body in groups:
            self.env.clear()
            self.env.update({k: Var(list(v.fields), v.array, v.line) for k, v in before.items()})
            if any(c.type == "command" and self.text(c).split()[:1] in (["exit"], ["return"]) for c in body):
                continue  # a branch that stops the script does not reach the launch below
            for c in body:
                self.run(c, True, ctx)
            results.append(self.snapshot())
        if not always:
            results.append(before)
        self.env.clear()
        if not results:
            self.env.update(before)
            return
        names = {n for r in results for n in r}
        for name in names:
            vals = [r.get(name) for r in results]
            self.env[name] = _merge(vals)

    def for_loop(self, node: Any, cond: bool, ctx: str) -> None:
        var = node.child_by_field_name("variable")
        body = node.child_by_field_name("body")
        if var is None or body is None:
            return
        values: list[Field] = []
        for i, c in enumerate(node.children):
            if node.field_name_for_child(i) == "value":
                values += self.word(c)
        name = self.text(var)
        if values and all(v.exact for v in values) and self.unrolled + len(values) <= _MAX_UNROLL:
            self.unrolled += len(values)
            for v in values:
                self.env[name] = Var([v], line=v.line)
                self.run(body, cond, (ctx + "; " if ctx else "") + f"{name}={v.text}")
            return
        opts = tuple(v.text for v in values)
        self.env[name] = Var([Field(f"${name}", False, True, f"${name} is a loop variable", node.start_point[0] + 1,
                                    opts)])
        self.branch_group([[body]], ctx, always=False)


def _merge(vals: list[Var | None]) -> Var:
    """One variable from its values in several branches (None: unset in that branch)."""
    present = [v for v in vals if v is not None]
    first = present[0]
    if all(v is not None and v.array == first.array and [f.text for f in v.fields] == [f.text for f in first.fields]
           for v in vals):
        return first
    line = max(v.line for v in present)
    if any(v.array for v in present):
        # keep the common prefix as it is; elements only some branches add are conditional
        lists = [v.fields if v is not None else [] for v in vals]
        n = 0
        while all(len(x) > n for x in lists) and len({x[n].text for x in lists}) == 1:
            n += 1
        out = list(lists[0][:n])
        seen: set[str] = set()
        for x in lists:
            for f in x[n:]:
                if f.text not in seen:
                    seen.add(f.text)
                    out.append(replace(f, exact=False, cond=True, why=f.why or "set only in an if/case branch"))
        return Var(out, True, line)
    texts = tuple(dict.fromkeys((v.scalar.text if v is not None else "<unset>") for v in vals))
    base = first.scalar
    return Var([Field(base.text, False, True, f"set differently in if/case branches ({' | '.join(texts)})",
                      base.line, texts)], line=line)


def interpret(text: str) -> Script:
    """The commands a launch script runs, with their words expanded as far as the file tells."""
    tree = parse_tree(text)
    it = _Interp(text)
    it.run(tree.root_node)
    for name, body in it.functions.items():  # a function never called here: read it once, args unknown
        if name not in it.called:
            it.positional = None
            it.run(body, True, f"in {name}() (not called in this file)")
    if tree.root_node.has_error:
        it.script.open_quote = _collect_errors(tree.root_node, it.script.errors, it.src)
    it.script.errors = sorted(set(it.script.errors))
    return it.script


def _collect_errors(node: Any, out: list[int], src: bytes) -> int | None:
    """Record error lines; return the line of an unterminated quote, if that is the error."""
    stack, quote = [node], None
    while stack:
        n = stack.pop()
        if n.is_missing and n.type in ('"', "'", "`") and n.parent is not None:
            quote = n.parent.start_point[0] + 1 if quote is None else min(quote, n.parent.start_point[0] + 1)
        if n.type == "ERROR" or n.is_missing:
            out.append(n.start_point[0] + 1)
            if n.type == "ERROR" and src[n.start_byte:n.start_byte + 1] in (b"'", b'"') and not src[
                    n.end_byte:].strip() and src[n.start_byte:n.end_byte].count(src[n.start_byte:n.start_byte + 1]) == 1:
                quote = n.start_point[0] + 1 if quote is None else min(quote, n.start_point[0] + 1)
        if n.has_error or n.type == "ERROR":
            stack.extend(n.children)
    return quote
