"""Benchmark: seconds per RL step, TRL's GRPOTrainer against the lab's own loop, on the same arm.

Both train the same arm (default: the outcome gate, the lab's main setting: 32 prompts x 5 rollouts,
up to 80 new tokens, LoRA r=8, one torch thread) from the same SFT checkpoint, in this process, one
after the other. Held-out evaluation is off in both; the first ``--warmup`` steps are timed but not
counted. The baseline is the lab loop (``phantom.lab.rl.Trainer.step``); TRL's step is
``GRPOTrainer.train()``'s optimizer step as PhantomCallback times it (generation with
``transformers.generate``, rewards through ``phantom.trl.outcome_gated``, the loss, the update).
Run it under ``nice`` on a shared machine; the table says how loaded the machine was.

usage: python benchmarks/bench_trl.py [--steps 4] [--warmup 1] [--arm outcome] [--model lab]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from phantom.lab.rl import Trainer
from phantom.lab.sft import ensure_sft_model
from phantom.lab.spec import ArmSpec
from phantom.trl.lab import TrlArmSpec, build_trainer


def lab_steps(spec: TrlArmSpec, n: int) -> list[float]:
    arm = ArmSpec(arm="none" if spec.gate == "none" else "outcome", estimator="drgrpo" if spec.arm == "drgrpo"
                  else "grpo", lam=spec.lam, seed=spec.seed, steps=10_000, prompts=spec.prompts,
                  rollouts=spec.rollouts, lr=spec.lr, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha,
                  max_new=spec.max_new, eval_every=10_000, model=spec.model)
    tr = Trainer(arm, ensure_sft_model(spec.model, progress=False))
    out = []
    for st in range(1, n + 1):
        t0 = time.perf_counter()
        tr.step(st)
        out.append(time.perf_counter() - t0)
    return out


def trl_steps(spec: TrlArmSpec, n: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        s = TrlArmSpec.from_dict(spec.to_dict(), steps=n)
        trainer, cb = build_trainer(s, output_dir=os.path.join(tmp, "out"), name="bench", root=tmp, evaluate=False)
        trainer.train()
        return [h["timing_s/step"] for h in cb.history if "timing_s/step" in h]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--arm", default="outcome")
    ap.add_argument("--model", default="lab")
    a = ap.parse_args()
    torch.set_num_threads(1)
    spec = TrlArmSpec(arm=a.arm, model=a.model)
    load0 = os.getloadavg()[0]
    n = a.steps + a.warmup
    rows = [("lab loop (phantom.lab.rl)", lab_steps(spec, n)[a.warmup:]),
            ("TRL 1.16 GRPOTrainer", trl_steps(spec, n)[a.warmup:])]
    base = statistics.mean(rows[0][1])
    print(f"arm={spec.arm} model={spec.model} {spec.prompts} prompts x {spec.rollouts} rollouts, max_new "
          f"{spec.max_new}, {a.steps} timed steps after {a.warmup} warm-up; load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| loop | s/step (mean) | min | max | ratio to the lab loop |\n|---|---|---|---|---|")
    for label, t in rows:
        print(f"| {label} | {statistics.mean(t):.2f} | {min(t):.2f} | {max(t):.2f} | "
              f"{statistics.mean(t) / base:.2f}x |")


if __name__ == "__main__":
    main()
