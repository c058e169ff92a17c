"""Shared by the tests of the committed multi-warm-start sweeps: one reader of their run folders."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from phantom.dynamics import dynamics
from phantom.runs import iter_runs, read_metrics


def arm(spec: dict) -> str:
    """The arm a run is judged as: Dr. GRPO's no-filter arm is its own."""
    return "drgrpo" if spec.get("estimator") == "drgrpo" else spec["arm"]


def cell(spec: dict) -> tuple:
    """What makes two runs train alike: the spec but for its length and how often it validates."""
    spec = {**spec, "sft_seed": spec.get("sft_seed") or 0}
    return tuple(sorted((k, str(v)) for k, v in spec.items() if k not in ("steps", "profile", "eval_every")))


def runs_by_arm(root: Path) -> dict[tuple[str, int], list[dict]]:
    """(arm, SFT seed) -> its runs sorted by RL seed: seed, spec, metrics frame and dynamics row."""
    out: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for run in iter_runs(root):
        spec = run.manifest()["spec"]
        df = read_metrics(run.path)
        out[arm(spec), spec.get("sft_seed") or 0].append({"seed": spec["seed"], "spec": spec, "df": df,
                                                          **dynamics(df)})
    for runs in out.values():
        runs.sort(key=lambda r: r["seed"])
    return out
