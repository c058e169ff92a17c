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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["REFERENCE", "probe_seconds", "cell_seconds", "estimate"]

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
