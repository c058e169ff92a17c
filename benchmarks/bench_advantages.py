"""Benchmark: phantom's gated advantages against verl 0.9.1's GRPO estimators.

For each batch shape, times (median of --repeats runs after a warm-up):
  * verl's loop estimator (`compute_grpo_outcome_advantage`),
  * verl's vectorized estimator (`compute_grpo_vectorized_outcome_advantage`, the baseline),
  * `phantom.advantages.group_advantages` with each gate, including what verl does around it:
    summing token-level rewards, decoding the outcome from the reward sign, broadcasting to tokens
    with the response mask,
  * the memory-bandwidth floor: a plain copy of the estimator's inputs (token-level rewards and
    response mask), the bytes any estimator must at least read once.
Inputs are shaped like verl's: float32 token-level rewards with the score on the last response
token, an int64 response mask, uuid-string group ids.

usage: python benchmarks/bench_advantages.py [--repeats 9] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import numpy as np
import torch

from phantom.advantages import broadcast_to_tokens, group_advantages

SHAPES = [(32, 5, 512), (512, 16, 1024)]  # (prompts, rollouts per prompt, response tokens)


def make_batch(prompts: int, rollouts: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = prompts * rollouts
    uids = [str(uuid.UUID(int=int(rng.integers(0, 2**63)))) for _ in range(prompts)]
    index = np.array([u for u in uids for _ in range(rollouts)], dtype=object)
    lengths = rng.integers(1, width + 1, n)
    outcome = (rng.random(n) < 0.4).astype(np.float32)
    score = outcome - 0.3 * np.minimum(lengths * 4 / 512, 1.0)
    mask = (torch.arange(width)[None, :] < torch.from_numpy(lengths)[:, None]).to(torch.int64)
    tlr = torch.empty(n, width, dtype=torch.float32).fill_(0.0)  # touch every page: real memory traffic
    tlr[torch.arange(n), torch.from_numpy(lengths - 1)] = torch.from_numpy(score.astype(np.float32))
    return tlr, mask, index


def time_interleaved(cells: dict, repeats: int) -> dict[str, float]:
    """Median wall time per cell; cells run round-robin so load changes hit all of them alike."""
    for fn in cells.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in cells}
    for _ in range(repeats):
        for name, fn in cells.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def phantom_estimator(tlr: torch.Tensor, mask: torch.Tensor, index, gate: str) -> torch.Tensor:
    scores = tlr.sum(-1)
    outcomes = scores > 0 if gate == "outcome" else None  # exact for 0 <= lam < 1
    adv, _ = group_advantages(scores, index, outcomes=outcomes, gate=gate)
    return broadcast_to_tokens(adv, mask)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9, help="timed runs per cell (median reported); >= 7")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.repeats < 7:
        ap.error(f"--repeats={args.repeats} is too small; allowed: >= 7")
    if args.threads:
        torch.set_num_threads(args.threads)
    from verl.trainer.ppo.core_algos import (
        compute_grpo_outcome_advantage,
        compute_grpo_vectorized_outcome_advantage,
    )

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}")
    header = f"{'batch':>22} {'method':>28} {'ms':>10} {'x verl-vec':>11} {'x floor':>9}"
    print(header)
    print("-" * len(header))
    worst = {}
    for prompts, rollouts, width in SHAPES:
        tlr, mask, index = make_batch(prompts, rollouts, width)
        label = f"{prompts}x{rollouts} rows x {width} tok"
        cells = {
            "floor: copy inputs": lambda t=tlr, m=mask: (t.clone(), m.clone()),
            "verl loop": lambda t=tlr, m=mask, i=index: compute_grpo_outcome_advantage(t, m, i),
            "verl vectorized": lambda t=tlr, m=mask, i=index: compute_grpo_vectorized_outcome_advantage(t, m, i),
        }
        for gate in ("none", "score", "outcome"):
            cells[f"phantom gate={gate}"] = lambda g=gate, t=tlr, m=mask, i=index: phantom_estimator(t, m, i, g)
        # same numbers as verl before timing anything
        ref = compute_grpo_vectorized_outcome_advantage(tlr, mask, index)[0]
        assert torch.allclose(phantom_estimator(tlr, mask, index, "none"), ref, atol=1e-6)
        times = time_interleaved(cells, args.repeats)
        base, floor = times["verl vectorized"], times["floor: copy inputs"]
        for name, t in times.items():
            print(f"{label:>22} {name:>28} {t * 1e3:10.3f} {t / base:11.2f} {t / floor:9.2f}")
            if name.startswith("phantom"):
                worst[label] = max(worst.get(label, (0, 0)), (t / base, t / floor))
        print()
    large = f"{SHAPES[-1][0]}x{SHAPES[-1][1]} rows x {SHAPES[-1][2]} tok"
    ok_vec = all(v[0] <= 1.0 for v in worst.values())
    ok_floor = worst[large][1] <= 2.0
    print(f"target: every gate <= 1.0x verl vectorized: {'met' if ok_vec else 'NOT met'} "
          f"(worst {max(v[0] for v in worst.values()):.2f}x)")
    print(f"target: <= 2x the floor at the large size: {'met' if ok_floor else 'NOT met'} "
          f"(worst {worst[large][1]:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
