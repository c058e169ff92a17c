"""The committed verl sweep (data/runs/verl_filter, chapter 5): verl 0.9.1's V1 trainer on the book's warm start,
cells a-d of `phantom verl sweep` and its two project-estimator cells (`outcome`, `drgrpo`, chapter 5's three-trainer
table); each finished run records its filter, its metric and how it ran."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from phantom.verl.launch import read_run_metrics
from phantom.verl.reward import compute_score
from phantom.verl.sweep import CELLS, KEEP, cell_of

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "runs" / "verl_filter"
NAMES = sorted(p.name for p in RUNS.iterdir() if (p / "manifest.json").is_file())
ACC = "val-core/phantom_lab/acc/mean@1"
LEN = "val-aux/phantom_lab/len_chars/mean@1"
#: what each cell's manifest must record about the filter: (enable, metric, where the metric came from)
FILTER = {"a": (False, None, None), "b": (True, "reward", "verl default"), "c": (True, "acc", None),
          "d": (True, "reward", "verl default"), "outcome": (False, None, None), "drgrpo": (False, None, None)}
NAME = re.compile(r"verl-(" + "|".join(CELLS) + r")-s(\d+)")


def manifest(name: str) -> dict:
    return json.loads((RUNS / name / "manifest.json").read_text())


def test_the_sweep_has_runs_of_the_filter_cells():
    cells = {NAME.fullmatch(n).group(1) for n in NAMES}
    assert set(FILTER) <= cells, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_committed_run_is_finished_small_and_in_its_cell(name):
    m = manifest(name)
    cell, seed = NAME.fullmatch(name).groups()
    # verl-a-s0 ran first, as the benchmark's arm (its manifest's name is the benchmark's); the folder names the cell
    assert m["kind"] == "verl" and m["status"] in ("done", "starved")
    if m["status"] == "done":
        assert m["returncode"] == 0
    else:  # stopped by the launcher's refill bound: only a filtered cell, and only past the bound
        assert m["spec"]["dapo"] and m["starve_batches"] >= 1 and m["starved"]["sequences"] > m["starved"]["limit"]
    assert m["name"] == name or (name == "verl-a-s0" and m["name"] == "bench-verl-shared-ray")
    assert {p.name for p in (RUNS / name).iterdir()} <= set(KEEP), "only the small files are committed"
    assert cell_of(m["spec"]) == cell and m["spec"]["seed"] == int(seed)
    assert m["versions"]["verl"] == "0.9.1" and m["filter_groups"]["trainer"] == "v1" and m["spec"]["trainer"] == "v1"
    assert {k: m["spec"][k] for k in CELLS[cell]} == CELLS[cell] or cell == "a"


@pytest.mark.parametrize("name", NAMES)
def test_filter_and_metric_are_recorded(name):
    """b and d give no metric (verl 0.9.1 composes `reward`); c gives metric=acc; a has the filter off."""
    m = manifest(name)
    cell = cell_of(m["spec"])
    enable, metric, source = FILTER[cell]
    fg, over = m["filter_groups"], m["overrides"]
    assert fg["enable"] is enable
    assert ("algorithm.filter_groups.enable=True" in over) is enable
    if enable:
        assert fg["metric"] == metric
        given = [o for o in over if o.startswith("algorithm.filter_groups.metric=")]
        assert given == ([] if source == "verl default" else [f"algorithm.filter_groups.metric={metric}"])
        assert fg["metric_source"] == (source or fg["metric_source"]) and (source or fg["metric_source"] != "verl default")
    assert (f"algorithm.norm_adv_by_std_in_grpo={cell not in ('d', 'drgrpo')}") in over


@pytest.mark.parametrize("name", NAMES)
def test_the_reward_returns_a_dict_with_a_binary_acc(name):
    over = manifest(name)["overrides"]
    assert "reward.custom_reward_function.path=pkg://phantom.verl.reward" in over
    assert "reward.custom_reward_function.name=compute_score" in over
    kw = {o.split("reward_kwargs.")[1].split("=")[0]: o.split("=", 1)[1] for o in over if "reward_kwargs." in o}
    assert kw == {"lam": "0.3", "kind": "length_short", "noise_p": "0.0"}
    for text, gold in (("2+2=4\n#### 4", "4"), ("2+2=5\n#### 5", "4"), ("", "4")):
        out = compute_score("phantom_lab", text, gold, extra_info=None, lam=0.3, kind="length_short", noise_p=0.0)
        assert isinstance(out, dict) and out["acc"] in (0.0, 1.0)
        assert out["score"] <= out["acc"]  # the shaped score subtracts the length term from the outcome


@pytest.mark.parametrize("name", NAMES)
def test_forty_steps_validated_every_five(name):
    """A done run has all 40 steps; a starved one every step up to the one the bound stopped."""
    m = manifest(name)
    last = m["last_step"]
    assert m["spec"]["steps"] == 40 and "trainer.total_training_steps=40" in m["overrides"]
    assert last == 40 if m["status"] == "done" else 0 < last < 40
    assert m["spec"]["val_freq"] == 5 and "trainer.test_freq=5" in m["overrides"] and m["spec"]["val_before_train"]
    df = read_run_metrics(RUNS / name)
    assert list(df.index) == list(range(last + 1))
    assert df[ACC].dropna().index.tolist() == list(range(0, last + 1, 5))
    assert df[LEN].dropna().index.tolist() == list(range(0, last + 1, 5))
    assert df.loc[1:, "phantom/groups/total"].eq(m["spec"]["train_batch_size"]).all(), "every step's gate counts"
    if m["filter_groups"]["enable"]:
        gen = df.loc[1:, "phantom/prompts_generated"]
        assert (gen >= m["spec"]["train_batch_size"]).all()
        assert (df.loc[1:, "phantom/refilled"] == (gen > m["spec"]["train_batch_size"])).all()


@pytest.mark.parametrize("name", NAMES)
def test_every_run_starts_from_the_shipped_warm_start(name):
    """The manifests record the model's path on the machine that ran them; its folder name is the shipped warm
    start's (scripts/collect_runs.py compared the files' sha256 with data/warmstart/manifest.json)."""
    shipped = json.loads((ROOT / "data" / "warmstart" / "manifest.json").read_text())
    assert Path(manifest(name)["spec"]["model"]).name in shipped


@pytest.mark.parametrize("name", NAMES)
def test_the_refill_bound_separates_starved_from_done(name):
    """Every run of a filtered cell is judged by the bound the starved ones were stopped at (the sweep's default,
    10 generation batches): a done run stayed under it at every step, a starved run went past it."""
    from phantom.verl.starve import RefillGuard, Starved
    from phantom.verl.sweep import STARVE_BATCHES

    m = manifest(name)
    if not m["spec"]["dapo"]:
        return
    spec = m["spec"]
    # 256 held-out problems, one greedy answer each (the launcher read the parquet; a starved manifest's limit agrees)
    guard = RefillGuard(RUNS / name / "rollout.jsonl", STARVE_BATCHES, spec["train_batch_size"] * spec["rollout_n"], 256)
    if m["status"] == "done":
        guard.check()  # raises Starved if any step went past the bound
    else:
        assert m["starve_batches"] == STARVE_BATCHES and m["starved"]["limit"] == guard.limit
        with pytest.raises(Starved):
            guard.check()
