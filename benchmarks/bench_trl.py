"""Benchmark: seconds per RL step, TRL's GRPOTrainer against the lab's own loop, on the same arm.

Both train the same arm (default: the outcome gate, the lab's main setting: 32 prompts x 5 rollouts,
up to 80 new tokens, LoRA r=8, one torch thread) from the same SFT checkpoint, in this process, one
after the other. Held-out evaluation is off in both; the first ``--warmup`` steps are timed but not
counted. The baseline is the lab loop (``phantom.lab.rl.Trainer.step``); TRL's step is
``GRPOTrainer.train()``'s optimizer step as PhantomCallback times it (generation with
``transformers.generate``, rewards through ``phantom.trl.outcome_gated``, the loss, the update).
Both loops use one thread, so CPU seconds per step (``time.process_time``) are the comparison that
survives a loaded machine; wall seconds are printed too, with the load average. Run it under ``nice``
on a shared machine.

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
from transformers import TrainerCallback

from phantom.lab.rl import Trainer
from phantom.lab.sft import ensure_sft_model
from phantom.lab.spec import ArmSpec
from phantom.trl.lab import TrlArmSpec, build_trainer


def lab_steps(spec: TrlArmSpec, n: int) -> list[tuple[float, float]]:
    arm = ArmSpec(arm="none" if spec.gate == "none" else "outcome", estimator="drgrpo" if spec.arm == "drgrpo"
                  else "grpo", lam=spec.lam, seed=spec.seed, steps=10_000, prompts=spec.prompts,
                  rollouts=spec.rollouts, lr=spec.lr, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha,
                  max_new=spec.max_new, eval_every=10_000, model=spec.model)
    tr = Trainer(arm, ensure_sft_model(spec.model, progress=False))
    out = []
    for st in range(1, n + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        tr.step(st)
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    return out


class CpuClock(TrainerCallback):
    """CPU seconds of each optimizer step (one thread: insensitive to other jobs on the machine)."""

    def __init__(self):
        self.cpu: list[float] = []

    def on_step_begin(self, args, state, control, **kw):
        self._c = time.process_time()

    def on_step_end(self, args, state, control, **kw):
        self.cpu.append(time.process_time() - self._c)


def trl_steps(spec: TrlArmSpec, n: int) -> list[tuple[float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        s = TrlArmSpec.from_dict(spec.to_dict(), steps=n)
        trainer, cb = build_trainer(s, output_dir=os.path.join(tmp, "out"), name="bench", root=tmp, evaluate=False)
        clock = CpuClock()
        trainer.add_callback(clock)
        trainer.train()
        wall = [h["timing_s/step"] for h in cb.history if "timing_s/step" in h]
        return list(zip(wall, clock.cpu))


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
    wall0 = statistics.mean(w for w, _ in rows[0][1])
    cpu0 = statistics.mean(c for _, c in rows[0][1])
    print(f"arm={spec.arm} model={spec.model} {spec.prompts} prompts x {spec.rollouts} rollouts, max_new "
          f"{spec.max_new}, {a.steps} timed steps after {a.warmup} warm-up; load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| loop | wall s/step (mean, min-max) | CPU s/step (mean) | wall ratio | CPU ratio |\n|---|---|---|---|---|")
    for label, t in rows:
        w, c = [x for x, _ in t], [y for _, y in t]
        print(f"| {label} | {statistics.mean(w):.2f} ({min(w):.2f}-{max(w):.2f}) | {statistics.mean(c):.2f} | "
              f"{statistics.mean(w) / wall0:.2f}x | {statistics.mean(c) / cpu0:.2f}x |")


if __name__ == "__main__":
    main()
