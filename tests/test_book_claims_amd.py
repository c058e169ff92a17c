"""The lab chapters' claims on another kind of CPU (data/runs/lab_paper_amd): each chapter that reads the
paper sweep is executed on each committed copy of it, and the claims that fail there must be the ones its
README lists.

A fresh clone on a machine whose torch picks other kernels trains another warm start and runs every cell
from it (the build of `make book` on an AMD EPYC did: warm start 0.613, not 0.570, and seven claims
written against one machine's trajectories failed). A claim that only one trajectory supports is a claim
about that machine; this test is where such a claim shows before a reader's build does. These copies ran
the lab's first main setting (worked answers at lr 2.5e-3, `FIRST_SETTING`); the book's claims are written
for the graded main setting that replaced it on 2026-12-06, so the one claim that setting changed the
answer of (GSPO's outcome arm holds) fails on them, and is listed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from _chapter_claims import failing_claims, lab_chapter_claims, listed_failing

from phantom.book.results import VAL_ACC, VAL_LEN
from phantom.dynamics import run_dynamics
from phantom.lab.sweep import expand, load_sweep
from phantom.runs import iter_runs, read_metrics

ROOT = Path(__file__).resolve().parents[1]
AMD = ROOT / "data" / "runs" / "lab_paper_amd"
SWEEPS = sorted(p.name for p in AMD.iterdir() if (p / "sweep.yaml").is_file())
#: The base of `paper.yaml` when these copies ran (before the graded main setting of 2026-12-06).
FIRST_SETTING = {"steps": 40, "lam": 0.3, "model": "lab"}


def test_each_copy_is_the_paper_sweep_on_its_warm_start():
    """Same groups, cells and base as `paper`, but for the SFT seed; and every cell finished, on that machine."""
    paper = yaml.safe_load((ROOT / "src" / "phantom" / "lab" / "sweeps" / "paper.yaml").read_text())
    assert SWEEPS == ["sft0", "sft1", "sft2"]
    for name in SWEEPS:
        mine = load_sweep(AMD / name / "sweep.yaml")
        seed = int(name.removeprefix("sft"))
        assert mine["groups"] == paper["groups"], name
        assert mine["base"] == {**FIRST_SETTING, **({"sft_seed": seed} if seed else {})}, name
        # the main setting since differs from these copies only in the answer style and the learning rate
        assert {k: v for k, v in paper["base"].items() if k not in ("model", "lr")} == {
            k: v for k, v in FIRST_SETTING.items() if k != "model"}
        want = sorted(c.name for c in expand(mine, "full"))
        runs = list(iter_runs(AMD / name))
        assert sorted(r.name for r in runs) == want and len(want) == len(expand(paper, "full")), name
        for r in runs:
            m = r.manifest()
            assert m["status"] == "done" and m["spec"]["profile"] == "full"
            assert m["spec"]["model"] == "lab" and m["spec"]["lr"] == 2.5e-3  # the first setting
            assert m["sft"]["key"] == runs[0].manifest()["sft"]["key"]  # one warm start per folder
            assert m["sweep"]["name"] == mine["name"], (name, r.name)  # the file is the one the runs ran
            assert m["git_commit"].startswith("208f05b")  # as the README says
            if "machine" in m:  # sft2's manifests record it (sft0 and sft1 predate the field)
                assert m["machine"]["torch_cpu_capability"] == "AVX2" and "AMD" in m["machine"]["cpu"]
    readme = " ".join((AMD / "README.md").read_text().split())
    with_machine = [n for n in SWEEPS if all("machine" in r.manifest() for r in iter_runs(AMD / n))]
    assert with_machine == ["sft2"] and "those of `sft2` record it" in readme
    starts = {r.manifest()["summary"]["start_acc"] for name in SWEEPS for r in iter_runs(AMD / name)
              if r.manifest()["spec"]["task"]["terms"] == [4, 6] and not r.manifest()["spec"]["noise_p"]}
    assert len(starts) == 3  # three different warm starts


def _cells(name: str) -> dict[tuple, dict]:
    """(group, estimator, arm, seed[, lam | noise_p]) -> the run's dynamics row and metrics."""
    out = {}
    for run in iter_runs(AMD / name):
        m = run.manifest()
        s = m["spec"]
        row = {**run_dynamics(run.path), "df": read_metrics(run.path)}
        extra = {"lam": (s["lam"],), "noise": (s["noise_p"],)}
        for g in m["sweep"]["groups"]:
            out[(g, s["estimator"], s["arm"], s["seed"], *extra.get(g, ()))] = row
    return out


def _first_below(df, threshold=0.10):
    acc = df[VAL_ACC].dropna()
    below = acc[acc < threshold]
    return int(below.index[0]) if len(below) else None


def _readme_rows(text: str) -> dict[str, list[str]]:
    """The README's table: SFT seed -> its cells (the header and the rule row left out)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]
    return {r[0]: r[1:] for r in rows[2:]}


def _ends(rows: list[dict]) -> str:
    return " / ".join(f"{r['acc_end']:.3f}" for r in rows)


def test_the_readme_table_and_statements():
    """Every number of the README, computed again from the committed run logs."""
    readme = (AMD / "README.md").read_text()
    text = " ".join(readme.split())  # the statements, whatever their line breaks
    table = _readme_rows(readme)
    cells = {name: _cells(name) for name in SWEEPS}
    assert sorted(table) == [n.removeprefix("sft") for n in SWEEPS]
    unsafe_ends, none_lf, out_changes = [], 0, []
    for n in SWEEPS:
        c = cells[n]
        none = [c[("core", "grpo", "none", s)] for s in range(3)]
        score = [c[("core", "grpo", "score", s)] for s in range(3)]
        out = [c[("core", "grpo", "outcome", s)] for s in range(3)]
        gain = float(np.mean([r["acc_end"] - r["acc0"] for r in out]))
        assert table[n.removeprefix("sft")] == [
            f"{none[0]['acc0']:.3f}", _ends(none), ", ".join(r["order"] for r in none),
            f"{_ends(out)} (mean {gain:+.3f})", f"{c[('estimators', 'drgrpo', 'none', 0)]['acc_end']:.3f}"], n
        assert [r["acc_end"] for r in score] == [r["acc_end"] for r in none]  # shaped score = no filter
        unsafe_ends += [r["acc_end"] for r in none + score]
        none_lf += sum(r["order"] == "length first" for r in none)
        assert not any(r["order"] == "accuracy first" for r in none + score)
        assert gain >= 0.03
        out_changes += [r["acc_end"] - r["acc0"] for r in out]
    low = sum(v <= 0.10 for v in unsafe_ends) // 2  # per arm (the two unsafe arms log the same)
    assert f"at or below 0.10 in {low} of {len(unsafe_ends) // 2} runs each (at most {max(unsafe_ends):.3f})" in text
    assert f"length falls first in {none_lf} of 9 no-filter runs" in text
    assert min(out_changes) >= -0.05 and f"(the lowest is {min(out_changes):.3f})" in text

    # GSPO: clip 0.2 loses the outcome arm's accuracy everywhere; its answers grew on one warm start only
    gs = {n: cells[n][("estimators", "gspo", "outcome", 0)] for n in SWEEPS}
    assert all(r["acc_end"] < r["acc0"] - 0.1 for r in gs.values())
    grew = [r for r in gs.values() if r["len_end"] > r["len0"]]
    assert len(grew) == 1 and f"({grew[0]['len0']:.0f} -> {grew[0]['len_end']:.0f} characters)" in text
    ct = [cells[n][("gspo_clip", "gspo", "outcome", 0)] for n in SWEEPS]
    assert all(r["acc_end"] > 0.10 for r in ct) and sum(r["acc_end"] < r["acc0"] for r in ct) == 2
    for n in SWEEPS:  # verl's clip delays the unsafe collapse, or prevents it within the run
        wide, tight = (_first_below(cells[n][(g, "gspo", "none", 0)]["df"]) for g in ("estimators", "gspo_clip"))
        assert wide is not None and (tight is None or tight > wide), n

    # DAPO: refills in fewer steps under the score filter; budget spent only on SFT seed 1
    refills = {n: {a: int((cells[n][("dapo", "grpo", a, 0)]["df"]["phantom/gen_batches"].dropna() > 1).sum())
                   for a in ("score", "outcome")} for n in SWEEPS}
    score_r = [r["score"] for r in refills.values()]
    assert all(r["score"] < r["outcome"] == 40 for r in refills.values())
    assert f"({min(score_r)}-{max(score_r)} of 40 against 40)" in text
    seed2 = cells["sft2"][("dapo", "grpo", "score", 0)]
    assert _first_below(seed2["df"]) is None and f"lost {seed2['acc0'] - seed2['acc_end']:.2f} of accuracy" in text
    spent = {n: int(cells[n][("dapo", "grpo", "score", 0)]["df"]["phantom/dapo/exhausted"].dropna().sum())
             for n in SWEEPS}
    first = _first_below(cells["sft1"][("dapo", "grpo", "score", 0)]["df"])
    exhausted_at = cells["sft1"][("dapo", "grpo", "score", 0)]["df"]["phantom/dapo/exhausted"].dropna()
    assert [n for n, v in spent.items() if v] == ["sft1"] and f"only on SFT seed 1 ({spent['sft1']} steps" in text
    assert first is not None and int(exhausted_at[exhausted_at > 0].index.min()) > first  # all after the collapse

    # λ = 0.1 and verifier noise
    lam01 = {n: cells[n][("lam", "grpo", "none", 0, 0.1)]["acc_end"] for n in SWEEPS}
    assert lam01["sft2"] > 0.10 and all(v <= 0.10 for n, v in lam01.items() if n != "sft2")
    assert f"ended at {lam01['sft2']:.3f} on SFT seed 2" in text
    true_end = {p: float(cells["sft0"][("noise", "grpo", "outcome", 0, p)]["df"]["phantom/val/acc_true"].dropna().iloc[-1])
                for p in (0.05,)}
    clean = float(cells["sft0"][("core", "grpo", "outcome", 0)]["df"]["phantom/val/acc_true"].dropna().iloc[-1])
    light = cells["sft0"][("noise", "grpo", "outcome", 0, 0.05)]["df"]["phantom/val/acc_true"].dropna()
    assert f"ended {clean - true_end[0.05]:.3f} below the clean cell on SFT seed 0" in text
    assert light.iloc[-1] >= light.iloc[0] - 0.05  # "though within 0.05 of its start"


@pytest.mark.slow
@pytest.mark.parametrize("sweep", SWEEPS)
def test_the_claims_that_fail_on_the_other_machine_are_the_oneslisted_failing(sweep, tmp_path):
    """Every chapter reads the copy and checks claims on it; exactly the README's list fails there."""
    folder = AMD / sweep
    claims = lab_chapter_claims(folder, tmp_path)
    assert all(claims.values()), claims
    failed = {r["key"] for rows in claims.values() for r in rows if r["status"] not in ("holds", "skipped")}
    assert failed == listed_failing(AMD / "README.md"), failed
    total = sum(map(len, claims.values()))
    gs = [r for r in iter_runs(folder) if "estimators" in r.manifest()["sweep"]["groups"]
          and r.manifest()["spec"]["arm"] == "outcome" and r.manifest()["spec"]["estimator"] == "gspo"]
    d = run_dynamics(gs[0].path)
    assert f"{d['acc0']:.3f} → {d['acc_end']:.3f}" in (AMD / "README.md").read_text()  # the listed claim's data
    assert f"{len(failed)} of the {total} claims of chapters 4 and 6-8 fails on each" in " ".join(
        (AMD / "README.md").read_text().split())


HELDOUT = ROOT / "data" / "runs" / "lab_paper_amd_heldout"


def _ends(dyns, sep: str = " / ") -> str:
    return sep.join(f"{d['acc_end']:.3f}" for d in dyns)


def _cell(run) -> dict:
    return {k: v for k, v in run.manifest()["spec"].items() if k not in ("steps", "profile")}


def test_the_held_out_warm_start_and_its_longer_runs():
    """SFT seed 3's copy is the paper sweep on that warm start, every cell finished; each longer run is one
    of its cells run on, logging the same values (timings aside) at every step of the first 40; the
    no-filter ones are exactly the runs that had not collapsed. Every number the README states comes from
    the logs."""
    paper = yaml.safe_load((ROOT / "src" / "phantom" / "lab" / "sweeps" / "paper.yaml").read_text())
    mine = load_sweep(HELDOUT / "sft3" / "sweep.yaml")
    assert mine["groups"] == paper["groups"] and mine["base"] == {**FIRST_SETTING, "sft_seed": 3}
    runs = {r.name: r for r in iter_runs(HELDOUT / "sft3")}
    assert sorted(runs) == sorted(c.name for c in expand(mine, "full"))
    for r in runs.values():
        m = r.manifest()
        assert m["status"] == "done" and m["sweep"]["name"] == mine["name"]
        assert m["machine"]["torch_cpu_capability"] == "AVX2" and "AMD" in m["machine"]["cpu"]

    def core(arm: str, estimator: str = "grpo", group: str = "core") -> dict:
        return {r.manifest()["spec"]["seed"]: r for r in runs.values() if group in r.manifest()["sweep"]["groups"]
                and r.manifest()["spec"]["arm"] == arm and r.manifest()["spec"]["estimator"] == estimator}

    none, outcome, dr = core("none"), core("outcome"), core("none", "drgrpo", "estimators")
    held = sorted(s for s, r in none.items() if r.manifest()["summary"]["final_acc"] > 0.10)
    longer = {(r.manifest()["spec"]["arm"], r.manifest()["spec"]["estimator"], r.manifest()["spec"]["seed"]): r
              for r in iter_runs(HELDOUT / "long")}
    assert sorted(longer) == sorted([("none", "grpo", s) for s in held] + [("outcome", "grpo", s) for s in range(3)]
                                    + [("none", "drgrpo", 0)]) and held
    for (arm, est, seed), r in longer.items():
        short = {"none": none, "outcome": outcome}[arm][seed] if est == "grpo" else dr[seed]
        assert r.manifest()["status"] == "done" and r.manifest()["spec"]["steps"] > 40
        assert r.manifest()["spec"]["sft_seed"] == 3 and _cell(r) == _cell(short)
        a, b = read_metrics(r.path), read_metrics(short.path)
        keys = [k for k in b.columns if not k.startswith("timing_s/")]
        assert set(keys) <= set(a.columns) and len(keys) > 30
        assert a.loc[a.index <= 40, keys].equals(b.loc[b.index <= 40, keys]), r.name  # a continuation, bit for bit

    # the README's numbers, from the logs
    text = " ".join((HELDOUT / "README.md").read_text().split())
    assert f"`sft3/`: the {len(runs)} cells" in text
    dyn = {s: run_dynamics(r.path) for s, r in none.items()}
    out = {s: run_dynamics(r.path) for s, r in outcome.items()}
    gain = np.mean([d["acc_end"] - d["acc0"] for d in out.values()])
    ends = " / ".join(f"{dyn[s]['acc_end']:.3f}" for s in range(3))
    assert f"| no filter (= shaped score), 40 steps | {dyn[0]['acc0']:.3f} | {ends} |" in text
    assert f"{', '.join(dyn[s]['order'] for s in range(3))} |" in text
    assert f"| {_ends(out[s] for s in range(3))} (mean {gain:+.3f}) |" in text
    assert f"gains ({gain:+.3f})" in text
    assert f"| Dr. GRPO, no filter, 40 steps | {dyn[0]['acc0']:.3f} | {run_dynamics(dr[0].path)['acc_end']:.3f} (seed 0) |" in text
    long = {s: run_dynamics(longer[("none", "grpo", s)].path) for s in held}
    long_ends = " / ".join(f"{long[s]['acc_end']:.3f}" if s in long else "-" for s in range(3))
    assert f"| no filter, 100 steps | {dyn[0]['acc0']:.3f} | {long_ends} |" in text
    len_at = {s: read_metrics(longer[("none", "grpo", s)].path)[VAL_LEN].dropna() for s in held}
    (len_step,) = {long[s]["len_step"] for s in held}
    (short_len,) = {f"{len_at[s].loc[len_step]:.0f}" for s in held}
    assert f"(length at step {len_step}, accuracy at {' and '.join(str(long[s]['acc_step']) for s in held)})" in text
    assert f"falls from {np.mean([dyn[s]['len0'] for s in held]):.0f} to {short_len} characters by step {len_step}" in text
    assert f"({_ends((dyn[s] for s in held), ' and ')} at step 40)" in text
    assert f"accuracy falls by 0.10 only at steps {' and '.join(str(long[s]['acc_step']) for s in held)}" in text
    assert all(long[s]["acc_end"] == 0.0 for s in held) and "both end at 0.000" in text
    empty = max(int(len_at[s][len_at[s] == 0].index.min()) for s in held)
    assert f"(length 0 by step {empty})" in text
    lead = [long[s]["acc_step"] - long[s]["len_step"] for s in held]
    assert f"falls {lead[0]} and {lead[1]} steps after their length" in text
    seed1 = dyn[1]
    assert seed1["acc_end"] <= 0.10 and f"{seed1['acc_step'] - seed1['len_step']} steps after" in text
    out_l = {s: run_dynamics(longer[("outcome", "grpo", s)].path) for s in range(3)}
    dr_l = run_dynamics(longer[("none", "drgrpo", 0)].path)
    gain_l = np.mean([d["acc_end"] - d["acc0"] for d in out_l.values()])
    assert f"| {_ends(out_l[s] for s in range(3))} (mean {gain_l:+.3f}) |" in text
    assert f"| Dr. GRPO, no filter, 100 steps | {dr_l['acc0']:.3f} | {dr_l['acc_end']:.3f} (seed 0) |" in text
    assert all(d["acc_end"] > d["acc0"] for d in [*out_l.values(), dr_l])  # "they still end above their start"
    assert f"(outcome {gain_l:+.3f}, Dr. GRPO {dr_l['acc_end']:.3f})" in text
    acc0 = read_metrics(longer[("outcome", "grpo", 0)].path)[VAL_ACC].dropna()
    assert acc0.min() == min(read_metrics(longer[("outcome", "grpo", s)].path)[VAL_ACC].min() for s in range(3))
    assert f"RL seed 0 fell to {acc0.min():.3f} at step {acc0.idxmin()} before it recovered" in text
    assert out_l[0]["acc_end"] - acc0.min() >= 0.10
    # the failing claims' data
    lam5 = [r for r in runs.values() if r.manifest()["spec"]["lam"] == 0.5 and r.manifest()["spec"]["arm"] == "none"]
    assert f"λ = 0.5 ({lam5[0].manifest()['summary']['final_acc']:.3f})" in text
    gspo = [r for r in runs.values() if "estimators" in r.manifest()["sweep"]["groups"]
            and r.manifest()["spec"]["arm"] == "outcome" and r.manifest()["spec"]["estimator"] == "gspo"]
    assert f"clip 0.2 ends at {gspo[0].manifest()['summary']['final_acc']:.3f}, above its start" in text
    assert gspo[0].manifest()["summary"]["final_acc"] > dyn[0]["acc0"]
    gacc = read_metrics(gspo[0].path)[VAL_ACC].dropna()
    assert f"it fell to {gacc.min():.3f} at step {gacc.idxmin()}" in text and gacc.min() <= 0.10
    noisy = [r for r in runs.values() if r.manifest()["spec"]["noise_p"] == 0.05]
    true_end = read_metrics(noisy[0].path)["phantom/val/acc_true"].dropna()
    assert f"ends at {true_end.iloc[-1]:.3f} in true accuracy, {true_end.iloc[0] - true_end.iloc[-1]:.2f} below its start" in text
    assert f"end at {ends}, not at or below 0.10" in text


@pytest.mark.slow
def test_the_claims_that_fail_on_the_held_out_warm_start_are_the_oneslisted_failing(tmp_path):
    """Out of sample the book does not hold everywhere: exactly the claims the README lists fail there."""
    folder = HELDOUT / "sft3"
    failed, total = failing_claims(folder, tmp_path)
    assert failed == listed_failing(HELDOUT / "README.md"), failed
    for readme in (HELDOUT / "README.md", ROOT / "README.md"):
        assert f"{len(failed)} of the {total} claims of chapters 4 and 6-8" in " ".join(readme.read_text().split())
