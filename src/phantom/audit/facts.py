"""What the audit can tell about the reward: is it composite, and which signals carry the shaping?

"Composite" here means what matters for the phantom: do *different failures get different
scores*? Then an all-fail group has spread, survives a shaped-score filter, and std normalization
blows the spread up to full-size advantages. The answer comes, strongest first, from the user
(``--shaped/--no-shaped``), from probing the reward function (``--reward-fn``), from what the
config says (a known reward function, a shaping coefficient in ``reward_kwargs``, DAPO's overlong
buffer, several TRL reward functions), or stays unknown (``None``) and is reported as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from phantom.audit.locate import locate
from phantom.audit.model import Evidence, Unresolved
from phantom.audit.probe import ProbeResult
from phantom.audit.reward_ast import Shape, function_shape
from phantom.audit.schema import Settings
from phantom.audit.scorers import BUILTIN, Scorer, scorer_for, sources_from_files
from phantom.audit.text import MAX_BYTES

__all__ = ["SHAPED_METRICS", "GROUP_STD_ESTIMATORS", "OUTCOME_GATE_ESTIMATORS", "PHANTOM_REWARD", "RewardFacts",
           "Signal", "TrlFunc", "metric_signal", "tri_or", "trl_facts", "verl_facts"]

#: filter metrics that read the shaped scalar (verl core, verl-recipe, and 0.9.1's default)
SHAPED_METRICS: tuple[str, ...] = ("score", "seq_reward", "seq_final_reward", "reward")
#: estimators that divide by the group std when ``norm_adv_by_std_in_grpo`` is on
GROUP_STD_ESTIMATORS = frozenset({"grpo", "grpo_vectorized", "grpo_passk", "gdpo", "phantom_grpo_none",
                                  "phantom_grpo_score"})
#: verl 0.9.1 estimators that divide by the group std *whatever* ``norm_adv_by_std_in_grpo`` says: the
#: generic branch of ``ray_trainer.compute_advantage`` does not pass the flag and their signature
#: defaults it to True (gdpo also whitens the summed advantage afterwards)
STD_ALWAYS_ESTIMATORS = frozenset({"grpo_vectorized", "gdpo"})
OUTCOME_GATE_ESTIMATORS = frozenset({"phantom_grpo_outcome"})
PHANTOM_REWARD = "pkg://phantom.verl.reward"
_COEF = re.compile(r"^(lam|lambda|lmbda|alpha|coef\w*|\w*_coef\w*|\w*weight\w*|\w*penalty\w*|\w*bonus\w*|"
                   r"format_score|len\w*|\w*_len\w*|\w*length\w*)$", re.I)
TRL_BINARY = frozenset({"accuracy_reward", "accuracy", "reasoning_accuracy_reward", "binary_code",
                        "binary_code_reward"})
TRL_SHAPING = frozenset({"think_format_reward", "get_soft_overlong_punishment", "soft_overlong_punishment",
                         "format", "format_reward", "tag_count", "tag_count_reward", "reasoning_steps",
                         "reasoning_steps_reward", "cosine", "get_cosine_scaled_reward", "repetition_penalty",
                         "get_repetition_penalty_reward", "length", "len_reward",
                         # open-r1's code rewards: the fraction of test cases passed (partial credit)
                         "code", "code_reward", "ioi_code", "ioi_code_reward", "cf_code", "cf_code_reward",
                         "code_format", "get_code_format_reward"})
_SHAPING_NAME = re.compile(r"format|length|(^|_)len(_|$)|penalty|cosine|tag|steps|repetition|overlong|bonus|"
                           r"brevity|concise|style", re.I)
_BINARY_NAME = re.compile(r"accuracy|correct|exact_match", re.I)
_BUILTIN_SET = frozenset(BUILTIN)


def tri_or(*values: bool | None) -> bool | None:
    """True if any is True, False if all are False, else None (unknown)."""
    if any(v is True for v in values):
        return True
    return False if all(v is False for v in values) else None


@dataclass
class TrlFunc:
    name: str
    weight: float | None
    shaped: bool | None
    why: str


@dataclass
class RewardFacts:
    """The audit's view of the reward (verl or TRL)."""

    composite: bool | None = None
    score_shaped: bool | None = None  # the reward function's own score spreads among failures
    overlong: bool = False  # verl DAPO overlong penalty: in ``reward``/rm_scores, not in score/acc
    custom_path: Any = None
    returns: str | None = None  # "dict" | "float" | None (unknown)
    acc_binary: bool | None = None
    keys: frozenset[str] | None = None
    probe: ProbeResult | None = None
    evidence: list[Evidence] = field(default_factory=list)
    trl_funcs: list[TrlFunc] = field(default_factory=list)
    builtin: list[tuple[str, Scorer | None]] = field(default_factory=list)  # (data_source, scorer) used
    spread: dict[str, bool | None] = field(default_factory=dict)  # format/length/overlong/empty among failures
    gated: bool = False  # TRL: the reward functions are wrapped by phantom.trl.outcome_gated

    @property
    def verdict(self) -> str:
        return {True: "composite", False: "outcome-only", None: "unknown"}[self.composite]


def _kwargs(s: Settings) -> dict[str, Any]:
    entries = {**s.doc.under("custom_reward_function.reward_kwargs"),
               **s.doc.under("reward.custom_reward_function.reward_kwargs")}
    return {k: e.value for k, e in entries.items()}


def read_body(path: Any, name: str, near: str) -> tuple[Shape | None, str]:
    """The shape of a reward function in a file a config names, read with ast; (None, why) if not found."""
    if not isinstance(path, str):
        return None, f"its path {path} cannot be resolved"
    file = locate(path, near)
    if file is None:
        return None, f"{path} is not found here"
    try:
        text = file.read_text(encoding="utf-8", errors="replace")[:MAX_BYTES]
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror})"
    shape = function_shape(text, name)
    return shape, (f"no function {name} in {path}" if shape is None else f"{name} in {file.name}")


def _apply_body(f: RewardFacts, shape: Shape, where: str, key: str, loc: str | None) -> bool:
    """verl facts from a compute_score body (float: acc = score; dict: its `score` and `acc`)."""
    sc = shape.scalar()
    if sc.kind == "dict":
        score, acc = sc.keys.get("score"), sc.keys.get("acc")
        f.returns, f.keys = "dict", frozenset(sc.keys)
        f.score_shaped = {"shaped": True, "binary": False}.get(score.verdict) if score else None
        f.acc_binary = {"binary": True, "shaped": False}.get(acc.verdict) if acc else None
    else:
        f.returns = "float"
        f.score_shaped = {"shaped": True, "binary": False}.get(sc.verdict)
        f.acc_binary = None if f.score_shaped is None else not f.score_shaped
    f.evidence.append(Evidence(f"read from the body of {where} (not run): {shape.describe()}", key, loc))
    return f.score_shaped is not None or f.acc_binary is not None


def _where(s: Settings, key: str) -> str | None:
    e = s.entry(key)
    return e.where if e is not None else None


def _builtin(s: Settings, f: RewardFacts, data_source: str | None) -> None:
    """No custom reward function: verl's ``default_compute_score``, by the data's ``data_source``."""
    key = "data.train_files"
    if data_source:
        pairs = [(f"--data-source {data_source}", data_source)]
    else:
        files = s.value(key)
        pairs = sources_from_files(files) if files is not None else []
    unknown = [p for p, src in pairs if not src]
    if not pairs or unknown:
        what = f"{key} ({', '.join(unknown)[:120]})" if pairs else f"{key} (not set)"
        f.evidence.append(Evidence("verl's built-in scorer depends on each row's data_source, which the audit cannot "
                                   f"infer from {what}; pass --data-source NAME", key, _where(s, key)))
    scorers: list[Scorer] = []
    for p, src in pairs:
        if not src:
            continue
        sc = scorer_for(src)
        f.builtin.append((src, sc))
        if sc is None:
            f.evidence.append(Evidence(f"data_source {src!r} (from {p}) has no built-in scorer in verl 0.9.1 "
                                       "(NotImplementedError): the reward is unknown", key, _where(s, key)))
            unknown.append(p)
            continue
        scorers.append(sc)
        where = "" if sc in _BUILTIN_SET else ", not in verl 0.9.1"
        f.evidence.append(Evidence(f"built-in scorer for {src} ({sc.module}{where}): {sc.semantics}; {sc.note}", key,
                                   _where(s, key)))
    complete = bool(pairs) and not unknown
    if any(sc.failure_spread for sc in scorers):
        f.score_shaped = True
    elif complete:
        f.score_shaped = False
    if any(not sc.acc_binary for sc in scorers):
        f.acc_binary = False
    elif complete:
        f.acc_binary = True
    kinds = {sc.returns for sc in scorers}
    f.returns = kinds.pop() if complete and len(kinds) == 1 else None
    for sc in scorers:
        if sc.semantics == "format-credit":
            f.spread["format"] = True
        if sc.semantics == "partial-credit":
            f.spread["partial"] = True


def verl_facts(s: Settings, probe: ProbeResult | None = None, shaped: bool | None = None,
               data_source: str | None = None) -> RewardFacts:
    f = RewardFacts()
    path_key = "reward.custom_reward_function.path"
    path = s.value(path_key)
    f.custom_path = path
    kwargs = _kwargs(s)
    rm_key = "reward.reward_model.enable"
    if path is None and s.flag(rm_key) and shaped is None and probe is None:
        f.score_shaped, f.composite = False, False
        f.evidence.append(Evidence("a reward model scores the responses: a continuous preference score with no "
                                   "pass/fail outcome, so there are no all-fail groups for shaping to revive (the "
                                   "audit's rules are about outcome rewards)", rm_key, _where(s, rm_key)))
        return f
    if path is None and s.spec.scorer == "entropy_math":
        f.returns, f.acc_binary, f.score_shaped = "dict", True, False
        f.evidence.append(Evidence("the entropy recipe's default scorer (entropy/reward_score): a dict with score 0/1 "
                                   "and a boolean `acc`, whatever the data source"))
    elif path is None:
        _builtin(s, f, data_source)
    elif isinstance(path, str) and (path == PHANTOM_REWARD or path.endswith("phantom/verl/reward.py")):
        lam = kwargs.get("lam", 0.3)
        f.returns, f.acc_binary = "dict", True
        f.score_shaped = None if not isinstance(lam, (int, float)) else lam != 0
        f.evidence.append(Evidence(f"phantom's reward with lam={lam} (dict with a binary `acc`)", path_key,
                                   _where(s, path_key)))
    else:
        fn_name = s.value("reward.custom_reward_function.name") or "compute_score"
        shape, where = read_body(path, str(fn_name), s.doc.path) if probe is None else (None, "")
        hits = {k: v for k, v in kwargs.items() if _COEF.match(k.split(".")[-1]) and isinstance(v, (int, float))
                and not isinstance(v, bool)}
        if shape is not None and _apply_body(f, shape, where, path_key, _where(s, path_key)):
            pass
        elif hits:
            f.score_shaped = any(v != 0 for v in hits.values())
            key, value = next(iter(hits.items()))
            f.evidence.append(Evidence(f"shaping coefficient {key}={value} in reward_kwargs",
                                       f"reward.custom_reward_function.reward_kwargs.{key}",
                                       _where(s, f"reward.custom_reward_function.reward_kwargs.{key}")))
        else:
            f.evidence.append(Evidence(f"custom reward function {path} (its shape is unknown: "
                                       f"{where or 'probed below'}; pass --reward-fn)", path_key, _where(s, path_key)))
    if probe is not None:  # the probe supersedes what the config hinted about the function
        f.evidence = [e for e in f.evidence if e.key != path_key and "reward_kwargs" not in (e.key or "")]
        f.probe, f.returns, f.keys = probe, probe.returns, probe.keys
        f.acc_binary = probe.binary("acc")
        f.score_shaped = probe.spread_among_failures("score")
        f.spread = probe.spread()
        f.evidence.append(Evidence("probe: " + probe.summary()))
    if shaped is not None:
        f.score_shaped = shaped
        f.evidence.append(Evidence(f"--{'' if shaped else 'no-'}shaped given"))
    manager = s.value("reward.reward_manager.name")
    if s.flag("reward.reward_kwargs.overlong_buffer_cfg.enable") and manager == "dapo":
        f.overlong = True
        key = "reward.reward_kwargs.overlong_buffer_cfg.enable"
        e = s.entry(key)
        meant = "" if e is None or e.key == s.live_key(key) or s.spec.migrates else \
            f"; as meant by `{e.key}`, which {s.spec.label} ignores"
        f.evidence.append(Evidence("DAPO overlong penalty enabled (added to `reward`, not to `score`/`acc`)" + meant,
                                   key, _where(s, key)))
    f.composite = tri_or(f.score_shaped, f.overlong)
    return f


@dataclass(frozen=True)
class Signal:
    """What a filter metric reads: shaped (spreads among failures)? missing (verl raises)?"""

    shaped: bool | None
    missing: bool | None
    why: str


def metric_signal(metric: Any, s: Settings, f: RewardFacts) -> Signal:
    if isinstance(metric, Unresolved) or not isinstance(metric, str):
        return Signal(None, None, f"the metric {metric!r} cannot be resolved from the file")
    kl = s.flag("algorithm.use_kl_in_reward")
    if metric == "reward" and s.trainer == "main_ppo":
        return Signal(f.composite, False, "verl 0.9.1 reads `reward` as the summed rm_scores: the training reward "
                                          "itself, shaping and overlong penalty included")
    if metric in ("seq_reward", "seq_final_reward") and s.trainer == "recipe":
        extra = metric == "seq_final_reward" and kl is True
        why = f"the recipe's `{metric}` sums the token-level {'rewards (KL included)' if extra else 'scores'}"
        return Signal(True if extra else f.composite, False, why)
    if metric == "acc":
        if f.returns == "float":
            return Signal(f.score_shaped, False, "the reward function returns a float, so verl sets acc = score")
        if f.returns in ("dict", "mixed") and f.keys is not None and "acc" not in f.keys:
            return Signal(None, True, "the reward dict has no `acc` key")
        if f.acc_binary is False:
            return Signal(f.probe.spread_among_failures("acc") if f.probe else True, False,
                          "the reward's `acc` is not binary")
        if f.acc_binary is True:
            return Signal(False, False, "`acc` is the binary outcome")
        return Signal(f.score_shaped if f.score_shaped is False else None, None,
                      "`acc` is binary only if the reward function returns a dict with a binary `acc` "
                      "(a float return makes acc = score)")
    if metric == "score":
        if f.returns == "float":
            return Signal(None, True, "a float-returning reward stores only `acc` (= score), no `score` key")
        return Signal(f.score_shaped, False if f.returns == "dict" else None,
                      "`score` is the reward function's own score (before DAPO's overlong penalty)")
    if f.probe is not None:
        present = metric in f.keys if f.returns == "dict" else metric == "acc"
        return Signal(f.probe.spread_among_failures(metric) if present else None, not present,
                      f"`{metric}` is read from the reward's extra info")
    if metric in ("seq_reward", "seq_final_reward"):
        return Signal(None, None, f"`{metric}` is a verl-recipe name; verl 0.9.1 main_ppo looks it up in the "
                                  "reward's extra info and raises if the reward does not return it")
    return Signal(None, None, f"`{metric}` is read from the reward's extra info; its values are unknown "
                              "without --reward-fn")


def _trl_func_shaped(name: str, probes: dict[str, ProbeResult],
                     bodies: dict[str, Any] | None = None) -> tuple[bool | None, str]:
    short = name.rsplit(".", 1)[-1]
    if short in probes:
        spread = probes[short].spread_among_failures("score")
        return spread, f"probe: {probes[short].summary()}"
    body = (bodies or {}).get(short)
    if body is not None:
        verdict = body.scalar().verdict
        return {"binary": False, "shaped": True}.get(verdict), f"read from its body (not run): {body.describe()}"
    if short in TRL_BINARY:
        return False, "a binary correctness reward"
    if short in TRL_SHAPING:
        return True, "a known shaping reward (it scores failures differently)"
    if _SHAPING_NAME.search(short):
        return True, "a shaping reward, judging from its name (its body is not in the audited file)"
    if _BINARY_NAME.search(short):
        return False, "a correctness reward, judging from its name (its body is not in the audited file)"
    return None, "unknown without --reward-fn"


def trl_facts(s: Settings, probes: dict[str, ProbeResult] | None = None, shaped: bool | None = None) -> RewardFacts:
    f = RewardFacts()
    probes = probes or {}
    funcs = s.value("reward_funcs")
    weights = s.value("reward_weights")
    names: list[str] = [funcs] if isinstance(funcs, str) else list(funcs) if isinstance(funcs, list) else []
    if isinstance(funcs, Unresolved):
        f.evidence.append(Evidence(f"reward_funcs={funcs} cannot be resolved", "reward_funcs",
                                   _where(s, "reward_funcs")))
    if s.doc.get("reward_model_name_or_path"):
        names.append(str(s.doc.get("reward_model_name_or_path")))
    ws = weights if isinstance(weights, list) and len(weights) == len(names) else [None] * len(names)
    for name, w in zip(names, ws):
        sh, why = _trl_func_shaped(name, probes, s.doc.bodies)
        f.trl_funcs.append(TrlFunc(name, w, sh, why))
    live = [t for t in f.trl_funcs if t.weight != 0]
    if live:
        f.score_shaped = tri_or(*(t.shaped for t in live))
        desc = ", ".join(f"{t.name}" + (f" (x{t.weight:g})" if t.weight not in (None, 1) else "") for t in live)
        f.evidence.append(Evidence(f"{len(live)} reward function(s) summed: {desc}", "reward_funcs",
                                   _where(s, "reward_funcs")))
        f.evidence += [Evidence(f"{t.name}: {t.why}") for t in live]
    if shaped is not None:
        f.score_shaped = shaped
        f.evidence.append(Evidence(f"--{'' if shaped else 'no-'}shaped given"))
    f.composite = f.score_shaped
    if "outcome_gated" in s.doc.mentions:
        f.gated = True
        f.evidence.append(Evidence("wrapped by phantom.trl.outcome_gated: inside a group whose outcomes are all "
                                   "equal the shaping terms are one constant, so that group gets zero advantage",
                                   "reward_funcs", _where(s, "reward_funcs")))
    return f
