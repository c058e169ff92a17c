"""Hydra's composition rules, as the audit applies them, checked against verl's real Hydra config.

The audit decides from a recorded key set (phantom.audit.verl_keys, verl_keys.json) whether an override
composes; here every decision on a table of override words is compared with what Hydra does when it
composes verl 0.9.1's ppo_trainer with that word, the key file is compared with the installed wheel,
and the fixes PH044/PH045 print are composed and must set what they say.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from phantom.audit import audit, read_configs
from phantom.audit.model import ConfigDoc
from phantom.audit.overrides import parse_override
from phantom.audit.schema import Settings
from phantom.audit.verl_keys import DATA, generate, key_set

HAS_VERL = importlib.util.find_spec("verl") is not None and importlib.util.find_spec("hydra") is not None
pytestmark = pytest.mark.skipif(not HAS_VERL, reason="verl/hydra not installed")
FIX = Path(__file__).parent / "fixtures" / "audit"

#: override words: each must compose with verl's Hydra exactly when the audit raises no PH044/PH045 (or the
#: legacy/reward_kwargs rules PH042/PH043) on it
WORDS = [
    "algorithm.adv_estimator=grpo", "data.gen_batch_size=4", "critic.model.path=x", "trainer.logger=[console]",
    "algorithm.filter_groups={enable: True, metric: acc}", "hydra.run.dir=/tmp/x", "++x.y=1",
    "+algorithm.gdpo_reward_keys=[a,b]", "+actor_rollout_ref.rollout.engine_kwargs.vllm.foo=1",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "~algorithm.filter_groups",
    "model_engine=megatron", "ray_kwargs.ray_init.runtime_env.py_executable=null", "+ray_kwargs.ray_init.num_gpus=8",
    "data.custom_cls.path=x", "reward.reward_manager.name=dapo", "+reward.reward_kwargs.max_resp_len=4096",
    "+data.custom_cls.path=x",  # the key is null: `+` may add it
    "+algorithm.filter_groups={enable: True}",  # a dict value merges
    "model_engine=megatron && actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "model_engine=megatron && +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
    "model_engine=veomni && actor_rollout_ref.actor.veomni.enable_full_shard=True",
    # refused
    "+algorithm.filter_groups.enable=True", "+data.train_batch_size=8", "~foo.bar", "data.max_respnse_length=1",
    "algorithm.gdpo_reward_keys=[a,b]", "actor_rollout_ref.rollout.engine_kwargs.vllm.foo=1",
    "actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "reward_model.overlong_buffer.enable=True",
    "reward.reward_kwargs.overlong_buffer_cfg.enable=True", "reward_model.reward_kwargs.x=1",
    "actor_rollout_ref.actor.clip_cov_ratio=0.1", "~data.custom_cls.path",
    "model_engine=megatron && actor_rollout_ref.actor.megatron.grad_offload=True",
    "model_engine=megatron && +actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
]
REFUSING = {"PH042", "PH043", "PH044", "PH045"}


@pytest.fixture(scope="module")
def compose():
    from phantom.verl.compose import compose as _compose

    def run(words: list[str]) -> bool:
        try:
            _compose(words, validate=False)
        except ValueError:
            return False
        return True

    return run


def _audit_refuses(words: list[str]) -> bool:
    from phantom.audit.hydra_rules import hydra_findings
    from phantom.audit.legacy import legacy_findings

    doc = ConfigDoc("words.txt", "verl", "overrides", entrypoint="main_ppo")
    for w in words:
        doc.set(parse_override(w, "words.txt", 1))
    s = Settings(doc)
    return any(f.rule in REFUSING for f in hydra_findings(s) + legacy_findings(s))


@pytest.mark.parametrize("word", WORDS)
def test_audit_agrees_with_hydra(compose, word):
    words = word.split(" && ")
    assert _audit_refuses(words) == (not compose(words)), word


def test_key_file_is_the_installed_wheels():
    recorded = json.loads(DATA.read_text())
    assert recorded == generate()
    ks = key_set("ppo_trainer")
    assert ks.has("algorithm.filter_groups.metric") and not ks.has("reward.reward_kwargs")
    assert ks.is_null("data.custom_cls.path") and key_set("ppo_trainer@megatron").has("actor_rollout_ref.actor.megatron")
    assert ks.is_group("model_engine") and ks.is_group("actor@actor_rollout_ref.actor")


def test_printed_fixes_compose(compose):
    from phantom.verl.compose import compose as raw

    path = FIX / "trainers" / "hydra_rejected.sh"
    (doc,) = read_configs(str(path))
    (inp,) = audit([str(path)]).inputs
    words = [e.raw for e in doc.entries.values() if e.raw and e.raw.lstrip("+~").startswith(e.key + "=")]
    words = [w.replace("$HOME", "/home") for w in words]
    assert not compose(words)
    fixed = list(words)
    for f in inp.findings:
        assert f.rule in ("PH044", "PH045") and f.fix_overrides and f.fix_status
        fixed = [w for w in fixed if w.split("=", 1)[0].lstrip("+~") not in f.keys] + list(f.fix_overrides)
    cfg = raw(fixed, validate=False)
    from omegaconf import OmegaConf

    for f in inp.findings:
        for key, value in f.fix_expect.items():
            assert OmegaConf.select(cfg, key) == value, (key, f.fix)
    near = next(f for f in inp.findings if f.rule == "PH045")
    assert "data.max_response_length" in near.fix  # the typo's nearest key


def test_commands_with_their_own_config_are_not_checked():
    text = ("python3 -m verl.trainer.main_ppo --config-path=/my/cfg --config-name=my_trainer "
            "algorithm.adv_estimator=grpo my_section.anything=1 +algorithm.filter_groups.enable=True\n")
    p = FIX / "trainers" / "_own_config_tmp.sh"
    try:
        p.write_text(text)
        (inp,) = audit([str(p)]).inputs
        assert not any(f.rule in ("PH044", "PH045") for f in inp.findings)
    finally:
        p.unlink(missing_ok=True)
