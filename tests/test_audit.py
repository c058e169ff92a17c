"""phantom audit: real-world-shaped configs are flagged or passed, malformed ones exit 2, nothing runs.

The fixtures in tests/fixtures/audit/ are written by the project in the shapes the tools produce:
a DAPO launch script shaped like verl-recipe's run_dapo_qwen2.5_32b.sh, verl Hydra YAML, Hydra's
.hydra/overrides.yaml and a plain override list, TRL GRPOConfig YAML/JSON/Python, reward functions.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phantom.audit import audit, main, read_config
from phantom.audit.bash import interpret
from phantom.audit.model import BOOK, Unresolved

FIX = Path(__file__).parent / "fixtures" / "audit"
REWARDS = FIX / "rewards"
ROOT = Path(__file__).resolve().parents[1]


def rules(report) -> dict[str, str]:
    """rule id -> most severe severity among its findings."""
    rank = {"error": 0, "warning": 1, "info": 2}
    out: dict[str, str] = {}
    for f in report.findings:
        if f.rule not in out or rank[f.severity] < rank[out[f.rule]]:
            out[f.rule] = f.severity
    return out


def line_of(path: Path, needle: str) -> int:
    """1-based number of the first line of ``path`` containing ``needle``."""
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def run(paths, **kw):
    return audit([str(p) for p in paths], **kw)


# ------------------------------------------------------------------------------------------------
# The fixtures: unsafe ones flagged, safe ones clean
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, expected, code", [
    ("verl_dapo_acc.sh", {}, 0),  # the official DAPO recipe shape: metric=acc, built-in dict reward
    ("verl_dapo_score.sh", {"PH001": "error", "PH010": "error"}, 1),
    ("verl_v1_default_metric.yaml", {"PH001": "error", "PH010": "error"}, 1),  # 0.9.1 default metric=reward
    ("verl_drgrpo.yaml", {}, 0),  # shaped, no filter, but no std normalization
    ("hydra_run/.hydra/overrides.yaml", {}, 0),  # phantom_grpo_outcome gate
    ("overrides_filter_acc.txt", {"PH002": "warning", "PH010": "warning"}, 1),  # custom fn, not probed
    # legacy keys main_ppo ignores (PH040); as meant, the reward is a custom function the audit cannot see
    ("verl_legacy_keys.sh", {"PH040": "error", "PH010": "warning", "PH050": "info"}, 1),
    ("trl_grpo_multi.yaml", {"PH020": "error", "PH021": "info"}, 1),
    ("trl_drgrpo.json", {"PH021": "info"}, 0),  # scale_rewards=none: only a note
    ("trl_train.py", {"PH020": "error", "PH021": "warning", "PH030": "info"}, 1),
])
def test_fixture_findings(name, expected, code):
    rep = run([FIX / name])
    assert rules(rep) == expected, [f"{f.rule} {f.severity} {f.message}" for f in rep.findings]
    assert rep.exit_code == code


def test_findings_name_key_line_why_fix_and_chapter():
    rep = run([FIX / "verl_dapo_score.sh"])
    f = next(f for f in rep.findings if f.rule == "PH001")
    assert f.key == "algorithm.filter_groups.metric"
    assert f.file.endswith("verl_dapo_score.sh")
    assert (FIX / "verl_dapo_score.sh").read_text().splitlines()[f.line - 1].strip().startswith(
        "algorithm.filter_groups.metric=")
    assert "score" in f.message and f.why and "metric=acc" in f.fix
    assert f.chapter in BOOK.values()


def test_default_metric_is_version_dependent():
    new = run([FIX / "verl_v1_default_metric.yaml"])
    f = next(f for f in new.findings if f.rule == "PH001")
    assert "default" in f.message and f.key == "algorithm.filter_groups.enable"
    assert f.line == line_of(FIX / "verl_v1_default_metric.yaml", "enable: true")
    old = run([FIX / "verl_v1_default_metric.yaml"], version="0.9.0")
    assert rules(old) == {"PH005": "error", "PH010": "error"}  # null metric: 0.9.0 raises at start


def test_legacy_keys_name_the_live_key():
    rep = run([FIX / "verl_legacy_keys.sh"])
    (f,) = [f for f in rep.findings if f.rule == "PH040"]  # one migration, one finding
    assert set(f.keys) == {"custom_reward_function.path", "custom_reward_function.name",
                           "reward_model.reward_manager"}
    assert "reward.custom_reward_function.path=./my_reward.py" in f.fix_overrides
    assert "reward.reward_manager.name=dapo" in f.fix_overrides
    # the recipe trainer migrates them: no finding there
    assert "PH040" not in rules(run([FIX / "verl_legacy_keys.sh"], entrypoint="recipe"))


# ------------------------------------------------------------------------------------------------
# Variants of the DAPO script: the verdict follows verl's semantics, not the metric's name
# ------------------------------------------------------------------------------------------------
def _variant(tmp_path: Path, **subs: str) -> Path:
    text = (FIX / "verl_dapo_acc.sh").read_text()
    for old, new in subs.items():
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / "variant.sh"
    out.write_text(text)
    return out


def test_dapo_score_with_builtin_binary_reward_is_clean(tmp_path):
    # DAPO-Math's score is ±1 and the overlong penalty is added after `score` is recorded
    p = _variant(tmp_path, **{"filter_groups_metric=acc": "filter_groups_metric=score"})
    assert rules(run([p])) == {}


def test_dapo_seq_reward_carries_the_overlong_penalty(tmp_path):
    p = _variant(tmp_path, **{"filter_groups_metric=acc": "filter_groups_metric=seq_reward"})
    assert rules(run([p])) == {"PH001": "error", "PH010": "error"}


def test_dapo_on_main_ppo_v1(tmp_path):
    p = _variant(tmp_path, **{"recipe.dapo.main_dapo": "verl.trainer.main_ppo"})
    # max_num_gen_batches is ignored by V1 (a note); reward.reward_kwargs.* is not in main_ppo's config: needs +
    assert rules(run([p])) == {"PH032": "info", "PH043": "error"}
    unset = _variant(tmp_path, **{"recipe.dapo.main_dapo": "verl.trainer.main_ppo",
                                  "    algorithm.filter_groups.metric=${filter_groups_metric} \\\n": ""})
    assert rules(run([unset]))["PH001"] == "error"  # default `reward` = rm_scores incl. overlong


def test_legacy_trainer_ignores_the_filter(tmp_path):
    p = _variant(tmp_path, **{"recipe.dapo.main_dapo": "verl.trainer.main_ppo",
                              "trainer.resume_mode=auto": "trainer.resume_mode=auto \\\n    trainer.use_v1=False"})
    assert rules(run([p]))["PH006"] == "warning"


def test_unresolved_metric_is_a_warning_not_a_guess(tmp_path):
    p = _variant(tmp_path, **{"filter_groups_metric=acc": "filter_groups_metric=$(cat metric.txt)"})
    rep = run([p])
    assert rules(rep) == {"PH001": "warning", "PH010": "warning"}
    assert rep.findings[0].line is not None


def test_refill_cap_against_measured_all_same_fraction(tmp_path):
    from phantom.audit import AllSame

    p = FIX / "verl_dapo_acc.sh"  # 512 kept groups from batches of 1536, at most 10 batches
    assert rules(run([p], all_same=AllSame(0.6, 0.6, "test"))) == {}
    rep = run([p], all_same=AllSame(0.97, 0.1, "test"))
    f = next(f for f in rep.findings if f.rule == "PH031")
    assert f.severity == "error" and "max_num_gen_batches=10" in f.message
    assert int(f.fix.split("max_num_gen_batches=")[1].split()[0]) > 10


def test_overlong_without_dapo_manager(tmp_path):
    p = _variant(tmp_path, **{"reward.reward_manager.name=dapo": "reward.reward_manager.name=naive"})
    assert rules(run([p]))["PH041"] == "warning"


# ------------------------------------------------------------------------------------------------
# --reward-fn probing, --shaped, unknown rewards
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn, expected", [
    ("length_shaped.py", {"PH002": "error", "PH010": "error"}),  # float return: acc = shaped score
    ("length_shaped_dict.py", {}),  # dict with binary acc: the outcome filter works
    ("partial_credit.py", {"PH003": "error", "PH010": "error"}),
    ("binary_float.py", {}),  # float, but 0/1: acc = score is the outcome
])
def test_probe_decides(fn, expected):
    rep = run([FIX / "overrides_filter_acc.txt"], reward_fns=[str(REWARDS / fn)])
    assert rules(rep) == expected
    assert rep.probes and rep.probes[0].returns in ("float", "dict")


def test_probe_passes_reward_kwargs_from_the_config():
    rep = run([FIX / "overrides_filter_acc.txt"], reward_fns=[str(REWARDS / "length_shaped_dict.py")])
    scores = [r.score for r in rep.probes[0].rows if r.error is None]
    assert min(scores) == pytest.approx(-0.3)  # lam=0.3 from +reward...reward_kwargs.lam reached the function


def test_unknown_reward_is_said_so(tmp_path):
    cfg = tmp_path / "o.txt"
    cfg.write_text("algorithm.adv_estimator=grpo\nreward.custom_reward_function.path=/opt/my_reward.py\n")
    rep = run([cfg])
    assert rules(rep) == {"PH010": "warning", "PH050": "info"}
    assert rep.inputs[0].facts.composite is None
    assert rules(run([cfg], shaped=True)) == {"PH010": "error"}
    assert rules(run([cfg], shaped=False)) == {}


def test_trl_probes_by_function_name(tmp_path):
    script = tmp_path / "train.py"
    script.write_text((FIX / "trl_train.py").read_text().replace(
        "REWARDS = [correctness_reward, length_penalty]", "REWARDS = [correctness_reward, gated_length_penalty]"))
    assert rules(run([script]))["PH020"] == "error"  # from the name alone: "length penalty" is shaping
    gated = run([script], reward_fns=[f"{REWARDS / 'trl_rewards.py'}:gated_length_penalty",
                                      f"{REWARDS / 'trl_rewards.py'}:correctness_reward"])
    assert "PH020" not in rules(gated)  # probed: failures all score 0, so no phantom spread
    assert gated.inputs[0].facts.composite is False


def test_bad_reward_fn_is_exit_2(tmp_path):
    cfg = FIX / "overrides_filter_acc.txt"
    assert run([cfg], reward_fns=[str(tmp_path / "missing.py")]).exit_code == 2
    rep = run([cfg], reward_fns=[f"{REWARDS / 'length_shaped.py'}:no_such_fn"])
    assert rep.exit_code == 2 and "compute_score" in str(rep.inputs[0].error)
    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(**kw):\n    raise RuntimeError('boom')\n")
    rep = run([cfg], reward_fns=[str(broken)])
    assert rep.exit_code == 2 and "boom" in str(rep.inputs[0].error)


# ------------------------------------------------------------------------------------------------
# Nothing is executed except an explicitly given reward function
# ------------------------------------------------------------------------------------------------
def test_trl_python_config_is_not_executed(tmp_path):
    script = tmp_path / "trl_train.py"
    shutil.copy(FIX / "trl_train.py", script)
    assert main([str(script)]) == 1
    assert not (tmp_path / "EXECUTED_BY_AUDIT").exists()


def test_reward_fn_named_in_config_runs_only_with_reward_fn(tmp_path):
    fn = tmp_path / "reward.py"
    fn.write_text("from pathlib import Path\nPath(__file__).with_name('RAN').write_text('x')\n"
                  "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return {'score': float('42' in solution_str), 'acc': float('42' in solution_str)}\n")
    cfg = tmp_path / "o.txt"
    cfg.write_text(f"algorithm.adv_estimator=grpo\nreward.custom_reward_function.path={fn}\n")
    run([cfg])
    assert not (tmp_path / "RAN").exists()
    run([cfg], reward_fns=[str(fn)])
    assert (tmp_path / "RAN").exists()


def test_audit_does_not_import_torch():
    code = ("import sys; from phantom.audit import main; "
            f"main([{str(FIX / 'verl_dapo_score.sh')!r}, {str(FIX / 'trl_train.py')!r}]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------------------------------------
# Malformed inputs: exit 2, naming the file and line (or key)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, line, needle", [
    ("bad_indent.yaml", 5, "invalid YAML"),
    ("bad_enable.yaml", 5, "algorithm.filter_groups.enable: value 'maybe' is invalid; allowed: a boolean"),
    ("bad_trailing_comma.json", 4, "invalid JSON"),
    ("bad_quote.sh", 4, "quotes"),
    ("bad_syntax.py", 6, "invalid Python"),
    ("trl_bad_scale.yaml", 2, "scale_rewards: value 'sometimes' is invalid; allowed: 'group', 'batch'"),
    ("bad_overrides.txt", 3, "is not a Hydra override"),
    ("not_a_config.yaml", None, "not a verl or TRL config"),
])
def test_malformed_inputs(name, line, needle, capsys, tmp_path):
    path = FIX / "malformed" / name
    if name.endswith(".py"):  # kept as .py.txt so that linters skip the deliberately broken file
        path = tmp_path / name
        shutil.copy(FIX / "malformed" / f"{name}.txt", path)
    assert main([str(path)]) == 2
    err = next(r.error for r in run([path]).inputs)
    assert err.line == line and needle in str(err)
    assert f"{name}:{line}" in capsys.readouterr().out if line else True


def test_missing_file_and_one_bad_among_good(tmp_path):
    rep = run([FIX / "verl_dapo_score.sh", tmp_path / "nope.yaml"])
    assert rep.exit_code == 2  # unreadable wins, but the readable input is still audited
    assert rules(rep) == {"PH001": "error", "PH010": "error"}
    assert "no such file" in str(rep.inputs[1].error)


def test_json_output_for_ci(capsys):
    code = main([str(FIX / "verl_dapo_score.sh"), str(FIX / "verl_dapo_acc.sh"), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == out["exit_code"] == 1
    assert out["summary"] == {"error": 2, "warning": 0, "info": 0}
    first = out["inputs"][0]
    assert first["reward"]["verdict"] == "composite" and first["trainer"] == "recipe"
    assert {f["rule"] for f in first["findings"]} == {"PH001", "PH010"}
    assert all({"key", "line", "why", "fix", "chapter", "severity"} <= set(f) for f in first["findings"])
    assert out["inputs"][1]["findings"] == []


def test_fail_on_and_ignore():
    p = str(FIX / "overrides_filter_acc.txt")
    assert main([p]) == 1  # two warnings fail by default
    assert main([p, "--fail-on", "error"]) == 0
    assert main([p, "--ignore", "PH010", "--ignore", "PH002"]) == 0
    assert main([str(FIX / "trl_drgrpo.json"), "--fail-on", "info"]) == 1


def test_merge_layers_overrides_on_a_yaml(tmp_path):
    fix = tmp_path / "fix.txt"
    fix.write_text("algorithm.filter_groups.metric=acc\n")
    rep = run([FIX / "verl_v1_default_metric.yaml", fix], merge=True)
    assert len(rep.inputs) == 1 and rules(rep) == {}  # binary acc from phantom's dict reward: gated


# ------------------------------------------------------------------------------------------------
# Readers
# ------------------------------------------------------------------------------------------------
def _words(script: str) -> list:
    """The expanded words of the last command of a script."""
    return interpret(script).commands[-1].argv[1:]


def test_shell_expansion():
    env = "a=3\nname=acc\nempty=\n"
    assert [w.text for w in _words(env + "echo x=$((1024 * 4))")] == ["x=4096"]
    assert [w.text for w in _words(env + "echo x=$((a * 3 + 1))")] == ["x=10"]
    assert _words(env + "echo m=${name}")[0].text == "m=acc"
    assert _words(env + "echo m=${missing:-score}")[0].text == "m=score"
    assert _words(env + "echo m=${empty:-seq}")[0].text == "m=seq"
    assert _words(env + "echo q='$name'")[0].text == "q=$name"  # single quotes: no expansion
    assert [w.text for w in _words(env + "echo k=1 # comment $name")] == ["k=1"]
    assert _words(env + "echo url=a#b")[0].text == "url=a#b"  # '#' inside a word is not a comment
    sub, unset = _words(env + "echo m=$(cat f) m=$unset")
    assert not sub.exact and "output of" in sub.why and not unset.exact and "environment" in unset.why


def test_shell_reads_values_and_lines():
    doc = read_config(str(FIX / "verl_dapo_acc.sh"))
    assert doc.entrypoint == "recipe.dapo"
    assert doc.get("data.gen_batch_size") == 1536 and doc.get("data.train_batch_size") == 512
    assert doc.get("algorithm.filter_groups.enable") is True
    assert doc.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu") == 2048 + 20480
    assert doc.get("trainer.logger") == ["console", "wandb"]
    assert doc.get("actor_rollout_ref.model.path") == "${HOME}/verl/models/Qwen2.5-32B" or isinstance(
        doc.get("actor_rollout_ref.model.path"), Unresolved)
    assert doc.entry("reward.reward_manager.name").line == line_of(FIX / "verl_dapo_acc.sh",
                                                                    "reward.reward_manager.name=dapo")


def test_override_values_are_typed_like_hydra(tmp_path):
    p = tmp_path / "o.txt"
    p.write_text("a.lr=1e-6\na.flag=False\n+a.items=[x,y]\n++a.s='acc'\na.n=null\n~a.gone\n")
    doc = read_config(str(p))
    assert doc.get("a.lr") == 1e-6 and doc.get("a.flag") is False and doc.get("a.items") == ["x", "y"]
    assert doc.get("a.s") == "acc" and doc.has("a.n") and doc.get("a.n") is None
    assert not doc.has("a.gone")


def test_yaml_lines_and_trl_python_kwargs():
    doc = read_config(str(FIX / "verl_v1_default_metric.yaml"))
    assert doc.entry("algorithm.filter_groups.enable").line == line_of(FIX / "verl_v1_default_metric.yaml",
                                                                        "enable: true")
    assert doc.get("reward.custom_reward_function.reward_kwargs.lam") == 0.3
    py = read_config(str(FIX / "trl_train.py"))
    assert py.kind == "trl" and py.get("reward_funcs") == ["correctness_reward", "length_penalty"]
    assert py.get("reward_weights") == [1.0, 0.3]
    assert py.entry("scale_rewards").line == line_of(FIX / "trl_train.py", 'scale_rewards="group"')
    assert "frac_reward_zero_std" in py.mentions


def test_verl_defaults_match_installed_verl():
    """The audit's verl 0.9.1 defaults are the installed wheel's ppo_trainer defaults."""
    import importlib.metadata
    import importlib.util

    import yaml

    from phantom.audit.schema import VERL_DEFAULTS

    spec = importlib.util.find_spec("verl")  # located, not imported: `import verl` takes seconds
    if spec is None or spec.origin is None:
        pytest.skip("verl is not installed")
    version = importlib.metadata.version("verl")
    if version != "0.9.1":
        pytest.skip(f"verl {version} installed")
    cfg = yaml.safe_load((Path(spec.origin).parent / "trainer/config/_generated_ppo_trainer.yaml").read_text())
    for key, value in VERL_DEFAULTS["0.9.1"].items():
        node = cfg
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                node = KeyError
                break
            node = node[part]
        if node is not KeyError:
            assert node == value, key


def test_book_links_exist_once_the_toc_names_them():
    toc = ROOT / "_toc.yml"
    if not toc.exists():
        pytest.skip("the book's _toc.yml does not exist yet")
    text = toc.read_text()
    for path in BOOK.values():
        assert Path(path).with_suffix("").as_posix() in text, path


def test_exposure_rollouts_feed_the_refill_rule(tmp_path):
    rollouts = str(FIX / "rollouts.jsonl")  # outcome filter drops 11/16 groups, score filter 1/16
    assert rules(run([FIX / "verl_dapo_acc.sh"], exposure=rollouts)) == {}  # 512 from 1536 per batch: fine
    tight = _variant(tmp_path, **{"gen_prompt_bsz=$((train_prompt_bsz * 3))": "gen_prompt_bsz=${train_prompt_bsz}",
                                  "max_num_gen_batches=10": "max_num_gen_batches=2"})
    f = next(f for f in run([tight], exposure=rollouts).findings if f.rule == "PH031")
    assert f.severity == "error" and "0.69" in f.message and "outcome predicate" in f.message
    assert rules(run([tight], exposure=str(tmp_path / "missing.jsonl"))) == {}
    assert run([tight], exposure=str(tmp_path / "missing.jsonl")).exit_code == 2


def test_cli_dispatch():
    from phantom.cli import main as phantom

    assert phantom(["audit", str(FIX / "verl_dapo_acc.sh")]) == 0
    assert phantom(["audit", str(FIX / "verl_dapo_score.sh")]) == 1
    assert phantom(["audit", str(FIX / "malformed" / "bad_enable.yaml")]) == 2


# ------------------------------------------------------------------------------------------------
# phantom's own run folders and lab specs
# ------------------------------------------------------------------------------------------------
def test_lab_spec_and_run_folders(tmp_path):
    assert rules(run([FIX / "lab_score_arm.yaml"])) == {"PH001": "error"}
    mask = run([FIX / "run_lab_mask"])  # a run folder: its manifest.json is read
    assert rules(mask) == {"PH030": "info"} and mask.exit_code == 0
    assert mask.inputs[0].kind == "lab"
    verl = run([FIX / "run_verl"])  # a verl run's manifest: the overrides it was launched with
    assert rules(verl) == {"PH001": "error", "PH010": "error"} and verl.inputs[0].trainer == "main_ppo"
    none_arm = tmp_path / "none.yaml"
    none_arm.write_text("arm: none\nestimator: grpo\nlam: 0.3\n")
    assert rules(run([none_arm])) == {"PH010": "error"}
    none_arm.write_text("arm: none\nestimator: drgrpo\nlam: 0.3\n")
    assert rules(run([none_arm])) == {}
    tight = tmp_path / "tight.yaml"
    tight.write_text("arm: outcome\nestimator: grpo\nsampling: dapo\nprompts: 32\ngen_prompts: 32\n"
                     "max_gen_batches: 1\n")
    assert rules(run([tight], exposure=str(FIX / "rollouts.jsonl"))) == {"PH031": "warning"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("arm: sideways\nestimator: grpo\n")
    rep = run([bad])
    assert rep.exit_code == 2 and "allowed: none, score, outcome" in str(rep.inputs[0].error)


@pytest.mark.parametrize("metric, fn", [("seq_reward", "length_shaped_dict.py"), ("score", "length_shaped.py")])
def test_filter_metric_the_reward_does_not_produce(tmp_path, metric, fn):
    cfg = tmp_path / "o.txt"
    cfg.write_text((FIX / "overrides_filter_acc.txt").read_text().replace("metric=acc", f"metric={metric}"))
    f = next(f for f in run([cfg], reward_fns=[str(REWARDS / fn)]).findings if f.rule == "PH004")
    assert f.severity == "error" and metric in f.message


def test_every_finding_is_a_documented_rule(tmp_path):
    from phantom.audit.rules import RULES

    paths = [p for p in FIX.rglob("*") if p.is_file() and p.suffix in (".sh", ".yaml", ".json", ".txt", ".py")
             and "malformed" not in p.parts and "rewards" not in p.parts and p.name != "make_fixtures.py"
             and "rollouts" not in p.name and "metrics" not in p.name]
    seen = set()
    for p in paths:
        for f in run([p]).findings:
            assert RULES[f.rule][0] == f.name, f
            seen.add(f.rule)
    assert {"PH001", "PH002", "PH010", "PH020", "PH021", "PH030", "PH040"} <= seen


def test_a_fully_composed_verl_config(tmp_path):
    """verl's own composed default config (what Hydra saves as .hydra/config.yaml) audits clean,
    legacy keys included (they are all null there); switching on GRPO, the filter and a shaped
    reward in it is flagged at the composed file's lines."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        pytest.skip("verl is not installed")
    composed = Path(spec.origin).parent / "trainer/config/_generated_ppo_trainer.yaml"
    assert rules(run([composed])) == {}
    text = composed.read_text()
    text = text.replace("  adv_estimator: gae\n", "  adv_estimator: grpo\n", 1)
    text = text.replace("  filter_groups:\n    _target_: verl.trainer.config.FilterGroupsConfig\n    enable: false\n",
                        "  filter_groups:\n    _target_: verl.trainer.config.FilterGroupsConfig\n    enable: true\n", 1)
    assert "enable: true" in text
    p = tmp_path / "config.yaml"
    p.write_text(text)
    rep = run([p], shaped=True)
    assert rules(rep) == {"PH001": "error", "PH010": "error"}
    f = next(f for f in rep.findings if f.rule == "PH001")
    assert text.splitlines()[f.line - 1].strip() == "metric: reward"


def test_override_values_read_without_yaml_equal_yamls():
    """parse_value reads plain words, ints and bools itself (PyYAML's loader was most of a batch's time); every
    value must come out as YAML (with Hydra's float rule) reads it."""
    import math

    import yaml

    from phantom.audit.overrides import _FLOAT, parse_value

    def by_yaml(s):
        try:
            v = yaml.safe_load(s)
        except yaml.YAMLError:
            return s
        return float(v) if isinstance(v, str) and _FLOAT.match(v) else v

    words = ["grpo", "acc", "True", "false", "FALSE", "null", "~", "5", "-3", "+7", "0", "012", "1e-6", "1.0", ".5",
             "Qwen/Qwen2.5-7B", "/data/x.parquet", "a.b.c", "yes", "No", "on", "off", "y", "n", ".inf", "inf", "x:y",
             "a@b", "a+b", "ab-cd", "_x", "127.0.0.1", "v0.9", "[a,b]", "{a: 1}", "'q'", "hdfs://x/y", "fsdp2", "2e5",
             "0x1F", "1_000", "-", "a b", ".nan"]
    for w in words:
        got, want = parse_value(w), by_yaml(w)
        assert type(got) is type(want) and (got == want or (isinstance(got, float) and math.isnan(got))), w
