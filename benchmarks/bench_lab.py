"""Benchmark: the CPU lab's RL step, per arm, against a torch matmul measured in the same process.

For each arm, runs the lab's real training loop (``phantom.lab.rl.Trainer``: sampling with the KV
cache, scoring, gated advantages, PPO update, held-out evaluation every ``eval_every`` steps) for
``--steps`` steps from the SFT checkpoint, one torch thread, and reports:

* seconds per RL step (mean) and per whole arm (wall, evaluations included, SFT excluded);
* rollout tokens per second (sampled response tokens / time spent generating them);
* achieved model FLOP/s: analytic FLOPs of the useful tokens (prefill, decode with the cache, the
  training forward+backward, evaluation) over the arm's wall time, and that as a fraction of the
  FLOP/s of a dense fp32 matmul (the baseline, same thread count, timed before and after the arms).

The analytic count is cross-checked once against ``torch.utils.flop_counter`` on a real update.

usage: python benchmarks/bench_lab.py [--steps 40] [--arms none,outcome] [--model lab] [--matmul 384]
                                     [--checkpoint DIR --set key=value ...] [--decode torch,c --rounds 2]
                                     [--threads 1,2]

``--decode torch,c`` runs every arm once per decode path (``$PHANTOM_DECODE``: torch's ops, the
baseline, and the C decode kernel), alternating their order over ``--rounds`` so the machine's drift
hits both alike, and adds a table of wall-time ratios against torch's path in the same run and
whether the two logged the same values (they must: the kernel is bit-identical by construction).

``--threads 1,2`` does the same for torch thread counts (``Trainer(threads=...)``, which keeps more than
one only where ``phantom.lab.threads`` finds they change no number; the table says how many were used),
both combined where both are given. An arm's wall time starts before its trainer is built, so it
includes that probe.

``--checkpoint`` runs the same loop on another checkpoint folder (e.g. an older lab's, to compare code
versions on one model); ``--set`` overrides ArmSpec fields (``--set task='{"terms": [2, 5]}'``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
# every arm evaluates before its first step, as in the rounds before the run code cached that evaluation
os.environ.setdefault("PHANTOM_EVAL0_CACHE", "0")

import numpy as np
import torch

from phantom.lab.model import train_flops_per_token
from phantom.lab.rl import Trainer
from phantom.lab.rollouts import Rollouts
from phantom.lab.sft import ensure_sft_model
from phantom.lab.spec import ArmSpec


def matmul_gflops(n: int, repeats: int = 15) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


class Counter:
    """Analytic FLOPs of the useful tokens, gathered by wrapping the trainer's hot calls."""

    def __init__(self, trainer: Trainer):
        self.t, self.flops, self.gen_tokens, self.gen_seconds = trainer, 0.0, 0, 0.0
        c, v = trainer.model.cfg, trainer.model.vocab_size
        self.body = lambda ctx: train_flops_per_token(c, v, ctx, head=False)
        self.head = train_flops_per_token(c, v, 0, head=True) - train_flops_per_token(c, v, 0, head=False)
        orig_rollout, orig_update, orig_eval = trainer.rollout, trainer.update, trainer.evaluate

        def rollout(n, step, tag=""):
            t0 = time.perf_counter()
            b: Rollouts = orig_rollout(n, step, tag)
            self.gen_seconds += time.perf_counter() - t0
            self.gen_tokens += sum(len(r) for r in b.response_ids)
            self._generation(b.prompt_ids, b.response_ids)
            return b

        def update(batch, adv, live, step):
            rows = range(len(batch)) if live is None else live
            s = trainer.spec
            # forward + backward: 3 forwards' worth, 2 under LoRA (no weight gradients for frozen weights)
            fb = 2 if s.lora_rank else 3
            # the old log-probs' no-grad pass runs for every mini-batch but the first (whose own first
            # forward gives them); the KL reference pass for all
            passes = fb * s.ppo_epochs + (s.mini_batches - 1) / s.mini_batches + (s.kl_coef > 0)
            for i in rows:
                p, r = len(batch.prompt_ids[i]), len(batch.response_ids[i])
                self.flops += passes * (sum(self.body(k + 1) for k in range(p + r - 1)) + r * self.head)
            return orig_update(batch, adv, live, step)

        def evaluate(step):
            out = orig_eval(step)
            prompts = trainer.tok.encode_batch([p.prompt for p in trainer.val])
            self._generation(prompts, [[0] * int(round(out["phantom/val/len_tokens"]))] * len(prompts))
            return out

        trainer.rollout, trainer.update, trainer.evaluate = rollout, update, evaluate

    def _generation(self, prompts, responses) -> None:
        for p, r in zip(prompts, responses):
            n = len(p)
            self.flops += sum(self.body(k + 1) for k in range(n)) + self.head
            self.flops += sum(self.body(n + k + 1) + self.head for k in range(len(r)))


def crosscheck(trainer: Trainer) -> tuple[float, float]:
    """Analytic vs torch.utils.flop_counter FLOPs of one policy update (fwd+bwd)."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = trainer.rollout(4, step=0)
    adv = np.ones(len(batch), dtype=np.float32)
    c, v = trainer.model.cfg, trainer.model.vocab_size
    head = train_flops_per_token(c, v, 0) - train_flops_per_token(c, v, 0, head=False)
    fb = 2 if trainer.spec.lora_rank else 3
    analytic = fb * sum(sum(train_flops_per_token(c, v, k + 1, head=False) for k in range(len(p) + len(r) - 1))
                        + len(r) * head for p, r in zip(batch.prompt_ids, batch.response_ids))
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with FlopCounterMode(display=False) as fc:
        trainer.update(batch, adv, None, step=1)
    trainer.model.load_state_dict(state)
    return analytic, float(fc.get_total_flops())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--arms", default="none,outcome")
    ap.add_argument("--model", default="lab")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--matmul", type=int, default=384, help="baseline matmul size n (n x n @ n x n)")
    ap.add_argument("--checkpoint", default=None, help="checkpoint folder to use instead of the profile's")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="ArmSpec field for every arm")
    ap.add_argument("--decode", default="", help="comma-separated decode paths to compare (torch,c); "
                    "default: the environment's ($PHANTOM_DECODE, else c)")
    ap.add_argument("--threads", default="1", help="comma-separated torch thread counts to compare (1,2); "
                    "an arm keeps more than one only where phantom.lab.threads finds they change no number")
    ap.add_argument("--rounds", type=int, default=1, help="with --decode or --threads: rounds, alternating the "
                    "variants' order")
    args = ap.parse_args()
    from phantom.cli import parse_sets
    from phantom.lab.decode_kernel import CHOICES, choice
    from phantom.lab.threads import parse_threads

    torch.set_num_threads(1)
    ckpt = args.checkpoint or ensure_sft_model(args.model)
    sets = parse_sets(args.sets)
    paths = [p.strip() for p in args.decode.split(",") if p.strip()] or [choice()]
    bad = [p for p in paths if p not in CHOICES]
    if bad:
        raise SystemExit(f"--decode {','.join(bad)} is unknown; allowed: {', '.join(CHOICES)}")
    try:
        counts = [parse_threads(t, what="--threads") for t in args.threads.split(",")]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    # each variant: a decode path on a thread count; the first is the baseline of the ratio table
    variants = [(p, t) for t in counts for p in paths]

    def label(v: tuple[str, int]) -> str:
        return " ".join(([v[0]] if len(paths) > 1 else []) + ([f"{v[1]}t"] if len(counts) > 1 else [])) or v[0]

    base0 = matmul_gflops(args.matmul)
    rows, runs = [], []
    for rnd in range(max(1, args.rounds)):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for arm in args.arms.split(","):
            for v in order:
                os.environ["PHANTOM_DECODE"] = v[0]
                r = run_one(arm, args, sets, ckpt, threads=v[1])
                torch.set_num_threads(1)
                runs.append((arm, v, rnd + 1, *r))
                if rnd == 0:
                    rows.append((arm, label(v), *r[:5], r[7]))
    base1 = matmul_gflops(args.matmul)
    base = (base0 + base1) / 2
    analytic, counted = crosscheck(Trainer(ArmSpec.from_dict({"model": args.model, **sets}), ckpt, threads=1))
    load = os.getloadavg()
    what = f"checkpoint {args.checkpoint}" if args.checkpoint else f"model '{args.model}'"
    print(f"\nCPU lab benchmark: {args.steps}-step arms, {what}, {sets or 'spec defaults'}, torch threads "
          f"{','.join(map(str, counts))}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs")
    print(f"baseline: fp32 matmul {args.matmul}x{args.matmul}, 1 thread: {base0:.2f} / {base1:.2f} GFLOP/s "
          "(before / after)")
    print(f"FLOP count check on one update: analytic (useful tokens, causal) {analytic / 1e9:.3f} GFLOP, "
          f"torch flop_counter (padded, full attention) {counted / 1e9:.3f} GFLOP (ratio {analytic / counted:.3f})\n")
    head = f"{'arm':<8} {'variant':>9} {'used':>5} {'s/step':>7} {f's/{args.steps}-step arm':>15} {'rollout tok/s':>14} " \
           f"{'model GFLOP/s':>14} {'x matmul':>9} {'final acc':>10}"
    print(head)
    print("-" * len(head))
    for arm, lab, sps, wall, tps, gf, acc, used in rows:
        print(f"{arm:<8} {lab:>9} {used:>5} {sps:>7.3f} {wall:>15.1f} {tps:>14.0f} {gf:>14.2f} {gf / base:>9.3f} "
              f"{acc:>10.3f}")
    if len(variants) > 1:
        names = [label(v) for v in variants]
        print(f"\nvariants, wall seconds per {args.steps}-step arm (and of it generating), ratio of each against "
              f"{names[0]} in the same round; 'same values': every logged value but timings agrees")
        head = f"{'arm':<8} {'round':>5} " + " ".join(f"{n + ' s':>9} {'gen ' + n:>9}" for n in names) + \
            " " + " ".join(f"{n + '/' + names[0]:>9}" for n in names[1:]) + f" {'same values':>12}"
        print(head)
        print("-" * len(head))
        ratios: dict[tuple[str, str], list[float]] = {}
        for arm in args.arms.split(","):
            for rnd in range(1, max(1, args.rounds) + 1):
                got = {v: r for a, v, n, *r in runs if a == arm and n == rnd}
                rs = [got[v][1] / got[variants[0]][1] for v in variants[1:]]
                for v, x in zip(variants[1:], rs):
                    ratios.setdefault((arm, label(v)), []).append(x)
                same = len({r[6] for r in got.values()}) == 1
                print(f"{arm:<8} {rnd:>5} " + " ".join(f"{got[v][1]:>9.1f} {got[v][5]:>9.1f}" for v in variants) +
                      " " + " ".join(f"{x:>9.3f}" for x in rs) + f" {'yes' if same else 'NO':>12}")
        for (arm, lab), rs in ratios.items():
            print(f"{arm}: {lab} / {names[0]} wall, mean over {len(rs)} round(s): {np.mean(rs):.3f}")


def run_one(arm: str, args: argparse.Namespace, sets: dict, ckpt, threads: int = 1) -> tuple:
    """One arm from its warm start on ``threads`` threads: (s/step, wall s, rollout tok/s, GFLOP/s,
    final acc, gen s, values hash, threads used). The wall time includes the thread probe."""
    import hashlib
    import json

    spec = ArmSpec.from_dict({"arm": arm, "steps": args.steps, "model": args.model, "seed": args.seed, **sets})
    t0 = time.perf_counter()
    tr = Trainer(spec, ckpt, threads=threads)
    cnt = Counter(tr)
    logged = [tr.evaluate(0)]
    per_step, acc = [], None
    for st in range(1, spec.steps + 1):
        m = tr.step(st)
        logged.append(m)
        per_step.append(m["timing_s/step"])
        acc = m.get("val-core/phantom_lab/acc/mean@1", acc)
    wall = time.perf_counter() - t0
    values = [{k: v for k, v in m.items() if not k.startswith("timing_s/")} for m in logged]
    digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()
    return (float(np.mean(per_step)), wall, cnt.gen_tokens / cnt.gen_seconds, cnt.flops / wall / 1e9, acc,
            cnt.gen_seconds, digest, tr.threads)


if __name__ == "__main__":
    main()
