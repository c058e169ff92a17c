"""Presets against verl 0.9.1's own config and against the paper's artifact, row by row.

* every preset value carries its source in the preset file (paper §N, the artifact, or "ours, because");
* every preset composes with verl's Hydra config and passes verl's ``validate_config`` under both
  trainers (v1 and legacy; DAPO presets: v1 and the recipe trainer, legacy refused);
* the paper presets' composed config equals the artifact's launcher value by value;
* the GPU backend's machine-dependent choices (attention, memory rows) and ``phantom verl overrides``
  before any input exists.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer")

from omegaconf import OmegaConf  # noqa: E402

from phantom.verl import gpu  # noqa: E402
from phantom.verl.launch import main  # noqa: E402
from phantom.verl.spec import compose, load_preset, make_spec, preset_path, presets, to_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "tests" / "fixtures" / "verl_recipe"
GPU32 = gpu.Hardware(gpus=(("RTX 5090", 31.4),), flash_attn=None, flash_attn_error="ModuleNotFoundError", probed=True)
PAPER = ["paper_gsm8k", "paper_math", "paper_gspo", "paper_drgrpo", "paper_dapo"]

# The artifact that produced the paper's numbers: verl-recipe PR #125, gsm8k_outcome_gating/run_gate_arm.sh
# (verl e52747a, vLLM 0.11, torch 2.8; field facts 2026-12). Its Hydra flags, as (verl key, value); paths,
# names and loggers left out. Each must hold in the config our paper presets compose to on verl 0.9.1.
ARTIFACT = [
    ("data.train_batch_size", 32),
    ("data.max_prompt_length", 512),
    ("data.max_response_length", 512),
    ("data.filter_overlong_prompts", True),
    ("data.truncation", "error"),
    ("actor_rollout_ref.model.use_remove_padding", False),
    ("actor_rollout_ref.model.override_config.attn_implementation", "sdpa"),
    ("actor_rollout_ref.model.lora_rank", 32),
    ("actor_rollout_ref.model.lora_alpha", 32),
    ("actor_rollout_ref.model.target_modules", "all-linear"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
    ("actor_rollout_ref.actor.optim.lr", 1e-4),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 16),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 2),
    ("actor_rollout_ref.actor.use_kl_loss", True),
    ("actor_rollout_ref.actor.kl_loss_coef", 0.001),
    ("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
    ("actor_rollout_ref.actor.entropy_coeff", 0),
    ("actor_rollout_ref.actor.fsdp_config.param_offload", False),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", False),
    ("actor_rollout_ref.rollout.name", "vllm"),
    ("actor_rollout_ref.rollout.max_model_len", 2048),
    ("actor_rollout_ref.rollout.enforce_eager", True),
    ("actor_rollout_ref.rollout.free_cache_engine", False),
    ("actor_rollout_ref.rollout.load_format", "safetensors"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", 1),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", 0.3),
    ("actor_rollout_ref.rollout.n", 5),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 2),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 2),
    ("actor_rollout_ref.ref.fsdp_config.param_offload", True),
    ("actor_rollout_ref.model.lora.merge", False),  # not set by the artifact: verl's default, adapters unmerged
    ("algorithm.use_kl_in_reward", False),
    ("trainer.use_v1", False),
    ("trainer.critic_warmup", 0),
    ("trainer.val_before_train", True),
    ("trainer.n_gpus_per_node", 1),
    ("trainer.nnodes", 1),
    ("trainer.save_freq", -1),
    ("trainer.test_freq", 5),
    ("trainer.total_epochs", 1),
    ("trainer.total_training_steps", 40),
]
# Where ours differs on purpose: (key, artifact value, ours, why).
DIFFERS = [
    ("algorithm.adv_estimator", "grpo", "phantom_grpo_outcome", "the gate is a registered estimator, not a patch"),
    ("reward.custom_reward_function.path", None, "pkg://phantom.verl.reward", "the artifact patched verl's gsm8k scorer"),
    ("data.seed", None, 42, "a run folder names its seed (the artifact's runs 1-3 used the framework default)"),
    ("trainer.logger", ["console", "tensorboard"], ["console", "file"], "the file logger is the run's metrics.jsonl"),
]
SOURCE = re.compile(r"#\s*(paper §\d+|artifact: |ours, because )")


def _spec(preset: str, **fields):
    return make_spec(preset, check_inputs=False, base=ROOT, **fields)


def _cfg(preset: str, trainer: str | None = None, hw=GPU32, notes=None, **fields):
    """(spec, composed and validated config); composed once per distinct call (a compose takes ~1 s)."""
    key = (preset, trainer, hw, tuple(sorted(fields.items())))
    if key not in _CACHE or notes is not None:
        spec = _spec(preset, **({"trainer": trainer} if trainer else {}), **fields)
        o = to_overrides(spec, "/tmp/phantom-test/r", "r", hw)
        _CACHE[key] = spec, compose(o, spec.trainer, spec.recipe_path, validate=True, notes=notes)
    return _CACHE[key]


_CACHE: dict = {}


@pytest.mark.parametrize("preset", presets())
def test_every_preset_value_names_its_source(preset):
    lines = preset_path(preset).read_text().splitlines()
    keys = [ln for ln in lines if re.match(r"^[a-z_]+:", ln) and not ln.startswith(("description:", "extends:"))]
    assert keys, preset
    unsourced = [ln for ln in keys if not SOURCE.search(ln)]
    assert not unsourced, f"{preset}: values without a source comment: {unsourced}"
    assert set(load_preset(preset)) >= {re.match(r"^([a-z_]+):", ln).group(1) for ln in keys}


@pytest.mark.parametrize("trainer", ["v1", "legacy"])
@pytest.mark.parametrize("preset", presets())
def test_every_preset_composes_and_validates_under_both_trainers(preset, trainer):
    spec0 = _spec(preset)
    if spec0.dapo and trainer == "legacy":
        with pytest.raises(ValueError, match="legacy trainer has no group filter"):
            _spec(preset, trainer="legacy")
        spec, cfg = _cfg(preset, trainer="recipe_dapo", recipe_path=str(RECIPE))  # the paper's §8 trainer
        assert cfg.data.gen_batch_size == 96 and cfg.algorithm.filter_groups.max_num_gen_batches == 10
        assert cfg.reward.reward_manager.name == "dapo" and cfg.algorithm.filter_groups.metric == "acc"
        return
    spec, cfg = _cfg(preset, trainer=trainer)
    assert cfg.trainer.use_v1 is (trainer == "v1")
    assert cfg.algorithm.adv_estimator == spec.estimator_name
    assert cfg.actor_rollout_ref.rollout.name == ("hf" if spec.backend == "cpu" else "vllm")


def test_paper_presets_default_to_the_artifacts_trainer():
    assert {p: _spec(p).trainer for p in PAPER} == {**dict.fromkeys(PAPER[:4], "legacy"), "paper_dapo": "v1"}
    assert _spec("gpu_smoke").trainer == "v1" and _spec("cpu_lora_kl").trainer == "v1"


@pytest.mark.parametrize("preset", PAPER)
@pytest.mark.parametrize(("key", "value"), ARTIFACT, ids=[k for k, _ in ARTIFACT])
def test_paper_presets_equal_the_artifact_row_by_row(preset, key, value):
    trainer = "recipe_dapo" if preset == "paper_dapo" else None
    fields = {"recipe_path": str(RECIPE)} if trainer else {}
    _, cfg = _cfg(preset, trainer=trainer, **fields)
    if preset == "paper_dapo" and key == "trainer.use_v1":
        return  # the recipe trainer is the legacy RayPPOTrainer; its main ignores use_v1
    got = OmegaConf.select(cfg, key)
    assert got == value, f"{preset}: {key} = {got!r}, artifact {value!r}"


@pytest.mark.parametrize(("key", "artifact", "ours", "why"), DIFFERS, ids=[d[0] for d in DIFFERS])
def test_where_paper_presets_differ_from_the_artifact_on_purpose(key, artifact, ours, why):
    _, cfg = _cfg("paper_gsm8k")
    got = OmegaConf.select(cfg, key)
    got = list(got) if OmegaConf.is_list(got) else got
    assert got == ours and got != artifact, why


def test_vllm_lora_check_is_substituted_only_without_vllm():
    notes: list[str] = []
    _cfg("paper_gsm8k", notes=notes)
    assert ("vLLM is not installed here" in " ".join(notes)) is (not __import__("phantom.verl.compose").verl.compose
                                                               .vllm_available())
    with pytest.raises(ValueError, match="lora_rank must be less than or equal to 512"):
        _cfg("paper_gsm8k", lora_rank=600)


def test_gspo_and_dapo_presets_say_what_they_chose():
    spec, cfg = _cfg("paper_gspo")
    a = cfg.actor_rollout_ref.actor
    assert (a.policy_loss.loss_mode, a.loss_agg_mode, a.clip_ratio_low, a.clip_ratio_high) == (
        "gspo", "seq-mean-token-mean", 0.2, 0.2)
    assert "3e-4" in preset_path("paper_gspo").read_text()  # verl's GSPO example, one --set away
    spec, cfg = _cfg("paper_dapo")
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches, fg.max_inflight_gen_batches) == (True, "acc", 10, 3)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 16  # the paper's settings otherwise


@pytest.mark.parametrize(("gib", "params", "row"), [(23.6, None, "24 GB"), (31.4, None, "32 GB"), (47.5, None, "48 GB"),
                                                    (79.2, None, "80+ GB"), (139.8, None, "80+ GB"),
                                                    (79.2, 7.6e9, "48 GB"), (16.0, None, "24 GB"), (None, None, "24 GB")])
def test_memory_rows(gib, params, row):
    assert gpu.memory_row(gib, params)[0].label == row


def test_gpu_smoke_picks_attention_and_memory_from_the_machine():
    big = gpu.Hardware(gpus=(("H100", 79.2),), flash_attn="2.8.3", flash_attn_error=None, probed=True)
    spec, cfg = _cfg("gpu_smoke", hw=big)
    m, a, r = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (m.override_config.attn_implementation, m.use_remove_padding) == ("flash_attention_2", True)
    assert (a.ppo_micro_batch_size_per_gpu, r.log_prob_micro_batch_size_per_gpu, r.gpu_memory_utilization) == (8, 16, 0.4)
    assert (m.lora.merge, a.use_kl_loss, cfg.trainer.use_v1, cfg.trainer.total_training_steps) == (False, True, True, 2)
    spec, cfg = _cfg("gpu_smoke", hw=gpu.Hardware(gpus=(("4090", 23.6),), flash_attn_error="missing", probed=True),
                     micro_batch_size=3)  # an explicit value beats the table
    m, a, r = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (m.override_config.attn_implementation, m.use_remove_padding) == ("sdpa", False)
    assert (a.ppo_micro_batch_size_per_gpu, r.gpu_memory_utilization) == (3, 0.25)
    with pytest.raises(ValueError, match="flash-attn does not import"):
        gpu.resolve(_spec("gpu_smoke", attention="flash_attention_2"), GPU32)
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5 is invalid"):
        _spec("gpu_smoke", gpu_memory_utilization=1.5)


def test_later_fields_at_their_defaults_keep_old_spec_hashes():
    d = _spec("cpu_tiny").to_dict()
    assert "attention" not in d and "micro_batch_size" not in d and "lora_merge" not in d
    assert _spec("paper_gsm8k").to_dict()["micro_batch_size"] == 2


def test_overrides_print_before_data_and_model_exist(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no artifacts/data here, and the Hub model is not downloaded
    monkeypatch.setenv("PHANTOM_ARTIFACTS", str(tmp_path / "artifacts"))  # not the checkout's cache
    assert main(["overrides", "--preset", "paper_gsm8k", "--gpu-memory", "80"]) == 0
    out, err = capsys.readouterr()
    lines = shlex.split(out.replace("\\\n", " "))  # one shell command, continued over lines
    assert lines[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert f"data.train_files={tmp_path}/artifacts/data/gsm8k/train.parquet" in lines
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.3" in lines  # the artifact's, not the 80 GB row
    assert "# missing train_files" in err and "phantom data gsm8k" in err and "memory row 80+ GB" not in err
    assert main(["overrides", "--preset", "gpu_smoke", "--gpu-memory", "80"]) == 0
    out, err = capsys.readouterr()
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.4" in shlex.split(out.replace("\\\n", " "))
    assert "memory row 80+ GB" in err
    assert main(["overrides", "--preset", "cpu_lab"]) == 0  # the lab's warm start ships; its verl data does not
    out, err = capsys.readouterr()
    assert "# missing model" not in err and "# missing train_files" in err and "built on first run" in err
    assert not (tmp_path / "artifacts").exists()


def test_gpu_guide_memory_table_is_the_code_table():
    text = (ROOT / "docs" / "gpu.md").read_text()
    block = text[text.index("| GPU memory | actor micro-batch"):].split("\n\n")[0].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block]
    assert rows == [[r.label, str(r.micro), str(r.logprob_micro), f"{r.gpu_memory_utilization:g}"]
                    for r in sorted(gpu.MEMORY_TABLE, key=lambda r: r.min_gib)]
