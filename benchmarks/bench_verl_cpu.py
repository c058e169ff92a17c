"""Benchmark: verl 0.9.1's real trainer on CPU, batched vs one-request-at-a-time ``hf`` rollout server.

Runs the same GRPO spec twice through ``phantom.verl.launch`` (32 prompts x 5 rollouts per step, the
paper's shape, with the CPU lab's SFT model and task), once with the batching server
(``rollout.max_num_seqs=1024``) and once forced to one request at a time (``max_num_seqs=1``, the
baseline). Reported per run:

* Ray start-up: ``ray.init`` of a local cluster with the run's resources, then ``ray.shutdown``
  (measured in this process, before the runs);
* start-up to first step: from launching verl to the advantages of step 1 (Ray, ~30 actors, model
  and FSDP init, the first generation);
* seconds per training step: verl's ``timing_s/step``, median over steps 2.. (step 1 warms up);
* generation seconds per step: time the rollout server spent generating (``rollout.jsonl``),
  and verl's ``timing_s/gen`` (in the v1 trainer it includes the replay buffer's 2 s poll);
* tokens generated per second of generation.

Ratios are baseline / batched (higher = batched is faster). The machine's load (``os.getloadavg``)
is printed before and after: on a shared 2-core box the absolute numbers move with it.

usage: python benchmarks/bench_verl_cpu.py [--model lab|lab:quick|tiny] [--steps 3] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from phantom.runs import read_metrics
from phantom.verl.launch import launch
from phantom.verl.spec import make_spec


def ray_startup_seconds(repeats: int = 2) -> float:
    import ray

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, logging_level="ERROR")
        ray.get(ray.remote(lambda: 1).remote())  # the cluster actually runs a task
        times.append(time.perf_counter() - t0)
        ray.shutdown()
    return statistics.median(times)


def run_once(model: str, batching: bool, steps: int, runs_dir: Path) -> dict:
    spec = make_spec("cpu_lab", model=model, steps=steps, val_before_train=False, val_freq=-1,
                     rollout_batching=batching, train_batch_size=32, rollout_n=5)
    name = f"bench-{'batched' if batching else 'unbatched'}"
    shutil.rmtree(runs_dir / name, ignore_errors=True)
    t0 = time.time()
    run = launch(spec, name, runs_dir=runs_dir, progress=True)
    wall = time.time() - t0
    df = read_metrics(run.path)
    lines = [json.loads(x) for x in (run.path / "rollout.jsonl").read_text().splitlines()]
    gen_s = sum(x["seconds"] for x in lines)
    tokens = sum(x["tokens"] for x in lines)
    started = run.manifest()["started"]
    first_adv = json.loads((run.path / "gate.jsonl").read_text().splitlines()[0])["time"]
    steady = df["timing_s/step"].dropna().iloc[1:] if len(df) > 1 else df["timing_s/step"].dropna()
    return {
        "wall_s": wall,
        "to_first_step_s": first_adv - started,
        "step_s": float(statistics.median(steady)),
        "gen_s_per_step": gen_s / steps,
        "verl_gen_s": float(df["timing_s/gen"].dropna().median()),
        "tokens_per_gen_s": tokens / gen_s if gen_s else float("nan"),
        "requests": sum(x["requests"] for x in lines),
        "batches": len(lines),
        "mean_response_tokens": float(df["response_length/mean"].mean()),
        "run": str(run.path),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lab", help="lab (the CPU lab's SFT model), lab:quick, or tiny")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--runs-dir", default=None)
    args = parser.parse_args(argv)
    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="bench_verl_cpu_"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs")
    ray_s = ray_startup_seconds()
    res = {mode: run_once(args.model, mode == "batched", args.steps, runs_dir) for mode in ("batched", "unbatched")}
    load1 = os.getloadavg()
    b, u = res["batched"], res["unbatched"]
    print(f"\nverl 0.9.1 on CPU, model={args.model}, 32 prompts x 5 rollouts, {args.steps} steps per run")
    print(f"Ray start-up (ray.init + one task, local cluster 8 CPUs / 1 logical GPU): {ray_s:.2f} s\n")
    rows = [("start-up to first step (s)", "to_first_step_s"), ("seconds per training step", "step_s"),
            ("generation s per step (server)", "gen_s_per_step"), ("verl timing_s/gen (s)", "verl_gen_s"),
            ("tokens per generation second", "tokens_per_gen_s"), ("server batches per run", "batches"),
            ("mean response length (tokens)", "mean_response_tokens"), ("whole run wall (s)", "wall_s")]
    print(f"| {'metric':<32} | {'unbatched (baseline)':>20} | {'batched':>10} | {'baseline / batched':>18} |")
    print(f"|{'-' * 34}|{'-' * 22}|{'-' * 12}|{'-' * 20}|")
    for label, key in rows:
        ratio = u[key] / b[key] if b[key] else float("nan")
        if key == "tokens_per_gen_s":
            ratio = b[key] / u[key]  # throughput: batched / baseline
        print(f"| {label:<32} | {u[key]:>20.2f} | {b[key]:>10.2f} | {ratio:>17.2f}x |")
    speedup = u["gen_s_per_step"] / b["gen_s_per_step"]
    print(f"\nbatched generation is {speedup:.1f}x faster than one request at a time "
          f"(target >= 4x: {'met' if speedup >= 4 else 'NOT met'})")
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; runs kept in {runs_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
