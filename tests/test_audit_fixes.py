"""Every printed fix is checked against the real thing.

verl: for each finding with override fixes, on every verl fixture launch script and override list,
verl 0.9.1's own Hydra config is composed (``phantom.verl.spec.compose``) from the input's overrides
with the finding's keys replaced by the printed fix, and the composed config must hold what the fix
says (``fix_expect``). Findings that say the original is rejected (PH042, PH043) must see Hydra reject
it. The estimator fixes (PH010, PH011) are also run through verl's ``compute_advantage`` on an all-fail
group with shaping spread: the original run divides by the std, the fixed one does not.

TRL: each printed ``GRPOConfig`` fix is constructed with TRL's real class when TRL is installed, and
checked against the recorded field table of the pinned TRL (which this file keeps honest).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from phantom.audit import audit, read_configs
from phantom.audit.model import Unresolved
from phantom.audit.trl import GRPO_FIELDS, OUTCOME_GATED_SNIPPET, check_kwargs, scale_rewards_fix

FIX = Path(__file__).parent / "fixtures" / "audit"
RECIPE = FIX / "recipe_stub"
HAS_VERL = importlib.util.find_spec("verl") is not None and importlib.util.find_spec("hydra") is not None
HAS_TRL = importlib.util.find_spec("trl") is not None

VERL_INPUTS = sorted([p for p in (FIX / "shapes").iterdir() if p.suffix in (".sh", ".slurm")]
                     + [p for p in (FIX / "trainers").iterdir() if p.suffix == ".sh"]
                     + [FIX / "verl_dapo_acc.sh", FIX / "verl_dapo_score.sh", FIX / "verl_legacy_keys.sh",
                        FIX / "overrides_filter_acc.txt"])
#: entry points whose config is composed here: verl's own (from the wheel) and verl-recipe's DAPO (the stub)
COMPOSED = ("main_ppo", "main_ppo_v0", "recipe", "recipe.dapo", "fully_async", None)


def _words(doc) -> list[str]:
    """The input's overrides as words, unresolved values replaced by a placeholder."""
    out = []
    for key, e in doc.entries.items():
        raw = (e.raw or "").strip()
        if not raw.lstrip("+~").startswith(key + "="):
            continue  # a child of a dict-valued override, or not an override word
        prefix = raw[: len(raw) - len(raw.lstrip("+~"))]
        if isinstance(e.value, Unresolved):
            raw = f"{prefix}{key}=UNRESOLVED"
        out.append(raw)
    return out


def _cases():
    for p in VERL_INPUTS:
        try:
            docs = read_configs(str(p))
        except Exception:  # noqa: BLE001 - inputs without a verl command are not cases here
            continue
        rep = audit([str(p)])
        for i, (doc, inp) in enumerate(zip(docs, rep.inputs)):
            if doc.kind != "verl" or doc.entrypoint not in COMPOSED or doc.config_name is not None:
                continue
            rejected = [f for f in inp.findings if f.rule in ("PH042", "PH043", "PH044", "PH045")]
            for f in inp.findings:
                if f.fix_overrides:
                    yield pytest.param(doc, f, [r for r in rejected if r is not f], id=f"{p.name}#{i + 1}-{f.rule}")


CASES = list(_cases())


def test_there_are_fixes_to_check():
    rules = {c.values[1].rule for c in CASES}
    assert {"PH001", "PH010", "PH011", "PH012", "PH040", "PH042", "PH043"} <= rules, rules


@pytest.fixture(scope="module")
def compose():
    if not HAS_VERL:
        pytest.skip("verl/hydra not installed")
    from phantom.verl.spec import compose as _compose

    def run(doc, words):
        if doc.entrypoint == "fully_async":
            return _compose_fully_async(words)
        trainer = "recipe_dapo" if doc.entrypoint in ("recipe", "recipe.dapo") else "v1"
        return _compose(words, trainer=trainer, recipe_path=str(RECIPE), validate=False)

    return run


def _compose_fully_async(words):
    """verl's fully-async trainer config (fully_async_ppo_trainer on ppo_trainer), from the installed wheel."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder = Path(importlib.util.find_spec("verl").origin).parent / "experimental" / "fully_async_policy" / "config"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(folder), version_base=None):
            return compose(config_name="fully_async_ppo_trainer", overrides=words)
    except Exception as exc:  # noqa: BLE001 - Hydra raises several types; the test wants "rejected"
        raise ValueError(f"rejected: {exc}") from exc
    finally:
        GlobalHydra.instance().clear()


def test_every_verl_fix_says_how_it_was_checked():
    for p in VERL_INPUTS:
        for f in audit([str(p)]).findings:
            if f.fix_overrides:
                assert f.fix_status, (p.name, f.rule)


def _select(cfg, key):
    from omegaconf import OmegaConf

    v = OmegaConf.select(cfg, key, throw_on_missing=False)
    return OmegaConf.to_container(v) if hasattr(v, "_content") else v


def _apply(words: list[str], finding) -> list[str]:
    """``words`` with the finding's keys (and the keys its fix sets) replaced by its fix."""
    drop = {w.split("=", 1)[0].lstrip("+~") for w in finding.fix_overrides}
    if finding.rule in ("PH040", "PH042", "PH043", "PH044", "PH045"):
        drop |= set(finding.keys)
    return [w for w in words if w.split("=", 1)[0].lstrip("+~") not in drop] + list(finding.fix_overrides)


@pytest.mark.parametrize("doc, finding, rejected", CASES)
def test_verl_fix_composes_with_the_intended_effect(compose, doc, finding, rejected):
    if finding.rule in ("PH042", "PH043", "PH044", "PH045"):
        with pytest.raises(ValueError, match="not in struct|Could not override|Could not append|Key"):
            compose(doc, _words(doc))  # the original is rejected, as the finding says
    base = _words(doc)
    for other in rejected:  # an input that does not compose as written: apply those fixes first
        base = _apply(base, other)
    cfg = compose(doc, _apply(base, finding))
    assert finding.fix_expect, finding.rule
    for key, value in finding.fix_expect.items():
        assert _select(cfg, key) == value, (key, finding.fix)


def _all_fail_group_advantages(cfg) -> list[float]:
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    scores = torch.tensor([-0.05, -0.10, -0.15, -0.20])  # all wrong, shaping spread only
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = scores
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": torch.ones(4, 3)},
                               non_tensors={"uid": np.array(["g"] * 4, dtype=object)})
    out = compute_advantage(data, adv_estimator=cfg.algorithm.adv_estimator,
                            norm_adv_by_std_in_grpo=cfg.algorithm.get("norm_adv_by_std_in_grpo", True),
                            config=cfg.algorithm)
    return out.batch["advantages"][:, 0].tolist()


@pytest.mark.parametrize("name, rule", [("export_vectorized_geo3k.sh", "PH011"), ("arrays_geo3k.sh", "PH010"),
                                        ("vectorized_drgrpo_gsm8k.sh", "PH011")])
def test_estimator_fix_removes_std_normalization_in_verl(compose, name, rule):
    (doc,) = read_configs(str(FIX / "shapes" / name))
    (inp,) = audit([str(FIX / "shapes" / name)]).inputs
    f = next(f for f in inp.findings if f.rule == rule)
    before = _all_fail_group_advantages(compose(doc, _words(doc)))
    after = _all_fail_group_advantages(compose(doc, _words(doc) + list(f.fix_overrides)))
    assert max(abs(a) for a in before) > 1.0  # std-normalized: the phantom, full size
    assert after == pytest.approx([0.075, 0.025, -0.025, -0.075], abs=1e-6)  # r - mean: scales with the shaping


# ------------------------------------------------------------------------------------------------
# TRL
# ------------------------------------------------------------------------------------------------
TRL_INPUTS = ["trl_cli_flags.sh", "trl_openr1_recipe.yaml", "trl_single_continuous.py", "trl_normalize_then_sum.json",
              "trl_env_kwargs.py", "trl_replay_buffer.py", "accelerate_openr1.sh"]


@pytest.fixture(scope="module")
def grpo_config():
    if not HAS_TRL:
        pytest.skip("trl is not installed: the recorded field table is checked instead")
    from trl import GRPOConfig

    return GRPOConfig


def _trl_fixes(version=None):
    for name in TRL_INPUTS:
        for f in audit([str(FIX / "shapes" / name)], trl_version=version).findings:
            if f.fix_kwargs:
                yield name, f


@pytest.mark.parametrize("version", [None, "0.19", "1.16"])
def test_trl_fixes_match_the_recorded_field_table(version):
    fixes = list(_trl_fixes(version))
    assert fixes
    for name, f in fixes:
        assert check_kwargs(f.fix_kwargs) == [], (name, f.rule)
        assert OUTCOME_GATED_SNIPPET in f.fix, (name, f.rule)
    text, kwargs = scale_rewards_fix(version)
    if version is None:
        assert "scale_rewards='none'" in text and "scale_rewards=False" in text  # says both
    elif version == "0.19":
        assert kwargs["scale_rewards"] is False
    else:
        assert kwargs["scale_rewards"] == "none" and "False" not in text


def test_trl_fixes_construct_grpo_config(grpo_config, tmp_path):
    seen = 0
    for name, f in _trl_fixes():
        cfg = grpo_config(output_dir=str(tmp_path), bf16=False, use_cpu=True, **f.fix_kwargs)
        for k, v in f.fix_kwargs.items():
            assert getattr(cfg, k) == v, (name, k)
        seen += 1
    assert seen
    old = grpo_config(output_dir=str(tmp_path), bf16=False, use_cpu=True, **scale_rewards_fix("0.19")[1])
    assert old.scale_rewards == "none"  # TRL 1.16 still maps the old bool


def test_recorded_field_table_is_trls(grpo_config):
    fields = {f.name: f for f in dataclasses.fields(grpo_config)}
    for name, (typ, default, _allowed) in GRPO_FIELDS.items():
        assert name in fields, name
        t = fields[name].type
        assert (t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")) == typ, name
        assert fields[name].default == default, name
    help_text = fields["loss_type"].metadata["help"]
    for value in GRPO_FIELDS["loss_type"][2]:
        assert f"'{value}'" in help_text
