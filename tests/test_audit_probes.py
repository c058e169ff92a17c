"""--reward-fn probes: format, length, overlong and empty spread among failures are each detected."""

from __future__ import annotations

import pytest

from phantom.audit.probe import PROBES, probe


def _fmt(text: str) -> bool:
    return "####" in text or "\\boxed" in text or "<answer>" in text


def _right(text: str) -> bool:
    return "42" in text.replace("42.", "42")


SCORERS = {
    "binary": lambda s: float(_right(s)),
    "format_credit": lambda s: 1.0 if _right(s) else (0.1 if _fmt(s) else 0.0),
    "length_penalty": lambda s: float(_right(s)) - 0.3 * min(len(s) / 512, 1.0),
    "overlong_only": lambda s: float(_right(s)) - (0.5 if len(s) > 4096 else 0.0),
    "empty_penalty": lambda s: float(_right(s)) - (1.0 if not s.strip() else 0.0),
}
EXPECT = {
    "binary": {"format": False, "length": False, "overlong": False, "empty": False},
    "format_credit": {"format": True, "length": False, "overlong": False, "empty": False},
    "length_penalty": {"format": True, "length": True, "overlong": True, "empty": True},
    "overlong_only": {"format": False, "length": False, "overlong": True, "empty": False},
    "empty_penalty": {"format": False, "length": False, "overlong": False, "empty": True},
}


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_each_kind_of_spread_is_seen(name):
    fn = SCORERS[name]

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return fn(solution_str)

    res = probe(compute_score, name)
    spread = res.spread()
    # length_penalty: a formatted short answer is shorter than an unformatted one of the same class
    expect = dict(EXPECT[name])
    if name == "length_penalty":
        expect["format"] = spread["format"]  # lengths differ between probes; only length is the point here
    assert spread == expect, spread
    assert res.spread_among_failures() is (name != "binary")


def test_probes_cover_every_class():
    wrong = [p for p in PROBES if p.wrong]
    assert {(p.fmt, p.size) for p in wrong} >= {(True, "short"), (True, "long"), (True, "overlong"),
                                                 (False, "short"), (False, "long"), (False, "empty")}
    assert any(not p.wrong for p in PROBES)
    assert max(len(p.text) for p in PROBES) > 4096


def test_lone_binary_trl_reward_is_not_shaping(tmp_path):
    from phantom.audit import audit

    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("reward_funcs: [my_checker]\nnum_generations: 8\n")
    fn = tmp_path / "rew.py"
    fn.write_text("def my_checker(completions, solution, **kw):\n"
                  "    return [float('42' in (c if isinstance(c, str) else c[0]['content'])) for c in completions]\n")
    rep = audit([str(cfg)], reward_fns=[f"{fn}:my_checker"])
    assert [f.rule for f in rep.findings] == [] and rep.exit_code == 0
    cont = tmp_path / "cont.py"
    cont.write_text("def my_checker(completions, **kw):\n"
                    "    return [len(c if isinstance(c, str) else c[0]['content']) / 1000 for c in completions]\n")
    rep = audit([str(cfg)], reward_fns=[f"{cont}:my_checker"])
    (f,) = [f for f in rep.findings if f.rule == "PH020"]
    assert f.severity == "error" and "the one reward function" in f.message and "summed" not in f.message
