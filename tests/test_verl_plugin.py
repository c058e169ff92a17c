"""phantom.verl.estimators: the gated estimators inside verl's own advantage call path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.ray_trainer")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from phantom.rewards import length_short  # noqa: E402
from phantom.verl import estimators as verl_plugin  # noqa: E402
from phantom.verl.launch import gate_metrics  # noqa: E402

LAM = 0.3
WIDTH = 8


def fixed_batch():
    """Four groups of 4 under r = outcome - 0.3*min(len/512, 1):

    g_mixed  - 2 pass, 2 fail                 (live in every arm)
    g_phant  - all fail, lengths differ       (a phantom group: spread without outcome contrast)
    g_pass   - all pass, lengths differ       (outcome-degenerate, spread)
    g_flat   - all fail, identical lengths    (flat shaped score)
    """
    groups = {
        "g_mixed": ([1, 1, 0, 0], [100, 300, 50, 400]),
        "g_phant": ([0, 0, 0, 0], [20, 200, 350, 500]),
        "g_pass": ([1, 1, 1, 1], [80, 90, 300, 310]),
        "g_flat": ([0, 0, 0, 0], [64, 64, 64, 64]),
    }
    uids, outcomes, lengths = [], [], []
    for uid, (o, n) in groups.items():
        uids += [uid] * 4
        outcomes += o
        lengths += n
    scores = length_short(np.array(outcomes, float), np.array(lengths, float), lam=LAM)
    return np.array(uids, dtype=object), torch.tensor(scores, dtype=torch.float32)


def as_dataproto(uids, scores):
    n = len(uids)
    resp_len = torch.randint(1, WIDTH + 1, (n,), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(WIDTH)[None, :] < resp_len[:, None]).to(torch.int64)
    tlr = torch.zeros(n, WIDTH, dtype=torch.float32)
    tlr[torch.arange(n), resp_len - 1] = scores  # verl puts the reward on the last response token
    return DataProto.from_dict(tensors={"token_level_rewards": tlr, "response_mask": mask},
                               non_tensors={"uid": uids})


def algorithm_config(**kw):
    base = {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
            "phantom": {"lam": LAM}}
    return OmegaConf.create({**base, **kw})


def run_arm(arm, norm=True, uids=None, scores=None, **cfg):
    if uids is None:
        uids, scores = fixed_batch()
    data = as_dataproto(uids, scores)
    name = f"phantom_grpo_{arm}"
    out = compute_advantage(data, adv_estimator=name, config=algorithm_config(adv_estimator=name,
                                                                             norm_adv_by_std_in_grpo=norm, **cfg))
    adv = out.batch["advantages"]
    mask = out.batch["response_mask"].bool()
    per_row = torch.where(mask, adv, torch.zeros(())).abs().amax(dim=-1)
    return out, per_row, uids


def zeroed_groups(per_row, uids):
    return sorted({u for u in set(uids) if float(per_row[uids == u].max()) == 0.0})


def test_entry_point_registers_the_estimators_in_a_fresh_process():
    """`import verl` alone (no phantom import) must register them: that is what the TaskRunner does."""
    code = ("import json, sys, verl; from verl.trainer.ppo import core_algos as c; "
            "json.dump(sorted(k for k in c.ADV_ESTIMATOR_REGISTRY if k.startswith('phantom_')), sys.stdout)")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout) == ["phantom_grpo_none", "phantom_grpo_outcome", "phantom_grpo_score"]
    # (VERL_USE_EXTERNAL_PLUGINS=none turning them off: tests/test_verl_launch.py::test_preflight...)


def test_three_arms_zero_different_groups_in_verls_compute_advantage():
    zeroed = {}
    for arm in ("none", "score", "outcome"):
        _, per_row, uids = run_arm(arm)
        zeroed[arm] = zeroed_groups(per_row, uids)
    # g_flat has zero advantage under every arm (no spread); only the gates differ elsewhere.
    assert zeroed["none"] == ["g_flat"]
    assert zeroed["score"] == ["g_flat"]  # the phantom group sails through the shaped-score gate
    assert zeroed["outcome"] == ["g_flat", "g_pass", "g_phant"]
    _, none_rows, uids = run_arm("none")
    phantom_rows = none_rows[uids == "g_phant"]
    assert float(phantom_rows.max()) > 1.0  # std normalization: full-size advantages from shaping noise


def test_gate_none_equals_verls_builtin_grpo():
    uids, scores = fixed_batch()
    for norm in (True, False):
        ours, _, _ = run_arm("none", norm=norm)
        ref = compute_advantage(as_dataproto(uids, scores), adv_estimator="grpo", norm_adv_by_std_in_grpo=norm,
                                config=algorithm_config(norm_adv_by_std_in_grpo=norm))
        torch.testing.assert_close(ours.batch["advantages"], ref.batch["advantages"], rtol=0, atol=1e-6)


def test_dr_grpo_flag_is_honoured():
    uids, scores = fixed_batch()
    out, _, _ = run_arm("outcome", norm=False)
    first = out.batch["advantages"][:, :].sum(-1) / out.batch["response_mask"].sum(-1)
    mixed = scores[:4] - scores[:4].mean()
    torch.testing.assert_close(first[:4], mixed, rtol=0, atol=1e-6)


def test_v1_padding_rows_are_ignored():
    uids, scores = fixed_batch()
    pad = np.array(["pad0123abcd"] * 3, dtype=object)
    out, per_row, all_uids = run_arm("outcome", uids=np.concatenate([uids, pad]),
                                     scores=torch.cat([scores, torch.zeros(3)]))
    assert float(per_row[-3:].max()) == 0.0
    ref, ref_rows, _ = run_arm("outcome")
    torch.testing.assert_close(per_row[:-3], ref_rows)


def test_gate_log_lines_and_metrics(tmp_path, monkeypatch):
    log = tmp_path / "gate.jsonl"
    monkeypatch.setenv(verl_plugin.GATE_LOG_ENV, str(log))
    run_arm("outcome")
    run_arm("outcome")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["stats"]["gate"] == "outcome"
    st = lines[0]["stats"]
    assert (st["groups"], st["zeroed"], st["all_fail"], st["all_pass"], st["mixed"], st["phantom"]) == (4, 3, 2, 1, 1, 1)
    metrics = gate_metrics(log)
    m = metrics[lines[1]["step"]]
    assert m["phantom/frac/zeroed"] == 0.75 and m["phantom/groups/phantom"] == 1.0
    assert m["phantom/acc/mean"] == pytest.approx(6 / 16)
    assert m["phantom/adv/abs_mean"] > 0


def test_kl_in_reward_breaks_the_outcome_gate():
    with pytest.raises(ValueError, match="use_kl_in_reward=False"):
        run_arm("outcome", use_kl_in_reward=True)
    run_arm("score", use_kl_in_reward=True)  # the score gate does not need the outcome


def test_scores_that_cannot_carry_the_outcome_are_rejected():
    uids, scores = fixed_batch()
    with pytest.raises(ValueError, match="cannot be decoded"):
        run_arm("outcome", uids=uids, scores=scores + 0.5)  # a failure at +0.4 is not a phantom reward
    with pytest.raises(ValueError, match="0 <= lam < 1"):
        run_arm("outcome", phantom={"lam": 1.0})


def test_registration_is_idempotent():
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert verl_plugin.register() == sorted(verl_plugin.ESTIMATORS)
    assert before == core_algos.ADV_ESTIMATOR_REGISTRY
