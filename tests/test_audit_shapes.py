"""Every fixture in tests/fixtures/audit/shapes/ has its verdict asserted: exit code and rule ids.

The fixtures are the project's own, written in the shapes of public verl / verl-recipe / TRL /
open-r1 / TinyZero launch scripts and configs (bash arrays, multi-line quotes, heredocs, branches,
several commands, sweeps, merge keys, control characters, built-in scorers by data source, ray job
submit, torchrun, accelerate, legacy keys). The expected verdicts were decided from the reward and
trainer semantics of verl 0.9.1 and TRL 1.16, not from the tool's output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phantom.audit import audit, main

SHAPES = Path(__file__).parent / "fixtures" / "audit" / "shapes"

E, W, I = "error", "warning", "info"  # noqa: E741
#: name -> (exit code, [rule -> worst severity] per audited input (one per trainer command))
EXPECTED: dict[str, tuple[int, list[dict[str, str]]]] = {
    # verl launch scripts: arrays, branches, built-in scorers
    "arrays_gsm8k_clean.sh": (0, [{}]),  # gsm8k + MATH built-ins are binary
    "arrays_geo3k.sh": (1, [{"PH010": E, "PH002": I}]),  # geo3k = 0.9 acc + 0.1 format
    "arrays_append_filter_score.sh": (1, [{"PH001": E, "PH010": E}]),
    "arrays_filter_default_metric.sh": (1, [{"PH001": E, "PH010": E}]),  # 0.9.1 default metric=reward
    "dict_override.sh": (0, [{}]),  # filter_groups={enable, metric: acc}, dict reward with binary acc
    "ray_multiline_runtime_env.sh": (0, [{}]),  # recipe DAPO, metric=acc, math_dapo binary acc
    "heredoc_config.sh": (0, [{}]),  # heredoc text and comments quoting metric=score are not commands
    "if_branch_metric.sh": (1, [{"PH001": W, "PH010": W}]),  # acc or score: depends on the environment
    "case_branch_norm.sh": (1, [{"PH010": W, "PH002": I}]),  # norm off only in one case branch
    "two_commands.sh": (1, [{"PH001": E, "PH010": E}, {}]),
    "sweep_loop.sh": (1, [{}, {"PH001": E, "PH010": E}]),  # lam=0.0 has no shaping
    "function_arms.sh": (1, [{}, {"PH001": E, "PH010": E}]),
    "default_vars.sh": (1, [{"PH001": E, "PH010": E}]),  # : ${FILTER_METRIC:=score}
    "export_vectorized_geo3k.sh": (1, [{"PH011": E, "PH002": I}]),
    "vectorized_drgrpo_gsm8k.sh": (1, [{"PH011": W}]),  # binary reward: no phantom, but not Dr. GRPO
    "torchrun_legacy_reward.sh": (1, [{"PH040": E, "PH010": W, "PH050": I}]),  # as meant: an unseen custom reward
    "recipe_legacy_overlong.sh": (1, [{"PH042": E}]),  # reward_model.overlong_buffer.*: not in 0.9.1
    "mainppo_plus_legacy_kwargs.sh": (1, [{"PH040": E, "PH010": E}]),  # as meant: overlong penalty, std, no gate
    "mainppo_reward_kwargs_noplus.sh": (1, [{"PH043": E, "PH010": E}]),  # overlong penalty in `reward`
    "nothing_read.sh": (1, [{"PH060": W, "PH050": I}]),
    "nothing_read_config_name.sh": (1, [{"PH060": W, "PH050": I}]),
    "crlf_script.sh": (1, [{"PH061": W}]),
    "gdpo_format_key.sh": (1, [{"PH012": E, "PH050": I}]),
    "countdown_grpo.sh": (1, [{"PH010": E, "PH002": I}]),  # TinyZero countdown: 0.1 format credit
    "train_geo3k.slurm": (1, [{"PH010": E, "PH002": I}]),
    "nohup_background_dapo_acc.sh": (0, [{}]),
    "unknown_source_grpo.sh": (1, [{"PH010": W, "PH050": I}]),
    "no_trainer.sh": (2, []),
    "reward_model_rlhf.sh": (0, [{}]),  # a reward model: no outcome, so no phantom
    # verl YAML
    "verl_merge_keys.yaml": (1, [{"PH001": E, "PH010": E}]),
    "verl_oc_env.yaml": (1, [{"PH001": W, "PH010": W}]),
    "verl_bom_crlf.yaml": (0, [{}]),
    "verl_nul_byte.yaml": (1, [{"PH061": W}]),
    "verl_ansi.yaml": (1, [{"PH061": W, "PH001": E, "PH010": E}]),
    "verl_grpo_vectorized.yaml": (1, [{"PH011": E}]),
    # TRL / open-r1
    "accelerate_openr1.sh": (1, [{"PH020": E, "PH021": I}]),  # reads the --config YAML next to it
    "trl_openr1_recipe.yaml": (1, [{"PH020": E, "PH021": I}]),
    "trl_cli_flags.sh": (1, [{"PH020": E, "PH021": I}]),
    "trl_cli_drgrpo_binary.sh": (0, [{}]),
    "trl_single_binary.yaml": (0, [{}]),  # one binary reward: not shaping
    "trl_single_continuous.py": (1, [{"PH020": E, "PH021": I}]),
    "trl_async.py": (1, [{"PH022": E, "PH021": I}]),
    "trl_replay_buffer.py": (1, [{"PH023": E}]),
    "trl_bool_scale_false.yaml": (0, [{"PH021": I}]),
    "trl_normalize_then_sum.json": (1, [{"PH020": E, "PH021": I}]),
    "trl_env_kwargs.py": (1, [{"PH020": W, "PH021": I}]),
    "trl_dpo_not_grpo.yaml": (2, []),  # TRL, but not GRPO: refused, not "clean"
    "trl_plain_format_bonus.py": (1, [{"PH020": E, "PH021": I}]),
    "trl_outcome_gated.py": (0, [{}]),  # phantom.trl.outcome_gated: the fix, applied
}
_RANK = {E: 0, W: 1, I: 2}


def _rules(inp) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in inp.findings:
        if f.rule not in out or _RANK[f.severity] < _RANK[out[f.rule]]:
            out[f.rule] = f.severity
    return out


def test_every_shape_fixture_has_a_verdict():
    names = {p.name for p in SHAPES.iterdir() if p.is_file()}
    assert names == set(EXPECTED)
    assert len(names) >= 40


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shape_verdict(name):
    code, per_input = EXPECTED[name]
    rep = audit([str(SHAPES / name)])
    got = [_rules(r) for r in rep.inputs if r.error is None]
    assert rep.exit_code == code, [str(r.error) for r in rep.inputs if r.error] or got
    assert got == per_input, [f"{f.rule} {f.severity} {f.message}" for f in rep.findings]
    for r in rep.inputs:
        assert r.error is not None or r.read is not None and r.read.overrides >= 0


def test_arrays_are_read_with_their_values():
    (inp,) = audit([str(SHAPES / "arrays_gsm8k_clean.sh")]).inputs
    assert inp.read.overrides == 14 and inp.read.caller_args
    rep = audit([str(SHAPES / "case_branch_norm.sh")])
    assert "algorithm.norm_adv_by_std_in_grpo" in rep.inputs[0].read.conditional
    text = (SHAPES / "arrays_append_filter_score.sh").read_text().splitlines()
    f = next(f for f in audit([str(SHAPES / "arrays_append_filter_score.sh")]).findings if f.rule == "PH001")
    assert text[f.line - 1].strip() == "algorithm.filter_groups.metric=score"  # the array element's line


def test_branch_value_depends_on_the_environment():
    from phantom.audit import read_config
    from phantom.audit.model import Unresolved

    doc = read_config(str(SHAPES / "if_branch_metric.sh"))
    v = doc.get("algorithm.filter_groups.metric")
    assert isinstance(v, Unresolved) and set(v.options) == {"acc", "score"} and "branch" in v.why


def test_one_audit_per_command_with_context():
    rep = audit([str(SHAPES / "sweep_loop.sh")])
    assert [r.label for r in rep.inputs] == ["command 1 of 2, line 4 [lam=0.0]", "command 2 of 2, line 4 [lam=0.3]"]
    rep = audit([str(SHAPES / "function_arms.sh")])
    assert [r.read.context for r in rep.inputs] == ["in run_arm()", "in run_arm()"]


def test_trl_config_named_by_the_launch_is_read():
    (inp,) = audit([str(SHAPES / "accelerate_openr1.sh")]).inputs
    assert any("trl_openr1_recipe.yaml" in n for n in inp.read.notes)
    assert [t.name for t in inp.facts.trl_funcs] == ["accuracy", "format", "tag_count"]


def test_skip_non_trainer_for_pre_commit_globs(capsys):
    assert main([str(SHAPES / "no_trainer.sh")]) == 2
    assert main([str(SHAPES / "no_trainer.sh"), "--skip-non-trainer"]) == 0
    assert "skipped" in capsys.readouterr().out
