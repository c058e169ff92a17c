# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # One CPU-lab arm in TRL's GRPOTrainer
#
# This notebook trains one arm of the CPU lab with TRL's real `GRPOTrainer` (no vLLM): the lab's SFT
# checkpoint loaded by `transformers`, the lab's task as a `datasets.Dataset`, and the shaped reward as
# two TRL reward functions (accuracy, length penalty). The arm is TRL's default (`none`), Dr. GRPO
# (`drgrpo`, `scale_rewards="none"`) or the outcome gate from `phantom.trl.outcome_gated`. A
# `phantom.trl.PhantomCallback` writes the run folder; the figure is drawn *from that folder*.
# `phantom trl sweep` executes it with papermill, one cell per execution; opened by hand it runs a
# short demonstration arm on the tiny checkpoint.

# %% tags=["parameters"]
spec = {"arm": "outcome", "model": "tiny", "steps": 2, "prompts": 4, "rollouts": 4, "eval_n": 16, "eval_every": 1,
        "max_new": 48}  # TrlArmSpec fields
run_name = None  # default: derived from the spec (readable head + spec hash)
runs_root = None  # default: $PHANTOM_RUNS, else ./runs
extra = {}  # extra manifest fields (the sweep records its name and profile here)

# %%
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import torch

torch.set_num_threads(1)  # the CPU is shared; more threads only contend

from phantom.lab.rl import VAL_ACC, VAL_LEN
from phantom.runs import read_metrics
from phantom.trl.lab import run_trl_arm

run = run_trl_arm(spec, name=run_name, root=runs_root, extra=extra)
manifest = run.manifest()
print(run.path, manifest["status"])
print({k: v for k, v in (manifest.get("summary") or {}).items()})

# %% [markdown]
# ## What happened
#
# Left: held-out greedy accuracy and mean response length (characters). Right: what the gate saw in
# each training batch, as fractions of groups, next to TRL's own `frac_reward_zero_std`: TRL counts a
# group as dead only when its *summed* reward is flat, so phantom groups (all fail, spread by the length
# term) look live to it.

# %%
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phantom import figures

figures.setup()
df = read_metrics(run.path)
ev = df[df[VAL_ACC].notna()] if VAL_ACC in df else df.iloc[:0]
fig = make_subplots(rows=1, cols=2, specs=[[{"secondary_y": True}, {}]],
                    subplot_titles=("held-out accuracy and length", "groups per training batch"))
fig.add_trace(go.Scatter(x=ev.index, y=ev[VAL_ACC], name="accuracy", mode="lines+markers"), row=1, col=1)
fig.add_trace(go.Scatter(x=ev.index, y=ev[VAL_LEN], name="length (chars)", mode="lines+markers",
                         line=dict(dash="dot")), row=1, col=1, secondary_y=True)
for key, label in [("phantom/frac/all_fail", "all-fail"), ("phantom/frac/phantom", "phantom"),
                   ("phantom/frac/zeroed", "zeroed by gate"), ("trl/frac_reward_zero_std", "TRL: zero std")]:
    if key in df:
        fig.add_trace(go.Scatter(x=df.index, y=df[key], name=label, mode="lines"), row=1, col=2)
s = manifest["spec"]
figures.style(fig, title=f"TRL arm={s['arm']} scale_rewards={s['scale_rewards']} λ={s['lam']} seed={s['seed']}")
fig.update_xaxes(title_text="RL step")
fig.update_yaxes(title_text="accuracy", range=[0, 1], row=1, col=1, secondary_y=False)
fig.update_yaxes(title_text="characters", row=1, col=1, secondary_y=True)
fig.update_yaxes(title_text="fraction of groups", range=[0, 1], row=1, col=2)
fig.show()

# %%
ev[[VAL_ACC, VAL_LEN, "phantom/sample"]].rename(columns={VAL_ACC: "acc", VAL_LEN: "len"})
