"""The phantom rules in the terms of trainers other than verl and TRL GRPO: EasyR1, ms-swift, OpenRLHF, NeMo-RL,
oat, TRL's RLOO.

Every one of them has the same two doors for the phantom, under its own names (facts and sources in
:mod:`phantom.audit.trainers`):

* **PH001** a group filter that reads a shaped signal keeps all-fail groups that differ only by
  shaping (EasyR1 ``online_filtering`` on ``filter_key: overall``; OpenRLHF's dynamic filtering on
  continuous ``scores`` - OpenRLHF #1270/#1272; ms-swift's ``dynamic_sample`` on the summed reward);
* **PH010** dividing by the group std while the reward spreads among failures (EasyR1 ``grpo``,
  ms-swift ``scale_rewards=group``, OpenRLHF ``group_norm``, NeMo-RL ``normalize_rewards`` with
  ``reward_shaping``, oat ``critic_type=grpo``), and batch-level normalization as a weaker form (TRL
  RLOO ``normalize_advantages``).

The fixes are written in each trainer's own syntax. None of these trainers' config schemas is
installable here, so every fix is *constructed* from their source (``fix_status``) rather than
composed and validated as verl's are.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from phantom.audit.facts import _BINARY_NAME, _SHAPING_NAME, RewardFacts, TrlFunc, read_body, tri_or
from phantom.audit.model import Evidence, Finding, Unresolved, chapter
from phantom.audit.schema import Settings

__all__ = ["FAMILY_DEFAULTS", "family_facts", "family_findings"]

CONSTRUCTED = "constructed from the trainer's source (its config schema is not installable here)"

#: defaults of each trainer's settings the rules read (sources in phantom.audit.trainers)
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "easyr1": {"algorithm.adv_estimator": "grpo", "algorithm.online_filtering": False,
               "algorithm.filter_key": "overall", "algorithm.filter_low": 0.01, "algorithm.filter_high": 0.99,
               "worker.reward.reward_function": None},
    "swift": {"advantage_estimator": "grpo", "scale_rewards": None, "dynamic_sample": False, "reward_funcs": None},
    "openrlhf": {"algo.advantage.estimator": "gae", "rollout.n_samples_per_prompt": 1,
                 "algo.dynamic_filtering_enable": False, "algo.dynamic_filtering_range": [0, 1],
                 "algo.advantage.no_std_norm": False},
    "nemo": {"grpo.normalize_rewards": True, "grpo.use_dynamic_sampling": False,
             "grpo.reward_shaping.enabled": False, "grpo.use_leave_one_out_baseline": False},
    "oat": {"critic_type": "drgrpo", "oracle": None},
}
#: OpenRLHF renamed its flags (--advantage_estimator -> --algo.advantage.estimator); both are read
_OPENRLHF_OLD = {"algo.advantage.estimator": "advantage_estimator", "rollout.n_samples_per_prompt":
                 "n_samples_per_prompt", "algo.dynamic_filtering_enable": "dynamic_filtering",
                 "algo.dynamic_filtering_range": "dynamic_filtering_reward_range",
                 "algo.advantage.no_std_norm": "no_advantage_std_norm", "reward.remote_url": "remote_rm_url",
                 "reward.model_name_or_path": "reward_pretrain", "train.agent_func_path": "agent_func_path",
                 "reward.overlong_buffer_len": "overlong_buffer_len"}
#: EasyR1's example reward functions (hiyouga/EasyR1@b44b311b, examples/reward_function/), for a script whose
#: reward file is not next to it: key -> shaped?
_EASYR1_REWARDS = {"math.py": {"overall": True, "format": False, "accuracy": False},
                   "r1v.py": {"overall": True, "format": False, "accuracy": False},
                   "dapo.py": {"overall": True, "accuracy": False, "overlong": True, "accuracy_normalized": False}}
#: ms-swift's built-in reward functions (swift/rewards/orm.py): shaped? (None: an outcome term)
_SWIFT_ORMS = {"accuracy": False, "format": True, "react_format": True, "cosine": True, "repetition": True,
               "soft_overlong": True}


def _get(s: Settings, key: str) -> Any:
    if s.doc.kind == "openrlhf" and not s.doc.has(key) and key in _OPENRLHF_OLD and s.doc.has(_OPENRLHF_OLD[key]):
        return s.doc.get(_OPENRLHF_OLD[key])
    return s.doc.get(key, FAMILY_DEFAULTS.get(s.doc.kind, {}).get(key))


def _loc(s: Settings, key: str) -> tuple[str, int | None]:
    e = s.doc.entry(key) or (s.doc.entry(_OPENRLHF_OLD[key]) if key in _OPENRLHF_OLD else None)
    return (e.file, e.line) if e is not None else (s.doc.path, None)


def _f(rule: str, name: str, sev: str, s: Settings, key: str, message: str, why: str, fix: str, topic: str,
       args: tuple[str, ...] = ()) -> Finding:
    file, line = _loc(s, key)
    return Finding(rule, name, sev, key, message, why, fix + f" ({CONSTRUCTED})" if args else fix, chapter(topic),
                   file, line, fix_args=args, fix_status=CONSTRUCTED if args else None)


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


# ------------------------------------------------------------------------------------------------ facts
def _easyr1(s: Settings, f: RewardFacts) -> None:
    target = _get(s, "worker.reward.reward_function")
    key = "worker.reward.reward_function"
    if not isinstance(target, str):
        f.evidence.append(Evidence("no reward function is named (EasyR1 needs worker.reward.reward_function)", key))
        return
    path, _, name = target.partition(":")
    shape, where = read_body(path, name or "main", s.doc.path)
    keys: dict[str, bool | None] = {}
    if shape is not None and shape.scalar().kind == "dict":
        keys = {k: {"shaped": True, "binary": False}.get(v.verdict) for k, v in shape.scalar().keys.items()}
        f.evidence.append(Evidence(f"read from the body of {where} (not run): {shape.describe()}", key))
    elif PurePosixPath(path).name in _EASYR1_REWARDS:
        keys = dict(_EASYR1_REWARDS[PurePosixPath(path).name])
        f.evidence.append(Evidence(f"EasyR1's example {PurePosixPath(path).name} (not found here: {where}): "
                                   + ", ".join(f"{k} {'shaped' if v else 'binary'}" for k, v in keys.items()), key))
    else:
        f.evidence.append(Evidence(f"reward function {target}: {where}; its shape is unknown", key))
    f.trl_funcs = [TrlFunc(k, None, v, "a key of the reward dict") for k, v in keys.items()]
    f.score_shaped = keys.get("overall") if keys else None


def _named_funcs(s: Settings, f: RewardFacts, table: dict[str, bool | None]) -> None:
    funcs = _get(s, "reward_funcs")
    names = [funcs] if isinstance(funcs, str) else [str(x) for x in funcs] if isinstance(funcs, list) else []
    if isinstance(funcs, Unresolved):
        f.evidence.append(Evidence(f"reward_funcs={funcs} cannot be resolved", "reward_funcs"))
        return
    for n in names:
        if n in table:
            sh, why = table[n], "a built-in " + ("shaping term" if table[n] else "outcome reward")
        elif _SHAPING_NAME.search(n):
            sh, why = True, "a shaping term, judging from its name (a plugin: its body is not read)"
        elif _BINARY_NAME.search(n) or n.endswith("acc"):
            sh, why = False, "an outcome reward, judging from its name (a plugin: its body is not read)"
        else:
            sh, why = None, "a plugin reward the audit cannot see"
        f.trl_funcs.append(TrlFunc(n, None, sh, why))
    if names:
        f.score_shaped = tri_or(*(t.shaped for t in f.trl_funcs)) if len(names) > 1 else f.trl_funcs[0].shaped
        f.evidence.append(Evidence(f"{len(names)} reward function(s) summed: " + "; ".join(
            f"{t.name}: {t.why}" for t in f.trl_funcs), "reward_funcs"))
    if _get(s, "reward_model"):
        f.evidence.append(Evidence("a reward model scores the responses (continuous)", "reward_model"))
        f.score_shaped = True if not names else tri_or(f.score_shaped, True)


def _openrlhf(s: Settings, f: RewardFacts) -> None:
    if _get(s, "reward.model_name_or_path"):
        f.evidence.append(Evidence("a reward model scores the responses: continuous, no pass/fail outcome",
                                   "reward.model_name_or_path"))
        f.score_shaped, f.returns = True, "model"
        return
    src = _get(s, "reward.remote_url") or _get(s, "train.agent_func_path")
    key = "reward.remote_url" if _get(s, "reward.remote_url") else "train.agent_func_path"
    if isinstance(src, str) and src.endswith(".py"):
        shape, where = read_body(src, "reward_func", s.doc.path)
        if shape is not None and shape.scalar().kind == "dict":
            k = shape.scalar().keys
            verdict = {"shaped": True, "binary": False}
            f.score_shaped = verdict.get(k["rewards"].verdict) if "rewards" in k else None
            scores = k.get("scores", k.get("rewards"))  # no `scores`: OpenRLHF filters on the rewards
            f.acc_binary = None if scores is None else {"binary": True, "shaped": False}.get(scores.verdict)
            f.evidence.append(Evidence(f"read from the body of {where} (not run): {shape.describe()}", key))
            return
        f.evidence.append(Evidence(f"the reward comes from {src} ({where}); its `scores` are unknown", key))
    elif src:
        f.evidence.append(Evidence(f"the reward comes from {src}, which the audit cannot read", key))
    if _get(s, "reward.overlong_buffer_len"):
        f.overlong = True
        f.evidence.append(Evidence("an overlong penalty is added to the rewards (not to the filter's scores)",
                                   "reward.overlong_buffer_len"))


def _nemo(s: Settings, f: RewardFacts) -> None:
    envs = sorted({k.split(".")[1] for k in s.doc.entries if k.startswith("env.") and k.count(".") >= 1})
    if "reward_model" in envs or s.doc.get("env.reward_model.enabled"):
        f.score_shaped, f.returns = True, "model"
        f.evidence.append(Evidence("a reward-model environment: continuous scores, no pass/fail outcome", "env"))
    elif envs and all(e in ("math", "dapo_math", "code", "math_env") for e in envs):
        f.score_shaped = False
        f.evidence.append(Evidence(f"NeMo-RL's {', '.join(envs)} environment: a 0/1 correctness reward", "env"))
    else:
        f.evidence.append(Evidence(f"environment(s) {', '.join(envs) or 'not set here'}: reward shape unknown", "env"))
    if _flag(_get(s, "grpo.reward_shaping.enabled")):
        f.overlong = True
        f.evidence.append(Evidence("grpo.reward_shaping adds an overlong penalty to total_reward",
                                   "grpo.reward_shaping.enabled"))


def family_facts(s: Settings) -> RewardFacts:
    f = RewardFacts()
    kind = s.doc.kind
    if kind == "easyr1":
        _easyr1(s, f)
    elif kind == "swift":
        _named_funcs(s, f, _SWIFT_ORMS)
    elif kind == "openrlhf":
        _openrlhf(s, f)
    elif kind == "nemo":
        _nemo(s, f)
    elif kind == "oat":
        oracle = _get(s, "oracle")
        f.score_shaped = False if oracle == "math" else None
        f.evidence.append(Evidence(f"oat's {oracle} oracle" + (": correct_reward or incorrect_reward, two values"
                                                                 if oracle == "math" else ": reward shape unknown"),
                                   "oracle"))
    f.composite = tri_or(f.score_shaped, f.overlong)
    return f


# ------------------------------------------------------------------------------------------------ rules
def _sev(composite: bool | None) -> str:
    return "error" if composite else "warning"


def _easyr1_rules(s: Settings, f: RewardFacts) -> list[Finding]:
    out = []
    est, on, key = _get(s, "algorithm.adv_estimator"), _flag(_get(s, "algorithm.online_filtering")), \
        _get(s, "algorithm.filter_key")
    keys = {t.name: t.shaped for t in f.trl_funcs}
    binary = next((k for k, v in keys.items() if v is False and "acc" in k and "normalized" not in k), None) or \
        next((k for k, v in keys.items() if v is False and "acc" in k), None) or "accuracy"
    gate = on and keys.get(key) is False
    if on and keys.get(key) is not False:
        out.append(_f("PH001", "filter-on-shaped-metric", "error" if keys.get(key) else "warning", s,
                      "algorithm.filter_key", f"online_filtering keeps a group when {_get(s, 'algorithm.filter_low')} < "
                      f"mean({key}) < {_get(s, 'algorithm.filter_high')}; `{key}` is "
                      + ("shaped" if keys.get(key) else "of unknown shape"),
                      "an all-fail group still has a mean inside the range when its score carries shaping (format "
                      "credit, overlong), so the filter keeps it and grpo turns the shaping into full-size advantages",
                      f"algorithm.filter_key={binary} (a 0/1 key of the reward dict)", "filter",
                      (f"algorithm.filter_key={binary}",)))
    if est == "grpo" and not gate and f.composite is not False:
        out.append(_f("PH010", "std-norm-with-shaping", _sev(f.composite), s, "algorithm.adv_estimator",
                      f"EasyR1's grpo divides each group by its std and the training score `overall` is {f.verdict}",
                      "an all-fail group that differs only by format credit gets advantages of about ±1",
                      f"algorithm.online_filtering=true algorithm.filter_key={binary} (an outcome gate), or "
                      "algorithm.adv_estimator=rloo (no std)", "estimators",
                      ("algorithm.online_filtering=true", f"algorithm.filter_key={binary}")))
    return out


def _swift_rules(s: Settings, f: RewardFacts) -> list[Finding]:
    est = _get(s, "advantage_estimator")
    scale = _get(s, "scale_rewards") or {"grpo": "group", "rloo": "none", "reinforce_plus_plus": "batch"}.get(est)
    out = []
    if _flag(_get(s, "dynamic_sample")) and f.composite is not False:
        out.append(_f("PH001", "filter-on-shaped-metric", _sev(f.composite), s, "dynamic_sample",
                      "dynamic_sample drops only groups whose summed reward has std 0; the sum here is " + f.verdict,
                      "an all-fail group with format or length spread has std > 0, so it is kept",
                      "keep only the outcome reward in reward_funcs while dynamic_sample is on, or --scale_rewards none",
                      "filter", ("--scale_rewards", "none")))
    if scale in ("group", "gdpo") and f.composite is not False:
        out.append(_f("PH010", "std-norm-with-shaping", _sev(f.composite), s, "scale_rewards",
                      f"scale_rewards={scale} divides each group by its std and the summed reward ("
                      f"{', '.join(t.name for t in f.trl_funcs) or 'unknown'}) is {f.verdict}",
                      "in an all-fail group the shaping terms still vary, and the group std makes them full-size",
                      "--scale_rewards none (Dr. GRPO), or one outcome reward function", "estimators",
                      ("--scale_rewards", "none")))
    return out


def _openrlhf_rules(s: Settings, f: RewardFacts) -> list[Finding]:
    est = _get(s, "algo.advantage.estimator")
    out = []
    filtering = _flag(_get(s, "algo.dynamic_filtering_enable"))
    if filtering and f.acc_binary is not True and f.returns != "model":
        out.append(_f("PH001", "filter-on-shaped-metric", _sev(f.acc_binary is False), s,
                      "algo.dynamic_filtering_enable",
                      f"dynamic filtering keeps a group when min < mean(scores) < max ({_get(s, 'algo.dynamic_filtering_range')}"
                      f"); the scores here are {'continuous or shaped' if f.acc_binary is False else 'of unknown shape'}",
                      "with continuous scores an all-fail group's mean lies inside the range, so it is kept "
                      "(OpenRLHF #1270/#1272)", "return the 0/1 outcome as `scores` and keep shaping in `rewards`",
                      "filter", ("--algo.dynamic_filtering_range", "0", "1")))
    gate = filtering and f.acc_binary is True
    if est == "group_norm" and f.composite is not False and f.returns != "model" and not gate:
        out.append(_f("PH010", "std-norm-with-shaping", _sev(f.composite), s, "algo.advantage.estimator",
                      f"group_norm divides each group by its std and the reward is {f.verdict}",
                      "an all-fail group that differs only by shaping gets advantages of about ±1",
                      "--algo.advantage.estimator dr_grpo (r - group mean, no std)", "estimators",
                      ("--algo.advantage.estimator", "dr_grpo")))
    return out


def _nemo_rules(s: Settings, f: RewardFacts) -> list[Finding]:
    if not _flag(_get(s, "grpo.normalize_rewards")) or f.returns == "model" or f.composite is False:
        return []
    if _flag(_get(s, "grpo.use_dynamic_sampling")) and not f.score_shaped:
        return [_f("PH001", "filter-on-shaped-metric", "info", s, "grpo.use_dynamic_sampling",
                   "dynamic sampling with reward shaping: NeMo-RL takes the filter's std on the unshaped reward since "
                   "PR #2478; older versions filtered on the shaped total_reward",
                   "before that fix all-fail groups with an overlong spread survived the filter",
                   "use a NeMo-RL with PR #2478 (the config is then fine)", "filter")]
    return [_f("PH010", "std-norm-with-shaping", _sev(f.composite), s, "grpo.normalize_rewards",
               f"grpo.normalize_rewards divides each group by its std and the reward is {f.verdict}",
               "an all-fail group that differs only by the shaping gets advantages of about ±1",
               "grpo.use_dynamic_sampling=true (NeMo-RL filters on the unshaped reward) or grpo.normalize_rewards=false",
               "estimators", ("grpo.use_dynamic_sampling=true",))]


def _rloo_rules(s: Settings, f: RewardFacts) -> list[Finding]:
    funcs = s.doc.get("reward_funcs")
    if isinstance(funcs, Unresolved) and not s.doc.has("normalize_advantages"):
        return [_f("PH060", "nothing-read", "warning", s, "reward_funcs",
                   f"the reward functions ({funcs}) and RLOOConfig are built when the script runs, from its command "
                   "line: the audit read nothing it can judge", funcs.why or "a generic script has no settings of its own",
                   "audit the command that launches it (its --reward_funcs, --normalize_advantages)", "rules")]
    if s.doc.get("normalize_advantages") is True and f.composite is not False:
        file, line = _loc(s, "normalize_advantages")
        return [Finding("PH020", "trl-shaping-group-scale", "warning", "normalize_advantages",
                        f"RLOO with normalize_advantages=True divides the advantages by the batch std; the reward is "
                        f"{f.verdict}", "when most groups of a batch fail, the batch std is the shaping's own spread, "
                        "and phantom advantages grow to full size", "normalize_advantages=False (RLOO's default)",
                        chapter("rules"), file, line, fix_kwargs={"normalize_advantages": False},
                        fix_status="RLOOConfig(**fix_kwargs) is constructed with TRL's class in the tests")]
    return []


def family_findings(s: Settings, f: RewardFacts) -> list[Finding]:
    kind = s.doc.kind
    if kind == "easyr1":
        return _easyr1_rules(s, f)
    if kind == "swift":
        return _swift_rules(s, f)
    if kind == "openrlhf":
        return _openrlhf_rules(s, f)
    if kind == "nemo":
        return _nemo_rules(s, f)
    if kind == "trl":
        return _rloo_rules(s, f)
    if kind == "oat" and _get(s, "critic_type") == "grpo" and f.composite is not False:
        return [_f("PH010", "std-norm-with-shaping", _sev(f.composite), s, "critic_type",
                   f"critic_type=grpo divides each group by its std and the reward is {f.verdict}",
                   "an all-fail group that differs only by shaping gets advantages of about ±1",
                   "--critic_type drgrpo (oat's default)", "estimators", ("--critic_type", "drgrpo"))]
    return []
