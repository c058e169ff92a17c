"""TRL settings from a Python training script, read with :mod:`ast` (never imported or run).

``GRPOConfig(...)``/``RLOOConfig(...)`` keyword arguments (also a module-level ``**settings`` dict),
``GRPOTrainer(reward_funcs=...)`` names (a list, a module-level list, ``outcome_gated(...)``), and the
bodies of the reward functions defined in the file or imported from a module next to it
(:mod:`phantom.audit.reward_ast`). A ``reward_funcs`` built only when the script runs (from its
command line) is kept as :class:`~phantom.audit.model.Unresolved`, never guessed.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from phantom.audit.locate import locate
from phantom.audit.model import ConfigDoc, Entry, InputError, Unresolved
from phantom.audit.reward_ast import function_shape

__all__ = ["read_python"]

_TRL_CALL = re.compile(r"(GRPO|RLOO)\w*(Config|Trainer)$")  # GRPOConfig, AsyncGRPOTrainer, RLOOConfig, ...


_LAST: list = [None, []]  # the last text split into lines (kept referenced, so `is` identifies it)


def _segment(text: str, node: ast.AST) -> str | None:
    """``ast.get_source_segment`` without splitting the whole file again for every keyword (it did, per call)."""
    if _LAST[0] is not text:
        _LAST[0], _LAST[1] = text, text.splitlines(keepends=True)
    lines = _LAST[1]
    try:
        l0, l1 = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined, operator]
        c0, c1 = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return None
    if c1 is None or l1 >= len(lines):
        return None
    if l0 == l1:
        return lines[l0].encode()[c0:c1].decode(errors="replace")
    first = lines[l0].encode()[c0:].decode(errors="replace")
    last = lines[l1].encode()[:c1].decode(errors="replace")
    return first + "".join(lines[l0 + 1:l1]) + last


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _module_assigns(tree: ast.Module) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            out[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            out[stmt.target.id] = stmt.value
    return out


def _literal(node: ast.expr, assigns: dict[str, ast.expr], text: str) -> Any:
    target = assigns.get(node.id, node) if isinstance(node, ast.Name) else node
    try:
        return ast.literal_eval(target)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return Unresolved(_segment(text, node) or ast.unparse(node))


def _func_names(node: ast.expr, assigns: dict[str, ast.expr], doc: ConfigDoc | None = None,
                defined: frozenset[str] = frozenset()) -> list[str] | Unresolved:
    """Names of the reward functions in ``reward_funcs=...`` (a list, a tuple, or one function).

    ``outcome_gated(acc, fmt, num_generations=8)`` (``phantom.trl``'s gate) yields its arguments and
    marks the document ``outcome_gated``: shaping then counts only in groups with an outcome contrast.
    """
    if isinstance(node, ast.Name) and isinstance(assigns.get(node.id), (ast.List, ast.Tuple, ast.Call)):
        node = assigns[node.id]
    elif isinstance(node, ast.Name) and node.id not in defined and node.id not in assigns:  # built at run time
        return Unresolved(node.id, f"`{node.id}` is built when the script runs (not a list in the file)")
    if isinstance(node, ast.Call) and _call_name(node.func) == "outcome_gated":
        if doc is not None:
            doc.mentions.add("outcome_gated")
        node = ast.List(elts=list(node.args))
    elements = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    names = []
    for el in elements:
        if isinstance(el, ast.Call):
            el = el.func
        if isinstance(el, ast.Constant):
            names.append(str(el.value))
        else:
            names.append(ast.unparse(el))
    return names


def read_python(path: str, text: str) -> ConfigDoc:
    """TRL settings from ``GRPOConfig(...)`` and ``GRPOTrainer(reward_funcs=...)`` calls in a file."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise InputError(path, f"invalid Python: {exc.msg}", exc.lineno) from None
    assigns = _module_assigns(tree)
    defined = frozenset([n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                    ast.ClassDef))]
                        + [a.asname or a.name.split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                           for a in n.names])
    doc = ConfigDoc(path, "trl", "python")
    seen = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names = [a.name for a in node.names]
            for m in mods + names:
                if "grpo_with_replay_buffer" in m or "GRPOWithReplayBuffer" in m:
                    doc.mentions.add("grpo_with_replay_buffer")
                if "async_grpo" in m or m.startswith("AsyncGRPO"):
                    doc.mentions.add("async_grpo")
        if isinstance(node, ast.Call) and _call_name(node.func).startswith("AsyncGRPO"):
            doc.mentions.add("async_grpo")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "frac_reward_zero_std" in node.value:
            doc.mentions.add("frac_reward_zero_std")
        if not isinstance(node, ast.Call) or not _TRL_CALL.search(_call_name(node.func)):
            continue
        seen = True
        if _call_name(node.func).startswith("RLOO"):
            doc.mentions.add("rloo")
        is_trainer = _call_name(node.func).endswith("Trainer")
        for kw in node.keywords:
            if kw.arg is None:  # GRPOConfig(**settings): read a module-level dict literal
                value = _literal(kw.value, assigns, text)
                if isinstance(value, dict):
                    for k, v in value.items():
                        doc.set(Entry(str(k), v, path, kw.value.lineno))
                continue
            if is_trainer and kw.arg != "reward_funcs":
                continue
            value = _func_names(kw.value, assigns, doc, defined) if kw.arg == "reward_funcs" else \
                _literal(kw.value, assigns, text)
            doc.set(Entry(kw.arg, value, path, kw.lineno, _segment(text, kw)))
    if not seen:
        raise InputError(path, "no GRPOConfig/GRPOTrainer/RLOOConfig/RLOOTrainer(...) call found; a Python input is "
                               "read as TRL settings (pass a verl reward function with --reward-fn instead)")
    funcs = doc.get("reward_funcs")
    doc.bodies = _bodies(tree, path, funcs if isinstance(funcs, list) else [])
    return doc


def _bodies(tree: ast.Module, path: str, names: list[str]) -> dict[str, object]:
    """Shapes of the reward functions defined in the file, or in a module imported from next to it."""
    imported: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                imported[a.asname or a.name] = node.module
    out: dict[str, object] = {}
    for name in names:
        short = name.rsplit(".", 1)[-1]
        shape = function_shape(tree, short)
        if shape is None and short in imported:
            found = locate(imported[short].replace(".", "/") + ".py", path)
            if found is not None:
                try:
                    shape = function_shape(found.read_text(encoding="utf-8", errors="replace"), short)
                except OSError:
                    shape = None
        if shape is not None:
            out[short] = shape
    return out
