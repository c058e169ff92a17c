"""The audit's rules: each turns settings and reward facts into findings with a why and a fix.

Rule ids are stable (CI configs may filter on them):

=====  ===============================  ==============================================================
PH001  filter-on-shaped-metric          group filter reads the shaped score under a composite reward
PH002  float-reward-acc                 the reward returns a float, so verl's ``acc`` is the score
PH003  non-binary-acc                   the reward's ``acc`` is not 0/1
PH004  filter-metric-missing            the filter metric is not produced; verl raises at step 1
PH005  filter-metric-unset              filter enabled with ``metric: null`` (0.9.0, verl-recipe)
PH006  filter-ignored-legacy-trainer    the trainer reads no group filter (``use_v1=False``, fully-async, ...)
PH010  std-norm-with-shaping            std-normalized GRPO, composite reward, no outcome gate
PH011  std-norm-flag-ignored            ``grpo_vectorized``/``gdpo`` ignore ``norm_adv_by_std_in_grpo=False``
PH012  gdpo-normalizes-shaping-key      GDPO z-scores a shaping reward key inside each group
PH020  trl-shaping-group-scale          TRL divides a reward that spreads among failures by the group std
PH021  trl-frac-reward-zero-std         TRL's dead-group count misses phantom groups
PH022  trl-async-grpo-std               TRL's experimental AsyncGRPO always divides by the group std
PH023  trl-replay-buffer-removed        ``grpo_with_replay_buffer`` is not in TRL 1.16
PH030  mask-drop-no-refill              rows dropped from the loss without refill (loss scale)
PH031  gen-batches-too-small            ``max_num_gen_batches`` too small for the all-same fraction
PH032  max-num-gen-batches-ignored      verl 0.9.1's V1 trainer ignores ``max_num_gen_batches``
PH040  legacy-reward-key-ignored        legacy reward keys verl 0.9.1 accepts and then ignores
PH041  overlong-without-dapo-manager    overlong buffer set but the reward manager is not ``dapo``
PH042  legacy-key-rejected              legacy keys verl 0.9.1 rejects: the run does not start
PH043  key-needs-plus                   a key missing from verl's config, overridden without ``+``
PH044  plus-on-existing-key             ``+key=value`` on a key the config has: Hydra refuses to start
PH045  key-not-in-config                ``key=value`` (or ``~key``) on a key the config lacks: Hydra refuses
PH050  reward-shape-unknown             the audit cannot tell whether the reward is composite
PH051  estimator-unresolved             ``adv_estimator`` comes from something the audit cannot resolve
PH060  nothing-read                     a trainer command whose settings the audit could not read
PH061  input-cleaned                    control characters, colour codes or CRLF the trainer would choke on
PH062  unknown-entrypoint               an entry point the audit does not model: read as main_ppo
=====  ===============================  ==============================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from phantom.audit.facts import (
    _SHAPING_NAME,
    GROUP_STD_ESTIMATORS,
    OUTCOME_GATE_ESTIMATORS,
    SHAPED_METRICS,
    STD_ALWAYS_ESTIMATORS,
    RewardFacts,
    metric_signal,
)
from phantom.audit.hydra_rules import hydra_findings
from phantom.audit.legacy import legacy_findings
from phantom.audit.model import Finding, Unresolved, chapter
from phantom.audit.schema import Settings

__all__ = ["RULES", "AllSame", "verl_findings"]

#: rule id -> (name, one-line summary), read from the table above
RULES: dict[str, tuple[str, str]] = {
    m.group(1): (m.group(2), m.group(3).strip())
    for m in re.finditer(r"^(PH\d{3})\s+(\S+)\s+(.+)$", __doc__ or "", re.M)
}

#: rules about whether the config composes at all (they do not depend on the trainer's semantics)
_CONFIG_RULES = frozenset({"PH042", "PH043", "PH044", "PH045"})
_WHY_PHANTOM = ("an all-fail group still has spread in a shaped score, so it survives this filter and std "
                "normalization turns the shaping noise into full-size advantages (paper §5: EM 0.754 vs 0.040)")
_ACC_OV = ("algorithm.filter_groups.metric=acc",)
_ACC_EXP = {"algorithm.filter_groups.metric": "acc"}
_FIX_ACC = ("algorithm.filter_groups.metric=acc with a reward function that returns a dict whose `acc` is "
            "the binary outcome (e.g. {'score': shaped, 'acc': outcome})")
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
       topic: str, overrides: tuple[str, ...] = (), expect: dict[str, Any] | None = None) -> Finding:
    file, line = s.where(key) if key else (s.doc.path, None)
    return Finding(rule, name, severity, key, message, why, fix, chapter(topic), file, line,
                   fix_overrides=overrides, fix_expect=expect or {})


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
                   "algorithm.filter_groups.max_inflight_gen_batches=3 bounds concurrent generation instead "
                   "(up to 3 x train_batch_size prompts in flight; pick your own n)", "filter",
                   ("algorithm.filter_groups.max_inflight_gen_batches=3",),
                   {"algorithm.filter_groups.max_inflight_gen_batches": 3})]
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
               "larger data.gen_batch_size", "filter",
               (f"algorithm.filter_groups.max_num_gen_batches={max(est.suggest, m + 1)}",),
               {"algorithm.filter_groups.max_num_gen_batches": max(est.suggest, m + 1)})]


def _amplified(s: Settings) -> bool | None:
    """Does the estimator divide each group by its std? (None: the estimator cannot be resolved.)"""
    est = s.value("algorithm.adv_estimator")
    if isinstance(est, Unresolved) or not isinstance(est, str):
        return None
    if est in STD_ALWAYS_ESTIMATORS:
        return True
    return est in GROUP_STD_ESTIMATORS and s.flag("algorithm.norm_adv_by_std_in_grpo") is not False


def _why_not_amplified(s: Settings) -> str:
    est = s.value("algorithm.adv_estimator")
    if est in GROUP_STD_ESTIMATORS:
        return "norm_adv_by_std_in_grpo=False (Dr. GRPO) does not divide by the group std"
    return f"adv_estimator={est} does not divide by the group std"


def _estimator_findings(s: Settings, f: RewardFacts) -> list[Finding]:
    """PH051 (the estimator is unresolved) and PH062 (an entry point the audit does not model)."""
    out = []
    est_key = "algorithm.adv_estimator"
    est = s.value(est_key)
    if isinstance(est, Unresolved):
        opts = f" (seen: {', '.join(est.options)})" if est.options else ""
        out.append(_f("PH051", "estimator-unresolved", "warning", s, est_key,
                      f"adv_estimator comes from `{est}`{opts}, which the audit cannot resolve"
                      + (f" ({est.why})" if est.why else "") + f"; the reward is {f.verdict}",
                      "if it is grpo (or another estimator that divides by the group std) the phantom rules apply; "
                      "the audit cannot call the run clean without knowing", "set algorithm.adv_estimator in the "
                      "file, or audit the override list the run is launched with", "estimators"))
    if s.entrypoint_assumed or s.spec.modelled:
        return out
    if s.spec.name.startswith("unknown:"):
        msg = (f"`{s.spec.name[len('unknown:'):]}` is an entry point the audit does not know: read as main_ppo; "
               "findings may not apply")
    else:
        msg = f"{s.spec.label}: {s.spec.note}; findings below assume verl's own semantics and may not apply"
    out.append(_f("PH062", "unknown-entrypoint", "warning", s, None, msg,
                  "each trainer reads its own config: a key verl's main_ppo honours may be ignored or mean something "
                  "else here, so a clean report would be a guess", "audit a launch of a trainer the audit knows "
                  "(phantom audit --help lists them), or pass --entrypoint NAME if this one wraps one of them",
                  "reference"))
    return out


def verl_findings(s: Settings, f: RewardFacts, *, all_same: AllSame | None = None) -> list[Finding]:
    out = legacy_findings(s) + hydra_findings(s) + _estimator_findings(s, f)
    en_key, m_key = "algorithm.filter_groups.enable", "algorithm.filter_groups.metric"
    enabled = s.flag(en_key)
    maybe = enabled is None and s.is_set(en_key)  # set through something unresolved
    ignored = None
    if (enabled or maybe) and s.spec.filter is None:
        ignored = f"{s.spec.label} reads no algorithm.filter_groups ({s.spec.source.split(': ', 1)[-1][:160]})"
    elif (enabled or maybe) and s.trainer == "main_ppo" and s.flag("trainer.use_v1") is False:
        ignored = "trainer.use_v1=False runs the legacy trainer, which has no group filter"
    if ignored:
        out.append(_f("PH006", "filter-ignored-legacy-trainer", "warning", s, en_key if s.is_set(en_key) else
                      "trainer.use_v1", f"group filtering is enabled but {ignored}",
                      "the filter you configured never runs, so dead and phantom groups all train",
                      "trainer.use_v1=True with verl.trainer.main_ppo (the 0.9.x default), or verl-recipe's DAPO "
                      "trainer" if s.spec.filter is not None else "a trainer that filters groups (verl main_ppo with "
                      "trainer.use_v1=True, or recipe.dapo.main_dapo), or an outcome-gated estimator "
                      "(algorithm.adv_estimator=phantom_grpo_outcome)", "verl",
                      ("trainer.use_v1=True",) if s.spec.filter is not None else (),
                      {"trainer.use_v1": True} if s.spec.filter is not None else None))
        enabled, maybe = False, False
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
                      "verl 0.9.1 changed the default to `reward`, the shaped score", _FIX_ACC, "filter", _ACC_OV, _ACC_EXP))
    elif active and isinstance(metric, Unresolved):
        out.append(_f("PH001", "filter-on-shaped-metric", "warning", s, loc,
                      f"the filter metric comes from `{metric}`, which the audit cannot resolve; if it is score, "
                      "seq_reward, seq_final_reward or reward, the filter reads the shaped score", _WHY_PHANTOM,
                      _FIX_ACC, "filter", _ACC_OV, _ACC_EXP))
    elif active and sig is not None:
        default = "" if s.is_set(m_key) else f" (the verl {s.version} default: unset here)"
        if sig.missing:
            out.append(_f("PH004", "filter-metric-missing", cap("error"), s, loc,
                          f"the filter reads `{metric}`{default}, which this reward does not produce: {sig.why}",
                          "verl raises at the first step ('Finished groups are missing DAPO metric' in 0.9.1, a "
                          "KeyError in the recipe trainer)", _FIX_ACC, "filter", _ACC_OV, _ACC_EXP))
        elif metric in SHAPED_METRICS and sig.shaped is not False:
            amp = _amplified(s)
            sev = (cap("error") if sig.shaped else "warning") if amp is not False else "info"
            tail = "" if amp is not False else (
                f"; but {_why_not_amplified(s)}, so the phantom groups it keeps get advantages the size of the "
                "shaping, not full-size ones")
            out.append(_f("PH001", "filter-on-shaped-metric", sev, s, loc,
                          f"the group filter reads `{metric}`{default}: {sig.why}; here it "
                          + ("carries the shaping" if sig.shaped else "may carry shaping (the audit cannot tell)") + tail,
                          _WHY_PHANTOM, _FIX_ACC + ("; or drop std normalization (algorithm.norm_adv_by_std_in_grpo="
                                                    "False)" if amp else ""), "filter", _ACC_OV, _ACC_EXP))
        elif metric not in SHAPED_METRICS and sig.shaped is not False and metric != "acc":
            out.append(_f("PH003", "non-binary-acc", cap("error") if sig.shaped else "warning", s, loc,
                          f"the group filter reads `{metric}`: {sig.why}" +
                          ("" if sig.shaped else "; the audit cannot tell whether it is binary"),
                          _WHY_PHANTOM, _FIX_ACC, "filter", _ACC_OV, _ACC_EXP))
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
                      "reward.reward_manager.name=dapo", "verl", ("reward.reward_manager.name=dapo",),
                      {"reward.reward_manager.name": "dapo"}))
    if not s.spec.modelled:  # the rules assume verl's semantics; this trainer's own may differ
        out = [replace(x, severity="warning") if x.severity == "error" and x.rule not in _CONFIG_RULES else x
               for x in out]
    if f.composite is None:
        hint = f" (the config names {f.custom_path})" if isinstance(f.custom_path, str) else ""
        out.append(_f("PH050", "reward-shape-unknown", "info", s, "reward.custom_reward_function.path",
                      "the audit cannot tell whether the reward scores failures differently" + hint,
                      "findings that depend on it are warnings instead of errors",
                      "pass --reward-fn PATH[:NAME] (imported and called on 8 probe answers) or --shaped/--no-shaped",
                      "reference"))
    return out


def _acc_findings(s: Settings, f: RewardFacts, filter_reads_acc: bool, cap: Any, loc: str) -> list[Finding]:
    path_key = "reward.custom_reward_function.path"
    out = []
    builtin = f.custom_path is None and f.builtin
    spread_builtin = any(sc is not None and sc.failure_spread for _, sc in f.builtin)
    if f.returns == "float" and f.score_shaped and (not builtin or spread_builtin):
        sev = cap("error") if filter_reads_acc else ("info" if builtin else "warning")
        what = ("so algorithm.filter_groups.metric=acc filters on the shaped score" if filter_reads_acc else
                "so val-core/<data_source>/acc reports the shaped score, not accuracy")
        who = "verl's built-in scorer for this data returns a float" if builtin else \
            "the reward function returns a float"
        out.append(_f("PH002", "float-reward-acc", sev, s, "data.train_files" if builtin else path_key,
                      f"{who} that spreads among failures; verl then sets acc = score, {what}",
                      _WHY_PHANTOM if filter_reads_acc else
                      "a shaped `acc` hides the outcome from the filter, the validation headline and dashboards",
                      "return a dict: {'score': shaped, 'acc': float(outcome)}" + (
                          " from a custom reward function (reward.custom_reward_function.path) that wraps the "
                          "built-in scorer" if builtin else ""), "defaults"))
    elif f.returns in ("dict", "mixed") and f.acc_binary is False:
        out.append(_f("PH003", "non-binary-acc", cap("error") if filter_reads_acc else "warning", s, path_key,
                      "the reward dict's `acc` is not 0/1" + (", and the group filter reads it" if filter_reads_acc
                                                               else ""),
                      _WHY_PHANTOM if filter_reads_acc else "verl reports `acc` as the validation accuracy",
                      "make `acc` the binary outcome and put partial credit or shaping in `score`", "defaults"))
    elif filter_reads_acc and f.returns is None and f.acc_binary is None and f.score_shaped is not False:
        out.append(_f("PH002", "float-reward-acc", "warning", s, loc,
                      "the filter reads `acc`, which is binary only if the reward function returns a dict with a "
                      "binary `acc`; a float return makes acc = the shaped score",
                      _WHY_PHANTOM, "check it with --reward-fn PATH[:NAME]; " + _FIX_ACC, "defaults"))
    return out


def _gdpo_keys(s: Settings) -> list[str] | None:
    v = s.value("algorithm.gdpo_reward_keys")
    if isinstance(v, str) and v.strip().startswith("["):
        v = [x.strip().strip("'\"") for x in v.strip()[1:-1].split(",") if x.strip()]
    return [str(x) for x in v] if isinstance(v, list) else None


def _std_norm(s: Settings, f: RewardFacts, outcome_filter: bool, gate_unknown: bool) -> list[Finding]:
    est_key, norm_key = "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo"
    est = s.value(est_key)
    if isinstance(est, Unresolved) or est in OUTCOME_GATE_ESTIMATORS or outcome_filter:
        return []
    if est not in GROUP_STD_ESTIMATORS:
        return []
    norm = s.flag(norm_key)
    loc = est_key if s.is_set(est_key) else norm_key
    if est == "gdpo":
        keys = _gdpo_keys(s) or []
        shaping = [k for k in keys if _SHAPING_NAME.search(k)]
        if shaping or (f.composite and not keys):
            outcome = [k for k in keys if k not in shaping]
            fix = (f"+algorithm.gdpo_reward_keys=[{','.join(outcome)}]",) if outcome else ()
            return [_f("PH012", "gdpo-normalizes-shaping-key", "error", s,
                       "algorithm.gdpo_reward_keys" if keys else loc,
                       "adv_estimator=gdpo z-scores each reward key within its group"
                       + (f", including the shaping key(s) {', '.join(shaping)}" if shaping else "")
                       + " and whitens the sum; verl 0.9.1 passes it no norm_adv_by_std_in_grpo, so it always "
                         "divides by the std",
                       "in an all-fail group the accuracy key is flat but a format or length key still varies, and "
                       "its z-score is a full-size advantage whatever its weight (the phantom, per reward key)",
                       (f"{fix[0]} (outcome keys only), or " if fix else "") + "gate the shaping key on the "
                       "outcome inside compute_score (0 format reward when the answer is wrong)", "estimators",
                       fix, {"algorithm.gdpo_reward_keys": outcome} if fix else None)]
    if f.composite is False:
        if est in STD_ALWAYS_ESTIMATORS and norm is False:
            return [_flag_ignored(s, est, "warning", "the reward is outcome-only, so no phantom, but the run is not "
                                                     "the Dr. GRPO it asks for")]
        return []
    if est in STD_ALWAYS_ESTIMATORS and norm is False:
        sev = "error" if f.composite and not gate_unknown else "warning"
        return [_flag_ignored(s, est, sev, f"the reward is {f.verdict}, so all-fail groups with shaping spread "
                                          "still get full-size advantages")]
    if norm is False:
        return []
    sev = "error" if f.composite and norm is True and not gate_unknown else "warning"
    gate = "the filter may or may not be an outcome gate" if gate_unknown else "no outcome gate is set"
    alt = " (with adv_estimator=grpo: grpo_vectorized ignores the flag in verl 0.9.1)" \
        if est in STD_ALWAYS_ESTIMATORS else ""
    overrides = ("algorithm.norm_adv_by_std_in_grpo=False",) + (
        ("algorithm.adv_estimator=grpo",) if est in STD_ALWAYS_ESTIMATORS else ())
    expect = {"algorithm.norm_adv_by_std_in_grpo": False, "algorithm.adv_estimator": "grpo" if alt else est}
    return [_f("PH010", "std-norm-with-shaping", sev, s, loc,
               f"adv_estimator={est} divides each group by its std (norm_adv_by_std_in_grpo={norm}) while the "
               f"reward is {f.verdict} and {gate}",
               "an all-fail group that differs only by shaping gets advantages of about ±1 whatever λ is, as loud "
               "as a group with a real success (paper §9: ±1.4 with the std vs ±0.12 without)",
               " ".join(overrides) + f" (Dr. GRPO){alt}, or an outcome gate: "
               "algorithm.adv_estimator=phantom_grpo_outcome, or algorithm.filter_groups.enable=True with "
               "metric=acc (binary acc)", "estimators", overrides, expect)]


def _flag_ignored(s: Settings, est: str, sev: str, consequence: str) -> Finding:
    return _f("PH011", "std-norm-flag-ignored", sev, s, "algorithm.norm_adv_by_std_in_grpo",
              f"norm_adv_by_std_in_grpo=False is ignored with adv_estimator={est} in verl 0.9.1: the run is still "
              f"std-normalized; {consequence}",
              "compute_advantage passes the flag only to the `grpo` branch; the generic branch calls "
              f"compute_{est}_outcome_advantage without it, and its default is True (verl PR #7893, closed unmerged)",
              "algorithm.adv_estimator=grpo (keeps norm_adv_by_std_in_grpo=False: Dr. GRPO)", "estimators",
              ("algorithm.adv_estimator=grpo",),
              {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False})
