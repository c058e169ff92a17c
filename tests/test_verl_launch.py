"""phantom.verl.spec / phantom.verl.launch without Ray: presets, overrides, verl's composed config, bad input."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer")

from phantom.runs import RunConflict, RunDir, RunInUse, spec_hash  # noqa: E402
from phantom.verl import gpu  # noqa: E402
from phantom.verl import launch as launch_mod  # noqa: E402
from phantom.verl.launch import default_name, gate_metrics, launch, main, read_run_metrics, run_env  # noqa: E402
from phantom.verl.spec import compose, load_preset, make_spec, presets, to_overrides  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two tiny parquet files in verl's schema, and a fake model folder (config.json only)."""
    from phantom.verl.data import verl_row, write_parquet

    root = tmp_path_factory.mktemp("verl_inputs")
    rows = [verl_row("openai/gsm8k", f"What is {i}+1?", i + 1, "train", i) for i in range(8)]
    train = write_parquet(rows, root / "train.parquet")
    test = write_parquet(rows[:2], root / "test.parquet")
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return {"train_files": str(train), "val_files": str(test), "model": str(model)}


@pytest.fixture()
def no_verl_process(monkeypatch):
    """Any attempt to start verl (or the preflight) fails the test: bad input must stop before."""

    def boom(*a, **k):
        raise AssertionError(f"a subprocess was started: {a[0] if a else k}")

    monkeypatch.setattr(launch_mod.subprocess, "Popen", boom)
    monkeypatch.setattr(launch_mod.subprocess, "run", boom)


def test_paper_presets_hold_the_paper_settings():
    p = load_preset("paper_gsm8k")
    assert p["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (p["lora_rank"], p["rollout_n"], p["train_batch_size"], p["lr"], p["steps"], p["val_freq"],
            p["kl_loss_coef"], p["lam"]) == (32, 5, 32, 1e-4, 40, 5, 0.001, 0.3)
    d = load_preset("paper_dapo")
    assert (d["dapo"], d["gen_batch_size"], d["train_batch_size"], d["max_num_gen_batches"]) == (True, 96, 32, 10)
    assert load_preset("paper_gspo")["estimator"] == "gspo" and load_preset("paper_drgrpo")["estimator"] == "drgrpo"
    assert {"cpu_tiny", "cpu_lab", "paper_math"} <= set(presets())


@pytest.mark.parametrize("preset", ["paper_gsm8k", "paper_dapo", "paper_gspo", "paper_drgrpo"])
def test_gpu_presets_compose_with_verls_config(preset, data, tmp_path):
    spec = make_spec(preset, train_files=data["train_files"], val_files=data["val_files"])
    o = to_overrides(spec, tmp_path / "r", "r", gpu.no_gpu())
    cfg = compose(o, spec.trainer)  # verl's validate_config too (its vLLM LoRA-rank lookup substituted here)
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.model.lora_rank == 32
    assert cfg.algorithm.adv_estimator == spec.estimator_name
    assert cfg.reward.custom_reward_function.path == "pkg://phantom.verl.reward"
    assert cfg.reward.custom_reward_function.reward_kwargs.lam == 0.3
    assert cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.actor.kl_loss_coef == 0.001
    assert cfg.trainer.test_freq == 5 and cfg.trainer.total_training_steps == 40
    if preset == "paper_dapo":
        fg = cfg.algorithm.filter_groups
        assert (fg.enable, fg.metric, fg.max_inflight_gen_batches) == (True, "acc", 3)
    if preset == "paper_gspo":
        assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
        assert cfg.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"
    assert cfg.algorithm.norm_adv_by_std_in_grpo is (preset != "paper_drgrpo")


def test_cpu_overrides(data, tmp_path):
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                     arm="score", n_gpus_per_node=2, kl_loss_coef=0.001, lora_rank=4)
    o = to_overrides(spec, tmp_path / "run", "run")
    for needed in ("actor_rollout_ref.rollout.name=hf", "trainer.device=cpu", "+ray_kwargs.ray_init.num_gpus=2",
                   "ray_kwargs.ray_init.num_cpus=10", "algorithm.adv_estimator=phantom_grpo_score",
                   "actor_rollout_ref.model.lora.merge=True", "+algorithm.phantom.lam=0.3",
                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
                   f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={tmp_path / 'run' / 'metrics.jsonl'}"):
        assert needed in o
    cfg = compose(o)
    assert cfg.trainer.n_gpus_per_node == 2
    env = run_env(spec, tmp_path / "run")
    assert env["VERL_USE_EXTERNAL_MODULES"].endswith("phantom.verl.cpu.plugin") and env["VERL_PLATFORM"] == "cpu"


def test_scale_out_and_passthrough(data, tmp_path):
    spec = make_spec("paper_gsm8k", train_files=data["train_files"], val_files=data["val_files"], nnodes=2,
                     n_gpus_per_node=8, ray_address="ray://head:10001",
                     extra_overrides=["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    o = to_overrides(spec, tmp_path / "r", "r", gpu.no_gpu())
    assert {"trainer.nnodes=2", "trainer.n_gpus_per_node=8", "+ray_kwargs.ray_init.address=ray://head:10001"} <= set(o)
    assert o[-1] == "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    cfg = compose(o, spec.trainer)
    assert cfg.ray_kwargs.ray_init.address == "ray://head:10001"


@pytest.mark.parametrize(
    ("fields", "error", "needle"),
    [
        ({"arm": "outcme"}, ValueError, "arm='outcme' is unknown"),
        ({"estimator": "ppo"}, ValueError, "estimator='ppo' is unknown"),
        ({"lam": 1.0}, ValueError, "0 <= lam < 1"),
        ({"lam": 1.5, "arm": "none"}, ValueError, "0 <= lam < 1"),
        ({"backend": "tpu"}, ValueError, "backend='tpu' is unknown"),
        ({"model": "/nonexistent/model"}, FileNotFoundError, "/nonexistent/model does not exist"),
        ({"train_files": "/nonexistent/train.parquet"}, FileNotFoundError, "train.parquet does not exist"),
        ({"steps": 0}, ValueError, "steps=0"),
        ({"trainer": "legacy", "dapo": True}, ValueError, "legacy trainer has no group filter"),
        ({"dapo_metric": "seq_reward"}, ValueError, "dapo_metric='seq_reward' is unknown"),
        ({"learning_rate": 1e-4}, ValueError, "unknown spec field"),
    ],
)
def test_bad_input_fails_before_anything(fields, error, needle, data, tmp_path, no_verl_process):
    base = {"model": data["model"], "train_files": data["train_files"], "val_files": data["val_files"]}
    with pytest.raises(error, match=needle.replace("(", r"\(")):
        spec = make_spec("cpu_tiny", **{**base, **fields})
        launch(spec, "bad", runs_dir=tmp_path)
    assert not (tmp_path / "bad").exists()


# A GPU launch on this CPU machine fails in the doctor: tests/test_verl_doctor.py.


def test_gpu_hub_id_is_accepted_but_cpu_needs_a_local_model(data):
    spec = make_spec("paper_gsm8k", train_files=data["train_files"], val_files=data["val_files"])
    assert spec.model == "Qwen/Qwen2.5-1.5B-Instruct"
    with pytest.raises(FileNotFoundError, match="backend=cpu needs a local model"):
        make_spec("cpu_tiny", model="Qwen/Qwen2.5-1.5B-Instruct", train_files=data["train_files"],
                  val_files=data["val_files"])
    with pytest.raises(FileNotFoundError, match="recipe/dapo/main_dapo.py"):
        make_spec("paper_dapo", trainer="recipe_dapo", recipe_path="/nonexistent",
                  train_files=data["train_files"], val_files=data["val_files"])


def test_typo_in_an_override_fails_in_compose_and_leaves_no_folder(data, tmp_path, no_verl_process):
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                     extra_overrides=["actor_rollout_ref.actor.optim.lrr=1e-4"])
    with pytest.raises(ValueError, match="lrr"):
        launch(spec, "typo", runs_dir=tmp_path)
    assert not (tmp_path / "typo").exists()
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                     extra_overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"])
    with pytest.raises(ValueError, match="ppo_micro_batch_size"):  # verl's own validate_config
        launch(spec, "microbatch", runs_dir=tmp_path)
    assert not (tmp_path / "microbatch").exists()


def _fake_run(root: Path, name: str, spec, status: str, pid: int | None = None) -> RunDir:
    run = RunDir(root / name)
    run.path.mkdir(parents=True)
    run.manifest_path.write_text(json.dumps({"name": name, "status": status, "spec": spec.to_dict(),
                                             "spec_hash": spec_hash(spec.to_dict()), "pid": pid,
                                             "host": os.uname().nodename}))
    return run


def test_running_folder_is_refused_and_left_alone(data, tmp_path, no_verl_process):
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"])
    run = _fake_run(tmp_path, "busy", spec, "running", pid=os.getpid())
    before = run.manifest_path.read_text()
    with pytest.raises(RunInUse, match="marked running"):
        launch(spec, "busy", runs_dir=tmp_path)
    assert run.manifest_path.read_text() == before
    assert main(["run", "--preset", "cpu_tiny", "--set", f"model={data['model']}", "--set",
                 f"train_files={data['train_files']}", "--set", f"val_files={data['val_files']}",
                 "--name", "busy", "--runs-dir", str(tmp_path)]) == 2


def test_finished_run_is_reused_never_overwritten(data, tmp_path, no_verl_process):
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"])
    run = _fake_run(tmp_path, "finished", spec, "done")
    (run.path / "metrics.jsonl").write_text('{"step": 0, "data": {"x": 1}}\n')
    assert launch(spec, "finished", runs_dir=tmp_path).path == run.path
    assert (run.path / "metrics.jsonl").read_text() == '{"step": 0, "data": {"x": 1}}\n'
    other = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                      lam=0.5)
    with pytest.raises(RunConflict):
        launch(other, "finished", runs_dir=tmp_path)


def test_cli_reports_bad_input_with_exit_code_2(capsys, no_verl_process):
    assert main(["run", "--preset", "cpu_tiny", "--set", "arm=bogus"]) == 2
    assert "arm='bogus' is unknown; allowed: none, score, outcome" in capsys.readouterr().err
    assert main(["run", "--preset", "nope"]) == 2


def test_cli_prints_the_command(data, capsys, tmp_path):
    assert main(["overrides", "--preset", "paper_gsm8k", "--set", "arm=score", "--set",
                 f"train_files={data['train_files']}", "--set", f"val_files={data['val_files']}",
                 "--runs-dir", str(tmp_path)]) == 0
    argv = shlex.split(capsys.readouterr().out.replace("\\\n", " "))  # one shell command, continued over lines
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"] and "algorithm.adv_estimator=phantom_grpo_score" in argv


def test_printed_command_is_shell_quoted(data, capsys, tmp_path):
    """A value with a space, a quote and a non-ASCII letter survives the shell as one argument."""
    odd = "a b/é'$x"
    assert main(["overrides", "--preset", "cpu_tiny", "--set", f"model={data['model']}", "--set",
                 f"train_files={data['train_files']}", "--set", f"val_files={data['val_files']}",
                 "--set", f"extra_overrides=[trainer.project_name={odd}]", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    echoed = subprocess.run(["bash", "-c", f"printf '%s\\n' {out}"], capture_output=True, text=True).stdout
    assert f"trainer.project_name={odd}" in echoed.splitlines()
    assert main(["overrides", "--preset", "cpu_tiny", "--name", "a b/é", "--runs-dir", str(tmp_path)]) == 2
    assert "name='a b/é' is invalid" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "lots"])
def test_gpu_memory_must_be_a_finite_positive_number(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["overrides", "--preset", "paper_gsm8k", "--gpu-memory", value])
    assert exc.value.code == 2 and f"--gpu-memory {value!r} is invalid" in capsys.readouterr().err


def test_preflight_checks_a_fresh_interpreter(data, tmp_path):
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"])
    env = run_env(spec, tmp_path)
    info = launch_mod.preflight(spec, env)
    assert (info["device"], info["ccl"], info["verl"]) == ("cpu", "gloo", "0.9.1") and "hf" in info["rollouts"]
    assert info["estimators"] == ["phantom_grpo_none", "phantom_grpo_outcome", "phantom_grpo_score"]
    with pytest.raises(RuntimeError, match="does not register phantom_grpo_outcome"):
        launch_mod.preflight(spec, {**env, "VERL_USE_EXTERNAL_PLUGINS": "none"})


def test_cpu_backend_refuses_another_verl_version():
    code = "import verl; verl.__version__ = '0.9.0'; import phantom.verl.cpu.plugin"
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "supports verl 0.9.1 only, found verl 0.9.0" in out.stderr


def test_read_run_metrics_overlays_the_gate_log(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "data": {"val": 0.5}}\n{"step": 1, "data": {"a": 1}}\n')
    stats = {"gate": "outcome", "norm": "std", "groups": 4, "zeroed": 2, "singletons": 0, "all_fail": 1,
             "all_pass": 1, "mixed": 2, "phantom": 1, "degenerate_live": 0}
    line = {"step": 1, "call": 1, "stats": stats, "rows": 8, "abs_adv_sum": 4.0, "acc_sum": 3.0}
    (tmp_path / "gate.jsonl").write_text(json.dumps(line) + "\n" + json.dumps({**line, "call": 2}) + "\n{torn")
    df = read_run_metrics(tmp_path)
    assert df.loc[1, "a"] == 1 and df.loc[0, "val"] == 0.5
    assert df.loc[1, "phantom/groups/total"] == 8 and df.loc[1, "phantom/frac/zeroed"] == 0.5  # two calls summed
    assert df.loc[1, "phantom/acc/mean"] == pytest.approx(6 / 16)
    assert gate_metrics(tmp_path / "missing.jsonl") == {}


def test_default_names_are_distinct_per_spec(data):
    a = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"])
    b = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                  arm="score")
    assert default_name(a) != default_name(b) and default_name(a).startswith("verl-grpo-outcome-lam0.3-s42-")


def test_bad_fields_fail_before_any_model_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("PHANTOM_ARTIFACTS", str(tmp_path / "artifacts"))
    with pytest.raises(ValueError, match="arm='bogus'"):
        make_spec("cpu_lab", arm="bogus")  # model "lab" would train an SFT checkpoint first
    with pytest.raises(ValueError, match="is a CPU model"):
        make_spec("cpu_tiny", backend="gpu")
    assert not (tmp_path / "artifacts").exists()


def test_reward_options_reach_the_reward(data, tmp_path):
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                     kind="overlong", reward_options={"l_max": 300, "l_cache": 100, "checker": "strict"})
    o = to_overrides(spec, tmp_path / "r", "r")
    assert "+reward.custom_reward_function.reward_kwargs.l_max=300" in o
    with pytest.raises(ValueError, match="needs integer l_max"):
        make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                  kind="overlong")


def test_dapo_refill_telemetry(data, tmp_path):
    spec = make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                     arm="none", dapo=True, dapo_metric="acc", train_batch_size=4)
    lines = [{"step": 0, "data": {"val-core/x/acc/mean@1": 0.5}},
             {"step": 1, "data": {"timing_s/step": 1.0}},  # verl omits the counters when they are 0
             {"step": 2, "data": {"timing_s/step": 1.0, "training/filter_groups/evicted_samples": 3,
                                  "training/filter_groups/discarded_surplus_samples": 1}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    m = launch_mod._dapo_metrics(tmp_path / "metrics.jsonl", spec)
    assert m[1] == {"phantom/prompts_generated": 4.0, "phantom/gen_batches": 1.0, "phantom/refilled": 0.0}
    assert m[2] == {"phantom/prompts_generated": 8.0, "phantom/gen_batches": 2.0, "phantom/refilled": 1.0}
    assert 0 not in m


@pytest.fixture()
def no_verl_start(monkeypatch):
    """verl itself must not start (the reward probe's short subprocess may run)."""
    real = subprocess.Popen

    def guarded(argv, *a, **k):
        if "verl.trainer.main_ppo" in argv:
            raise AssertionError("verl was started")
        return real(argv, *a, **k)

    monkeypatch.setattr(launch_mod.subprocess, "Popen", guarded)


def _tiny(data, **fields):
    return make_spec("cpu_tiny", model=data["model"], train_files=data["train_files"], val_files=data["val_files"],
                     **fields)


def test_no_metric_given_is_verls_default_reward_and_warns(data, tmp_path):
    from phantom.verl.filters import check_filter

    spec = _tiny(data, arm="none", dapo=True, dapo_metric="default")
    o = to_overrides(spec, tmp_path / "r", "r")
    assert "algorithm.filter_groups.enable=True" in o and not any(".filter_groups.metric=" in x for x in o)
    assert not any("max_num_gen_batches" in x or "max_inflight_gen_batches" in x for x in o)  # verl's defaults
    cfg = compose(o)
    setting, warnings = check_filter(cfg, o, "v1")
    assert (setting["enable"], setting["metric"], setting["metric_source"]) == (True, "reward", "verl default")
    assert len(warnings) == 1 and "reads the shaped score (lam=0.3)" in warnings[0]
    o_acc = to_overrides(_tiny(data, arm="none", dapo=True, dapo_metric="acc"), tmp_path / "r", "r")
    setting, warnings = check_filter(compose(o_acc), o_acc, "v1")
    assert (setting["metric"], setting["metric_source"], warnings) == ("acc", "override", [])


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"dapo": True, "dapo_metric": "banana"},
         "dapo_metric='banana' is unknown; allowed: default, acc, score, reward, outcome"),
        ({"dapo": True, "extra_overrides": ["algorithm.filter_groups.metric=banana"]},
         "metric='banana' is not a key the reward pkg://phantom.verl.reward:compute_score returns.*"
         "allowed: reward, acc, len_chars, outcome, score"),
        ({"trainer": "legacy", "extra_overrides": ["algorithm.filter_groups.enable=True"]},
         "enable=True with trainer=legacy: verl 0.9.1's legacy trainer has no group filter.*allowed: trainer=v1"),
    ],
)
def test_filter_mistakes_fail_before_anything(fields, needle, data, tmp_path, no_verl_process):
    with pytest.raises(ValueError, match=needle):
        launch(_tiny(data, arm="none", **fields), "bad", runs_dir=tmp_path)
    assert not (tmp_path / "bad").exists()


def test_metric_acc_with_a_float_reward_is_refused(data, tmp_path, no_verl_start, capsys):
    """verl stores acc = score for a float reward: metric=acc would filter on the shaped score."""
    reward = tmp_path / "my_reward.py"
    reward.write_text("def shaped(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                      "    right = solution_str.strip().endswith(str(ground_truth))\n"
                      "    return float(right) - 0.3 * min(len(solution_str) / 512, 1.0)\n")
    wired = [f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=shaped"]
    spec = _tiny(data, arm="none", dapo=True, dapo_metric="acc", extra_overrides=wired)
    with pytest.raises(ValueError, match=r"metric='acc' but the reward .*my_reward.py:shaped returns a float"):
        launch(spec, "floaty", runs_dir=tmp_path)
    spec = _tiny(data, arm="none", dapo=True, dapo_metric="score", extra_overrides=wired)
    with pytest.raises(ValueError, match=r"metric='score' is not a key.*allowed: reward, acc$"):
        launch(spec, "floaty", runs_dir=tmp_path)
    assert not (tmp_path / "floaty").exists()
    argv = ["run", "--preset", "cpu_tiny", "--set", f"model={data['model']}", "--set", f"train_files={data['train_files']}",
            "--set", f"val_files={data['val_files']}", "--set", "arm=none", "--set", "dapo=true",
            "--set", f"extra_overrides=[{wired[0]},{wired[1]}]", "--runs-dir", str(tmp_path)]
    assert main(argv) == 2 and "returns a float" in capsys.readouterr().err


def test_the_plan_is_made_once_per_launch(tmp_path, monkeypatch):
    """spec -> plan -> overrides -> doctor: the machine is resolved once and the manifest would record that plan."""
    from phantom.verl import plan as plan_mod

    calls = []
    real = gpu.resolve
    monkeypatch.setattr(gpu, "resolve", lambda spec, hw: calls.append(1) or real(spec, hw))
    monkeypatch.setattr(launch_mod.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = make_spec("paper_gsm8k", check_inputs=False)
    with pytest.raises(RuntimeError, match="no CUDA"):
        launch(spec, "gpu_here", runs_dir=tmp_path, progress=False)
    assert len(calls) == 1
    p = plan_mod.make_plan(spec, gpu.Hardware(gpus=(("H100", 79.2),), flash_attn_error="missing", probed=True))
    o = to_overrides(spec, tmp_path / "r", "r", p)
    assert f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={p.micro}" in o and p.micro == 2  # the spec's own
    assert p.manifest()["plan"]["memory_row"] == "80+ GB" and len(calls) == 2
