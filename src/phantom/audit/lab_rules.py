"""Rules for phantom's own CPU-lab arm specs (a spec YAML, or a lab run's ``manifest.json``).

The lab's knobs map one to one onto the verl settings the other rules check: ``arm=score`` is a
filter on the shaped score, ``arm=none`` is plain GRPO, ``drop=mask`` removes gated rows from the
loss instead of zeroing their advantages, and ``sampling=dapo`` is DAPO's deletion and refill.
The same rule ids are used, so a reader learns one vocabulary.
"""

from __future__ import annotations

from phantom.audit.facts import RewardFacts
from phantom.audit.model import Evidence, Finding, chapter
from phantom.audit.rules import AllSame
from phantom.audit.schema import Settings

__all__ = ["lab_facts", "lab_findings"]


def lab_facts(s: Settings, shaped: bool | None = None) -> RewardFacts:
    lam, kind = s.value("lam"), s.value("kind")
    f = RewardFacts(score_shaped=bool(lam), returns="dict", acc_binary=True)
    e = s.entry("lam")
    f.evidence.append(Evidence(f"lab reward kind={kind} with lam={lam}" + ("" if e else " (the default)"), "lam",
                               e.where if e and e.line else None))
    if shaped is not None:
        f.score_shaped = shaped
        f.evidence.append(Evidence(f"--{'' if shaped else 'no-'}shaped given"))
    f.composite = f.score_shaped
    return f


def _f(rule: str, name: str, severity: str, s: Settings, key: str, message: str, why: str, fix: str,
       topic: str) -> Finding:
    file, line = s.where(key)
    return Finding(rule, name, severity, key, message, why, fix, chapter(topic), file, line)


def lab_findings(s: Settings, f: RewardFacts, *, all_same: AllSame | None = None) -> list[Finding]:
    out: list[Finding] = []
    arm, est, sampling, drop = (s.value(k) for k in ("arm", "estimator", "sampling", "drop"))
    if f.composite and arm == "score":
        how = "DAPO deletes" if sampling == "dapo" else "the gate zeroes"
        out.append(_f("PH001", "filter-on-shaped-metric", "error", s, "arm",
                      f"arm=score: {how} only groups whose shaped score is flat (DAPO metric=score)",
                      "an all-fail group still has spread in the shaped score, so it survives and std "
                      "normalization turns the shaping noise into full-size advantages (paper §5)",
                      "arm=outcome (DAPO metric=acc), or estimator=drgrpo", "filter"))
    if f.composite and arm == "none" and est in ("grpo", "gspo"):
        out.append(_f("PH010", "std-norm-with-shaping", "error", s, "estimator",
                      f"estimator={est} normalizes by the group std with a shaped reward and no gate (arm=none)",
                      "an all-fail group that differs only by shaping gets advantages of about ±1 whatever λ is "
                      "(paper §9)", "arm=outcome, or estimator=drgrpo", "estimators"))
    if drop == "mask" and sampling == "gate" and arm != "none":
        out.append(_f("PH030", "mask-drop-no-refill", "info", s, "drop",
                      "drop=mask removes gated groups' rows from the loss mask without refilling the batch",
                      "the token-mean loss is rescaled by 1/live fraction (paper §10: Adam largely absorbs it; "
                      "no consistent endpoint effect)", "drop=zero keeps the denominator fixed; sampling=dapo "
                      "deletes and refills", "what_not"))
    if sampling == "dapo" and all_same is not None:
        from phantom.audit.exposure import refill_estimate

        prompts, gen = s.value("prompts"), s.value("gen_prompts") or 2 * s.value("prompts")
        cap = s.value("max_gen_batches")
        frac = all_same.for_signal(arm == "score")
        est_ = refill_estimate(frac, train_batch=prompts, gen_batch=gen, max_batches=cap)
        if est_.p_exceed >= 0.01:
            out.append(_f("PH031", "gen-batches-too-small", "warning", s, "max_gen_batches",
                          f"max_gen_batches={cap}: with all-same fraction {frac:.2f} ({all_same.source}) a step "
                          f"needs {est_.expected:.2f} generation batches on average and exceeds the cap with "
                          f"probability {est_.p_exceed:.2g}",
                          "the lab then trains on the survivors it has (a smaller batch)",
                          f"max_gen_batches={est_.suggest}", "filter"))
    return out
