"""The TRL rules (PH020-PH023, PH030): TRL has no group filter, so the phantom is decided by the reward.

TRL's ``GRPOTrainer`` sums the reward functions (weighted) and divides each group by its std
(``scale_rewards="group"``, the default). If the sum spreads among failures - a format, length or
tag-count term next to the correctness function, or one continuous reward - an all-fail group gets
full-size advantages, and no filter can drop it. The fixes point to the outcome-gated wrapper
(:data:`phantom.audit.trl.OUTCOME_GATED_SNIPPET`) or to Dr. GRPO's ``scale_rewards``, in the form of
the TRL version the config states.
"""

from __future__ import annotations

from typing import Any

from phantom.audit.facts import RewardFacts
from phantom.audit.model import Finding, Unresolved, chapter
from phantom.audit.schema import Settings
from phantom.audit.trl import OUTCOME_GATED_SNIPPET, scale_rewards_fix

__all__ = ["trl_findings"]


def _f(rule: str, name: str, severity: str, s: Settings, key: str, message: str, why: str, fix: str, topic: str,
       kwargs: dict[str, Any] | None = None) -> Finding:
    file, line = s.where(key)
    return Finding(rule, name, severity, key, message, why, fix, chapter(topic), file, line,
                   fix_kwargs=kwargs or {})


def _gate_fix(f: RewardFacts, scale_text: str) -> str:
    live = [t for t in f.trl_funcs if t.weight != 0]
    outcome = [t.name for t in live if t.shaped is False]
    shaping = [t.name for t in live if t.shaped is not False]
    here = ""
    if outcome and shaping:
        here = f" (here: outcome_gated({outcome[0]}, {', '.join(shaping)}, num_generations=...))"
    return (f"wrap the reward functions so shaping counts only where the outcome differs{here}:\n"
            f"{OUTCOME_GATED_SNIPPET}\nor use Dr. GRPO: {scale_text}")


def trl_findings(s: Settings, f: RewardFacts, trl_version: str | None = None) -> list[Finding]:
    out = []
    scale = s.value("scale_rewards")
    agg = s.value("multi_objective_aggregation")
    key = "scale_rewards" if s.is_set("scale_rewards") else "reward_funcs"
    scale_text, scale_kwargs = scale_rewards_fix(trl_version)
    live = [t for t in f.trl_funcs if t.weight != 0]
    funcs = ", ".join(t.name for t in live) or "the reward"
    single = len(live) == 1
    # outcome_gated flattens the shaping inside outcome-degenerate groups: no phantom is left to find
    exposed = f.composite is not False and not f.gated
    if "grpo_with_replay_buffer" in s.doc.mentions:
        out.append(_f("PH023", "trl-replay-buffer-removed", "error", s, "reward_funcs",
                      "this script imports trl.experimental.grpo_with_replay_buffer, which TRL 1.16 no longer ships "
                      "(the import fails)", "the replay-buffer trainer was removed; it also judged zero variance on "
                      "the summed reward, so phantom groups counted as live there too",
                      "use GRPOTrainer; to keep shaping out of all-fail groups, " + _gate_fix(f, scale_text),
                      "defaults", scale_kwargs))
    if "async_grpo" in s.doc.mentions and exposed:
        out.append(_f("PH022", "trl-async-grpo-std", "error" if f.composite else "warning", s, "reward_funcs",
                      f"TRL's experimental AsyncGRPOTrainer computes (r - mean) / (std + 1e-8) per group, always, "
                      f"with no scale_rewards or loss_type to turn it off; the reward ({funcs}) is {f.verdict}",
                      "every all-fail group whose reward still varies gets full-size advantages, and there is no "
                      "switch: the most phantom-prone trainer in TRL",
                      "gate the shaping on the outcome in the reward itself, or train with GRPOTrainer and "
                      + _gate_fix(f, scale_text), "defaults"))
    if exposed and isinstance(scale, Unresolved) and "async_grpo" not in s.doc.mentions:
        out.append(_f("PH020", "trl-shaping-group-scale", "warning", s, key,
                      f"scale_rewards comes from `{scale}`, which the audit cannot resolve"
                      + (f" ({scale.why})" if scale.why else "") + f"; with 'group' (TRL's default) and this "
                      f"reward ({funcs}, {f.verdict}) all-fail groups get full-size advantages",
                      "in an all-fail group the reward still varies with the shaping terms, and dividing by the "
                      "group std turns that variation into full-size advantages", _gate_fix(f, scale_text), "defaults",
                      scale_kwargs))
    if exposed and not isinstance(scale, Unresolved) and "async_grpo" not in s.doc.mentions:
        what = (f"the one reward function ({funcs}) gives different scores to different failures" if single else
                f"the summed reward ({funcs}) spreads among failures")
        if f.composite is None:
            what = f"the audit cannot tell whether the reward ({funcs}) spreads among failures"
        if agg == "normalize_then_sum" and not single:
            out.append(_f("PH020", "trl-shaping-group-scale", "warning" if f.composite is None else "error", s,
                          "multi_objective_aggregation",
                          f"normalize_then_sum z-scores each reward function within its group ({funcs}); a shaping "
                          "function stays O(1) in all-fail groups",
                          "GDPO-style aggregation removes the correctness term from an all-fail group but keeps the "
                          "shaping term at full size times its weight", _gate_fix(f, scale_text), "rules"))
        elif scale in ("group", True):
            sev = "error" if f.composite else ("info" if single else "warning")
            out.append(_f("PH020", "trl-shaping-group-scale", sev, s, key,
                          f"scale_rewards={scale!r} divides each group by its std and TRL has no group filter; {what}",
                          "in an all-fail group the reward still varies, and dividing by the group std turns that "
                          "variation into full-size advantages whatever the weights",
                          _gate_fix(f, scale_text) if not single or f.composite is None else
                          f"{scale_text} (Dr. GRPO), or split the reward into an outcome function and shaping "
                          "functions and wrap them:\n" + OUTCOME_GATED_SNIPPET, "defaults", scale_kwargs))
        elif scale == "batch":
            out.append(_f("PH020", "trl-shaping-group-scale", "info", s, key,
                          f"scale_rewards='batch' ({funcs}): phantom advantages are divided by the batch std, which "
                          "mixed groups dominate, so they shrink but do not vanish",
                          "batch scaling weakens the phantom without removing it", _gate_fix(f, scale_text), "rules",
                          scale_kwargs))
    if exposed:
        mentioned = "frac_reward_zero_std" in s.doc.mentions
        out.append(_f("PH021", "trl-frac-reward-zero-std", "warning" if mentioned else "info", s,
                      "reward_funcs", "TRL's frac_reward_zero_std is computed on the summed reward"
                      + (", and this file reads it" if mentioned else ""),
                      "under shaping an all-fail group has nonzero std, so this dead-group count misses exactly the "
                      "phantom groups", "log a per-group outcome statistic: phantom.trl.PhantomCallback, "
                      "log_completions=True, or a callback counting groups whose correctness reward is all 0",
                      "defaults"))
    if s.value("mask_truncated_completions") is True:
        out.append(_f("PH030", "mask-drop-no-refill", "info", s, "mask_truncated_completions",
                      "mask_truncated_completions=True removes truncated completions from the loss without refill",
                      "the token-mean loss is rescaled by 1/kept fraction, and masked completions still count in "
                      "the group mean and std", "keep it if you want it; phantom groups are not affected by it",
                      "what_not"))
    return out
