"""Reading a sweep file: YAML that parses, the shape of a sweep, and every cell a valid arm.

A sweep file is hand-written, and a mistake in it used to surface as a parser traceback, an
``AttributeError`` (a top level that is a list) or a ``TypeError`` (a group that is a list), or not at
all (a misspelt key was ignored). :func:`read_sweep` checks it before anything runs and names the
file, the line and the problem: the YAML itself, a key given twice, each level's allowed keys and
types, profile names, and finally every cell of every profile through the caller's ``cells`` function
(:func:`phantom.lab.sweep.expand`, which builds each :class:`~phantom.lab.spec.ArmSpec`), its errors
placed at their group's line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import yaml

__all__ = ["SweepError", "read_sweep", "TOP_KEYS", "PROFILE_KEYS", "GROUP_KEYS"]

TOP_KEYS: tuple[str, ...] = ("name", "about", "base", "profiles", "groups")
PROFILE_KEYS: tuple[str, ...] = ("base", "seeds", "groups", "set")
GROUP_KEYS: tuple[str, ...] = ("set", "grid", "section", "about")


class SweepError(ValueError):
    """A sweep that cannot run; ``group`` names the group a cell error came from (for its line)."""

    def __init__(self, message: str, *, group: str | None = None) -> None:
        super().__init__(message)
        self.group = group


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "empty" if node.tag.endswith(":null") else f"the value {node.value!r}"


class _Checker:
    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, node: yaml.Node, problem: str) -> SweepError:
        return SweepError(f"{self.label}:{_line(node)}: {problem}")

    def mapping(self, node: yaml.Node | None, what: str, keys: Sequence[str] | None = None,
                null_ok: bool = True) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The entries of a mapping node by key (checked: a mapping, string keys, no key twice, allowed keys)."""
        if node is None or (null_ok and isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
            return {}
        if not isinstance(node, yaml.MappingNode):
            shape = f"a mapping of {', '.join(keys)}" if keys else "a mapping"
            raise self.fail(node, f"{what} is {_kind(node)}; allowed: {shape}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode) or k.tag.endswith((":null", ":seq", ":map")):
                raise self.fail(k, f"{what} has a key that is {_kind(k)}; allowed: names")
            if k.value in out:
                raise self.fail(k, f"{what} gives {k.value!r} twice (lines {_line(out[k.value][0])} and {_line(k)}); "
                                   "allowed: once")
            if keys is not None and k.value not in keys:
                raise self.fail(k, f"{what} has the unknown key {k.value!r}; allowed: {', '.join(keys)}")
            out[k.value] = (k, v)
        return out

    def nested_twice(self, node: yaml.Node) -> None:
        """A key given twice anywhere (YAML keeps the last one silently)."""
        if isinstance(node, yaml.MappingNode):
            self.mapping(node, "a mapping")
            for _, v in node.value:
                self.nested_twice(v)
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                self.nested_twice(v)


def _parse(text: str, label: str) -> tuple[yaml.Node | None, Any]:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(p) for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p)
        raise SweepError(f"{label}{where}: not valid YAML: {problem or str(e).splitlines()[0]}") from None


def read_sweep(path: Any, *, label: str | None = None, profiles: Sequence[str] = ("full", "quick"),
               cells: Callable[[dict[str, Any], str], Any] | None = None) -> dict[str, Any]:
    """The sweep in ``path`` (a ``Path`` or a package resource), checked; raises :class:`SweepError`.

    ``cells(sweep, profile)`` builds every cell of a profile (raising ``ValueError`` on a bad one); each
    of ``profiles`` is expanded once, so a cell that only the quick profile makes is checked too.
    """
    label = label or str(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise SweepError(f"{label}: not a text file; allowed: a YAML sweep file") from None
    root, data = _parse(text, label)
    c = _Checker(label)
    if root is None:
        raise SweepError(f"{label}: the file is empty; allowed: a mapping with groups (and base, profiles, name, "
                         "about)")
    top = c.mapping(root, "the top level", TOP_KEYS, null_ok=False)
    if "groups" not in top:
        raise c.fail(root, "the sweep has no groups; allowed: groups: a mapping of group name -> set/grid")
    groups = c.mapping(top["groups"][1], "groups", null_ok=False)
    if not groups:
        raise c.fail(top["groups"][1], "groups is empty; allowed: at least one group (name -> set/grid)")
    if "base" in top:
        c.mapping(top["base"][1], "base (spec fields every cell starts from)")
    for gname, (_, gnode) in groups.items():
        g = c.mapping(gnode, f"group {gname!r}", GROUP_KEYS)
        if "set" in g:
            c.mapping(g["set"][1], f"group {gname!r}: set (fixed spec fields)")
        grid = c.mapping(g["grid"][1], f"group {gname!r}: grid (spec field -> list of values)") if "grid" in g else {}
        if "variant" in grid and isinstance(grid["variant"][1], yaml.SequenceNode):
            for v in grid["variant"][1].value:
                c.mapping(v, f"group {gname!r}: each variant", null_ok=False)
    for pname, (pkey, pnode) in c.mapping(top["profiles"][1], "profiles").items() if "profiles" in top else ():
        if pname not in profiles:
            raise c.fail(pkey, f"profile {pname!r} is unknown; allowed: {', '.join(profiles)}")
        p = c.mapping(pnode, f"profile {pname!r}", PROFILE_KEYS)
        if "base" in p:
            c.mapping(p["base"][1], f"profile {pname!r}: base")
        if "seeds" in p:
            seeds = data["profiles"][pname]["seeds"]
            if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool)
                                                              and s >= 0 for s in seeds)):
                raise c.fail(p["seeds"][1], f"profile {pname!r}: seeds is {seeds!r}; allowed: a list of integers >= 0")
        if "groups" in p:
            named = data["profiles"][pname]["groups"]
            if not isinstance(named, list) or not all(isinstance(n, str) for n in named):
                raise c.fail(p["groups"][1], f"profile {pname!r}: groups is {named!r}; allowed: a list of group names")
            unknown = [n for n in named if n not in groups]
            if unknown:
                raise c.fail(p["groups"][1], f"profile {pname!r}: group(s) {unknown} are not in the sweep; allowed: "
                                             f"{', '.join(groups)}")
        for gname, (gkey, gnode) in c.mapping(p["set"][1], f"profile {pname!r}: set").items() if "set" in p else ():
            if gname not in groups:
                raise c.fail(gkey, f"profile {pname!r}: set names the group {gname!r}, which is not in the sweep; "
                                   f"allowed: {', '.join(groups)}")
            c.mapping(gnode, f"profile {pname!r}: set: {gname}")
    c.nested_twice(root)
    if cells is not None:
        for profile in profiles:
            try:
                cells(data, profile)
            except SweepError as e:
                if e.group in groups:
                    raise SweepError(f"{label}:{_line(groups[e.group][0])}: {e}", group=e.group) from None
                raise SweepError(f"{label}: {e}") from None
            except ValueError as e:
                raise SweepError(f"{label}: profile {profile!r}: {e}") from None
    return data
