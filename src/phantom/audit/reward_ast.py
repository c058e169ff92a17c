"""The value set of a reward function, read from its body with :mod:`ast` (never run).

A reward function's *name* says little: ``format_reward`` may return 1.0/0.0 (binary: no spread
among failures if it is the only reward) and ``accuracy`` may add a length bonus. So the audit
reads the body of a reward function defined in an audited file (a TRL script, an EasyR1 or verl
custom reward module it can find) and classifies what it returns:

* **binary**: every return is one of at most two constants (``1.0``/``0.0``, ``True``/``False``,
  ``1``/``-1``), a comparison or a boolean test (``float(a == b)``), an affine map of one such value
  (``0.5 * (acc + 1)``), or a product of two;
* **shaped**: arithmetic on lengths (``len(...)``), a ratio or sum of parts (partial credit), the sum
  of two non-constant terms (``0.9 * acc + 0.1 * fmt``), or more than two distinct constants;
* **unknown** otherwise (a parameter, a library call, a value from elsewhere), and said so.

Dict returns (verl's ``{"score": ..., "acc": ...}``, EasyR1's ``{"overall": ..., "accuracy": ...}``)
are classified per key; lists (TRL, EasyR1 batch rewards) by their elements, also when built with
``.append``. Calls to functions of the same module are followed (a few levels deep).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

__all__ = ["Shape", "function_shape", "module_functions"]

_DEPTH = 4
_NUMERIC = (int, float, bool)
#: library functions known to return a bool (their bodies are not in the audited file):
#: math_verify.verify, mathruler.grader.grade_answer, verl's math_dapo/prime_math checks
_BOOL_FUNCS = frozenset({"verify", "grade_answer", "is_equiv", "math_equal", "grade", "is_correct",
                         "check_correctness", "strip_string_equal"})


@dataclass(frozen=True)
class Shape:
    """``kind``: binary | shaped | unknown | const | dict | seq; ``why``: what in the body decided it."""

    kind: str
    why: str = ""
    line: int | None = None
    values: frozenset = frozenset()  # const: the constants; binary: its two values when known
    keys: dict[str, Shape] = field(default_factory=dict, compare=False)  # dict
    elt: Shape | None = None  # seq

    @property
    def verdict(self) -> str:
        """binary | shaped | unknown for a scalar (a constant or two are binary)."""
        if self.kind == "const":
            return "binary" if len(self.values) <= 2 else "shaped"
        if self.kind == "seq" and self.elt is not None:
            return self.elt.verdict
        return self.kind if self.kind in ("binary", "shaped") else "unknown"

    @property
    def returns(self) -> str:
        if self.kind == "dict":
            return "dict"
        if self.kind == "seq":
            return "list of " + (self.elt.returns if self.elt is not None else "?")
        return "float"

    def scalar(self) -> Shape:
        """A list's element; the shape itself otherwise."""
        return self.elt.scalar() if self.kind == "seq" and self.elt is not None else self

    def describe(self) -> str:
        s = self.scalar()
        if s.kind == "dict":
            return "a dict: " + ", ".join(f"{k} {v.verdict} ({v.explain()})" for k, v in s.keys.items())
        return f"{s.verdict}: {s.explain()}"

    def explain(self) -> str:
        if self.kind == "const":
            vals = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in sorted(self.values, key=float))
            why = f"returns only the constant(s) {vals}"
            if len(self.values) > 2:
                why += " (more than two values: partial credit)"
            return why + (f" (line {self.line})" if self.line else "")
        return self.why + (f" (line {self.line})" if self.line and self.why else "")


def _fixed(s: Shape) -> bool:
    """One known constant (a weight, an offset)."""
    return s.kind == "const" and len(s.values) == 1


def _apply(op: ast.operator, x: float, y: float) -> float | None:
    try:
        if isinstance(op, ast.Add):
            return x + y
        if isinstance(op, ast.Sub):
            return x - y
        if isinstance(op, ast.Mult):
            return x * y
        if isinstance(op, ast.Div):
            return x / y
        if isinstance(op, ast.Pow):
            return float(x ** y)
    except (ArithmeticError, TypeError, ValueError):
        return None
    return None


def _const(v: object, line: int) -> Shape:
    return Shape("const", line=line, values=frozenset({float(v)}))  # type: ignore[arg-type]


_BIN = frozenset({0.0, 1.0})


def _combine(shapes: list[Shape], line: int | None = None) -> Shape:
    """One shape for several returns (branches)."""
    shapes = [s for s in shapes if s is not None]
    if not shapes:
        return Shape("unknown", "no return value found", line)
    for k in ("shaped",):
        hit = next((s for s in shapes if s.kind == k), None)
        if hit is not None:
            return hit
    if all(s.kind == "dict" for s in shapes):
        keys: dict[str, Shape] = {}
        for name in dict.fromkeys(k for s in shapes for k in s.keys):
            keys[name] = _combine([s.keys[name] for s in shapes if name in s.keys])
        return Shape("dict", keys=keys, line=shapes[0].line)
    if all(s.kind == "seq" for s in shapes):
        return Shape("seq", elt=_combine([s.elt for s in shapes if s.elt is not None]), line=shapes[0].line)
    if any(s.kind in ("dict", "seq") for s in shapes):
        return Shape("unknown", "returns values of different kinds", shapes[0].line)
    unknown = next((s for s in shapes if s.kind == "unknown"), None)
    if unknown is not None:
        return unknown
    values = frozenset().union(*(s.values if s.values else _BIN for s in shapes))
    if all(s.kind == "const" for s in shapes):
        return Shape("const", line=shapes[0].line, values=values)
    if len(values) > 2:
        lines = sorted({s.line for s in shapes if s.line})
        return Shape("shaped", f"its returns take more than two values ({', '.join(f'{v:g}' for v in sorted(values))})",
                     lines[0] if lines else None)
    first = next(s for s in shapes if s.kind == "binary")
    return Shape("binary", first.why, first.line, values)


class _Body:
    """Evaluates expressions of one function body."""

    def __init__(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, funcs: dict[str, ast.AST], consts: dict[str, object],
                 depth: int):
        self.fn, self.funcs, self.depth = fn, funcs, depth
        self.consts = dict(consts)
        args = fn.args
        pos = args.posonlyargs + args.args
        for a, d in zip(pos[len(pos) - len(args.defaults):], args.defaults):
            if isinstance(d, ast.Constant) and isinstance(d.value, _NUMERIC):
                self.consts[a.arg] = d.value  # a weight with a numeric default: its default
        for a, d in zip(args.kwonlyargs, args.kw_defaults):
            if isinstance(d, ast.Constant) and isinstance(d.value, _NUMERIC):
                self.consts[a.arg] = d.value
        self.params = {a.arg for a in pos + args.kwonlyargs} - set(self.consts)
        self.assigns: dict[str, list[ast.expr]] = {}
        self.augs: dict[str, list[ast.AugAssign]] = {}
        self.appends: dict[str, list[ast.expr]] = {}
        for node in _walk_own(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigns.setdefault(t.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigns.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                self.augs.setdefault(node.target.id, []).append(node)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
                  and isinstance(node.func.value, ast.Name) and node.args):
                self.appends.setdefault(node.func.value.id, []).append(node.args[0])
        self.seen: set[str] = set()

    def returns(self) -> Shape:
        rets = [n for n in _walk_own(self.fn) if isinstance(n, ast.Return) and n.value is not None]
        return _combine([self.expr(r.value) for r in rets], self.fn.lineno)

    def name(self, node: ast.Name) -> Shape:
        n, line = node.id, node.lineno
        if n in self.consts and isinstance(self.consts[n], _NUMERIC):
            return _const(self.consts[n], line)
        if n in self.seen:
            return Shape("unknown", f"`{n}` depends on itself", line)
        if n in self.appends:
            self.seen.add(n)
            try:
                return Shape("seq", elt=_combine([self.expr(e) for e in self.appends[n]]), line=line)
            finally:
                self.seen.discard(n)
        if n in self.assigns:
            self.seen.add(n)
            try:
                base = _combine([self.expr(e) for e in self.assigns[n]])
            finally:
                self.seen.discard(n)
            for aug in self.augs.get(n, []):
                add = self.expr(aug.value)
                if base.kind == "const" and add.kind == "const" and isinstance(aug.op, (ast.Add, ast.Sub)):
                    step = next(iter(add.values)) * (1 if isinstance(aug.op, ast.Add) else -1)
                    base = Shape("const", line=base.line, values=base.values | {v + step for v in base.values})
                else:
                    return Shape("shaped", f"`{n}` accumulates ({ast.unparse(aug)[:40]}): partial credit", aug.lineno)
            return base
        if n in self.params:
            return Shape("unknown", f"`{n}` is an argument of the function", line)
        return Shape("unknown", f"`{n}` is set outside the function", line)

    def call(self, node: ast.Call) -> Shape:
        f, line = node.func, node.lineno
        fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        args = [self.expr(a) for a in node.args]
        if fname in ("float", "int", "bool", "round", "abs") and len(node.args) >= 1:
            a0 = node.args[0]
            if isinstance(a0, (ast.Compare, ast.BoolOp)) or (isinstance(a0, ast.UnaryOp) and isinstance(a0.op, ast.Not)):
                return Shape("binary", f"{fname}() of a test", line, _BIN)
            return args[0] if fname != "bool" else Shape("binary", "bool()", line, _BIN)
        if fname == "len":
            return Shape("shaped", "uses a length (len)", line)
        if fname in ("tensor", "as_tensor", "array", "asarray", "list", "tuple", "Tensor", "FloatTensor") and args:
            return args[0]  # a container of the values: their shape
        if fname in ("sum", "mean", "average", "fmean", "median"):
            return Shape("shaped", f"{fname}() over parts: partial credit", line)
        if fname in ("min", "max", "clip", "clamp"):
            return _combine(args, line) if args else Shape("unknown", f"{fname}()", line)
        if isinstance(f, ast.Name) and fname in self.funcs and self.depth < _DEPTH:
            inner = self.funcs[fname]
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                s = _Body(inner, self.funcs, {}, self.depth + 1).returns()
                return Shape(s.kind, s.why or f"from {fname}()", s.line, s.values, s.keys, s.elt)
        if fname in _BOOL_FUNCS:
            return Shape("binary", f"{fname}() returns a bool", line, _BIN)
        if fname in ("search", "match", "fullmatch", "startswith", "endswith", "isdigit", "isinstance"):
            return Shape("binary", f"{fname}() as a test", line, _BIN)
        return Shape("unknown", f"the result of {ast.unparse(f)[:40]}()", line)

    def binop(self, node: ast.BinOp) -> Shape:
        a, b = self.expr(node.left), self.expr(node.right)
        line, op = node.lineno, node.op
        text = _short(node)
        for s in (a, b):
            if s.kind == "shaped":
                return Shape("shaped", s.why, s.line or line)
        fixed_a, fixed_b = _fixed(a), _fixed(b)
        if fixed_a or fixed_b:  # an affine map of the other side: its values move, their number does not
            c, other = (next(iter(a.values)), b) if fixed_a else (next(iter(b.values)), a)
            if other.kind in ("const", "binary") and (other.values or other.kind == "binary"):
                vals = other.values or _BIN
                out = {_apply(op, v, c) if fixed_b else _apply(op, c, v) for v in vals}
                if None not in out:
                    return Shape("const" if other.kind == "const" or other.values else "binary",
                                 other.why or text, other.line or line, frozenset(out))
            if isinstance(op, ast.Div) and fixed_a:
                return Shape("unknown", f"{text}: a constant divided by a value", line)
            return Shape(other.kind, other.why or text, other.line or line, frozenset(), other.keys, other.elt)
        if isinstance(op, ast.Div):
            return Shape("shaped", f"{text}: a ratio of two values (partial credit)", line)
        two = {"const", "binary"}
        if a.kind in two and b.kind in two and len(a.values or _BIN) <= 2 and len(b.values or _BIN) <= 2:
            if isinstance(op, ast.Mult):
                return Shape("binary", f"{text}: a product of two tests", line)
            if isinstance(op, (ast.Add, ast.Sub)):
                return Shape("shaped", f"{text}: the sum of two terms, so a failure can still score", line)
        unknown = a if a.kind == "unknown" else b
        return Shape("unknown", unknown.why or text, unknown.line or line)

    def expr(self, node: ast.expr) -> Shape:
        line = getattr(node, "lineno", None)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, _NUMERIC):
                return _const(node.value, node.lineno)
            return Shape("unknown", f"returns {node.value!r}", line)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return Shape("binary", "a negated test", line, _BIN)
            inner = self.expr(node.operand)
            if inner.kind == "const" and isinstance(node.op, ast.USub):
                return Shape("const", line=line, values=frozenset(-v for v in inner.values))
            return inner
        if isinstance(node, (ast.Compare, ast.BoolOp)):
            return Shape("binary", "a test", line, _BIN)
        if isinstance(node, ast.IfExp):
            return _combine([self.expr(node.body), self.expr(node.orelse)], line)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BinOp):
            return self.binop(node)
        if isinstance(node, ast.Dict):
            keys = {}
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    keys[k.value] = self.expr(v)
            return Shape("dict", keys=keys, line=line)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return Shape("seq", elt=self.expr(node.elt), line=line)
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            return Shape("seq", elt=_combine([self.expr(e) for e in node.elts]), line=line)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            base = self.expr(node.value)
            if base.kind == "dict" and node.slice.value in base.keys:
                return base.keys[node.slice.value]
        if isinstance(node, ast.Await):
            return self.expr(node.value)
        return Shape("unknown", f"{ast.unparse(node)[:40]} cannot be read statically", line)


def _short(node: ast.AST, n: int = 80) -> str:
    text = ast.unparse(node)
    return text if len(text) <= n else text[: n - 3] + "..."


def _walk_own(fn: ast.AST):
    """The nodes of a function body, not of functions or classes nested in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(n))


def module_functions(tree: ast.Module) -> tuple[dict[str, ast.AST], dict[str, object]]:
    """Module-level functions (and a class's ``__call__``, under the class name) and numeric constants."""
    funcs: dict[str, ast.AST] = {}
    consts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs[node.name] = node
        elif isinstance(node, ast.ClassDef):
            call = next((b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and b.name == "__call__"), None)
            if call is not None:
                funcs[node.name] = call
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, _NUMERIC):
            consts[node.targets[0].id] = node.value.value
    return funcs, consts


def function_shape(source: str | ast.Module, name: str) -> Shape | None:
    """The shape of ``name``'s return value in ``source`` (None: no such function, or not Python)."""
    try:
        tree = source if isinstance(source, ast.Module) else ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    funcs, consts = module_functions(tree)
    fn = funcs.get(name)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    try:
        return _Body(fn, funcs, consts, 0).returns()
    except RecursionError:
        return Shape("unknown", "the body nests too deeply to read", fn.lineno)
