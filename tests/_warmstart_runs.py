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


def meets(cells: dict[tuple[str, int], list[dict]], sft: int) -> bool:
    """Every criterion of issue 13 on one warm start of a four-arm sweep, read here from the run logs alone
    (not with phantom.lab.acceptance, which the chapter uses), so the two readings check each other."""
    unsafe = [cells[a, sft] for a in ("none", "score")]
    o, d = cells["outcome", sft], cells["drgrpo", sft]
    return (all(x["acc_end"] <= 0.10 for u in unsafe for x in u)
            and all([x["order"] for x in u].count("length first") >= 2 for u in unsafe)
            and sum(x["acc_end"] - x["acc0"] for x in o) / len(o) >= 0.03
            and all(x["acc_end"] >= x["acc0"] - 0.05 for x in o) and all(x["acc_end"] > 0.10 for x in d))


def readme_table(cells: dict[tuple[str, int], list[dict]], readme: Path) -> list[tuple[list[str], list[str]]]:
    """(README row, the same row recomputed from the run logs) for each warm start of a four-arm sweep's
    README table: SFT seed, start acc, start length, highest no-filter end, length first (no filter / score),
    outcome mean gain (worst run), lowest Dr. GRPO end, all criteria. Bold marks and "(why)" notes are dropped."""
    out = []
    for line in readme.read_text().splitlines():
        if not (line.startswith("| ") and line[2].isdigit()):
            continue
        row = [c.strip().replace("*", "").replace("−", "-").split(" (collapse")[0].split(" (outcome")[0]
               for c in line.strip("|").split("|")]
        sft = int(row[0])
        n, s, o, d = (cells[a, sft] for a in ("none", "score", "outcome", "drgrpo"))
        gains = [x["acc_end"] - x["acc0"] for x in o]
        lf = [[x["order"] for x in u].count("length first") for u in (n, s)]
        out.append((row, [str(sft), f"{n[0]['acc0']:.3f}", f"{n[0]['len0']:.0f}", f"{max(x['acc_end'] for x in n):.3f}",
                          f"{lf[0]} / {lf[1]}", f"{sum(gains) / len(gains):+.3f} ({min(gains):+.3f})",
                          f"{min(x['acc_end'] for x in d):.3f}", "yes" if meets(cells, sft) else "no"]))
    return out
