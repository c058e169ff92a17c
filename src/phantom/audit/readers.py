"""Turn a config file of any supported form into a :class:`~phantom.audit.model.ConfigDoc`.

Forms: verl YAML (a Hydra config, or the composed ``.hydra/config.yaml``), JSON, a Hydra override
list (``.hydra/overrides.yaml`` or a text file with one ``key=value`` per line), a bash launch
script, and TRL ``GRPOConfig`` settings as YAML, JSON or keyword arguments in a Python file. Python
is read with :mod:`ast` only: a training script is never imported or run.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import yaml

from phantom.audit.locate import locate
from phantom.audit.model import ConfigDoc, Entry, InputError, ReadInfo, Unresolved
from phantom.audit.overrides import looks_like_overrides, read_override_lines
from phantom.audit.reward_ast import function_shape
from phantom.audit.shell import read_shell, script_dir_loader
from phantom.audit.text import read_text
from phantom.audit.trainers import NEMO_GRPO_MATH_BASE

__all__ = ["KINDS", "LAB_KEYS", "VERL_TOP_KEYS", "TRL_KEYS", "read_config", "read_configs", "read_python"]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when available (10x faster)

KINDS: tuple[str, ...] = ("verl", "trl", "lab", "easyr1", "nemo")
#: Keys of a phantom lab arm spec (``phantom.lab.spec.ArmSpec``).
LAB_KEYS = frozenset({"arm", "estimator", "sampling", "drop", "rollouts", "max_gen_batches", "gen_prompts"})
#: Top-level keys of a verl (Hydra) config, including the legacy ones 0.9.x still accepts.
VERL_TOP_KEYS = frozenset({"algorithm", "actor_rollout_ref", "data", "reward", "reward_model", "trainer", "critic",
                           "custom_reward_function", "ray_kwargs", "hydra", "transfer_queue", "sandbox_fusion"})
#: Keys that only a TRL GRPOConfig (or TRL's ``grpo`` script arguments) has.
TRL_KEYS = frozenset({"reward_funcs", "reward_weights", "scale_rewards", "loss_type", "num_generations",
                      "multi_objective_aggregation", "mask_truncated_completions", "max_completion_length",
                      "epsilon_high", "importance_sampling_level", "use_vllm", "reward_model_name_or_path",
                      "beta", "num_iterations", "generation_batch_size"})
_TRL_CALL = re.compile(r"(GRPO|RLOO)\w*(Config|Trainer)$")  # GRPOConfig, AsyncGRPOTrainer, RLOOConfig, ...
#: top-level sections only EasyR1's PPOConfig (``worker``) or NeMo-RL's master config (``grpo`` + ``policy``) has
_EASYR1_TOP = frozenset({"worker"})
_NEMO_TOP = frozenset({"policy", "env", "loss_fn", "cluster", "checkpointing"})


def read_config(path: str, *, kind: str | None = None) -> ConfigDoc:
    """Read one input (a launch script with several trainer commands: the first of them)."""
    return read_configs(path, kind=kind)[0]


def read_configs(path: str, *, kind: str | None = None) -> list[ConfigDoc]:
    """Read one input: one document per trainer command of a launch script, else one.

    ``kind`` (``verl``/``trl``/``lab``) overrides detection for YAML and JSON. Every document's
    ``read`` says what was read; text cleaning (BOM, CRLF, colour codes, NUL) is noted there too.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {', '.join(KINDS)}")
    text, notes = read_text(path)
    docs = _read(path, text, kind)
    cleaned = notes.describe()
    for d in docs:
        d.read.cleaned = cleaned
        d.read.crlf_shell = bool(notes.crlf_lines) and d.form == "shell"
    return docs


def _read(path: str, text: str, kind: str | None) -> list[ConfigDoc]:
    suffix = Path(path).suffix.lower()
    first = text.lstrip().splitlines()[0]
    if suffix in (".sh", ".bash", ".slurm", ".sbatch") or (first.startswith("#!") and "sh" in first.split("/")[-1]):
        return read_shell(path, text, script_dir_loader(path, lambda p, k: read_config(p, kind=k)))
    if suffix == ".py":
        return [_counted(read_python(path, text), "Python (GRPOConfig/GRPOTrainer keyword arguments)")]
    if Path(path).is_dir():
        path, suffix = str(Path(path) / "manifest.json"), ".json"
    if suffix == ".json":
        manifest = _manifest(path, text)
        if manifest is not None:
            return [_counted(manifest, "run manifest")]
        return [_from_mapping(path, _read_json(path, text), "json", kind)]
    body = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if suffix not in (".yaml", ".yml") and (suffix in (".txt", ".overrides", ".args", "")
                                           or looks_like_overrides(body[:1])):
        return [_counted(read_override_lines(path, list(enumerate(text.splitlines(), start=1))), "override list")]
    form, items = _read_yaml(path, text)
    if form == "overrides":
        return [_counted(read_override_lines(path, items), "YAML override list")]
    return [_from_mapping(path, items, "yaml", kind)]


def _counted(doc: ConfigDoc, what: str) -> ConfigDoc:
    n = len(doc.entries)
    unresolved = [k for k, e in doc.entries.items() if isinstance(e.value, Unresolved)]
    doc.read = ReadInfo(what, overrides=n, unresolved=unresolved)
    return doc


# ------------------------------------------------------------------------------------------------
# YAML and JSON, with line numbers
# ------------------------------------------------------------------------------------------------
def _yaml_error(path: str, exc: yaml.YAMLError) -> InputError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return InputError(path, f"invalid YAML: {problem}", mark.line + 1 if mark else None)


def _read_yaml(path: str, text: str) -> tuple[str, list[Any]]:
    """``("mapping", entries)`` for a YAML mapping, ``("overrides", [(line, word)])`` for a list."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InputError(path, "the file holds no YAML document")
        if isinstance(node, yaml.SequenceNode):
            items = []
            for item in node.value:
                value = loader.construct_object(item, deep=True)
                if not isinstance(value, str):
                    raise InputError(path, f"a YAML list must hold override strings, got {value!r}",
                                     item.start_mark.line + 1)
                items.append((item.start_mark.line + 1, value))
            return "overrides", items
        if not isinstance(node, yaml.MappingNode):
            raise InputError(path, "expected a YAML mapping (a config) or a list (Hydra overrides)",
                             node.start_mark.line + 1)
        out: list[Entry] = []
        _walk(loader, node, "", path, out)
        return "mapping", out
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    except RecursionError:
        raise InputError(path, "the YAML nests too deeply to read") from None
    finally:
        loader.dispose()


def _walk(loader: Any, node: yaml.MappingNode, prefix: str, path: str, out: list[Entry], depth: int = 0) -> None:
    if depth > 64:
        raise InputError(path, "the YAML nests more than 64 levels deep", node.start_mark.line + 1)
    loader.flatten_mapping(node)  # YAML merge keys (`<<: *base`): the merged keys, at the anchor's lines
    for knode, vnode in node.value:
        key = str(loader.construct_object(knode))
        full = prefix + key
        if isinstance(vnode, yaml.MappingNode) and vnode.value:
            _walk(loader, vnode, full + ".", path, out, depth + 1)
        else:
            out.append(Entry(full, loader.construct_object(vnode, deep=True), path, knode.start_mark.line + 1))


def _read_json(path: str, text: str) -> list[Entry]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", exc.lineno) from None
    if not isinstance(obj, dict):
        raise InputError(path, f"expected a JSON object, got {type(obj).__name__}")
    try:  # JSON is (nearly) YAML: reuse the YAML walker for line numbers
        form, items = _read_yaml(path, text)
        if form == "mapping":
            return items
    except InputError:
        pass
    out: list[Entry] = []

    def flat(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and v:
                flat(v, f"{prefix}{k}.")
            else:
                out.append(Entry(f"{prefix}{k}", v, path, None))

    flat(obj, "")
    return out


def _detect_kind(path: str, entries: list[Entry], kind: str | None) -> str:
    if kind is not None:
        return kind
    top = {e.key.split(".")[0] for e in entries}
    if "arm" in top and len(top & LAB_KEYS) >= 2:
        return "lab"
    if top & _EASYR1_TOP and top & {"algorithm", "data", "trainer"}:
        return "easyr1"
    nemo_base = next((e.value for e in entries if e.key == "defaults" and isinstance(e.value, str)
                      and e.value.endswith((".yaml", ".yml"))), None)
    if ("grpo" in top and (top & _NEMO_TOP or nemo_base)) or (nemo_base and top & _NEMO_TOP and "grpo" in nemo_base):
        return "nemo"  # NeMo-RL: a GRPO master config, or an overlay on a GRPO base
    verl, trl = top & VERL_TOP_KEYS, top & TRL_KEYS
    if verl and not (trl and len(trl) > len(verl)):
        return "verl"
    if trl:
        return "trl"
    raise InputError(path, f"not a verl or TRL config: none of its top-level keys ({', '.join(sorted(top)[:8])}) "
                           f"is a verl section ({', '.join(sorted(VERL_TOP_KEYS))}) or a TRL GRPOConfig field "
                           f"({', '.join(sorted(TRL_KEYS))}), nor EasyR1's `worker` or NeMo-RL's `grpo`; pass --kind "
                           f"{'|'.join(KINDS)}")


def _from_mapping(path: str, entries: list[Entry], form: str, kind: str | None, depth: int = 0) -> ConfigDoc:
    doc = ConfigDoc(path, _detect_kind(path, entries, kind), form)
    notes = []
    if doc.kind == "nemo":  # NeMo-RL: `defaults: base.yaml` (relative to this file) is loaded underneath
        base = next((e.value for e in entries if e.key == "defaults"), None)
        for name in ([base] if isinstance(base, str) else base if isinstance(base, list) else []):
            found = locate(str(name), path) if depth < 5 else None
            if found is None and re.search(r"(^|/)grpo_math_\w+\.ya?ml$", str(name)):
                notes.append(f"its defaults file {name} was not found here: read as NeMo-RL's shipped GRPO math base "
                             "(math environment, normalize_rewards, no reward shaping, no dynamic sampling)")
                for k, v in NEMO_GRPO_MATH_BASE.items():
                    doc.set(Entry(k, v, path, None, f"defaults: {name}"))
                continue
            if found is None or not str(name).endswith((".yaml", ".yml")):
                notes.append(f"its defaults file {name} was not found: NeMo-RL's defaults are assumed for what it sets")
                continue
            try:
                under = _from_mapping(str(found), _read_yaml(str(found), read_text(str(found))[0])[1], "yaml", "nemo",
                                      depth + 1)
            except InputError as exc:
                notes.append(f"its defaults file {name} could not be read ({exc.message})")
                continue
            notes.append(f"read its defaults file {name} underneath")
            for e in under.entries.values():
                doc.set(e)
    for e in entries:
        doc.set(e)
    doc = _counted(doc, f"{form.upper()} mapping")
    doc.read.notes += notes
    return doc


def _manifest(path: str, text: str) -> ConfigDoc | None:
    """A phantom run's ``manifest.json``: the lab spec, or the overrides a verl run was launched with."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None  # _read_json reports the error with its line
    if not isinstance(obj, dict) or obj.get("kind") not in ("lab", "verl", "trl") or "spec" not in obj:
        return None
    if obj["kind"] == "trl":  # phantom.trl's run folder: the GRPOConfig it ran with and its reward functions
        config, funcs = obj.get("trl_config"), obj.get("reward_funcs")
        if not isinstance(config, dict) or not isinstance(funcs, list):
            raise InputError(path, "a TRL run manifest needs `trl_config` (an object) and `reward_funcs` (a list)",
                             key="trl_config")
        doc = ConfigDoc(path, "trl", "manifest")
        for k, v in config.items():
            doc.set(Entry(str(k), v, path, None))
        doc.set(Entry("reward_funcs", [str(f) for f in funcs], path, None))
        if obj.get("gate") == "outcome":
            doc.mentions.add("outcome_gated")
        return doc
    if obj["kind"] == "verl":
        overrides = obj.get("overrides")
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise InputError(path, "a verl run manifest needs `overrides`: a list of strings", key="overrides")
        doc = read_override_lines(path, [(None, o) for o in overrides])
        command = " ".join(map(str, obj.get("command") or []))
        doc.entrypoint = "recipe" if "recipe." in command else "main_ppo" if "main_ppo" in command else None
        doc.form = "manifest"
        return doc
    if not isinstance(obj["spec"], dict):
        raise InputError(path, "a lab run manifest needs `spec`: an object", key="spec")
    doc = ConfigDoc(path, "lab", "manifest")
    for k, v in obj["spec"].items():
        doc.set(Entry(str(k), v, path, None))
    return doc


# ------------------------------------------------------------------------------------------------
# TRL in Python, parsed (never run)
# ------------------------------------------------------------------------------------------------
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
