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
# # One CPU-lab arm
#
# This notebook trains one arm of the CPU lab: GRPO-family RL on the running-sum task, starting from
# the cached SFT checkpoint, with the shaped reward and group gate given in `spec`. It writes the run
# folder (`manifest.json`, `metrics.jsonl`) and then plots the run *from that folder*, so the figure
# shows exactly what a chapter would read. `phantom lab sweep` executes it with papermill, one cell
# of a sweep per execution; opened by hand it runs a short demonstration arm.

# %% tags=["parameters"]
spec = {"arm": "score", "steps": 12, "model": "quick", "eval_every": 3, "eval_n": 128}  # ArmSpec fields
run_name = None  # default: derived from the spec (readable head + spec hash)
runs_root = None  # default: $PHANTOM_RUNS, else ./runs
extra = {}  # extra manifest fields (a sweep records its name, profile and groups here)
progress = False

# %%
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch

torch.set_num_threads(1)  # two processes share two cores; more threads only contend

from phantom.lab.rl import VAL_ACC, VAL_LEN, run_arm
from phantom.runs import read_metrics

run = run_arm(spec, name=run_name, root=runs_root, progress=progress, extra=extra)
manifest = run.manifest()
print(run.path, manifest["status"])
print({k: v for k, v in (manifest.get("summary") or {}).items()})

# %% [markdown]
# ## What happened
#
# Left: held-out greedy accuracy and mean response length (characters). Right: what the gate saw in
# each training batch, as fractions of groups: all-fail groups (the phantom's dose), phantom groups
# (all-fail yet spread in shaped score, so std normalisation gives them full-size advantages) and
# groups the gate zeroed.

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
                   ("phantom/frac/zeroed", "zeroed by gate")]:
    if key in df:
        fig.add_trace(go.Scatter(x=df.index, y=df[key], name=label, mode="lines"), row=1, col=2)
s = manifest["spec"]
figures.style(fig, title=f"arm={s['arm']} estimator={s['estimator']} kind={s['kind']} λ={s['lam']} seed={s['seed']}")
fig.update_xaxes(title_text="RL step")
fig.update_yaxes(title_text="accuracy", range=[0, 1], row=1, col=1, secondary_y=False)
fig.update_yaxes(title_text="characters", row=1, col=1, secondary_y=True)
fig.update_yaxes(title_text="fraction of groups", range=[0, 1], row=1, col=2)
fig.show()

# %%
ev[[VAL_ACC, VAL_LEN, "phantom/sample"]].rename(columns={VAL_ACC: "acc", VAL_LEN: "len"})
