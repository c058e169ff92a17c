"""verl's group filter as a run will see it: read from the composed config, checked before anything starts.

verl 0.9.1's dynamic sampling (``algorithm.filter_groups``) fails late or not at all on three
mistakes, so the launcher checks the *composed* config (whatever route set the keys: spec fields or
``extra_overrides``) against the trainer and the reward first:

* the legacy trainer (``trainer.use_v1=False``) has no group filter: ``filter_groups.enable=True``
  there is ignored without a word (``trainer/ppo/ray_trainer.py`` never reads it) -> error;
* the V1 replay buffer reads ``metric`` from each trajectory's ``reward_extra_info`` (or, for
  ``reward``, the summed ``rm_scores``) and raises ``Finished groups are missing DAPO metric`` inside
  the TaskRunner after Ray, the model and the first generation -> an unknown metric is an error here,
  naming the keys the reward returns;
* a reward function that returns a float gets ``reward_extra_info = {"acc": score}`` from verl's reward
  managers (``experimental/reward_loop/reward_manager/naive.py``), so ``metric=acc`` then filters on the
  shaped score, the very configuration this project is about -> error, unless the reward returns a
  dict with a binary ``acc``.

A filter that reads the shaped score on purpose (``metric=reward``/``score``, or no metric: verl
0.9.1's default is ``reward``) is allowed, with a warning line: it is an experiment of chapter 5.
The reward is probed (two calls) in a fresh interpreter with a time limit, only when it is not
phantom's own (whose keys are known).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

__all__ = ["PHANTOM_REWARD", "REWARD_KEYS", "filter_setting", "reward_keys", "check_filter", "describe"]

PHANTOM_REWARD = "pkg://phantom.verl.reward"
#: Keys of phantom's reward dict (``phantom.verl.reward.compute_score``); ``true_acc`` only with verifier noise.
REWARD_KEYS = ("score", "acc", "outcome", "len_chars")
#: verl's canonical metric: the pre-KL sum of ``rm_scores`` (``v1/replay_buffer.py``, FILTER_GROUPS_REWARD_METRIC).
CANONICAL = "reward"
PROBE_TIMEOUT_S = 120.0

# Loads the function as verl's load_extern_object does (verl/utils/import_utils.py: pkg://module, file://path or a
# path), without importing verl: `import verl` loads every plugin (torch included), tens of seconds on a busy CPU.
_PROBE = """
import importlib, importlib.util, json, sys
path, name, source, gold = sys.argv[1:5]
if path.startswith("pkg://"):
    module = importlib.import_module(path[len("pkg://"):].replace("/", "."))
else:
    spec = importlib.util.spec_from_file_location("phantom_reward_probe", path.removeprefix("file://"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
fn = getattr(module, name)
out = []
for text in (f"#### {gold}", ""):
    r = fn(source, text, gold, {"split": "train", "index": 0})
    out.append({"type": "dict", "keys": sorted(map(str, r)), "acc": r.get("acc")} if isinstance(r, dict)
               else {"type": type(r).__name__, "value": r if isinstance(r, (int, float)) else repr(r)[:80]})
print(json.dumps(out, default=str))
"""


def _get(node: Any, key: str, default: Any = None) -> Any:
    try:
        value = node.get(key, default)
    except Exception:  # omegaconf struct nodes: a missing key
        return default
    return default if value is None else value


def filter_setting(cfg: Any, overrides: list[str], trainer: str) -> dict[str, Any]:
    """What the composed config asks of the group filter, and whether its metric was given or is verl's default."""
    fg = _get(cfg.algorithm, "filter_groups", {}) or {}
    given = any(o.lstrip("+").startswith("algorithm.filter_groups.metric=") for o in overrides)
    return {"enable": bool(_get(fg, "enable", False)), "metric": _get(fg, "metric"),
            "metric_source": "override" if given else "verl default",
            "max_inflight_gen_batches": _get(fg, "max_inflight_gen_batches"),
            "max_num_gen_batches": _get(fg, "max_num_gen_batches"), "trainer": trainer}


def _first_row(files: Any) -> tuple[str, str]:
    """(data_source, ground truth) of the first held-out row, for the reward probe."""
    try:
        import pandas as pd

        path = list(files)[0] if not isinstance(files, str) else files
        row = pd.read_parquet(path).iloc[0]
        return str(row["data_source"]), str(row["reward_model"]["ground_truth"])
    except Exception:  # a remote or unreadable file: probe with a neutral row
        return "unknown", "0"


def reward_keys(path: str, name: str, data_files: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    """What the reward ``path:name`` returns on two responses: ``{"type": "dict"|"float"|..., "keys": [...]}``.

    Raises ``ValueError`` when it cannot be loaded or called (named), or runs past :data:`PROBE_TIMEOUT_S`.
    """
    if path == PHANTOM_REWARD and name == "compute_score":
        return {"type": "dict", "keys": sorted(REWARD_KEYS), "binary_acc": True}
    source, gold = _first_row(data_files)
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, path, name, source, gold], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise ValueError(f"reward.custom_reward_function {path}:{name} did not return within {PROBE_TIMEOUT_S:.0f} s "
                         "on a probe call") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ValueError(f"reward.custom_reward_function {path}:{name} could not be loaded or called: {tail[:300]}")
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    if any(c["type"] != "dict" for c in calls):
        bad = next(c for c in calls if c["type"] != "dict")
        return {"type": bad["type"], "value": bad.get("value"), "keys": ["acc"], "binary_acc": False}
    keys = sorted(set.intersection(*(set(c["keys"]) for c in calls)))
    accs = [c.get("acc") for c in calls]
    binary = "acc" in keys and all(isinstance(a, (int, float)) and float(a) in (0.0, 1.0) for a in accs)
    return {"type": "dict", "keys": keys, "binary_acc": binary}


def check_filter(cfg: Any, overrides: list[str], trainer: str, env: dict[str, str] | None = None) -> tuple[dict, list[str]]:
    """The filter setting and warning lines; raises ``ValueError`` (naming the value and the allowed ones)."""
    setting = filter_setting(cfg, overrides, trainer)
    if not setting["enable"]:
        return setting, []
    if trainer == "legacy":
        raise ValueError("algorithm.filter_groups.enable=True with trainer=legacy: verl 0.9.1's legacy trainer has no "
                         "group filter and would ignore it; allowed: trainer=v1 (the replay buffer's filter) or "
                         "trainer=recipe_dapo")
    if trainer != "v1":
        return setting, []  # verl-recipe's trainer reads its own keys (seq_reward, ...): not checked here
    rf = cfg.reward.custom_reward_function
    path, name = str(_get(rf, "path", "")), str(_get(rf, "name", "compute_score"))
    metric = str(setting["metric"])
    if not path:
        raise ValueError("algorithm.filter_groups is on but no reward.custom_reward_function.path is set: "
                         f"the filter's metric {metric!r} would come from a built-in scorer (not checked here); "
                         f"use reward.custom_reward_function.path={PHANTOM_REWARD}")
    probe = reward_keys(path, name, cfg.data.val_files, env)
    allowed = [CANONICAL, *probe["keys"]]
    if metric not in allowed:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r} is not a key the reward {path}:{name} returns "
                         f"(verl 0.9.1 would fail after the first generation: 'Finished groups are missing DAPO "
                         f"metric'); allowed: {', '.join(allowed)}")
    if metric == "acc" and probe["type"] != "dict":
        raise ValueError(f"algorithm.filter_groups.metric='acc' but the reward {path}:{name} returns a {probe['type']} "
                         f"({probe.get('value')!r}), so verl stores acc = score: the filter would read the shaped "
                         "score, not the outcome; return a dict with 'score' and a binary 'acc' "
                         f"({PHANTOM_REWARD} does), or set metric=reward knowingly")
    if metric == "acc" and not probe["binary_acc"]:
        raise ValueError(f"algorithm.filter_groups.metric='acc' but the reward {path}:{name} returns an 'acc' that is "
                         "not 0 or 1 on the probe calls; the filter needs the binary outcome there")
    warnings = []
    if metric in (CANONICAL, "score") and path == PHANTOM_REWARD:
        lam = _get(_get(rf, "reward_kwargs", {}), "lam", 0.3)
        if float(lam) > 0:
            warnings.append(f"algorithm.filter_groups.metric={metric!r} ({setting['metric_source']}) reads the shaped "
                            f"score (lam={lam}): all-fail groups whose lengths differ pass the filter (the phantom "
                            "configuration); metric=acc reads the outcome")
    return setting, warnings


def describe(setting: dict[str, Any]) -> str:
    """One line for a report: ``filter on, metric reward (verl default)`` / ``filter off``."""
    if not setting.get("enable"):
        return "filter off"
    return f"filter on, metric {setting['metric']} ({setting['metric_source']})"
