"""A run's inputs: the model (local folder, Hub id, or built by the project) and the parquet files.

:func:`resolve_files` and :func:`resolve_model` turn what a spec names into absolute paths; with
``check=False`` they do so without requiring anything to exist yet, so ``phantom verl overrides``
can print a complete command before a single file is downloaded or built. :func:`inputs_status`
then says, per input, whether it is present and how to get it when it is not.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from phantom.paths import artifacts_base

__all__ = ["TINY_MODEL", "HUB_ID", "artifacts", "tiny_root", "resolve_files", "built_model", "resolve_model", "inputs_status"]

#: ``model: tiny`` on the CPU backend means the project's random Qwen2 (built locally on first use).
TINY_MODEL = "tiny"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DATA_HINT = {"gsm8k": "phantom data gsm8k", "math": "phantom data math", "lab": "phantom data lab"}


def artifacts(base: str | os.PathLike[str] | None = None) -> Path:
    """The artifacts cache (:func:`phantom.paths.artifacts_base`); a relative ``$PHANTOM_ARTIFACTS`` is
    taken relative to ``base`` (the launcher's folder), as the launcher always did."""
    env = os.environ.get("PHANTOM_ARTIFACTS", "").strip()
    return artifacts_base(Path(base or os.getcwd()) / env if env else None)


def tiny_root(base: str | os.PathLike[str] | None = None) -> Path:
    """Where the tiny CPU model and its data are built: ``verl_cpu/tiny`` under :func:`artifacts`."""
    return artifacts(base) / "verl_cpu" / "tiny"


def resolve_files(name: str, value: Any, base: Path, check: bool = True) -> tuple[str, ...]:
    """Absolute paths of ``train_files`` / ``val_files`` (remote ``scheme://`` paths are kept as given)."""
    items = [value] if isinstance(value, (str, os.PathLike)) else list(value or [])
    if not items:
        raise ValueError(f"{name} is empty; give at least one parquet file")
    out = []
    for item in items:
        s = str(item)
        if "://" in s:  # hdfs://, s3://: verl copies them itself
            out.append(s)
            continue
        p = (base / s).resolve()
        if check and not p.is_file():
            raise FileNotFoundError(f"{name}: {p} does not exist ({_data_hint(p)})")
        out.append(str(p))
    return tuple(out)


def _data_hint(path: Path) -> str:
    cmd = next((c for k, c in _DATA_HINT.items() if k in path.parts), None)
    return f"build it with `{cmd}`" if cmd else "build data with `phantom data ...`"


def built_model(value: str, root: Path, build: bool = True) -> tuple[str, str, str] | None:
    """(model, train, test) for the project's locally built models, else None.

    ``tiny``: a random Qwen2 with addition data (:mod:`phantom.verl.cpu.assets`). ``lab`` or
    ``lab:<profile>``: the CPU lab's SFT checkpoint (``phantom.lab.sft.ensure_sft_model``, trained on
    first use) and its task in verl form (``phantom.verl.data.build_lab``). ``build=False`` gives the
    paths they will have without building anything.
    """
    if value == TINY_MODEL:
        tiny = tiny_root(root)
        if build:
            from phantom.verl.cpu.assets import ensure_tiny

            ensure_tiny(tiny)
        return str(tiny / "model"), str(tiny / "data" / "train.parquet"), str(tiny / "data" / "test.parquet")
    if value == "lab" or value.startswith("lab:"):
        from phantom.lab.sft import ensure_sft_model, locate_sft

        profile = value.partition(":")[2] or "lab"
        cache = artifacts(root)
        # the shipped warm start when the checkout has it (data/warmstart/), else the cached build
        model = ensure_sft_model(profile, root=cache) if build else locate_sft(profile, cache)
        data = cache / "data" / f"lab-{Path(model).name}"  # keyed by the checkpoint, so by its task
        if build and not (data / "test.parquet").is_file():
            from phantom.verl.data import build_lab

            build_lab(data, profile=profile)
        return str(model), str(data / "train.parquet"), str(data / "test.parquet")
    return None


def resolve_model(value: str, backend: str, base: Path, check: bool = True) -> str:
    """A local model folder (absolute) or, for backend=gpu, a Hugging Face Hub id as given."""
    p = (base / value).expanduser().resolve()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model: {p} has no config.json (not a Hugging Face model folder)")
        return str(p)
    if backend == "gpu" and HUB_ID.match(value) and not value.startswith((".", "/", "~")):
        return value  # a Hub id: verl downloads it on the GPU machine
    if not check:
        return str(p)
    raise FileNotFoundError(f"model: {p} does not exist" + ("" if backend == "gpu" else " (backend=cpu needs a local model)"))


def _hub_cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # huggingface_hub missing or a malformed id: treat as not cached
        return False


def inputs_status(spec: Any, root: str | os.PathLike[str] | None = None) -> list[dict[str, str]]:
    """One entry per input: ``{"input", "path", "state": ok|missing|hub|cached, "fix"}``."""
    base = Path(root or os.getcwd())
    cache = artifacts(base)
    built = {str(tiny_root(base)): "built on first run (`phantom verl run`, seconds)",
             str(cache / "lab") + "/": "built on first run (the lab's SFT checkpoint: minutes)",
             str(cache / "data" / "lab-"): "built on first run (the lab's task in verl form)"}
    out = []
    model = str(spec.model)
    if Path(model).is_dir():
        out.append({"input": "model", "path": model, "state": "ok", "fix": ""})
    elif HUB_ID.match(model) and not model.startswith("/"):
        cached = _hub_cached(model)
        out.append({"input": "model", "path": model, "state": "cached" if cached else "hub",
                    "fix": "" if cached else f"downloaded by verl at start (or first: `huggingface-cli download {model}`)"})
    else:
        hint = next((h for k, h in built.items() if model.startswith(k)), "give a model folder or a Hub id")
        out.append({"input": "model", "path": model, "state": "missing", "fix": hint})
    for kind in ("train_files", "val_files"):
        for f in getattr(spec, kind):
            if "://" in f or Path(f).is_file():
                out.append({"input": kind, "path": f, "state": "ok", "fix": ""})
            else:
                hint = next((h for k, h in built.items() if f.startswith(k)), _data_hint(Path(f)))
                out.append({"input": kind, "path": f, "state": "missing", "fix": hint})
    return out
