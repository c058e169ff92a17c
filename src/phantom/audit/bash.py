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

import re
from dataclasses import dataclass, field, replace
from typing import Any

from phantom.audit.bash_words import Field, Var, Words

__all__ = ["Field", "Command", "Script", "interpret", "parser_available", "parse_tree"]

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


#: Code points from U+20000 up (CJK extension planes and beyond) crash tree-sitter-bash 0.25.1's
#: scanner in a word after "{" (``x{\U000dda15m`` is a segmentation fault; the audit's fuzz test
#: found it). The parser sees them as U+10000, a letter of the same UTF-8 length, so every byte
#: offset, and every text the interpreter slices from the original bytes, stays as written.
_PARSER_UNSAFE = re.compile("[\U00020000-\U0010ffff]")
#: Valid bash the grammar (0.25.1) marks as an error, handed to it as a stand-in of the same byte length (the
#: interpreter slices every text from the original): a default that starts with "[" (``${X:-["a"]}``, a Hydra
#: list) and a line continuation at the very end of the file.
_DEFAULT_BRACKET = re.compile(r"(\$\{[#!]?[A-Za-z_][A-Za-z0-9_]*(?:\[[^\]]*\])?:?[-=+?])\[")
_TRAILING_CONTINUATION = re.compile(r"\\(\s*)\Z")


def parse_tree(text: str) -> Any:
    global _PARSER
    if _PARSER is None:
        import tree_sitter_bash
        from tree_sitter import Language, Parser

        _PARSER = Parser(Language(tree_sitter_bash.language()))
    text = _PARSER_UNSAFE.sub("\U00010000", text)
    text = _DEFAULT_BRACKET.sub(lambda m: m.group(1) + "X", text)
    text = _TRAILING_CONTINUATION.sub(lambda m: " " + m.group(1), text)
    return _PARSER.parse(text.encode("utf-8"))

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



class _Interp(Words):
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
