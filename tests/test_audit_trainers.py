"""Each trainer the audit knows is read in its own terms: fixtures in each trainer's real shapes, verdicts asserted.

The fixtures in tests/fixtures/audit/trainers/ are the project's own, written in the shapes of EasyR1,
ms-swift, OpenRLHF, NeMo-RL, oat, TRL RLOO, verl's fully-async trainer and verl-recipe's entropy and
transfer-queue mains (none copied). The expected verdicts were decided from each trainer's source
(cited in phantom.audit.trainers), not from the tool's output. The registry's facts about verl's own
entry points are checked against the installed wheel's source.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from phantom.audit import audit, read_config
from phantom.audit.bash import Field
from phantom.audit.families import CONSTRUCTED
from phantom.audit.shell import trainer_of
from phantom.audit.trainers import TRAINERS, by_name

DIR = Path(__file__).parent / "fixtures" / "audit" / "trainers"
HELPERS = {"easyr1_reward.py", "openrlhf_reward.py", "openrlhf_reward_continuous.py"}  # read by others, not inputs
E, W, I = "error", "warning", "info"  # noqa: E741
#: name -> (exit code, trainer id, rule -> worst severity)
EXPECTED: dict[str, tuple[int, str, dict[str, str]]] = {
    # EasyR1: online_filtering on the shaped `overall` (PH001) and grpo's std on it (PH010); an accuracy filter gates
    "easyr1_filter_overall.sh": (1, "easyr1", {"PH001": E, "PH010": E}),
    "easyr1_filter_accuracy.sh": (0, "easyr1", {}),
    "easyr1_config.yaml": (1, "easyr1", {"PH010": E}),
    # ms-swift: format + accuracy scaled per group; RLOO's default scale is none; dynamic_sample on a continuous sum
    "swift_format_accuracy.sh": (1, "swift.grpo", {"PH010": E}),
    "swift_rloo_format.sh": (0, "swift.grpo", {}),
    "swift_dynamic_sample.sh": (1, "swift.grpo", {"PH001": E}),
    # OpenRLHF: group_norm gated by dynamic filtering on 0/1 scores; without the filter; continuous scores
    "openrlhf_group_norm_filtered.sh": (0, "openrlhf", {}),
    "openrlhf_group_norm_unfiltered.sh": (1, "openrlhf", {"PH010": E}),
    "openrlhf_legacy_flags_continuous.sh": (1, "openrlhf", {"PH001": E}),
    # NeMo-RL: the base config; overlong shaping without dynamic sampling; DAPO (dynamic sampling, unshaped std)
    "nemo_base.yaml": (0, "nemo.grpo", {}),
    "nemo_overlong_no_filter.yaml": (1, "nemo.grpo", {"PH010": E}),
    "nemo_dapo_dynamic.yaml": (0, "nemo.grpo", {"PH001": I}),
    "nemo_overlay_unknown_base.yaml": (1, "nemo.grpo", {"PH010": W}),  # its environment is not in the file
    # oat: grpo critic on an oracle the audit does not know; drgrpo on the two-valued math oracle
    "oat_grpo_countdown.sh": (1, "oat", {"PH010": W}),
    "oat_drgrpo_math.sh": (0, "oat", {}),
    # TRL: RLOO with batch normalization; a generic RLOO script (nothing read); bodies decide, not names
    "trl_rloo_normalized.py": (1, "trl.rloo", {"PH020": W}),
    "trl_rloo_generic.py": (1, "trl.rloo", {"PH060": W}),
    "trl_format_only.py": (0, "trl", {}),
    "trl_local_bodies.py": (1, "trl", {"PH020": E, "PH021": I}),
    # verl's fully-async trainer ignores the acc filter: the overlong penalty is std-normalized, ungated
    "fully_async_acc_filter.sh": (1, "fully_async", {"PH006": W, "PH010": E}),
    # verl-recipe: entropy's own reward_model section is live; the transfer-queue main does not migrate
    "entropy_acc_filter.sh": (0, "recipe.entropy", {}),
    "entropy_overlong_no_filter.sh": (1, "recipe.entropy", {"PH010": E}),
    "transfer_queue_dapo.sh": (1, "recipe.dapo_transfer_queue", {"PH040": E}),
    # never clean: an unknown entry point, an unresolved estimator
    "unknown_entrypoint.sh": (1, "unknown:mylab.rl.main_grpo", {"PH062": W}),
    "unresolved_estimator.sh": (1, "main_ppo", {"PH051": W, "PH002": I}),
    # a shaped-score filter without std normalization: a note, and no advice to set the flag already set
    "drgrpo_filter_score.sh": (0, "main_ppo", {"PH001": I}),
    # Hydra's rules: + on an existing key, a key the config lacks
    "hydra_rejected.sh": (1, "main_ppo", {"PH044": E, "PH045": E}),
    # valid bash: a list default and a final line continuation, no syntax note
    "list_default_continuation.sh": (0, "main_ppo", {}),
}
_RANK = {E: 0, W: 1, I: 2}


def _rules(inp) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in inp.findings:
        if f.rule not in out or _RANK[f.severity] < _RANK[out[f.rule]]:
            out[f.rule] = f.severity
    return out


def test_every_trainer_fixture_has_a_verdict():
    assert {p.name for p in DIR.iterdir() if p.is_file()} - HELPERS == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_trainer_verdict(name):
    code, trainer, rules = EXPECTED[name]
    rep = audit([str(DIR / name)])
    (inp,) = rep.inputs
    assert inp.error is None, str(inp.error)
    assert (rep.exit_code, inp.trainer, _rules(inp)) == (code, trainer, rules), \
        [f"{f.rule} {f.severity} {f.message}" for f in inp.findings]
    assert not any("syntax error" in n for n in inp.read.notes), inp.read.notes


def test_fully_async_names_why_its_filter_does_not_run():
    (inp,) = audit([str(DIR / "fully_async_acc_filter.sh")]).inputs
    f = next(f for f in inp.findings if f.rule == "PH006")
    assert "fully-async" in f.message and "filter_groups" in f.message
    ph010 = next(f for f in inp.findings if f.rule == "PH010")
    assert "no outcome gate" in ph010.message  # the acc filter is not counted as a gate
    assert inp.facts.overlong is True


def test_fixes_of_other_trainers_are_in_their_syntax_and_marked_constructed():
    seen = {}
    for name in ("easyr1_filter_overall.sh", "swift_format_accuracy.sh", "openrlhf_group_norm_unfiltered.sh",
                 "nemo_overlong_no_filter.yaml", "oat_grpo_countdown.sh"):
        for f in audit([str(DIR / name)]).findings:
            assert f.fix_args and f.fix_status == CONSTRUCTED and "constructed" in f.fix, (name, f.rule)
            seen[name] = f.fix_args
    assert seen["easyr1_filter_overall.sh"] == ("algorithm.online_filtering=true", "algorithm.filter_key=accuracy")
    assert seen["swift_format_accuracy.sh"] == ("--scale_rewards", "none")
    assert seen["openrlhf_group_norm_unfiltered.sh"] == ("--algo.advantage.estimator", "dr_grpo")
    easyr1 = next(f for f in audit([str(DIR / "easyr1_filter_overall.sh")]).findings if f.rule == "PH001")
    assert easyr1.fix_args == ("algorithm.filter_key=accuracy",)  # the 0/1 key read from the reward's body


def test_easyr1_fix_gates_the_run():
    """Applying the printed fix to the EasyR1 script gives a clean audit."""
    text = (DIR / "easyr1_filter_overall.sh").read_text().replace(
        "algorithm.online_filtering=True", "algorithm.online_filtering=True algorithm.filter_key=accuracy")
    fixed = DIR.parent / "trainers" / "_fixed_tmp.sh"
    try:
        fixed.write_text(text)
        assert audit([str(fixed)]).exit_code == 0
    finally:
        fixed.unlink(missing_ok=True)


def test_rloo_fix_constructs_trls_rlooconfig(tmp_path):
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed")
    from trl import RLOOConfig

    (f,) = audit([str(DIR / "trl_rloo_normalized.py")]).findings
    cfg = RLOOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **f.fix_kwargs)
    assert cfg.normalize_advantages is False and f.fix_kwargs == {"normalize_advantages": False}


def test_bodies_not_names_decide():
    (inp,) = audit([str(DIR / "trl_local_bodies.py")]).inputs
    why = {t.name: (t.shaped, t.why) for t in inp.facts.trl_funcs}
    assert why["reward_a"][0] is False and "body" in why["reward_a"][1]
    assert why["reward_b"][0] is True and "len" in why["reward_b"][1]


@pytest.mark.parametrize("words, expected", [
    (["python3", "-m", "verl.trainer.main_ppo", "a=1"], ("verl", "main_ppo")),
    (["python3", "-m", "recipe.entropy.main_entropy", "a=1"], ("verl", "recipe.entropy")),
    (["python3", "-m", "recipe.dapo.dapo_transfer_queue.main_dapo"], ("verl", "recipe.dapo_transfer_queue")),
    (["python", "-m", "verl.experimental.fully_async_policy.fully_async_main", "a=1"], ("verl", "fully_async")),
    (["python3", "-m", "verl.trainer.main", "config=x.yaml"], ("easyr1", "easyr1")),
    (["python3", "-m", "recipe.async_flow.main_grpo", "algorithm.adv_estimator=grpo"],
     ("verl", "unknown:recipe.async_flow.main_grpo")),  # a "grpo" module with Hydra overrides is not TRL
    (["python3", "-m", "mylab.train_grpo", "--reward_funcs", "a"], ("trl", "trl.grpo")),
    (["accelerate", "launch", "scripts/rloo.py", "--num_generations", "8"], ("trl", "trl.rloo")),
    (["swift", "rlhf", "--rlhf_type", "grpo"], ("swift", "swift.grpo")),
    (["python3", "-m", "openrlhf.cli.train_ppo_ray", "--x"], ("openrlhf", "openrlhf")),
    (["uv", "run", "examples/run_grpo_math.py", "--config", "c.yaml"], ("nemo", "nemo.grpo")),
    (["python", "-m", "oat.experiment.run_math_rl", "--critic_type", "grpo"], ("oat", "oat")),
    (["python3", "-m", "verl.trainer.main_generation", "a=1"], None),
    (["python3", "-m", "verl.trainer.sft_trainer", "a=1"], None),
])
def test_entry_points_are_recognised(words, expected):
    got = trainer_of([Field(w) for w in words])
    assert (got[:2] if got else None) == expected


def _wheel(rel: str) -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        pytest.skip("verl is not installed")
    return (Path(spec.origin).parent / rel).read_text()


def test_registry_facts_match_the_installed_verl():
    """The facts recorded for verl's own entry points, checked against the 0.9.1 wheel's source."""
    assert "migrate_legacy_reward_impl" not in _wheel("trainer/main_ppo.py")
    assert 'config_name="ppo_trainer"' in _wheel("trainer/main_ppo.py")
    fa = _wheel("experimental/fully_async_policy/fully_async_main.py")
    assert "migrate_legacy_reward_impl(config)" in fa and 'config_name="fully_async_ppo_trainer"' in fa
    for f in ("fully_async_trainer.py", "fully_async_rollouter.py"):
        assert "filter_groups" not in _wheel(f"experimental/fully_async_policy/{f}")
    assert "filter_groups" not in _wheel("experimental/separation/ray_trainer.py")
    osp = _wheel("experimental/one_step_off_policy/main_ppo.py")
    assert "migrate_legacy_reward_impl" not in osp and 'config_name="one_step_off_ppo_trainer"' in osp
    assert by_name("fully_async").migrates and not by_name("main_ppo").migrates
    assert by_name("fully_async").filter is None and by_name("one_step_off").filter is None
    reward = _wheel("trainer/ppo/reward.py")
    assert 'config.reward.get("custom_reward_function")' in reward  # what the entropy recipe's custom path reads


def test_registry_is_consistent():
    names = [t.name for t in TRAINERS]
    assert len(names) == len(set(names))
    for t in TRAINERS:
        assert t.source and t.label and t.norm, t.name
        if t.family == "verl" and t.keys is not None:
            from phantom.audit.verl_keys import key_set

            assert key_set(t.keys) is not None, t.name


def test_entropy_reads_its_own_reward_model_section():
    doc = read_config(str(DIR / "entropy_overlong_no_filter.sh"))
    assert doc.entrypoint == "recipe.entropy"
    (inp,) = audit([str(DIR / "entropy_overlong_no_filter.sh")]).inputs
    assert not any(f.rule in ("PH040", "PH042") for f in inp.findings)  # live keys, not legacy ones
    assert any("overlong" in e.text for e in inp.facts.evidence)
