"""The shipped warm start: committing the book's checkpoint, recording its recipe, comparing rebuilds.

The book's warm start is committed under ``data/warmstart/`` (issue 45) because SFT is where machines
part ways: the same recipe, trained on a CPU whose torch picks other vector kernels, rounds differently
and ends at another checkpoint (0.609 against 0.562 held-out accuracy on the two kinds measured), and
every RL run from it differs. Shipping the weights gives every reader the same starting point and saves
them 4-15 minutes of training. ``phantom lab sft`` still rebuilds from scratch and says whether the
rebuild is bit-identical to the shipped copy.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from phantom.paths import shipped_warmstarts

__all__ = ["SFT_MINUTES", "shipped_sft", "announce_build", "WEIGHT_FILES", "checkpoint_hashes", "ship_warm_start", "compare_with_shipped", "shipped_manifest"]


def shipped_sft(cfg: Any) -> Path | None:
    """The committed copy of ``cfg``'s checkpoint under the checkout's ``data/warmstart/``, if any.

    The book's warm start is shipped (issue 45): a fresh clone starts RL from the very weights the book's
    runs started from, whatever its CPU (a rebuild on another kind of CPU rounds differently and lands on
    another checkpoint), and skips 4-15 minutes of SFT. Its folder name carries the config hash, so a
    change of recipe or code version simply stops matching it.
    """
    base = shipped_warmstarts()
    if base is None:
        return None
    path = base / f"sft-{cfg.profile}-{cfg.key()}"
    return path if (path / "lab_meta.json").is_file() and (path / "model.safetensors").is_file() else None


#: SFT wall time measured for the book's warm start (``lab_base`` to its stopping rule, about 900 steps,
#: then ``lab_graded``, 300): 2-core AVX-512 AMD EPYC ~4 min, 2-core AVX2-only AMD EPYC 14.5 min (issue 45)
SFT_MINUTES = (4, 15)


def _cost(cfg: Any) -> float:
    """Training work of a profile, in the units of :data:`SFT_MINUTES`' builds: steps x batch x hidden^2 x
    layers (a stopping rule is counted at half its step budget, where the base usually stops)."""
    steps = cfg.steps * (0.5 if cfg.target_acc else 1.0)
    return steps * cfg.batch * cfg.model.hidden ** 2 * cfg.model.layers


def announce_build(cfg: Any, final: Path, cached: Callable[[Any], Path], reference: Sequence[Any]) -> None:
    """Tell the user, before a build starts, what is trained (the profile and any parent not yet built),
    about how long it takes and where it is cached (``cached(cfg)``: a config's cache folder;
    ``reference``: the configs whose build :data:`SFT_MINUTES` measured)."""
    chain, parent = [cfg], cfg.parent()
    while parent is not None and not (shipped_sft(parent) or (cached(parent) / "lab_meta.json").is_file()):
        chain.insert(0, parent)
        parent = parent.parent()
    ref = sum(_cost(c) for c in reference)
    share = sum(_cost(c) for c in chain) / ref
    lo, hi = (round(m * share) for m in SFT_MINUTES)
    how_long = ("under a minute" if hi < 1 else f"up to about {hi} minute{'s' if hi > 1 else ''}" if lo < 1
                else f"about {lo}-{hi} minutes")
    print(f"phantom: building the warm start {cfg.profile!r} (SFT seed {cfg.seed}; "
          f"{' then '.join(c.profile for c in chain)}): it is not shipped with this checkout, so it is trained "
          f"here once, {how_long} on a 2-core CPU; cached in {final}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: the files of a checkpoint that determine what it computes (lab_meta.json holds timings, so it is
#: recorded but not compared)
WEIGHT_FILES = ("model.safetensors", "config.json", "tokenizer.json")


def checkpoint_hashes(path: str | Path) -> dict[str, str]:
    """sha256 of each file of a checkpoint folder, by name (what the shipped manifest records)."""
    p = Path(path)
    return {f.name: _sha256(f) for f in sorted(p.iterdir()) if f.is_file()}


def ship_warm_start(built: str | Path, dest: str | Path | None = None) -> Path:
    """Copy a built checkpoint into the checkout's ``data/warmstart/`` and record its recipe.

    ``data/warmstart/manifest.json`` gets one entry per shipped folder: the SFT config and its hash, the
    code version, torch's version and the CPU that built it, the held-out accuracies and every file's
    sha256, so a test can check that the committed files are the ones recorded and that the recipe is
    the one the code would run today.
    """
    from phantom.runs import machine, write_json_atomic

    src = Path(built)
    meta = json.loads((src / "lab_meta.json").read_text())
    base = Path(dest) if dest is not None else shipped_warmstarts()
    if base is None:
        raise ValueError("no checkout to ship into (phantom is installed from a wheel); pass dest")
    out = base / src.name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    manifest_path = base / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    cfg = meta["config"]
    manifest[src.name] = {
        "profile": cfg["profile"], "seed": cfg["seed"], "key": meta["key"], "code_version": meta["code_version"],
        "config": cfg, "init": meta.get("init"), "torch": torch.__version__, "machine": machine(),
        "params": meta["params"], "steps_trained": meta.get("steps_trained"),
        "val_greedy_acc": meta["val_greedy_acc"], "val_sampled_acc": meta["val_sampled_acc"],
        "val_greedy_len_chars": meta["val_greedy_len_chars"], "val_n": meta["val_n"],
        "sha256": checkpoint_hashes(out),
        "rebuild": f"phantom lab sft --profile {cfg['profile']} --seed {cfg['seed']}",
    }
    write_json_atomic(manifest_path, dict(sorted(manifest.items())))
    return out


def compare_with_shipped(built: str | Path) -> dict[str, Any] | None:
    """How a fresh build compares with the shipped copy of the same config (None: nothing shipped).

    ``identical`` is True when the weights, config and tokenizer hash the same: the CPU rounds as the
    one that built the shipped copy did. Another kind of CPU gives another checkpoint from the same
    recipe (see the lab notes), whose accuracies are reported beside the shipped ones.
    """
    p = Path(built)
    meta = json.loads((p / "lab_meta.json").read_text())
    entry = shipped_manifest().get(p.name)
    if entry is None:
        return None
    mine = checkpoint_hashes(p)
    return {"identical": all(mine.get(f) == entry["sha256"].get(f) for f in WEIGHT_FILES),
            "built_val_greedy_acc": meta["val_greedy_acc"], "shipped_val_greedy_acc": entry["val_greedy_acc"],
            "shipped_machine": entry["machine"]}



def shipped_manifest() -> dict[str, Any]:
    """``data/warmstart/manifest.json`` of this checkout, by folder name ({} when there is none)."""
    base = shipped_warmstarts()
    if base is None or not (base / "manifest.json").is_file():
        return {}
    return json.loads((base / "manifest.json").read_text())

