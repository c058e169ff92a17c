"""Experiment specs for real verl runs, and their translation into verl's Hydra overrides.

A :class:`VerlSpec` names one run in the paper's terms (arm, estimator, lambda, DAPO filter, ...).
:func:`to_overrides` turns it into the exact ``key=value`` list handed to
``python -m verl.trainer.main_ppo``; :func:`compose` builds verl's own config from those overrides
with Hydra's compose API and runs verl's ``validate_config``, so a typo or an inconsistent batch size
fails in seconds instead of after Ray has started ~30 processes. Presets (``phantom/verl/presets/*.yaml``)
hold the paper's settings; a preset may ``extends:`` another.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from phantom import rewards
from phantom.advantages import GATES
from phantom.verl.reward import check_reward_kwargs

__all__ = ["ARMS", "ESTIMATORS", "BACKENDS", "TRAINERS", "DAPO_METRICS", "VerlSpec", "presets", "load_preset",
           "make_spec", "to_overrides", "compose", "TINY_MODEL", "tiny_root"]

ARMS = GATES  # which groups get zero advantage: none, score, outcome
ESTIMATORS = ("grpo", "drgrpo", "gspo")
BACKENDS = ("cpu", "gpu")
TRAINERS = ("v1", "legacy", "recipe_dapo")
DAPO_METRICS = ("acc", "score", "reward")
#: ``model: tiny`` on the CPU backend means the project's random Qwen2 (built locally on first use).
TINY_MODEL = "tiny"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class VerlSpec:
    """One verl run. Paths are resolved to absolute ones by :func:`make_spec`."""

    arm: str = "outcome"
    estimator: str = "grpo"
    lam: float = 0.3
    kind: str = "length_short"
    noise_p: float = 0.0
    model: str = TINY_MODEL
    train_files: tuple[str, ...] = ()
    val_files: tuple[str, ...] = ()
    steps: int = 2
    train_batch_size: int = 4
    rollout_n: int = 4
    val_freq: int = -1
    val_before_train: bool = True
    lr: float = 1e-4
    lora_rank: int = 0
    lora_alpha: int = 32
    kl_loss_coef: float = 0.0
    max_prompt_length: int = 64
    max_response_length: int = 16
    temperature: float = 1.0
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    seed: int = 42
    backend: str = "cpu"
    n_gpus_per_node: int = 1
    nnodes: int = 1
    ray_address: str | None = None
    trainer: str = "v1"
    dapo: bool = False
    dapo_metric: str = "acc"
    gen_batch_size: int | None = None
    max_num_gen_batches: int = 0
    max_inflight_gen_batches: int = 1
    recipe_path: str | None = None
    rollout_batching: bool = True
    reward_options: dict = field(default_factory=dict)  # more reward kwargs: cap, checker, l_max, l_cache, noise_seed
    extra_overrides: tuple[str, ...] = ()
    preset: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The spec as stored in the manifest (and hashed): ``preset`` is a label, empty options are left out."""
        d = dataclasses.asdict(self)
        d.pop("preset")
        if not d["reward_options"]:
            d.pop("reward_options")
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @property
    def estimator_name(self) -> str:
        return f"phantom_grpo_{self.arm}"

    @property
    def reward_kwargs(self) -> dict[str, Any]:
        return {"lam": self.lam, "kind": self.kind, "noise_p": self.noise_p, **self.reward_options}


def presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.name[:-5] for p in resources.files("phantom.verl").joinpath("presets").iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """A preset's fields, with ``extends:`` chains merged (the child wins)."""
    if name not in presets():
        raise ValueError(f"preset={name!r} is unknown; allowed: {', '.join(presets())}")
    data = yaml.safe_load(resources.files("phantom.verl").joinpath("presets", f"{name}.yaml").read_text()) or {}
    parent = data.pop("extends", None)
    data.pop("description", None)
    return {**(load_preset(parent) if parent else {}), **data}


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is unknown; allowed: {', '.join(allowed)}")


def _positive(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an integer >= {minimum}")
    return value


def _files(name: str, value: Any, base: Path) -> tuple[str, ...]:
    items = [value] if isinstance(value, (str, os.PathLike)) else list(value or [])
    if not items:
        raise ValueError(f"{name} is empty; give at least one parquet file")
    out = []
    for item in items:
        s = str(item)
        if "://" in s:  # hdfs://, s3://: verl copies them itself
            out.append(s)
            continue
        p = (base / s).resolve()
        if not p.is_file():
            raise FileNotFoundError(f"{name}: {p} does not exist (build data with `phantom data ...`)")
        out.append(str(p))
    return tuple(out)


def _built_model(value: str, root: Path) -> tuple[str, str, str] | None:
    """(model, train, test) for the project's locally built models, else None.

    ``tiny``: a random Qwen2 with addition data (:mod:`phantom.verl.cpu.assets`). ``lab`` or
    ``lab:<profile>``: the CPU lab's SFT checkpoint (``phantom.lab.sft.ensure_sft_model``, trained on
    first use) and its task in verl form (``phantom.verl.data.build_lab``).
    """
    if value == TINY_MODEL:
        from phantom.verl.cpu.assets import ensure_tiny

        tiny = ensure_tiny(tiny_root(root))
        return str(tiny["model"]), str(tiny["train"]), str(tiny["test"])
    if value == "lab" or value.startswith("lab:"):
        from phantom.lab.sft import ensure_sft_model
        from phantom.verl.data import build_lab

        profile = value.partition(":")[2] or "lab"
        artifacts = (root / os.environ.get("PHANTOM_ARTIFACTS", "artifacts")).resolve()
        model = ensure_sft_model(profile, root=artifacts)
        data = artifacts / "data" / f"lab-{Path(model).name}"  # keyed by the checkpoint, so by its task
        if not (data / "test.parquet").is_file():
            build_lab(data, profile=profile)
        return str(model), str(data / "train.parquet"), str(data / "test.parquet")
    return None


def _model(value: str, backend: str, base: Path) -> str:
    p = (base / value).expanduser().resolve()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model: {p} has no config.json (not a Hugging Face model folder)")
        return str(p)
    if backend == "gpu" and _HUB_ID.match(value) and not value.startswith((".", "/", "~")):
        return value  # a Hub id: verl downloads it on the GPU machine
    raise FileNotFoundError(f"model: {p} does not exist" + ("" if backend == "gpu" else " (backend=cpu needs a local model)"))


def make_spec(preset: str | None = None, base: str | os.PathLike[str] | None = None, **fields: Any) -> VerlSpec:
    """Validate a spec (a preset plus field overrides); raise ``ValueError``/``FileNotFoundError`` naming the problem.

    Relative paths are resolved against ``base`` (default: the current directory).
    """
    data = {**(load_preset(preset) if preset else {}), **{k: v for k, v in fields.items() if v is not None}}
    known = {f.name for f in dataclasses.fields(VerlSpec)} - {"preset"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown spec field(s) {unknown}; allowed: {', '.join(sorted(known))}")
    root = Path(base or os.getcwd())
    if isinstance(data.get("arm"), str) and data["arm"].startswith("phantom_grpo_"):
        data["arm"] = data["arm"][len("phantom_grpo_"):]  # accept the estimator's name for the arm
    spec = VerlSpec(**{**data, "preset": preset})
    _check(spec)  # everything cheap first: a typo never waits for a model to be built
    model = str(spec.model)
    if (model == TINY_MODEL or model.split(":")[0] == "lab") and spec.backend != "cpu":
        raise ValueError(f"model={model!r} is a CPU model; give a model path or Hub id for backend=gpu")
    built = _built_model(model, root)
    if built is not None:  # "tiny" / "lab[:profile]": the model (and its data, unless given) built locally
        files = {} if spec.train_files or spec.val_files else {"train_files": [built[1]], "val_files": [built[2]]}
        spec = dataclasses.replace(spec, model=built[0], **files)
    return dataclasses.replace(
        spec,
        model=_model(spec.model, spec.backend, root),
        train_files=_files("train_files", spec.train_files, root),
        val_files=_files("val_files", spec.val_files, root),
        recipe_path=str(Path(spec.recipe_path).resolve()) if spec.recipe_path else None,
        extra_overrides=tuple(spec.extra_overrides),
    )


def _check(spec: VerlSpec) -> None:
    """Field checks that need no file system and no model."""
    _choice("arm", spec.arm, ARMS)
    _choice("estimator", spec.estimator, ESTIMATORS)
    _choice("backend", spec.backend, BACKENDS)
    _choice("trainer", spec.trainer, TRAINERS)
    _choice("dapo_metric", spec.dapo_metric, DAPO_METRICS)
    _choice("kind", spec.kind, rewards.KINDS)
    # lam < 1 keeps outcome == (score > 0): the outcome gate decodes it (and so do the statistics).
    check_reward_kwargs(spec.reward_kwargs)
    for name in ("steps", "train_batch_size", "rollout_n", "max_prompt_length", "max_response_length",
                 "n_gpus_per_node", "nnodes", "max_inflight_gen_batches"):
        _positive(name, getattr(spec, name))
    _positive("lora_rank", spec.lora_rank, 0)
    _positive("max_num_gen_batches", spec.max_num_gen_batches, 0)
    if spec.gen_batch_size is not None:
        _positive("gen_batch_size", spec.gen_batch_size)
    for name in ("lr", "kl_loss_coef", "temperature"):
        value = getattr(spec, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={value!r} is invalid; allowed: a finite number >= 0")
    if not (spec.val_freq == -1 or spec.val_freq >= 1):
        raise ValueError(f"val_freq={spec.val_freq!r} is invalid; allowed: -1 (never) or a step count >= 1")
    if spec.dapo and spec.trainer == "legacy":
        raise ValueError("dapo=True needs trainer=v1 (replay-buffer filter) or trainer=recipe_dapo; "
                         "the legacy trainer has no group filter")
    if spec.trainer == "recipe_dapo":
        if spec.backend == "cpu":
            raise ValueError("trainer=recipe_dapo is for GPU machines (verl-recipe's DAPO trainer drives vLLM)")
        if not spec.recipe_path or not (Path(spec.recipe_path) / "recipe" / "dapo" / "main_dapo.py").is_file():
            raise FileNotFoundError(
                f"recipe_path={spec.recipe_path!r} must be the folder that holds recipe/dapo/main_dapo.py "
                "(git clone https://github.com/verl-project/verl-recipe recipe)")


def tiny_root(base: str | os.PathLike[str] | None = None) -> Path:
    """Where the tiny CPU model and its data are built: ``$PHANTOM_ARTIFACTS/verl_cpu/tiny`` (default ``artifacts``)."""
    return (Path(base or os.getcwd()) / os.environ.get("PHANTOM_ARTIFACTS", "artifacts") / "verl_cpu" / "tiny").resolve()


def _lst(values: tuple[str, ...]) -> str:
    return values[0] if len(values) == 1 else "[" + ",".join(f"'{v}'" for v in values) + "]"


def to_overrides(spec: VerlSpec, run_dir: str | os.PathLike[str], name: str) -> list[str]:
    """verl Hydra overrides for ``spec`` (a validated one: see :func:`make_spec`)."""
    run = Path(run_dir).resolve()
    model = spec.model
    b, n = spec.train_batch_size, spec.rollout_n
    use_kl = spec.kl_loss_coef > 0
    a, r, rw, t = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "reward.custom_reward_function", "trainer"
    o = [
        f"algorithm.adv_estimator={spec.estimator_name}",
        f"algorithm.norm_adv_by_std_in_grpo={spec.estimator != 'drgrpo'}",
        "algorithm.use_kl_in_reward=False",  # the outcome is decoded from the reward's sign
        f"+algorithm.phantom.lam={spec.lam}",
        f"data.train_files={_lst(spec.train_files)}", f"data.val_files={_lst(spec.val_files)}",
        f"data.train_batch_size={b}", f"data.max_prompt_length={spec.max_prompt_length}",
        f"data.max_response_length={spec.max_response_length}", f"data.seed={spec.seed}",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.lora_rank={spec.lora_rank}",
        f"actor_rollout_ref.model.lora_alpha={spec.lora_alpha}",
        f"{a}.optim.lr={spec.lr}", f"{a}.ppo_mini_batch_size={b}",  # one on-policy update per step
        f"{a}.use_kl_loss={use_kl}", f"{a}.kl_loss_coef={spec.kl_loss_coef}",
        f"{r}.n={n}", f"{r}.temperature={spec.temperature}", f"{r}.seed={spec.seed}",
        f"{rw}.path=pkg://phantom.verl.reward", f"{rw}.name=compute_score",
        *(f"+{rw}.reward_kwargs.{k}={v}" for k, v in spec.reward_kwargs.items()),
        f"{t}.logger=[console,file]", f"{t}.project_name=phantom", f"{t}.experiment_name={name}",
        f"{t}.total_training_steps={spec.steps}", f"{t}.test_freq={spec.val_freq}",
        f"{t}.val_before_train={spec.val_before_train}", f"{t}.save_freq=-1",
        f"{t}.default_local_dir={run / 'checkpoints'}",
        f"{t}.n_gpus_per_node={spec.n_gpus_per_node}", f"{t}.nnodes={spec.nnodes}",
        f"{t}.use_v1={spec.trainer == 'v1'}",
        # The file logger and the gate log live in the TaskRunner actor: pass their paths through
        # Ray's runtime env so they also arrive on an existing cluster (not only in local children).
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={run / 'metrics.jsonl'}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.PHANTOM_GATE_LOG={run / 'gate.jsonl'}",
    ]
    if spec.estimator == "gspo":
        o += [f"{a}.policy_loss.loss_mode=gspo", f"{a}.loss_agg_mode=seq-mean-token-mean"]
    if spec.clip_ratio_low is not None:
        o.append(f"{a}.clip_ratio_low={spec.clip_ratio_low}")
    if spec.clip_ratio_high is not None:
        o.append(f"{a}.clip_ratio_high={spec.clip_ratio_high}")
    if spec.dapo:
        o += ["algorithm.filter_groups.enable=True", f"algorithm.filter_groups.metric={spec.dapo_metric}",
              f"algorithm.filter_groups.max_num_gen_batches={spec.max_num_gen_batches}",
              f"algorithm.filter_groups.max_inflight_gen_batches={spec.max_inflight_gen_batches}"]
    if spec.trainer == "recipe_dapo":
        # The recipe's YAML finds verl's config only from a verl checkout; point Hydra at the package.
        o += [f"data.gen_batch_size={spec.gen_batch_size or b}", "hydra.searchpath=[pkg://verl.trainer.config]"]
    if spec.ray_address:
        o.append(f"+ray_kwargs.ray_init.address={spec.ray_address}")
    o += _cpu_overrides(spec, run) if spec.backend == "cpu" else _gpu_overrides(spec)
    return o + list(spec.extra_overrides)


def _cpu_overrides(spec: VerlSpec, run: Path) -> list[str]:
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    micro = spec.train_batch_size * spec.rollout_n
    ranks = spec.n_gpus_per_node * spec.nnodes
    o = [
        "actor_rollout_ref.model.use_remove_padding=False",  # the rmpad path wants flash-attn varlen
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # verl's default is FA2
        f"{a}.strategy=fsdp2", f"{a}.ppo_micro_batch_size_per_gpu={micro}",
        f"{a}.use_torch_compile=False", f"{a}.fsdp_config.use_torch_compile=False",
        f"{r}.name=hf", f"{r}.tensor_model_parallel_size=1", f"{r}.load_format=auto",
        f"{r}.log_prob_micro_batch_size_per_gpu={micro}", f"{r}.agent.num_workers=1",
        f"{r}.max_num_seqs={1024 if spec.rollout_batching else 1}",
        "reward.num_workers=1", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "data.dataloader_num_workers=0", "trainer.device=cpu",
        # fp32 training (verl's default is bf16 mixed precision): faster on CPU, and the actor then
        # recomputes the rollout server's fp32 log-probs to float rounding (rollout_probs_diff ~1e-7).
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        # Each FSDP rank's bundle asks for 3 CPUs + 1 logical GPU: declare enough of both.
        f"ray_kwargs.ray_init.num_cpus={max(8, 3 * ranks + 4)}", f"+ray_kwargs.ray_init.num_gpus={ranks}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.PHANTOM_ROLLOUT_LOG={run / 'rollout.jsonl'}",
    ]
    if spec.kl_loss_coef > 0:
        o.append(f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}")
    if spec.lora_rank > 0:
        o.append("actor_rollout_ref.model.lora.merge=True")  # the hf server takes merged weights
    return o


def _gpu_overrides(spec: VerlSpec) -> list[str]:
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    o = [f"{a}.ppo_micro_batch_size_per_gpu=8", f"{r}.name=vllm", f"{r}.tensor_model_parallel_size=1",
         f"{r}.log_prob_micro_batch_size_per_gpu=16", f"{r}.gpu_memory_utilization=0.5"]
    if spec.lora_rank > 0:
        o.append(f"{r}.load_format=safetensors")  # verl's LoRA docs: the rollout loads real weights
    if spec.kl_loss_coef > 0:
        o.append("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16")
    return o


def compose(overrides: list[str], trainer: str = "v1", recipe_path: str | None = None, validate: bool = True) -> Any:
    """verl's config composed from ``overrides`` and (``validate=True``) checked by verl's ``validate_config``.

    Raises ``ValueError`` with Hydra's or verl's message; ``hydra.*`` overrides are skipped (they
    configure the launcher process, not the config). verl's validation also instantiates the rollout
    config, which for ``rollout.name=vllm`` requires vLLM to be installed: on a CPU-only machine compose
    GPU specs with ``validate=False``.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    cfg_overrides = [x for x in overrides if not x.startswith("hydra.")]
    GlobalHydra.instance().clear()
    try:
        if trainer == "recipe_dapo":
            cfg_overrides.append("hydra.searchpath=[pkg://verl.trainer.config]")
            ctx = initialize_config_dir(str(Path(recipe_path or ".") / "recipe" / "dapo" / "config"), version_base=None)
            name = "dapo_trainer"
        else:
            ctx, name = initialize_config_module("verl.trainer.config", version_base=None), "ppo_trainer"
        with ctx:
            cfg = hydra_compose(config_name=name, overrides=cfg_overrides)
        if validate:
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils.config import validate_config

            with warnings.catch_warnings():  # "Disabled critic as adv_estimator != gae": expected for GRPO
                warnings.filterwarnings("ignore", message="Disabled critic")
                validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except Exception as exc:  # Hydra/OmegaConf/verl raise many types; the caller wants one
        raise ValueError(f"verl config rejected the overrides: {type(exc).__name__}: {exc}") from exc
    finally:
        GlobalHydra.instance().clear()
    return cfg
