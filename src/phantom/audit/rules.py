"""The audit's rules: each turns settings and reward facts into findings with a why and a fix.

Rule ids are stable (CI configs may filter on them):

=====  ===============================  ==============================================================
PH001  filter-on-shaped-metric          group filter reads the shaped score under a composite reward
PH002  float-reward-acc                 the reward returns a float, so verl's ``acc`` is the score
PH003  non-binary-acc                   the reward's ``acc`` is not 0/1
PH004  filter-metric-missing            the filter metric is not produced; verl raises at step 1
PH005  filter-metric-unset              filter enabled with ``metric: null`` (0.9.0, verl-recipe)
PH006  filter-ignored-legacy-trainer    ``trainer.use_v1=False`` under main_ppo: no group filter
PH010  std-norm-with-shaping            std-normalized GRPO, composite reward, no outcome gate
PH020  trl-shaping-group-scale          TRL sums shaping into the reward and scales by group std
PH021  trl-frac-reward-zero-std         TRL's dead-group count misses phantom groups
PH030  mask-drop-no-refill              rows dropped from the loss without refill (loss scale)
PH031  gen-batches-too-small            ``max_num_gen_batches`` too small for the all-same fraction
PH032  max-num-gen-batches-ignored      verl 0.9.1's V1 trainer ignores ``max_num_gen_batches``
PH040  legacy-reward-key-ignored        legacy top-level reward keys 0.9.x main_ppo silently drops
PH041  overlong-without-dapo-manager    overlong buffer set but the reward manager is not ``dapo``
PH050  reward-shape-unknown             the audit cannot tell whether the reward is composite
=====  ===============================  ==============================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from phantom.audit.facts import (
    GROUP_STD_ESTIMATORS,
    OUTCOME_GATE_ESTIMATORS,
    SHAPED_METRICS,
    RewardFacts,
    metric_signal,
)
from phantom.audit.model import Finding, Unresolved, chapter
from phantom.audit.schema import Settings

__all__ = ["RULES", "AllSame", "verl_findings", "trl_findings"]

#: rule id -> (name, one-line summary), read from the table above
RULES: dict[str, tuple[str, str]] = {
    m.group(1): (m.group(2), m.group(3).strip())
    for m in re.finditer(r"^(PH\d{3})\s+(\S+)\s+(.+)$", __doc__ or "", re.M)
}

_WHY_PHANTOM = ("an all-fail group still has spread in a shaped score, so it survives this filter and std "
                "normalization turns the shaping noise into full-size advantages (paper §5: EM 0.754 vs 0.040)")
_FIX_ACC = ("algorithm.filter_groups.metric=acc with a reward function that returns a dict whose `acc` is "
            "the binary outcome (e.g. {'score': shaped, 'acc': outcome})")
_LEGACY_FIX = {
    "custom_reward_function.": "reward.custom_reward_function.",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.reward_kwargs.": "reward.reward_kwargs.",
    "reward_model.overlong_buffer.": "reward.reward_kwargs.overlong_buffer_cfg.",
    "custom_reward_function.overlong_buffer.": "reward.reward_kwargs.overlong_buffer_cfg.",
    "reward_model.": "reward.reward_model.",
    "sandbox_fusion.": "reward.sandbox_fusion.",
}


@dataclass(frozen=True)
class AllSame:
    """Measured fractions of groups a filter drops (outcome and shaped-score predicates), and their source."""

    outcome: float
    score: float
    source: str

    def for_signal(self, shaped: bool | None) -> float:
        """The fraction for the configured filter: the score predicate when it reads a shaped signal."""
        return self.score if shaped else self.outcome


def _f(rule: str, name: str, severity: str, s: Settings, key: str | None, message: str, why: str, fix: str,
       topic: str) -> Finding:
    file, line = s.where(key) if key else (s.doc.path, None)
    return Finding(rule, name, severity, key, message, why, fix, chapter(topic), file, line)


def _legacy_target(key: str) -> str:
    for old in sorted(_LEGACY_FIX, key=len, reverse=True):
        if key == old or key.startswith(old):
            return _LEGACY_FIX[old] + key[len(old):] if old.endswith(".") else _LEGACY_FIX[old]
    return "reward." + key


def _legacy(s: Settings) -> list[Finding]:
    if s.trainer != "main_ppo":
        return []
    out = []
    for key, e in s.doc.entries.items():
        if not key.startswith(("custom_reward_function.", "reward_model.", "sandbox_fusion.")):
            continue
        if e.value is None or e.value == {} or e.value == []:
            continue  # a composed config (.hydra/config.yaml) carries every legacy key as null
        important = key in ("custom_reward_function.path", "reward_model.reward_manager") or "overlong" in key
        sev = "error" if important and not s.entrypoint_assumed else "warning"
        assumed = " (assuming the run uses verl 0.9.x main_ppo)" if s.entrypoint_assumed else ""
        out.append(_f("PH040", "legacy-reward-key-ignored", sev, s, key,
                      f"`{key}={e.value}` is a legacy top-level key that verl 0.9.x main_ppo accepts and then "
                      f"ignores{assumed}",
                      "main_ppo no longer calls migrate_legacy_reward_impl, so the run silently uses the default "
                      "reward settings instead of this one", f"{_legacy_target(key)}={e.value}", "verl"))
    return out


def _refill(s: Settings, measured: AllSame | None, filter_on: bool | None, shaped: bool | None) -> list[Finding]:
    if not filter_on:
        return []
    frac = measured.for_signal(shaped) if measured is not None else None
    pred = "shaped-score predicate" if shaped else "outcome predicate"
    source = f"{pred}, {measured.source}" if measured is not None else ""
    m_key = "algorithm.filter_groups.max_num_gen_batches"
    m = s.integer(m_key)
    if s.trainer == "main_ppo":
        if m is None or m <= 0:
            return []
        tb = s.integer("data.train_batch_size")
        extra = ""
        if frac is not None and tb and frac < 1:
            extra = (f"; with the measured all-same fraction {frac:.2f} ({source}) each step "
                     f"generates about {tb / (1 - frac):.0f} prompts for {tb} kept")
        return [_f("PH032", "max-num-gen-batches-ignored", "info", s, m_key,
                   f"max_num_gen_batches={m} is ignored by verl 0.9.1's V1 trainer (it refills without a cap)" + extra,
                   "V1 refills each evicted group from replay-buffer credits, so this cap does not bound generation",
                   "algorithm.filter_groups.max_inflight_gen_batches=<n> bounds concurrent generation instead",
                   "filter")]
    if frac is None or m is None or m <= 0:
        return []
    from phantom.audit.exposure import refill_estimate  # torch-free

    tb, gb = s.integer("data.train_batch_size"), s.integer("data.gen_batch_size") or s.integer("data.train_batch_size")
    if not tb or not gb:
        return []
    est = refill_estimate(frac, train_batch=tb, gen_batch=gb, max_batches=m)
    steps = s.integer("trainer.total_training_steps") or 100
    p_run = 1.0 - (1.0 - est.p_exceed) ** steps
    sev = "error" if p_run >= 0.5 else "warning" if p_run >= 0.05 else None
    if sev is None:
        return []
    return [_f("PH031", "gen-batches-too-small", sev, s, m_key,
               f"max_num_gen_batches={m}: with all-same fraction {frac:.2f} ({source}), "
               f"{tb} kept groups from batches of {gb} need {est.expected:.2f} generation batches on average; "
               f"a step exceeds the cap with probability {est.p_exceed:.2g}, and a {steps}-step run with "
               f"probability {p_run:.2f}",
               "the recipe trainer raises `num_gen_batches >= max_num_gen_batches` and stops the run when the "
               "cap is hit; outcome filtering drops more groups than score filtering, so it needs more batches",
               f"algorithm.filter_groups.max_num_gen_batches={max(est.suggest, m + 1)} (or 0 for no cap), or a "
               "larger data.gen_batch_size", "filter")]


def verl_findings(s: Settings, f: RewardFacts, *, all_same: AllSame | None = None) -> list[Finding]:
    out = _legacy(s)
    en_key, m_key = "algorithm.filter_groups.enable", "algorithm.filter_groups.metric"
    enabled = s.flag(en_key)
    maybe = enabled is None and s.is_set(en_key)  # set through something unresolved
    if enabled and s.trainer == "main_ppo" and s.flag("trainer.use_v1") is False:
        out.append(_f("PH006", "filter-ignored-legacy-trainer", "warning", s, "trainer.use_v1",
                      "group filtering is enabled but trainer.use_v1=False runs the legacy trainer, which has no "
                      "group filter", "the filter you configured never runs, so dead and phantom groups all train",
                      "trainer.use_v1=True (the 0.9.x default), or verl-recipe's DAPO trainer", "verl"))
        enabled = False
    metric = s.value(m_key)
    sig = metric_signal(metric, s, f) if metric is not None else None
    active = bool(enabled) or maybe

    def cap(sev: str) -> str:  # a filter switched on through an unresolved variable: "maybe"
        return "warning" if maybe and sev == "error" else sev

    loc = m_key if s.is_set(m_key) else en_key
    if active and metric is None:
        out.append(_f("PH005", "filter-metric-unset", cap("error"), s, loc,
                      f"group filtering is enabled but algorithm.filter_groups.metric is null "
                      f"({'verl-recipe' if s.trainer == 'recipe' else 'verl ' + s.version} default)",
                      "verl 0.9.0 raises ValueError at start and the recipe trainer cannot look the metric up; "
                      "verl 0.9.1 changed the default to `reward`, the shaped score", _FIX_ACC, "filter"))
    elif active and isinstance(metric, Unresolved):
        out.append(_f("PH001", "filter-on-shaped-metric", "warning", s, loc,
                      f"the filter metric comes from `{metric}`, which the audit cannot resolve; if it is score, "
                      "seq_reward, seq_final_reward or reward, the filter reads the shaped score", _WHY_PHANTOM,
                      _FIX_ACC, "filter"))
    elif active and sig is not None:
        default = "" if s.is_set(m_key) else f" (the verl {s.version} default: unset here)"
        if sig.missing:
            out.append(_f("PH004", "filter-metric-missing", cap("error"), s, loc,
                          f"the filter reads `{metric}`{default}, which this reward does not produce: {sig.why}",
                          "verl raises at the first step ('Finished groups are missing DAPO metric' in 0.9.1, a "
                          "KeyError in the recipe trainer)", _FIX_ACC, "filter"))
        elif metric in SHAPED_METRICS and sig.shaped is not False:
            sev = cap("error") if sig.shaped else "warning"
            out.append(_f("PH001", "filter-on-shaped-metric", sev, s, loc,
                          f"the group filter reads `{metric}`{default}: {sig.why}; here it "
                          + ("carries the shaping" if sig.shaped else "may carry shaping (the audit cannot tell)"),
                          _WHY_PHANTOM, _FIX_ACC + "; or drop std normalization (algorithm."
                          "norm_adv_by_std_in_grpo=False)", "filter"))
        elif metric not in SHAPED_METRICS and sig.shaped is not False and metric != "acc":
            out.append(_f("PH003", "non-binary-acc", cap("error") if sig.shaped else "warning", s, loc,
                          f"the group filter reads `{metric}`: {sig.why}" +
                          ("" if sig.shaped else "; the audit cannot tell whether it is binary"),
                          _WHY_PHANTOM, _FIX_ACC, "filter"))
    out += _acc_findings(s, f, active and metric == "acc", cap, loc)
    outcome_gate = active and sig is not None and sig.shaped is False and not sig.missing
    gate_unknown = active and not outcome_gate and (maybe or isinstance(metric, Unresolved)
                                                    or (sig is not None and sig.shaped is None and not sig.missing))
    out += _std_norm(s, f, outcome_gate, gate_unknown)
    out += _refill(s, all_same, active, sig.shaped if sig is not None else None)
    ob_key = "reward.reward_kwargs.overlong_buffer_cfg.enable"
    if s.flag(ob_key) and s.value("reward.reward_manager.name") != "dapo":
        out.append(_f("PH041", "overlong-without-dapo-manager", "warning", s, ob_key,
                      f"the overlong buffer is enabled but reward.reward_manager.name="
                      f"{s.value('reward.reward_manager.name')}", "only verl's `dapo` reward manager applies the "
                      "overlong penalty; the other managers ignore reward_kwargs.overlong_buffer_cfg",
                      "reward.reward_manager.name=dapo", "verl"))
    if f.composite is None:
        hint = f" (the config names {f.custom_path})" if isinstance(f.custom_path, str) else ""
        out.append(_f("PH050", "reward-shape-unknown", "info", s, "reward.custom_reward_function.path",
                      "the audit cannot tell whether the reward scores failures differently" + hint,
                      "findings that depend on it are warnings instead of errors",
                      "pass --reward-fn PATH[:NAME] (imported and called on 8 probe answers) or --shaped/--no-shaped",
                      "rules"))
    return out


def _acc_findings(s: Settings, f: RewardFacts, filter_reads_acc: bool, cap: Any, loc: str) -> list[Finding]:
    path_key = "reward.custom_reward_function.path"
    out = []
    if f.returns == "float" and f.score_shaped:
        sev = cap("error") if filter_reads_acc else "warning"
        what = ("so algorithm.filter_groups.metric=acc filters on the shaped score" if filter_reads_acc else
                "so val-core/<data_source>/acc reports the shaped score, not accuracy")
        out.append(_f("PH002", "float-reward-acc", sev, s, path_key,
                      f"the reward function returns a float that spreads among failures; verl then sets acc = "
                      f"score, {what}", _WHY_PHANTOM if filter_reads_acc else
                      "a shaped `acc` hides the outcome from the filter, the validation headline and dashboards",
                      "return a dict: {'score': shaped, 'acc': float(outcome)}", "filter"))
    elif f.returns in ("dict", "mixed") and f.acc_binary is False:
        out.append(_f("PH003", "non-binary-acc", cap("error") if filter_reads_acc else "warning", s, path_key,
                      "the reward dict's `acc` is not 0/1" + (", and the group filter reads it" if filter_reads_acc
                                                               else ""),
                      _WHY_PHANTOM if filter_reads_acc else "verl reports `acc` as the validation accuracy",
                      "make `acc` the binary outcome and put partial credit or shaping in `score`", "filter"))
    elif filter_reads_acc and f.returns is None and f.acc_binary is None and f.score_shaped is not False:
        out.append(_f("PH002", "float-reward-acc", "warning", s, loc,
                      "the filter reads `acc`, which is binary only if the reward function returns a dict with a "
                      "binary `acc`; a float return makes acc = the shaped score",
                      _WHY_PHANTOM, "check it with --reward-fn PATH[:NAME]; " + _FIX_ACC, "filter"))
    return out


def _std_norm(s: Settings, f: RewardFacts, outcome_filter: bool, gate_unknown: bool) -> list[Finding]:
    est_key = "algorithm.adv_estimator"
    est = s.value(est_key)
    if isinstance(est, Unresolved) or est in OUTCOME_GATE_ESTIMATORS or outcome_filter:
        return []
    if est not in GROUP_STD_ESTIMATORS or f.composite is False:
        return []
    norm_key = "algorithm.norm_adv_by_std_in_grpo"
    norm = s.flag(norm_key)
    if norm is False:
        return []
    sev = "error" if f.composite and norm is True and not gate_unknown else "warning"
    gate = "the filter may or may not be an outcome gate" if gate_unknown else "no outcome gate is set"
    return [_f("PH010", "std-norm-with-shaping", sev, s, est_key if s.is_set(est_key) else norm_key,
               f"adv_estimator={est} divides each group by its std (norm_adv_by_std_in_grpo={norm}) while the "
               f"reward is {f.verdict} and {gate}",
               "an all-fail group that differs only by shaping gets advantages of about ±1 whatever λ is, as loud "
               "as a group with a real success (paper §9: ±1.4 with the std vs ±0.12 without)",
               "algorithm.norm_adv_by_std_in_grpo=False (Dr. GRPO), or an outcome gate: "
               "algorithm.adv_estimator=phantom_grpo_outcome, or algorithm.filter_groups.enable=True with "
               "metric=acc (binary acc)", "estimators")]


def trl_findings(s: Settings, f: RewardFacts) -> list[Finding]:
    out = []
    scale = s.value("scale_rewards")
    agg = s.value("multi_objective_aggregation")
    key = "scale_rewards" if s.is_set("scale_rewards") else "reward_funcs"
    if f.composite is not False and not isinstance(scale, Unresolved):
        funcs = ", ".join(t.name for t in f.trl_funcs if t.weight != 0) or "the reward"
        if agg == "normalize_then_sum":
            out.append(_f("PH020", "trl-shaping-group-scale", "warning", s, "multi_objective_aggregation",
                          f"normalize_then_sum z-scores each reward function within its group ({funcs}); the "
                          "shaping function stays O(1) in all-fail groups",
                          "GDPO-style aggregation removes the correctness term from an all-fail group but keeps the "
                          "shaping term at full size times its weight", "gate the shaping inside the reward "
                          "function (return 0 shaping when the answer is wrong)", "rules"))
        elif scale in ("group", True):
            sev = "error" if f.composite else "warning"
            out.append(_f("PH020", "trl-shaping-group-scale", sev, s, key,
                          f"scale_rewards={scale!r} divides the summed reward ({funcs}) by each group's std, and TRL "
                          f"has no group filter to drop all-fail groups; the reward is {f.verdict}",
                          "in an all-fail group the summed reward still varies with the shaping terms, and dividing "
                          "by the group std turns that variation into full-size advantages whatever the weights",
                          "scale_rewards='none' with loss_type='dr_grpo' (Dr. GRPO), or gate the shaping inside the "
                          "reward function (return 0 shaping when the answer is wrong)", "filter"))
        elif scale == "batch":
            out.append(_f("PH020", "trl-shaping-group-scale", "info", s, key,
                          f"scale_rewards='batch' ({funcs}): phantom advantages are divided by the batch std, which "
                          "mixed groups dominate, so they shrink but do not vanish",
                          "batch scaling weakens the phantom without removing it",
                          "scale_rewards='none', or gate the shaping inside the reward function", "rules"))
    if f.composite is not False:
        mentioned = "frac_reward_zero_std" in s.doc.mentions
        out.append(_f("PH021", "trl-frac-reward-zero-std", "warning" if mentioned else "info", s,
                      "reward_funcs", "TRL's frac_reward_zero_std is computed on the summed reward"
                      + (", and this file reads it" if mentioned else ""),
                      "under shaping an all-fail group has nonzero std, so this dead-group count misses exactly the "
                      "phantom groups", "log a per-group outcome statistic (log_completions=True, or a callback "
                      "counting groups whose correctness reward is all 0)", "filter"))
    if s.value("mask_truncated_completions") is True:
        out.append(_f("PH030", "mask-drop-no-refill", "info", s, "mask_truncated_completions",
                      "mask_truncated_completions=True removes truncated completions from the loss without refill",
                      "the token-mean loss is rescaled by 1/kept fraction, and masked completions still count in "
                      "the group mean and std", "keep it if you want it; phantom groups are not affected by it",
                      "what_not"))
    return out
