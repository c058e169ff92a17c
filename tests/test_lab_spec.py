"""Bad lab input fails fast, before any work, with a message naming the value and the allowed ones."""

from __future__ import annotations

import pytest

from phantom.lab.cli import main as lab_main
from phantom.lab.spec import ArmSpec
from phantom.lab.sweep import expand, load_sweep


@pytest.mark.parametrize(("field", "value", "match"), [
    ("arm", "shaped", r"arm='shaped' is unknown; allowed: none, score, outcome"),
    ("estimator", "ppo", r"allowed: grpo, drgrpo, gspo"),
    ("kind", "cosine", r"allowed: length_short, length_long, format, overlong"),
    ("lam", -0.1, r"lam=-0.1 is out of range"),
    ("lam", 1.0, r"0 <= lam < 1"),
    ("steps", 0, r"steps=0 is out of range; allowed: 1 <= steps <= 100000"),
    ("steps", -3, r"steps=-3"),
    ("steps", 2.5, r"not an integer"),
    ("rollouts", 1, r"2 <= rollouts <= 256"),
    ("prompts", 1e23, r"prompts=1e\+23 is out of range; allowed: 1 <= prompts <= 4096"),
    ("seed", float("inf"), r"seed=inf is not an integer"),
    ("noise_p", 0.5, r"0 <= p < 0.5"),
    ("lr", 0, r"lr=0 is out of range"),
    ("loss_agg", "token-sum", r"allowed: token-mean"),
    ("model", "gpt2", r"model='gpt2' is unknown"),
    ("sampling", "rejection", r"allowed: gate, dapo"),
    ("drop", "rows", r"allowed: zero, mask"),
    ("task", {"terms": [1, 3]}, r"terms"),
])
def test_bad_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        ArmSpec.from_dict({field: value})


def test_gen_batch_smaller_than_train_batch():
    with pytest.raises(ValueError, match=r"gen_prompts=16 is smaller than the train batch prompts=32"):
        ArmSpec(arm="outcome", sampling="dapo", prompts=32, gen_prompts=16)
    with pytest.raises(ValueError, match=r"gen_prompts=8 is smaller"):
        ArmSpec(arm="outcome", prompts=32, gen_prompts=8)
    assert ArmSpec(arm="outcome", sampling="dapo", prompts=32).gen_prompts == 64


def test_dapo_needs_a_filter_metric():
    with pytest.raises(ValueError, match="arm='none' has no DAPO filter metric"):
        ArmSpec(arm="none", sampling="dapo")
    assert ArmSpec(arm="score", sampling="dapo").dapo_metric == "score"
    assert ArmSpec(arm="outcome", sampling="dapo").dapo_metric == "acc"


def test_unknown_field_lists_allowed():
    with pytest.raises(ValueError, match=r"unknown spec field\(s\) \['lambda'\]; allowed: .*lam"):
        ArmSpec.from_dict({"lambda": 0.3})


def test_spec_round_trip_and_names():
    s = ArmSpec(arm="score", estimator="drgrpo", lam=0.1, seed=2)
    d = s.to_dict()
    assert ArmSpec.from_dict(d) == s
    for key in ("arm", "estimator", "lam", "kind", "seed", "steps", "lr", "kl_coef", "noise_p", "task", "model"):
        assert key in d
    assert s.run_name().startswith("lab-score-drgrpo-length_short-lam0.1-s2-")
    assert s.run_name() != ArmSpec(arm="score", estimator="drgrpo", lam=0.1, seed=2, kl_coef=0.001).run_name()


@pytest.mark.parametrize("argv", [
    ["run", "--arm", "nonsense", "--steps", "1"],
    ["run", "--lam", "-1"],
    ["run", "--steps", "0"],
    ["run", "--set", "sampling=dapo", "--set", "gen_prompts=4"],
    ["run", "--set", "bogus"],
    ["sweep", "no-such-sweep"],
    ["sweep", "paper", "--profile", "medium"],
    ["sft", "--profile", "huge"],  # the old spelling of --model still checks its value
    ["sft", "--model", "huge"],
    ["run", "--steps", "2", "--set", "steps=1"],
    ["run", "--name", "../x"],
])
def test_cli_bad_input_exits_2(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PHANTOM_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PHANTOM_ARTIFACTS", str(tmp_path / "art"))
    assert lab_main(argv) == 2
    assert "allowed" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "art").exists()  # nothing half-written


def test_packaged_sweeps_expand_and_validate():
    for profile in ("full", "quick"):
        cells = expand(load_sweep("paper"), profile)
        names = [c.name for c in cells]
        assert len(names) == len(set(names))
        assert all(c.spec.profile == profile for c in cells)
    full = expand(load_sweep("paper"), "full")
    core = [c for c in full if "core" in c.groups]
    assert {(c.spec.arm, c.spec.seed) for c in core} == {(a, s) for a in ("none", "score", "outcome") for s in (0, 1, 2)}
    assert all(c.spec.steps == 40 and c.spec.lam == 0.3 for c in core)


def test_bad_sweep_cell_names_group(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("groups:\n  g1:\n    grid: {arm: [none, sideways]}\n")
    with pytest.raises(ValueError, match=r"group 'g1'.*arm='sideways'"):
        expand(load_sweep(p), "full")


def test_cli_task_prints_problems(capsys):
    import json

    assert lab_main(["task", "--n", "3", "--split", "val", "--wording", "words"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3 and all(r["solution"].endswith(f"#### {r['answer']}") for r in rows)
    assert all("How many" in r["prompt"] for r in rows)


def test_task_default_follows_the_model_profile():
    from phantom.lab.sft import resolve_sft

    assert ArmSpec(model="tiny").task == resolve_sft("tiny").task.to_dict()
    assert ArmSpec(task={"terms": [2, 3]}).task["terms"] == [2, 3]


def test_a_partial_task_overrides_only_its_fields_of_the_profiles_task():
    from phantom.lab.sft import PROFILES

    own = PROFILES["lab_graded"].task.to_dict()
    t = ArmSpec(model="lab_graded", task={"terms": [3, 5]}).task
    assert t["terms"] == [3, 5] and own["terms"] != [3, 5]
    assert {k: v for k, v in t.items() if k != "terms"} == {k: v for k, v in own.items() if k != "terms"}
    assert t["style"] == "graded"
    with pytest.raises(ValueError, match="unknown field"):
        ArmSpec(model="lab_graded", task={"trems": [3, 5]})


def test_max_new_and_warm_start_follow_the_profile():
    from phantom.lab.sft import PROFILES

    assert ArmSpec().max_new == PROFILES["lab"].max_new and ArmSpec(model="tiny").max_new == PROFILES["tiny"].max_new
    assert ArmSpec(max_new=24).max_new == 24
    assert ArmSpec().sft == "lab" and ArmSpec(sft_seed=2).sft == {"profile": "lab", "seed": 2}
    # the profile's own seed is the profile's own checkpoint: one spec, one run folder
    assert ArmSpec(sft_seed=PROFILES["lab"].seed) == ArmSpec() and ArmSpec(sft_seed=1).run_name() != ArmSpec().run_name()
    with pytest.raises(ValueError, match="sft_seed"):
        ArmSpec(sft_seed=-1)


def test_cli_task_defaults_to_the_lab_task_and_takes_style_and_slack(capsys):
    import json

    from phantom.lab.sft import PROFILES

    assert lab_main(["task", "--n", "4"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    lo, hi = PROFILES["lab"].task.terms
    assert all(lo <= r["prompt"].count("+") + 1 <= hi for r in rows)
    assert lab_main(["task", "--n", "4", "--style", "terse"]) == 0
    terse = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in terse] == [r["prompt"] for r in rows]
    assert sum(len(r["solution"]) for r in terse) < sum(len(r["solution"]) for r in rows)
    assert lab_main(["task", "--slack", "2"]) == 2 and "slack" in capsys.readouterr().err


def test_cli_run_defaults_to_the_books_main_setting(monkeypatch, capsys):
    """`phantom lab run --arm none` is the book's no-filter cell (the paper sweep's base), not ArmSpec's
    older defaults: a user's extra seed must run the setting the chapters show."""
    import dataclasses

    import phantom.lab.rl as rl
    from phantom.lab.sweep import expand, load_sweep

    seen = []

    class _Run:
        path = "runs/x"

        def manifest(self):
            return {"summary": {}}

    monkeypatch.setattr(rl, "run_arm", lambda spec, **kw: seen.append(spec) or _Run())
    assert lab_main(["run", "--arm", "none", "--seed", "1"]) == 0
    cell = next(c for c in expand(load_sweep("paper"), "full") if "core" in c.groups
                and c.spec.arm == "none" and c.spec.seed == 1)
    assert dataclasses.replace(seen[-1], profile="full") == cell.spec
    assert cell.spec.model != ArmSpec().model  # the main setting is not ArmSpec's default
    assert lab_main(["run", "--arm", "none", "--model", "lab", "--set", "lr=0.0025", "--lam", "0.1"]) == 0
    assert (seen[-1].model, seen[-1].lr, seen[-1].lam) == ("lab", 0.0025, 0.1)
