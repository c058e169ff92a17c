# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # One arm on verl's real trainer
#
# This notebook launches **one** run of `python -m verl.trainer.main_ppo` (verl 0.9.1) through
# `phantom.verl.launch`, follows it step by step, and plots its curves from the run's `metrics.jsonl`.
# Run it with papermill to sweep arms, lambdas and seeds: every run gets its own folder
# `runs/<name>/`, and a finished run with the same spec is reused instead of re-run, so a
# sweep that stopped half-way resumes where it stopped.
#
# * `backend="cpu"` (default): the smallest real run this machine can afford. A tiny random Qwen2
#   (built locally), 2 GRPO steps of 4 prompts x 4 rollouts, validation before training. It shows
#   the plumbing (reward dict, gated estimator, telemetry), not learning.
# * `backend="gpu"`: the paper's section 4 preset as its artifact ran it (Qwen2.5-1.5B-Instruct, LoRA
#   r=32, 32 prompts x 5 rollouts in 2 updates, lr 1e-4, 40 steps, responses up to 512 tokens,
#   validation every 5 steps, KL loss 0.001, lambda 0.3, verl's legacy trainer). Build the data first
#   with `phantom data gsm8k`; `phantom verl doctor --preset paper_gsm8k` checks the machine.
#
# The arm is the only thing that changes between the paper's three runs: which groups get zero
# advantage (`none`, `score`: shaped score flat, `outcome`: binary outcome all equal).

# %% tags=["parameters"]
backend = "cpu"  # "cpu" (tiny, this machine) or "gpu" (the paper's preset)
preset = None  # None: "cpu_tiny" for cpu, "paper_gsm8k" for gpu; see `phantom verl presets`
arm = "outcome"  # none | score | outcome: the estimator phantom_grpo_<arm>
estimator = "grpo"  # grpo | drgrpo | gspo
lam = 0.3  # phantom strength, in [0, 1)
steps = None  # None: the preset's
dapo = False  # DAPO dynamic sampling (verl v1 replay-buffer filter)
dapo_metric = "acc"  # acc (binary outcome) | score (shaped) | reward (shaped, pre-KL) | default (no metric: verl's reward)
model = None  # None: the preset's
train_files = None
val_files = None
seed = None
name = None  # None: derived from the spec
runs_dir = None  # None: $PHANTOM_RUNS or ./runs
timeout_s = None  # None: 2 h on cpu, 4 h on gpu (a paper arm took ~50 min on an RTX 5090, §12; 7B or smaller cards take longer)
echo = False  # copy verl's own output into this notebook
extra = {}  # any other spec field by name, e.g. val_freq or noise_p
sweep = None  # manifest field of a sweep's cell (phantom verl sweep sets it)
starve_batches = None  # with the group filter on CPU: stop a step after this many generation batches (run "starved")

# %%
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phantom import figures
from phantom.verl.launch import launch, read_run_metrics
from phantom.verl.spec import make_spec

figures.setup()
fields = dict(backend=backend, arm=arm, estimator=estimator, lam=lam, steps=steps, dapo=dapo,
              dapo_metric=dapo_metric, model=model, train_files=train_files, val_files=val_files, seed=seed, **extra)
spec = make_spec(preset or ("cpu_tiny" if backend == "cpu" else "paper_gsm8k"), **fields)
spec

# %% [markdown]
# `launch` validates everything before Ray starts (spec, files, verl's composed config, that
# `import verl` registers the phantom estimators), then runs verl and shows a progress bar per step.

# %%
timeout = timeout_s if timeout_s is not None else (2 if spec.backend == "cpu" else 4) * 3600
run = launch(spec, name, runs_dir=runs_dir, timeout=timeout, echo=echo, progress=sweep is None,
             manifest={"sweep": sweep} if sweep else None, starve_batches=starve_batches)
manifest = run.manifest()
status = manifest["status"]
print(f"{run.name}: {status} in {manifest['finished'] - manifest['started']:.0f} s -> {run.path}")
if status == "starved":  # an outcome: the filter evicted every group of a step, batch after batch
    print(f"stopped at step {manifest['starved']['step']}: {manifest['starved']['sequences']} sequences generated, "
          f"bound {manifest['starved']['limit']}")
assert status in ("done", "starved"), status

# %% [markdown]
# ## Curves
#
# Held-out accuracy is verl's `val-core/<data source>/acc/mean@1`, the *binary* outcome from the reward
# dict. Response length is in tokens; the training score is the shaped reward. The `phantom/frac/*`
# lines come from the estimator: the fraction of groups it zeroed, and of groups that are all-fail
# yet still spread in shaped score (the phantom groups).

# %%
df = read_run_metrics(run.path)
acc_key = next(c for c in df.columns if c.startswith("val-core/") and c.endswith("/acc/mean@1"))
len_key = acc_key.replace("val-core/", "val-aux/").replace("/acc/", "/len_chars/")
panels = [
    ("held-out accuracy", [(acc_key, "accuracy")]),
    ("response length", [("response_length/mean", "train (tokens)"), (len_key, "held-out (chars / 10)")]),
    ("shaped score", [("critic/score/mean", "train"), (acc_key.replace("val-core/", "val-aux/").replace("/acc/", "/score/"), "held-out")]),
    ("groups", [("phantom/frac/zeroed", "zeroed"), ("phantom/frac/phantom", "phantom"), ("phantom/frac/all_fail", "all-fail")]),
]
fig = make_subplots(rows=2, cols=2, subplot_titles=[p[0] for p in panels])
for i, (_, series) in enumerate(panels):
    for key, label in series:
        if key not in df:
            continue
        y = df[key].dropna() / (10 if "len_chars" in key else 1)
        fig.add_trace(go.Scatter(x=y.index, y=y.values, mode="lines+markers", name=label,
                                 legendgroup=str(i)), row=i // 2 + 1, col=i % 2 + 1)
figures.style(fig, title=f"{run.name}", height=560)
fig.update_xaxes(title_text="step")
fig

# %%
keys = [acc_key, "response_length/mean", "critic/score/mean", "phantom/acc/mean", "phantom/frac/zeroed",
        "phantom/frac/phantom", "phantom/adv/abs_mean", "phantom/gen_batches",
        "training/filter_groups/evicted_samples", "timing_s/step"]
pd.DataFrame({k: df[k] for k in keys if k in df}).round(4)

# %% [markdown]
# ## Running the paper's experiments, and scaling out
#
# The same call runs on a GPU machine with `backend="gpu"` (`pip install -e .[gpu]`, then
# `phantom data gsm8k`). The presets hold the paper's settings: `paper_gsm8k` (section 4),
# `paper_math` (section 7), `paper_dapo` (section 8), `paper_gspo` and `paper_drgrpo` (section 9).
# `phantom verl overrides --preset paper_gsm8k --set arm=score` prints the exact verl command.
#
# Scale-out is verl's own, passed through unchanged:
#
# | what | spec fields | verl overrides produced |
# |---|---|---|
# | more GPUs on one node | `n_gpus_per_node=8` | `trainer.n_gpus_per_node=8` |
# | several nodes | `nnodes=2, n_gpus_per_node=8`, and `ray_address` of the cluster | `trainer.nnodes=2 trainer.n_gpus_per_node=8 +ray_kwargs.ray_init.address=<addr>` |
# | an existing Ray cluster | `ray_address="ray://head:10001"` (or `"auto"`) | `+ray_kwargs.ray_init.address=ray://head:10001` |
# | larger rollout tensor parallelism | `extra_overrides=["actor_rollout_ref.rollout.tensor_model_parallel_size=2"]` | passed verbatim |
#
# On an existing cluster the workers do not inherit the launcher's environment: the run's file-logger
# path and gate log travel in `+ray_kwargs.ray_init.runtime_env.env_vars.*` (always set by the launcher),
# and `phantom` must be installed in the cluster's Python so verl's `verl.plugins` entry point registers
# the estimators there too. Run folders must be on a file system the TaskRunner's node can write.
#
# **DAPO.** `dapo=True` uses verl 0.9.1's v1 replay-buffer filter (`algorithm.filter_groups.*`);
# it forces a generation batch of 1 prompt and ignores `max_num_gen_batches`, so the paper's
# `gen_batch_size=96, max_num_gen_batches=10` maps to `max_inflight_gen_batches=3` (up to 96 prompts
# in flight). Refills show up as `training/filter_groups/evicted_samples`; the launcher adds
# `phantom/prompts_generated` (= batch + evicted + discarded surplus) and `phantom/gen_batches`
# (that divided by the batch size). The classic trainer of section 8 lives in verl-recipe, not in the
# verl wheel: `git clone https://github.com/verl-project/verl-recipe recipe`, then
# `trainer="recipe_dapo", recipe_path="<folder holding recipe/>"`; the launcher runs
# `python -m recipe.dapo.main_dapo` there with `hydra.searchpath=[pkg://verl.trainer.config]`,
# `data.gen_batch_size=96` and `algorithm.filter_groups.max_num_gen_batches=10`, and copies
# `train/num_gen_batches` into `phantom/gen_batches`. **That path is not tested here** (it needs vLLM
# on a GPU); the v1 path is tested on CPU.
