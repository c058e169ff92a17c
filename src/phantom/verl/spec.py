"""Experiment specs for real verl runs, and their translation into verl's Hydra overrides.

A :class:`VerlSpec` names one run in the paper's terms (arm, estimator, lambda, DAPO filter, ...).
:func:`to_overrides` turns it into the exact ``key=value`` list handed to
``python -m verl.trainer.main_ppo``; :func:`phantom.verl.compose.compose` builds verl's own config from
those overrides and runs verl's ``validate_config``. Presets (``phantom/verl/presets/*.yaml``) hold the
paper's settings, each value with its source in a comment; a preset may ``extends:`` another.

Machine-dependent settings (attention kernel, micro-batches, vLLM's memory share) stay ``None`` /
``"auto"`` in a spec, so a spec names an experiment, not a machine: :func:`phantom.verl.plan.make_plan`
resolves them once for the machine at hand, :func:`to_overrides` builds the command from that plan,
and the run's manifest records it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from phantom import rewards
from phantom.advantages import GATES
from phantom.verl.compose import compose
from phantom.verl.inputs import (
    TINY_MODEL,
    built_model,
    inputs_status,
    resolve_files,
    resolve_model,
    tiny_root,
)
from phantom.verl.reward import check_reward_kwargs

__all__ = ["ARMS", "ESTIMATORS", "BACKENDS", "TRAINERS", "DAPO_METRICS", "ATTENTIONS", "KL_TYPES", "VerlSpec",
           "presets", "load_preset", "preset_path", "make_spec", "inputs_status", "to_overrides", "compose",
           "TINY_MODEL", "tiny_root"]

ARMS = GATES  # which groups get zero advantage: none, score, outcome
ESTIMATORS = ("grpo", "drgrpo", "gspo")
BACKENDS = ("cpu", "gpu")
TRAINERS = ("v1", "legacy", "recipe_dapo")
#: ``algorithm.filter_groups.metric`` values a phantom run may ask for: keys of phantom's reward dict and verl's
#: ``reward`` (the pre-KL sum of ``rm_scores``); ``default`` emits no metric, so verl 0.9.1's own default applies
#: (``reward`` in ``ppo_trainer.yaml``, verl PR #7792): the one-flag configuration a user gets.
DAPO_METRICS = ("default", "acc", "score", "reward", "outcome")
ATTENTIONS = ("auto", "sdpa", "flash_attention_2")
KL_TYPES = tuple(k + p for k in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3") for p in ("", "+"))


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
    dapo_metric: str = "acc"  # default: no metric override (verl 0.9.1's `reward`)
    gen_batch_size: int | None = None
    max_num_gen_batches: int = 0
    max_inflight_gen_batches: int = 1
    recipe_path: str | None = None
    rollout_batching: bool = True
    reward_options: dict = field(default_factory=dict)  # more reward kwargs: cap, checker, l_max, l_cache, noise_seed
    extra_overrides: tuple[str, ...] = ()
    preset: str | None = field(default=None, compare=False)
    # Fields below were added later; at their defaults they are left out of to_dict() (and so of the
    # spec hash), so earlier run folders keep their identity. None = verl's default, or (micro-batches,
    # memory) the backend's choice for the machine; "auto" means the same.
    mini_batch_size: int | None = None  # actor.ppo_mini_batch_size; None = train_batch_size (1 update/step)
    micro_batch_size: int | str | None = None  # actor.ppo_micro_batch_size_per_gpu
    logprob_micro_batch_size: int | str | None = None  # rollout/ref log_prob_micro_batch_size_per_gpu
    gpu_memory_utilization: float | str | None = None  # rollout.gpu_memory_utilization (vLLM)
    attention: str = "auto"  # auto: flash_attention_2 + remove-padding if flash-attn imports, else sdpa
    lora_merge: bool | None = None  # model.lora.merge; None: verl's False on GPU, True on the CPU backend
    kl_loss_type: str | None = None  # actor.kl_loss_type
    gradient_checkpointing: bool | None = None  # model.enable_gradient_checkpointing
    enforce_eager: bool | None = None  # rollout.enforce_eager (vLLM without CUDA graphs)
    free_cache_engine: bool | None = None  # rollout.free_cache_engine
    max_model_len: int | None = None  # rollout.max_model_len
    filter_overlong_prompts: bool | None = None  # data.filter_overlong_prompts
    ref_param_offload: bool | None = None  # ref.fsdp_config.param_offload
    total_epochs: int | None = None  # trainer.total_epochs
    val_max_samples: int | None = None  # data.val_max_samples (None: the whole held-out file)
    lr_warmup_steps: int | None = None  # actor.optim.lr_warmup_steps (linear warm-up, in training steps)

    def to_dict(self) -> dict[str, Any]:
        """The spec as stored in the manifest (and hashed): ``preset`` is a label, defaults of later fields are left out."""
        d = dataclasses.asdict(self)
        d.pop("preset")
        if not d["reward_options"]:
            d.pop("reward_options")
        for f in dataclasses.fields(self):
            if f.name in _LATER and d[f.name] == f.default:
                d.pop(f.name)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @property
    def estimator_name(self) -> str:
        return f"phantom_grpo_{self.arm}"

    @property
    def reward_kwargs(self) -> dict[str, Any]:
        return {"lam": self.lam, "kind": self.kind, "noise_p": self.noise_p, **self.reward_options}


_LATER = {f.name for f in dataclasses.fields(VerlSpec)[[f.name for f in dataclasses.fields(VerlSpec)].index("mini_batch_size"):]}
#: Later fields that map one to one onto a verl key (emitted only when set).
_VERL_KEYS = {
    "kl_loss_type": "actor_rollout_ref.actor.kl_loss_type",
    "enforce_eager": "actor_rollout_ref.rollout.enforce_eager",
    "free_cache_engine": "actor_rollout_ref.rollout.free_cache_engine",
    "max_model_len": "actor_rollout_ref.rollout.max_model_len",
    "filter_overlong_prompts": "data.filter_overlong_prompts",
    "ref_param_offload": "actor_rollout_ref.ref.fsdp_config.param_offload",
    "total_epochs": "trainer.total_epochs",
    "val_max_samples": "data.val_max_samples",
    "lr_warmup_steps": "actor_rollout_ref.actor.optim.lr_warmup_steps",
}


def presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.name[:-5] for p in resources.files("phantom.verl").joinpath("presets").iterdir() if p.name.endswith(".yaml"))


def preset_path(name: str) -> Path:
    """The preset's YAML file (each value there carries its source in a comment)."""
    if name not in presets():
        raise ValueError(f"preset={name!r} is unknown; allowed: {', '.join(presets())}")
    return Path(str(resources.files("phantom.verl").joinpath("presets", f"{name}.yaml")))


def load_preset(name: str) -> dict[str, Any]:
    """A preset's fields, with ``extends:`` chains merged (the child wins)."""
    data = yaml.safe_load(preset_path(name).read_text()) or {}
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


def make_spec(preset: str | None = None, base: str | os.PathLike[str] | None = None, check_inputs: bool = True,
              **fields: Any) -> VerlSpec:
    """Validate a spec (a preset plus field overrides); raise ``ValueError``/``FileNotFoundError`` naming the problem.

    Relative paths are resolved against ``base`` (default: the current directory). ``check_inputs=False``
    resolves model and data paths without requiring them to exist (and builds nothing): enough to print
    the command; :func:`inputs_status` then says what is missing.
    """
    data = {**(load_preset(preset) if preset else {}), **{k: v for k, v in fields.items() if v is not None}}
    known = {f.name for f in dataclasses.fields(VerlSpec)} - {"preset"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown spec field(s) {unknown}; allowed: {', '.join(sorted(known))}")
    root = Path(base or os.getcwd())
    if isinstance(data.get("arm"), str) and data["arm"].startswith("phantom_grpo_"):
        data["arm"] = data["arm"][len("phantom_grpo_"):]  # accept the estimator's name for the arm
    for k in ("extra_overrides", "train_files", "val_files"):
        if isinstance(data.get(k), list):
            data[k] = tuple(data[k])
    spec = VerlSpec(**{**data, "preset": preset})
    _check(spec)  # everything cheap first: a typo never waits for a model to be built
    model = str(spec.model)
    if (model == TINY_MODEL or model.split(":")[0] == "lab") and spec.backend != "cpu":
        raise ValueError(f"model={model!r} is a CPU model; give a model path or Hub id for backend=gpu")
    built = built_model(model, root, build=check_inputs)
    if built is not None:  # "tiny" / "lab[:profile]": the model (and its data, unless given) built locally
        files = {} if spec.train_files or spec.val_files else {"train_files": [built[1]], "val_files": [built[2]]}
        spec = dataclasses.replace(spec, model=built[0], **files)
    return dataclasses.replace(
        spec,
        model=resolve_model(spec.model, spec.backend, root, check=check_inputs),
        train_files=resolve_files("train_files", spec.train_files, root, check=check_inputs),
        val_files=resolve_files("val_files", spec.val_files, root, check=check_inputs),
        recipe_path=str(Path(spec.recipe_path).resolve()) if spec.recipe_path else None,
        extra_overrides=tuple(spec.extra_overrides),
    )


def _optional(name: str, value: Any, kind: type, test: Any, allowed: str, auto: bool = False) -> None:
    if value is None or (auto and value == "auto"):
        return
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind) or not test(value):
        raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}" + (", auto" if auto else "") + " or null")


def _check(spec: VerlSpec) -> None:
    """Field checks that need no file system and no model."""
    _choice("arm", spec.arm, ARMS)
    _choice("estimator", spec.estimator, ESTIMATORS)
    _choice("backend", spec.backend, BACKENDS)
    _choice("trainer", spec.trainer, TRAINERS)
    _choice("dapo_metric", spec.dapo_metric, DAPO_METRICS)
    _choice("kind", spec.kind, rewards.KINDS)
    _choice("attention", spec.attention, ATTENTIONS)
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
    for name in ("micro_batch_size", "logprob_micro_batch_size"):
        _optional(name, getattr(spec, name), int, lambda v: v >= 1, "an integer >= 1", auto=True)
    _optional("gpu_memory_utilization", spec.gpu_memory_utilization, (int, float), lambda v: 0 < v < 1,
              "a number in (0, 1)", auto=True)
    for name in ("mini_batch_size", "max_model_len", "total_epochs", "val_max_samples", "lr_warmup_steps"):
        _optional(name, getattr(spec, name), int, lambda v: v >= 1, "an integer >= 1")
    for name in ("lora_merge", "gradient_checkpointing", "enforce_eager", "free_cache_engine",
                 "filter_overlong_prompts", "ref_param_offload"):
        _optional(name, getattr(spec, name), bool, lambda v: True, "true, false")
    if spec.kl_loss_type is not None:
        _choice("kl_loss_type", spec.kl_loss_type, KL_TYPES)
    if spec.mini_batch_size is not None and spec.train_batch_size % spec.mini_batch_size:
        raise ValueError(f"mini_batch_size={spec.mini_batch_size} must divide train_batch_size={spec.train_batch_size}")
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


def _lst(values: tuple[str, ...]) -> str:
    return values[0] if len(values) == 1 else "[" + ",".join(f"'{v}'" for v in values) + "]"


def to_overrides(spec: VerlSpec, run_dir: str | os.PathLike[str], name: str, plan: Any = None) -> list[str]:
    """verl Hydra overrides for ``spec`` (a validated one: see :func:`make_spec`).

    ``plan`` (:class:`phantom.verl.plan.Plan`) holds the backend's machine-dependent choices (attention
    kernel, micro-batches, vLLM's memory share); a :class:`phantom.verl.gpu.Hardware` is turned into
    one, and ``None`` makes one for this machine.
    """
    from phantom.verl.plan import Plan, make_plan

    plan = plan if isinstance(plan, Plan) else make_plan(spec, plan)
    run = Path(run_dir).resolve()
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
        f"actor_rollout_ref.model.path={spec.model}",
        f"actor_rollout_ref.model.lora_rank={spec.lora_rank}",
        f"actor_rollout_ref.model.lora_alpha={spec.lora_alpha}",
        f"{a}.optim.lr={spec.lr}", f"{a}.ppo_mini_batch_size={spec.mini_batch_size or b}",
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
    o += [f"{key}={getattr(spec, f)}" for f, key in _VERL_KEYS.items() if getattr(spec, f) is not None]
    if spec.estimator == "gspo":
        o += [f"{a}.policy_loss.loss_mode=gspo", f"{a}.loss_agg_mode=seq-mean-token-mean"]
    if spec.clip_ratio_low is not None:
        o.append(f"{a}.clip_ratio_low={spec.clip_ratio_low}")
    if spec.clip_ratio_high is not None:
        o.append(f"{a}.clip_ratio_high={spec.clip_ratio_high}")
    if spec.dapo:  # only what differs from verl's defaults: dapo_metric=default is the one-flag configuration
        fg = "algorithm.filter_groups"
        o.append(f"{fg}.enable=True")
        if spec.dapo_metric != "default":
            o.append(f"{fg}.metric={spec.dapo_metric}")
        if spec.max_num_gen_batches:
            o.append(f"{fg}.max_num_gen_batches={spec.max_num_gen_batches}")
        if spec.max_inflight_gen_batches != 1:
            o.append(f"{fg}.max_inflight_gen_batches={spec.max_inflight_gen_batches}")
    if spec.trainer == "recipe_dapo":
        # The recipe's YAML finds verl's config only from a verl checkout; point Hydra at the package.
        o += [f"data.gen_batch_size={spec.gen_batch_size or b}", "hydra.searchpath=[pkg://verl.trainer.config]"]
    if spec.ray_address:
        o.append(f"+ray_kwargs.ray_init.address={spec.ray_address}")
    if spec.backend == "cpu":
        o += _cpu_overrides(spec, run, plan)
    else:
        from phantom.verl import gpu

        o += gpu.gpu_overrides(spec, plan)
    return o + list(spec.extra_overrides)


def cpu_env(plan: Any) -> dict[str, str]:
    """Environment of verl's workers on the CPU backend (Ray's runtime env; values must be strings), for
    ``plan`` (a :class:`phantom.verl.plan.Plan`).

    Why each (measured in ``benchmarks/bench_verl_cpu.py``, ``benchmarks/results_verl.md``):
    ``OMP_NUM_THREADS`` (when the plan has a thread count): every verl worker gets it, for the FSDP actor's
    update; the rollout server sets its own. ``TQ_NUM_THREADS``: verl's transfer queue asks for 8 torch
    threads around every put and get, and on a smaller CPU logs a warning each time (thousands per run).
    ``TQ_CLIENT_ZMQ_IO_THREADS``: it starts 8 ZeroMQ I/O threads per client. ``TQ_LOGGING_LEVEL``: it logs
    errors only.
    """
    env = {"TQ_NUM_THREADS": "1", "TQ_CLIENT_ZMQ_IO_THREADS": "1", "TQ_LOGGING_LEVEL": "ERROR"}
    if plan.threads:
        env["OMP_NUM_THREADS"] = str(plan.threads)
    return env


def _cpu_overrides(spec: VerlSpec, run: Path, plan: Any) -> list[str]:
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    actor_micro, lp_micro = plan.micro, plan.logprob_micro
    ranks = spec.n_gpus_per_node * spec.nnodes
    o = [
        f"actor_rollout_ref.model.use_remove_padding={plan.remove_padding}",  # the rmpad path wants flash-attn varlen
        f"actor_rollout_ref.model.enable_gradient_checkpointing={bool(spec.gradient_checkpointing)}",
        f"+actor_rollout_ref.model.override_config.attn_implementation={plan.attn}",  # verl's default is FA2
        f"{a}.strategy=fsdp2", f"{a}.ppo_micro_batch_size_per_gpu={actor_micro}",
        f"{a}.use_torch_compile=False", f"{a}.fsdp_config.use_torch_compile=False",
        f"{r}.name=hf", f"{r}.tensor_model_parallel_size=1", f"{r}.load_format=auto",
        f"{r}.log_prob_micro_batch_size_per_gpu={lp_micro}", f"{r}.agent.num_workers=1",
        f"{r}.max_num_seqs={1024 if spec.rollout_batching else 1}",
        "reward.num_workers=1", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "data.dataloader_num_workers=0", "trainer.device=cpu",
        # fp32 training (verl's default is bf16 mixed precision): faster on CPU, and the actor then
        # recomputes the rollout server's fp32 log-probs to float rounding (rollout_probs_diff ~1e-7).
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.PHANTOM_ROLLOUT_LOG={run / 'rollout.jsonl'}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.PHANTOM_SYNC_LOG={run / 'sync.jsonl'}",
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}='{v}'" for k, v in cpu_env(plan).items()),
    ]
    if plan.poll_s:  # verl's own replay buffer, polling faster (phantom.verl.cpu.sampler)
        from phantom.verl.cpu.sampler import NAME, PATH

        o += [f"trainer.v1.sampler.custom_sampler.path={PATH}", f"trainer.v1.sampler.custom_sampler.name={NAME}"]
    if plan.ray_address:  # a sweep's running head: Ray refuses num_cpus/num_gpus when joining a cluster
        o.append(f"+ray_kwargs.ray_init.address={plan.ray_address}")
    else:  # each FSDP rank's bundle asks for 3 CPUs + 1 logical GPU: declare enough of both
        o += [f"ray_kwargs.ray_init.num_cpus={max(8, 3 * ranks + 4)}", f"+ray_kwargs.ray_init.num_gpus={ranks}"]
    if spec.kl_loss_coef > 0:
        o.append(f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={lp_micro}")
    if spec.lora_rank > 0:
        # The hf server takes merged weights or, with lora_merge=False, verl's adapter protocol.
        o.append(f"actor_rollout_ref.model.lora.merge={True if spec.lora_merge is None else spec.lora_merge}")
    return o
