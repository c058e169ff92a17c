"""verl 0.9.1's real trainer on this CPU, end to end: the papermill notebook, a sweep cell with verl's filter.

Each verl run is `python -m verl.trainer.main_ppo` for 2 steps with the tiny random model under a local
Ray cluster (~30 processes); the two sweep cells share one Ray head and one preflight (`swept`), the
smoke test starts its own, as a GPU user's first command does. About 1.5-2.5 minutes per run on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer")
pytest.importorskip("transfer_queue")

from phantom.runs import RunDir, read_metrics  # noqa: E402
from phantom.verl.launch import read_run_metrics  # noqa: E402
from phantom.verl.spec import make_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.timeout(900)]


def _check_run(run: RunDir, steps: int = 2):
    m = run.manifest()
    assert m["status"] == "done", m
    df = read_metrics(run.path)  # the plain reader: gate lines were merged into metrics.jsonl
    assert sorted(df.index) == list(range(steps + 1))  # step 0 = validation before training
    acc = [c for c in df.columns if c.startswith("val-core/") and c.endswith("/acc/mean@1")]
    assert acc and 0 <= df.loc[0, acc[0]] <= 1
    for key in ("response_length/mean", "critic/score/mean", "phantom/frac/zeroed", "phantom/groups/total",
                "phantom/acc/mean", "phantom/adv/abs_mean"):
        assert df.loc[1:, key].notna().all(), key
    for key in ("val-aux/phantom_arith/score/mean@1", "val-aux/phantom_arith/len_chars/mean@1"):
        assert key in df.columns
    assert (df.loc[1:, "phantom/groups/total"] == 4).all()  # 4 prompts per step, one group each
    return df


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """`phantom verl sweep`'s quick profile, cells `outcome` and `b`, under the sweep's own Ray head: each cell is a
    papermill execution of notebooks/verl_arm.py, so one verl start-up serves the notebook's test and the filter's."""
    from phantom.verl.sweep import run_sweep

    root = tmp_path_factory.mktemp("verl_sweep")
    outcome, b = run_sweep("quick", only=["outcome", "b"], seeds=[0], runs_dir=root, progress=False)
    return root, outcome, b


def test_notebook_runs_one_outcome_arm_on_cpu(swept):
    _, run, _ = swept
    df = _check_run(run)
    m = run.manifest()
    assert m["spec"]["arm"] == "outcome" and m["spec"]["val_before_train"]
    assert make_spec("cpu_tiny", arm="phantom_grpo_outcome").arm == "outcome"  # the estimator's name is accepted
    assert "algorithm.adv_estimator=phantom_grpo_outcome" in m["overrides"]
    assert "starve_batches" not in m  # the refill bound is for filtered cells only
    # the random model never solves the task: every group all-fail, all zeroed by the outcome gate
    assert (df.loc[1:, "phantom/frac/zeroed"] == 1.0).all() and (df.loc[1:, "phantom/adv/abs_mean"] == 0).all()
    assert "plotly" in (run.path / "verl_arm.ipynb").read_text()  # the notebook ran to its curves


def test_sweep_cell_b_verls_default_filter_under_a_shared_ray_head(swept):
    """`phantom verl sweep`'s cell b (filter on, no metric: verl 0.9.1's `reward`) through the notebook, under
    the sweep's own Ray head; verl's replay buffer polling every 0.2 s; resumed, not re-run."""
    from phantom.verl.sweep import STARVE_BATCHES, run_sweep

    root, outcome, run = swept
    df = _check_run(run)
    m = run.manifest()
    o = m["overrides"]
    assert "algorithm.filter_groups.enable=True" in o and not any(".filter_groups.metric=" in x for x in o)
    assert m["filter_groups"] == {"enable": True, "metric": "reward", "metric_source": "verl default",
                                  "max_inflight_gen_batches": 1, "max_num_gen_batches": 0, "trainer": "v1"}
    assert m["sweep"] == {"name": "verl", "profile": "quick", "cell": "b"}
    assert m["starve_batches"] == STARVE_BATCHES  # bounded, and the tiny run stayed under the bound
    assert m["plan"]["ray"].startswith("127.0.0.1:") and m["plan"]["replay_buffer_poll_s"] == 0.2
    assert m["plan"]["torch_threads"] >= 1
    assert m["plan"]["ray"] == outcome.manifest()["plan"]["ray"]  # both cells joined the sweep's one head
    assert any(x.startswith("+ray_kwargs.ray_init.address=127.0.0.1:") for x in o)
    assert not any(x.startswith("ray_kwargs.ray_init.num_cpus=") for x in o)
    assert (df.loc[1:, "phantom/gen_batches"] >= 1).all() and (df.loc[1:, "phantom/prompts_generated"] >= 4).all()
    assert (df.loc[1:, "phantom/frac/zeroed"] == 0).all()  # arm none: the filter, not the estimator, acts
    # Weight sync and log-prob semantics: step 2 samples from the weights step 1 trained (arm none has
    # live advantages), and verl's fp32 actor recomputes the hf server's log-probs to float rounding.
    assert df.loc[1, "actor/grad_norm"] > 0
    assert df.loc[2, "training/rollout_probs_diff_max"] < 1e-5
    batches = [json.loads(x) for x in (run.path / "rollout.jsonl").read_text().splitlines()]
    assert sum(b["requests"] for b in batches) >= 4 * 4 * 2 + 16  # 2 steps of 4x4 rollouts + 16 validation prompts
    assert max(b["requests"] for b in batches) > 1  # the server batched concurrent requests
    log = run.stdout_path.read_text()
    assert "data.gen_batch_size defaulted to 1" in log  # verl's replay-buffer DAPO path was taken
    # the transfer queue's environment reached verl's workers: no thread warning around its puts and gets
    assert "target_num_threads" not in log
    assert (run.path / "verl_arm.ipynb").is_file()
    (again,) = run_sweep("quick", only=["b"], seeds=[0], runs_dir=root, progress=False)  # reused, not re-run
    assert again.manifest()["started"] == m["started"]
    assert read_run_metrics(run.path).equals(read_run_metrics(again.path))


def test_kl_loss_with_unmerged_lora_adapters_on_v1(tmp_path, capsys):
    """The paper's structure on the CPU: LoRA adapters synced unmerged, KL loss with the reference inside the
    actor (adapters disabled), verl's V1 trainer; through `phantom verl smoke`, the GPU user's first command."""
    from phantom.verl.smoke import main as smoke_main
    from phantom.verl.smoke import run_checks

    rc = smoke_main(["--preset", "cpu_lora_kl", "--arms", "none", "--runs-dir", str(tmp_path), "--timeout", "800"])
    out = capsys.readouterr().out
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("smoke-cpu_lora_kl-none-")]
    run = RunDir(folder)
    spec = make_spec("cpu_lora_kl", base=ROOT)
    assert rc == 0 and out.rstrip().endswith("all checks passed"), out
    df = _check_run(run)
    o = run.manifest()["overrides"]
    for needed in ("actor_rollout_ref.model.lora.merge=False", "actor_rollout_ref.actor.use_kl_loss=True",
                   "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "trainer.use_v1=True",
                   "actor_rollout_ref.model.lora_rank=8"):
        assert needed in o, needed
    # LoRA's B starts at zero: at step 1 the policy is the reference; after one update it is not, which
    # holds only if verl computed the reference with the adapters disabled (ref inside the actor).
    assert df.loc[1, "actor/kl_loss"] == pytest.approx(0, abs=1e-9) and df.loc[2, "actor/kl_loss"] > 0
    sync = [json.loads(x) for x in (run.path / "sync.jsonl").read_text().splitlines()]
    # load_format=auto: the server read the base from disk, like vLLM with safetensors; then adapters only
    assert {s["mode"] for s in sync} == {"adapter"} and len(sync) >= 2
    assert sync[-1]["lora_rank"] == 8 and sync[-1]["checksum"] != sync[0]["checksum"]  # adapters changed
    assert df.loc[2, "training/rollout_probs_diff_max"] < 1e-3  # the server samples the trained adapters
    assert {c.name for c in run_checks(run, spec)} >= {"reference = adapters off", "adapter sync", "rollout = actor"}
