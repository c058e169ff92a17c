"""The trainers the audit knows: what each entry point composes, reads, ignores, filters and normalizes.

A launch script names an entry point (``python3 -m recipe.entropy.main_entropy``, ``swift rlhf``,
``python -m oat.experiment.run_math_rl``); the same key means different things under each. Reading
every verl-recipe main as ``main_dapo`` on stock ``ppo_trainer.yaml``, or every unknown module as
``main_ppo``, is how the audit used to print "clean" for a fully-async run whose group filter never
ran. Each :class:`Trainer` records, from the trainer's own source (cited per entry; no code copied):

* ``config``/``keys``: the Hydra config it composes and which key set :mod:`phantom.audit.verl_keys`
  checks overrides against (``None``: not checked, said so);
* ``migrates``: whether its main calls ``migrate_legacy_reward_impl`` (legacy ``reward_model.*`` /
  ``custom_reward_function.*`` keys then reach ``reward.*``), and ``aliases``: where it reads a reward
  setting from a section of its own instead (the entropy recipe's ``reward_model.overlong_buffer``);
* ``filter``: how it filters groups - ``v1`` (verl 0.9.1's replay buffer, default metric ``reward``),
  ``recipe`` (the DAPO loop, default metric null), ``None`` (it reads no ``filter_groups``);
* ``scorer``: its default scorer (``verl``: ``default_compute_score`` by data source);
* ``norm``: how it normalizes advantages, in words, for the report.

An entry point not listed here is audited as ``main_ppo`` with a warning naming it (PH062), never as
clean. Sources (read with ``git show``, commits below): verl 0.9.1's wheel from PyPI;
verl-project/verl-recipe@48ea0a79; hiyouga/EasyR1@b44b311b; huggingface/trl 1.16.0's wheel;
OpenRLHF/OpenRLHF@3c3be623; modelscope/ms-swift@3602360a; NVIDIA-NeMo/RL@7ea279ab; sail-sg/oat@c1a074c3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EASYR1_EXAMPLE_CONFIG", "FAMILIES", "NEMO_GRPO_MATH_BASE", "TRAINERS", "Trainer", "by_name", "match_module", "unknown_verl"]

#: config families; ``verl`` covers verl's own mains and verl-recipe's
FAMILIES: tuple[str, ...] = ("verl", "easyr1", "trl", "openrlhf", "swift", "nemo", "oat", "lab")

RECIPE = "verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3"


@dataclass(frozen=True)
class Trainer:
    """One entry point and the facts the rules need about it."""

    name: str  # registry id, also accepted by --entrypoint
    family: str
    label: str  # for reports
    pattern: str  # regex on a module name (``-m X``) or a script path
    source: str  # where the facts come from (repository, file, commit)
    config: str = "ppo_trainer"  # the Hydra config (or argument parser) it starts from
    keys: str | None = "ppo_trainer"  # key set for Hydra checks (phantom.audit.verl_keys), None: unchecked
    extra_keys: frozenset[str] = frozenset()  # keys its own config adds on top of ``keys``
    migrates: bool = False  # calls migrate_legacy_reward_impl
    #: (canonical prefix, the prefix this trainer really reads): e.g. the overlong buffer from reward_model.*
    aliases: tuple[tuple[str, str], ...] = ()
    filter: str | None = "v1"  # v1 | recipe | None (reads no algorithm.filter_groups)
    scorer: str = "verl"  # default scorer: verl (by data_source) | entropy_math | none
    norm: str = "algorithm.adv_estimator, divided by the group std when norm_adv_by_std_in_grpo"
    modelled: bool = True  # False: known, but its loss/advantage is its own: findings may not apply
    #: prefixes of verl's legacy sections this trainer reads as its own (not ignored, not migrated)
    own_sections: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)  # config defaults that differ from ppo_trainer
    note: str = ""

    @property
    def style(self) -> str:
        """``main_ppo`` (verl 0.9.1 V1 semantics) or ``recipe`` (the DAPO loop): what verl rules key on."""
        return "recipe" if self.filter == "recipe" else "main_ppo"


_OVERLONG = ("enable", "len", "penalty_factor", "log")
_DAPO_REWARD_KEYS = frozenset([f"reward.reward_kwargs.overlong_buffer_cfg.{k}" for k in _OVERLONG]
                              + ["reward.reward_kwargs.max_resp_len"])
_DAPO_DEFAULTS = {"reward.reward_manager.name": "dapo", "algorithm.filter_groups.metric": None,
                  "data.gen_batch_size": "${data.train_batch_size}", "trainer.use_v1": False,
                  "reward.reward_kwargs.overlong_buffer_cfg.enable": False}
_RM_OVERLONG = frozenset(f"reward_model.overlong_buffer.{k}" for k in _OVERLONG)

TRAINERS: tuple[Trainer, ...] = (
    # ---- verl 0.9.1 (wheel: verl/trainer/main_ppo.py, verl/experimental/*) -------------------------------
    Trainer("main_ppo", "verl", "verl main_ppo (V1 trainer)", r"verl\.trainer\.main_ppo|(^|/)main_ppo\.py$",
            "verl==0.9.1 wheel, verl/trainer/main_ppo.py: hydra config ppo_trainer, no migrate_legacy_reward_impl; "
            "trainer.use_v1=False runs main_ppo_v0.TaskRunner (no group filter)"),
    Trainer("main_ppo_v0", "verl", "verl main_ppo_v0 (legacy trainer)", r"verl\.trainer\.main_ppo_v0",
            "verl==0.9.1 wheel, verl/trainer/main_ppo_v0.py: the legacy TaskRunner; RayPPOTrainer has no group filter",
            filter=None, defaults={"trainer.use_v1": False}),
    Trainer("fully_async", "verl", "verl fully-async trainer",
            r"verl\.experimental\.fully_async_policy\.fully_async_main|(^|/)fully_async_main\.py$",
            "verl==0.9.1 wheel, verl/experimental/fully_async_policy/fully_async_main.py (hydra config "
            "fully_async_ppo_trainer, calls migrate_legacy_reward_impl); fully_async_trainer.py and its "
            "SeparateRayPPOTrainer base read no algorithm.filter_groups",
            config="fully_async_ppo_trainer", keys="fully_async_ppo_trainer", migrates=True, filter=None),
    Trainer("one_step_off", "verl", "verl one-step-off-policy trainer",
            r"verl\.experimental\.one_step_off_policy\.main_ppo",
            "verl==0.9.1 wheel, verl/experimental/one_step_off_policy/main_ppo.py (config one_step_off_ppo_trainer, "
            "no migration); its ray_trainer reads no algorithm.filter_groups",
            config="one_step_off_ppo_trainer", keys=None, filter=None),
    # ---- verl-recipe ------------------------------------------------------------------------------------
    Trainer("recipe.dapo", "verl", "verl-recipe DAPO (main_dapo)", r"recipe\.dapo\.main_dapo|(^|/)dapo/main_dapo\.py$",
            f"{RECIPE}: dapo/main_dapo.py (config dapo_trainer on ppo_trainer, migrate_legacy_reward_impl, "
            "RayDAPOTrainer's filter loop); dapo/config/dapo_trainer.yaml",
            config="dapo_trainer", extra_keys=_DAPO_REWARD_KEYS, migrates=True, filter="recipe",
            defaults=_DAPO_DEFAULTS),
    Trainer("recipe.dapo_transfer_queue", "verl", "verl-recipe DAPO with TransferQueue",
            r"recipe\.dapo\.dapo_transfer_queue\.main_dapo",
            f"{RECIPE}: dapo/dapo_transfer_queue/main_dapo.py (config dapo_transfer_queue_trainer on "
            "ppo_megatron_trainer; no migration: the overlong buffer comes from reward_model.overlong_buffer, the "
            "reward manager from 0.9.1's load_reward_manager, i.e. reward.reward_manager)",
            config="dapo_transfer_queue_trainer", keys="ppo_megatron_trainer", extra_keys=_RM_OVERLONG,
            own_sections=("reward_model.overlong_buffer.", "reward_model.enable", "reward_model.strategy"),
            filter="recipe", aliases=(("reward.reward_kwargs.overlong_buffer_cfg.", "reward_model.overlong_buffer."),),
            defaults={"algorithm.filter_groups.metric": None, "trainer.use_v1": False,
                      "reward_model.overlong_buffer.enable": False}),
    Trainer("recipe.entropy", "verl", "verl-recipe entropy (main_entropy)", r"recipe\.entropy\.main_entropy",
            f"{RECIPE}: entropy/main_entropy.py and entropy/reward.py (reward manager from "
            "reward_model.reward_manager, overlong from reward_model.overlong_buffer, default scorer "
            "entropy/reward_score: a dict whose `acc` is a bool); entropy/config/entropy_trainer.yaml",
            config="entropy_trainer",
            extra_keys=_RM_OVERLONG | frozenset(f"reward_model.reward_kwargs.overlong_buffer_cfg.{k}" for k in _OVERLONG)
            | frozenset({"reward_model.reward_kwargs.overlong_buffer_cfg"}),
            filter="recipe", scorer="entropy_math", own_sections=("reward_model.",),
            aliases=(("reward.reward_kwargs.overlong_buffer_cfg.", "reward_model.overlong_buffer."),
                     ("reward.reward_kwargs.", "reward_model.reward_kwargs."),
                     ("reward.reward_manager.name", "reward_model.reward_manager")),
            defaults={"algorithm.filter_groups.metric": None, "trainer.use_v1": False,
                      "reward_model.reward_manager": "dapo", "reward_model.overlong_buffer.enable": False}),
    Trainer("recipe.partial_rollout", "verl", "verl-recipe partial rollout", r"recipe\.partial_rollout\.main_ppo",
            f"{RECIPE}: partial_rollout/main_ppo.py (ppo_trainer, migrate_legacy_reward_impl, main_ppo's TaskRunner "
            "with PartialRolloutRayPPOTrainer; no filter_groups in the recipe)", migrates=True, filter=None),
    Trainer("recipe.gvpo", "verl", "verl-recipe GVPO", r"recipe\.gvpo\.gvpo_main_ppo",
            f"{RECIPE}: gvpo/gvpo_main_ppo.py (config gvpo_trainer; RayGVPOTrainer; no filter_groups)",
            config="gvpo_trainer", keys=None, filter=None),
    Trainer("recipe.prime", "verl", "verl-recipe PRIME", r"recipe\.prime\.main_prime",
            f"{RECIPE}: prime/main_prime.py (config prime_trainer: an implicit process reward model trained online, "
            "its own reward_model section - not verl's legacy one; no filter_groups); the advantage is verl's "
            "algorithm.adv_estimator on the verifier's score plus the implicit PRM's", config="prime_trainer",
            keys=None, filter=None, own_sections=("reward_model.",),
            note="PRIME's implicit PRM adds a continuous process reward"),
    Trainer("recipe.flowrl", "verl", "verl-recipe FlowRL", r"recipe\.flowrl\.main_flowrl",
            f"{RECIPE}: flowrl/main_flowrl.py (config flowrl_trainer; RayFlowRLTrainer's flow-balance loss)",
            config="flowrl_trainer", keys=None, filter=None, modelled=False,
            note="FlowRL trains a trajectory-balance objective on the reward, not GRPO advantages"),
    Trainer("recipe.spo", "verl", "verl-recipe SPO", r"recipe\.spo\.spo_main_ppo",
            f"{RECIPE}: spo/spo_main_ppo.py (config spo_trainer)", config="spo_trainer", keys=None, filter=None,
            modelled=False, note="SPO's single-stream advantage (a tracked value baseline) is its own"),
    Trainer("recipe.other", "verl", "a verl-recipe main with its own trainer",
            r"recipe\.(sppo\.main_sppo|spin\.main_spin|dynamo\.main_dynamo|atropos\.main_atropos|"
            r"rep_exp\.main_rep_exp|specRL\.histoSpec\.main_ppo|gkd\.megatron\.main_gkd|"
            r"dance_grpo\.dance_grpo_\w+\.main_dance)",
            f"{RECIPE}: sppo, spin, dynamo, atropos, rep_exp, specRL, gkd, dance_grpo mains (each its own config "
            "and trainer class; none reads filter_groups)", config="(the recipe's own)", keys=None, filter=None,
            modelled=False, note="self-play, distillation, diffusion or environment trainers with their own losses"),
    # ---- forks and other trainers -------------------------------------------------------------------------
    Trainer("easyr1", "easyr1", "EasyR1 (verl fork)", r"verl\.trainer\.main$",
            "hiyouga/EasyR1@b44b311b669bf1fd1aa2fc36f2251482ba33cb16: verl/trainer/main.py (OmegaConf.from_cli over "
            "PPOConfig and the `config=` YAML), verl/trainer/config.py (AlgorithmConfig: adv_estimator grpo, "
            "online_filtering False, filter_key overall, filter_low 0.01, filter_high 0.99), ray_trainer.py (keeps a "
            "group when filter_low < mean(filter_key) < filter_high), core_algos.py (grpo: (r - mean) / (std + 1e-6))",
            config="PPOConfig + config=YAML", keys=None, filter="easyr1", scorer="none",
            norm="algorithm.adv_estimator=grpo divides by the group std (no flag); rloo/remax/reinforce_plus_plus do not"),
    Trainer("trl.grpo", "trl", "TRL GRPOTrainer", r"trl\.scripts\.grpo|(^|/)[\w.-]*grpo[\w.-]*\.py$|open_r1\.grpo",
            "trl 1.16.0 wheel: trl/trainer/grpo_trainer.py, grpo_config.py", config="GRPOConfig", keys=None,
            filter=None, scorer="none", norm="scale_rewards: group (default) divides by the group std"),
    Trainer("trl.rloo", "trl", "TRL RLOOTrainer", r"trl\.scripts\.rloo|(^|/)[\w.-]*rloo[\w.-]*\.py$",
            "trl 1.16.0 wheel: trl/trainer/rloo_trainer.py (advantage = r - leave-one-out mean; "
            "normalize_advantages, default False, divides by the batch std), rloo_config.py",
            config="RLOOConfig", keys=None, filter=None, scorer="none",
            norm="r - leave-one-out mean; normalize_advantages=True divides by the batch std"),
    Trainer("openrlhf", "openrlhf", "OpenRLHF (train_ppo_ray)", r"openrlhf\.cli\.train_ppo_ray",
            "OpenRLHF/OpenRLHF@3c3be6234e0cb353e76bb8019947db9dfe99fca7: openrlhf/cli/train_ppo_ray.py (flags), "
            "trainer/ppo_utils/experience_maker.py (group_norm: (r - mean) / (std + 1e-9); reinforce_baseline, "
            "dr_grpo: r - mean; gae/reinforce/reinforce_baseline whitened over the batch unless no_std_norm), "
            "samples_generator.py (dynamic filtering keeps a group when min < mean(scores) < max)",
            config="argparse", keys=None, filter="openrlhf", scorer="none",
            norm="group_norm divides by the group std; reinforce_baseline subtracts the group mean, then whitens "
                 "over the batch"),
    Trainer("swift.grpo", "swift", "ms-swift GRPO (swift rlhf --rlhf_type grpo)", r"swift rlhf",
            "modelscope/ms-swift@3602360a562313afbf2ef6065fdf61f271a2c5b9: swift/rlhf_trainers/args_mixin.py "
            "(scale_rewards default: group for grpo, none for rloo, batch for reinforce_plus_plus; dynamic_sample "
            "drops groups whose summed reward has std 0), swift/rewards/orm.py (accuracy, format, react_format: 0/1; "
            "cosine, repetition, soft_overlong: continuous)", config="argparse", keys=None, filter="swift",
            scorer="none", norm="scale_rewards (group by default for grpo) over the weighted sum"),
    Trainer("nemo.grpo", "nemo", "NeMo-RL GRPO", r"examples\.run_grpo\w*|(^|/)run_grpo\w*\.py$",
            "NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909: nemo_rl/algorithms/grpo.py (normalize_rewards "
            "divides by the group std; with use_dynamic_sampling the std, and so the filter, is taken on "
            "unshaped_total_reward: PR #2478; reward_shaping adds the overlong penalty to total_reward)",
            config="examples/configs/*.yaml", keys=None, filter="nemo", scorer="none",
            norm="grpo.normalize_rewards divides by the group std"),
    Trainer("oat", "oat", "oat (run_math_rl)", r"oat\.experiment\.run_math_rl",
            "sail-sg/oat@c1a074c320ff5ca9fe9a4f669bf05208e2f310be: oat/args.py (critic_type drgrpo default), "
            "algorithms/ppo.py (grpo divides by the group std), oracles/math.py (correct_reward / incorrect_reward)",
            config="argparse", keys=None, filter=None, scorer="none",
            norm="critic_type=grpo divides by the group std; drgrpo (the default) does not"),
)
_BY_NAME = {t.name: t for t in TRAINERS}
#: what NeMo-RL's shipped GRPO math bases (examples/configs/grpo_math_1B.yaml and its siblings,
#: NVIDIA-NeMo/RL@7ea279ab) set that the rules read: an overlay naming one that is not found here gets these
NEMO_GRPO_MATH_BASE: dict[str, Any] = {
    "grpo.normalize_rewards": True, "grpo.use_leave_one_out_baseline": True, "grpo.use_dynamic_sampling": False,
    "grpo.reward_shaping.enabled": False, "env.math.num_workers": 8}
#: what EasyR1's shipped examples/config.yaml sets that the rules read (hiyouga/EasyR1@b44b311b): a launch script
#: passing `config=examples/config.yaml` from an EasyR1 checkout gets these when the file is not found here
EASYR1_EXAMPLE_CONFIG: dict[str, Any] = {
    "algorithm.adv_estimator": "grpo", "algorithm.online_filtering": False, "algorithm.filter_key": "overall",
    "algorithm.filter_low": 0.01, "algorithm.filter_high": 0.99,
    "worker.reward.reward_function": "./examples/reward_function/math.py:compute_score"}
_COMPILED = sorted(((re.compile(t.pattern), t) for t in TRAINERS), key=lambda p: -len(p[1].pattern))


def by_name(name: str) -> Trainer:
    """The registry entry (KeyError on an unknown name; ``recipe`` is the DAPO main, as before)."""
    return _BY_NAME["recipe.dapo" if name == "recipe" else name]


def match_module(name: str, family: str | None = None) -> Trainer | None:
    """The entry for a module name or script path, most specific pattern first."""
    for rx, t in _COMPILED:
        if (family is None or t.family == family) and rx.search(name):
            return t
    return None


def unknown_verl(name: str) -> Trainer:
    """An entry point the registry does not know: audited as main_ppo, with a warning that names it."""
    base = _BY_NAME["main_ppo"]
    return Trainer(f"unknown:{name}", "verl", f"{name} (unknown entry point, read as main_ppo)", re.escape(name),
                   "not in phantom.audit.trainers", keys=None, filter=base.filter, modelled=False,
                   note="the audit does not know this entry point; findings assume verl 0.9.1 main_ppo semantics")
