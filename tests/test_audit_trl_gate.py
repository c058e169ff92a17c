"""The audit and phantom.trl agree: the printed wrapper code runs, and a gated run reads as safe."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantom.audit import audit
from phantom.audit.trl import OUTCOME_GATED_SNIPPET

RUNS = Path(__file__).resolve().parent / "fixtures" / "trl_runs"  # run folders in the TRL arm's schema


def test_printed_wrapper_snippet_runs_against_phantom_trl():
    pytest.importorskip("trl")
    lines = OUTCOME_GATED_SNIPPET.splitlines()
    assert lines[0] == "from phantom.trl import outcome_gated" and "GRPOTrainer(" in lines[-1]

    def accuracy_reward(completions, **kw):
        return [1.0 if "42" in c else 0.0 for c in completions]

    def format_reward(completions, **kw):
        return [0.1 if c.startswith("<think>") else 0.0 for c in completions]

    scope = {"accuracy_reward": accuracy_reward, "format_reward": format_reward}
    exec("\n".join(lines[:-1]), scope)  # the import and the wrapping; the trainer line needs a model
    funcs = scope["reward_funcs"]
    assert len(funcs) == 2 and all(callable(f) for f in funcs)


def _verdict(path: Path) -> tuple[int, set[str]]:
    rep = audit([str(path)])
    return rep.exit_code, {f.rule for f in rep.findings}


def test_trl_run_manifests_audit_by_their_arm():
    by_arm = {}
    for manifest in sorted(RUNS.glob("trl-*/manifest.json")):
        by_arm.setdefault(manifest.parent.name.split("-")[1], []).append(_verdict(manifest))
    assert set(by_arm) == {"none", "drgrpo", "outcome"}
    assert all(code == 1 and "PH020" in rules for code, rules in by_arm["none"])  # TRL default: the phantom
    assert all(code == 0 and not rules for code, rules in by_arm["outcome"])  # outcome_gated: clean
    assert all("PH020" not in rules for _, rules in by_arm["drgrpo"])  # scale_rewards="none": no std division
