#!/usr/bin/env python3
"""Copy the finished runs of a verl or TRL sweep into a committed folder, keeping only the small files.

    python scripts/collect_runs.py SRC DST            # e.g. runs/verl_sweep data/runs/verl_filter
    python scripts/collect_runs.py SRC DST --dry-run  # say what would be copied

For every run folder under SRC whose ``manifest.json`` says ``"status": "done"`` (or ``"starved"``: a verl
run stopped by the refill bound), the small files are copied to ``DST/<run name>/``: for a verl run those in
``phantom.verl.sweep.KEEP`` (manifest, metrics, gate, rollout and sync logs), for a TRL run (``"kind":
"trl"``) ``manifest.json`` and ``metrics.jsonl``. ``stdout.log``, Hydra's folder and the executed notebook
stay behind. A run that is still running, or failed, is skipped and named.

Before copying, the run's warm start (a verl run's ``spec.model``, a TRL run's ``checkpoint``) is hashed file by file and
compared with the shipped warm start's ``sha256`` table in ``data/warmstart/manifest.json``; a run
whose model differs, or whose model folder is not on this machine, is refused (``--allow-unverified``
copies it anyway and says so). Exit code 0 when every finished run was copied, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from phantom.lab.warmstart import checkpoint_hashes  # noqa: E402
from phantom.verl.sweep import KEEP  # noqa: E402

#: what a TRL run folder keeps (its executed notebook and stdout.log stay behind)
TRL_KEEP = ("manifest.json", "metrics.jsonl")


def shipped_hashes(manifest: Path) -> dict[str, dict[str, str]]:
    """warm-start name -> {file: sha256} from data/warmstart/manifest.json."""
    return {name: entry["sha256"] for name, entry in json.loads(manifest.read_text()).items() if "sha256" in entry}


def check_model(model: str, shipped: dict[str, dict[str, str]]) -> tuple[bool, str]:
    """(matches, what was found): the model folder's files against the shipped warm start of the same name."""
    path = Path(model)
    want = shipped.get(path.name)
    if want is None:
        return False, f"{path.name} is not a shipped warm start (shipped: {', '.join(shipped) or 'none'})"
    if not path.is_dir():
        return False, f"{path} is not on this machine"
    have = checkpoint_hashes(path)  # the same hashing the shipped manifest was written with
    bad = [f for f, h in want.items() if have.get(f) != h]
    if bad:
        return False, f"{path}: {', '.join(bad)} differ from the shipped warm start"
    return True, f"{path.name}: all {len(want)} files match the shipped sha256"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the sweep's --runs-dir (its run folders)")
    ap.add_argument("dst", type=Path, help="the committed folder, e.g. data/runs/verl_filter")
    ap.add_argument("--warmstart", type=Path, default=ROOT / "data" / "warmstart" / "manifest.json",
                    help="the shipped warm start's manifest (default: data/warmstart/manifest.json)")
    ap.add_argument("--allow-unverified", action="store_true", help="copy a run whose warm start cannot be verified")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if not args.src.is_dir():
        ap.error(f"src={str(args.src)!r} is not a folder")
    shipped = shipped_hashes(args.warmstart)
    status = 0
    for run in sorted(p for p in args.src.iterdir() if (p / "manifest.json").is_file()):
        m = json.loads((run / "manifest.json").read_text())
        if m.get("status") not in ("done", "starved"):  # starved: stopped by the refill bound, an outcome
            print(f"skip  {run.name}: status {m.get('status')!r}")
            continue
        trl = m.get("kind") == "trl"
        model = m.get("checkpoint", "") if trl else m.get("spec", {}).get("model", "")
        ok, found = check_model(str(model), shipped)
        if not ok and not args.allow_unverified:
            print(f"REFUSE {run.name}: {found}")
            status = 1
            continue
        files = [f for f in (TRL_KEEP if trl else KEEP) if (run / f).is_file()]
        print(f"copy  {run.name}: {', '.join(files)} ({'verified' if ok else 'UNVERIFIED'}: {found})")
        if args.dry_run:
            continue
        out = args.dst / run.name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for f in files:
            shutil.copy2(run / f, out / f)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
