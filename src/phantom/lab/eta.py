"""How long a sweep will take on this machine, said before it starts.

A lab cell's wall time is set by the CPU: the same 40-step arm takes 30 s on one machine and 80 s on a
slower one (benchmarks/results_lab.md). A newcomer's ``make book`` should say up front which it is. The
estimate scales the committed runs' own wall times (their manifests record them, measured on the machine
named in ``REFERENCE``) by the ratio of a short probe timed here to the same probe timed there. The probe
is the lab's own work in miniature - forward and backward passes of the lab model on a batch shaped like a
training batch, on one thread - so it tracks what a cell spends its time on (small matmuls, attention,
elementwise kernels) better than a peak-FLOP number would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["REFERENCE", "PAGES_SECONDS", "probe_seconds", "cell_seconds", "estimate", "build_message"]

#: The probe's time on the machine that made the committed runs (data/runs/lab_paper, one thread, best of
#: four; measured with ``python -c "from phantom.lab.eta import probe_seconds; print(probe_seconds())"``).
REFERENCE: dict[str, Any] = {"probe_s": 0.31, "machine": "2-core AMD EPYC, AVX-512 kernels (torch 2.13.0 CPU)"}


def probe_seconds(repeats: int = 4) -> float:
    """Best-of-``repeats`` seconds for one forward+backward pass of the lab model (the book warm start's
    shape) on 32 sequences of 200 tokens, one torch thread (about a second in all)."""
    import torch

    from phantom.lab.model import LabQwen2
    from phantom.lab.sft import PROFILES

    cfg = PROFILES["lab_graded"].model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        model = LabQwen2(cfg, 1024)
        ids = torch.randint(0, 1024, (32, 200), generator=gen)
        pos = torch.arange(200).expand(32, 200)
        valid = torch.ones(32, 200, dtype=torch.bool)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            model.hidden_states(ids, pos, valid).square().mean().backward()
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        torch.set_num_threads(threads)


def cell_seconds(committed: str | Path, names: Iterable[str]) -> dict[str, float]:
    """Wall seconds of each named cell in a committed sweep folder (cells without a copy are left out)."""
    out = {}
    for name in names:
        m = Path(committed) / name / "manifest.json"
        if m.is_file():
            wall = json.loads(m.read_text()).get("wall_seconds")
            if isinstance(wall, (int, float)) and wall > 0:
                out[name] = float(wall)
    return out


def estimate(committed: str | Path, names: Iterable[str], jobs: int, probe: float | None = None) -> dict[str, Any]:
    """Seconds the cells ``names`` should take here with ``jobs`` at a time: their committed wall times
    scaled by this machine's probe against the reference's, packed longest first onto ``jobs`` workers.

    Returns ``{"seconds", "ratio", "cells", "known"}``; ``seconds`` is None when no cell has a committed
    time or the reference probe is unset.
    """
    names = list(names)
    walls = cell_seconds(committed, names)
    ref = float(REFERENCE.get("probe_s") or 0.0)
    if not walls or ref <= 0:
        return {"seconds": None, "ratio": None, "cells": len(names), "known": len(walls)}
    ratio = (probe if probe is not None else probe_seconds()) / ref
    mean = sum(walls.values()) / len(walls)
    loads = [0.0] * max(1, jobs)
    for w in sorted((walls.get(n, mean) for n in names), reverse=True):
        loads[loads.index(min(loads))] += w * ratio
    return {"seconds": max(loads), "ratio": ratio, "cells": len(names), "known": len(walls)}
#: chapter execution and the strict Jupyter Book build of the full profile on the reference machine of
#: :data:`phantom.lab.eta.REFERENCE` (seconds; `make book`, benchmarks/results_book.md)
PAGES_SECONDS = 75.0


def build_message(needs: Mapping[str, list[str]], profile: str, jobs: int, root: Path, n_chapters: int) -> str:
    """Say up front how long the build should take here: the lab cells' committed wall times and the
    pages' time, scaled by a one-second probe of this machine (:func:`phantom.lab.eta.estimate`)."""
    from phantom.lab.sweep import expand, load_sweep, sweep_file
    from phantom.runs import runs_root

    probe = probe_seconds()
    lab = 0.0
    cells = 0
    for name in needs:
        todo = [c.name for c in expand(load_sweep(sweep_file(name, root)), profile)
                if not (runs_root() / c.name / "manifest.json").is_file()]
        est = estimate(root / "data" / "runs" / "lab_paper", todo, jobs, probe=probe)
        if est["seconds"] is None and todo:
            return f"no time estimate for {len(todo)} lab cells of {name!r} (profile {profile})"
        lab += est["seconds"] or 0.0
        cells += len(todo)
    ratio = probe / REFERENCE["probe_s"]
    pages = PAGES_SECONDS * ratio if profile == "full" else PAGES_SECONDS
    return (f"estimated time here: {(lab + pages) / 60:.1f} min ({cells} lab cells, {jobs} at a time: "
        f"{lab / 60:.1f} min; {n_chapters} chapters and the HTML: {pages / 60:.1f} min). This machine runs the "
        f"lab's probe in {probe:.2f} s, {ratio:.2f}x the {REFERENCE['probe_s']:.2f} s of the machine that made "
        "the committed runs")
