"""Turn a config file of any supported form into a :class:`~phantom.audit.model.ConfigDoc`.

Forms: verl YAML (a Hydra config, or the composed ``.hydra/config.yaml``), EasyR1 and NeMo-RL YAML
(NeMo-RL's ``defaults:`` base read underneath), JSON, a Hydra override list
(``.hydra/overrides.yaml`` or a text file with one ``key=value`` per line), a bash launch script
(:mod:`phantom.audit.shell`), TRL ``GRPOConfig`` settings as YAML or JSON, and TRL keyword
arguments in a Python file (:mod:`phantom.audit.trl_python`, read with :mod:`ast` only: a training
script is never imported or run).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from phantom.audit.locate import locate
from phantom.audit.model import ConfigDoc, Entry, InputError, ReadInfo, Unresolved
from phantom.audit.overrides import looks_like_overrides, read_override_lines
from phantom.audit.shell import read_shell, script_dir_loader
from phantom.audit.text import read_text
from phantom.audit.trainers import NEMO_GRPO_MATH_BASE
from phantom.audit.trl_python import read_python

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
