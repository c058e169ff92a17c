"""Benchmark: one 40-step arm on verl 0.9.1's real trainer (CPU backend) beside the lab loop on the same cell.

The cell is the lab's book cell: the book's warm start (``lab_graded``), no filter, GRPO, 32 prompts x
5 rollouts, two updates per step, 40 steps, greedy validation on 256 held-out problems every 5 steps
(``cpu_lab`` on verl, ``paper.yaml``'s base in the lab). Both run in this process's session, one after
the other, so the ratio verl / lab is measured under the same load (printed before and after).

Reported for the verl arm (the profile behind ``benchmarks/results_verl.md``):

* wall seconds of the whole arm, from ``launch`` to the folder marked done, with a Ray head of its own
  (``--own-ray``: what one ``phantom verl run`` costs) or joining one started before (a sweep's case;
  the head's start is timed separately);
* start-up: launch -> the first training step's advantages (Ray, ~30 actors, model and FSDP init, the
  step-0 validation); validation: verl's ``timing_s/testing`` summed;
* per training step (mean over steps 2..): verl's ``timing_s/{gen,old_log_prob,adv,update_actor,update_weights,step}``
  and the rollout server's own generation seconds (``rollout.jsonl``): ``timing_s/gen`` minus those is verl's
  agent loop, transfer queue and replay-buffer polling around the server;
* CPU seconds by process kind (psutil, sampled every second): where the two cores went.

``--override KEY=VALUE`` (repeatable) adds one of verl's Hydra overrides to the arm, to measure a setting
(``results_verl.md`` measures ``algorithm.rollout_correction.bypass_mode=True`` this way).

usage: python benchmarks/bench_verl_cpu.py [--steps 40] [--own-ray] [--runs-dir DIR] [--skip-lab] [--override K=V]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

KINDS = [("ray::WorkerDict", "FSDP actor (WorkerDict)"), ("HFServer", "rollout server (HFServer)"),
         ("ray::TaskRunner", "TaskRunner"), ("AgentLoopWorker", "agent loop worker"),
         ("RewardLoopWorker", "reward loop worker"), ("gcs_server", "Ray GCS"), ("raylet", "Ray raylet"),
         ("dashboard", "Ray dashboard / agent"), ("runtime_env", "Ray runtime-env agent"),
         ("log_monitor", "Ray log monitor"), ("monitor.py", "Ray autoscaler monitor"),
         ("verl.trainer.main_ppo", "driver (main_ppo)")]


def _kind(cmd: str) -> str:
    for pat, k in KINDS:
        if pat in cmd:
            return k
    m = re.search(r"ray::(\w+)", cmd)
    return f"ray::{m.group(1)}" if m else "other"


class CpuSampler(threading.Thread):
    """CPU seconds used while sampling by every process under ``roots`` (and anything naming ``mark`` with
    its children), by kind, until stopped."""

    def __init__(self, roots: list[int], mark: str | None = None):
        super().__init__(daemon=True)
        self.roots, self.mark, self.seen, self.done = roots, mark, {}, threading.Event()
        self.base: dict[int, float] = {}  # CPU seconds a process had used before the sampler started
        self.t0 = time.time()

    def run(self) -> None:
        import psutil

        while not self.done.is_set():
            procs = []
            for r in self.roots:
                with contextlib.suppress(psutil.Error):
                    procs += psutil.Process(r).children(recursive=True)
            if self.mark:  # the head's processes and everything its raylet started (the run's workers)
                for p in psutil.process_iter(["cmdline"]):
                    if self.mark in " ".join(p.info["cmdline"] or []):
                        with contextlib.suppress(psutil.Error):
                            procs += [p, *p.children(recursive=True)]
            for p in procs:
                try:
                    c = p.cpu_times()
                    cmd = " ".join(p.cmdline())
                    kind = self.seen.get(p.pid, ("other",))[0]
                    # a worker starts as default_worker.py, idles as ray::IDLE, then takes its actor's name
                    if cmd.startswith("ray::") and not cmd.startswith("ray::IDLE") or kind == "other":
                        kind = _kind(cmd) if "default_worker.py" not in cmd else "Ray worker (starting)"
                    if p.pid not in self.base:
                        self.base[p.pid] = c.user + c.system if p.create_time() < self.t0 else 0.0
                    self.seen[p.pid] = (kind, c.user + c.system - self.base[p.pid])
                except psutil.Error:
                    pass
            self.done.wait(1.0)

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for kind, cpu in self.seen.values():
            out[kind] = out.get(kind, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def verl_arm(steps: int, runs_dir: Path, own_ray: bool, overrides: tuple[str, ...] = ()) -> dict:
    from phantom.runs import read_metrics
    from phantom.verl.cluster import RayHead
    from phantom.verl.doctor import run_env
    from phantom.verl.launch import launch
    from phantom.verl.spec import make_spec

    spec = make_spec("cpu_lab", arm="none", steps=steps, seed=0, extra_overrides=overrides)
    head, head_s = None, 0.0
    sampler = CpuSampler([os.getpid()])
    sampler.start()
    try:
        if own_ray:
            for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
                os.environ.pop(k, None)
        elif os.environ.get("RAY_ADDRESS"):  # a head started before (a sweep's): joined as is, its start not timed
            head_s = float("nan")
            if os.environ.get("RAY_AUTH_TOKEN_PATH"):
                sampler.mark = str(Path(os.environ["RAY_AUTH_TOKEN_PATH"]).parent)
        else:
            t0 = time.time()
            head = RayHead(run_env(spec, runs_dir))
            head.start()
            os.environ.update(head.run_env())
            head_s = time.time() - t0
            sampler.mark = str(head.temp_dir)
        t0 = time.time()
        run = launch(spec, f"bench-verl-{'own' if own_ray else 'shared'}-ray", runs_dir=runs_dir, progress=True)
        wall = time.time() - t0
    finally:
        sampler.done.set()
        sampler.join()
        if head is not None:
            head.stop()
            for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
                os.environ.pop(k, None)
    df = read_metrics(run.path)
    started = run.manifest()["started"]
    first_adv = json.loads((run.path / "gate.jsonl").read_text().splitlines()[0])["time"]
    gen_server = {}
    for line in (run.path / "rollout.jsonl").read_text().splitlines():
        rec = json.loads(line)
        gen_server[rec["step"]] = gen_server.get(rec["step"], 0.0) + rec["seconds"]
    train = df.loc[2:steps] if steps > 2 else df.loc[1:steps]
    phase = {k: float(train[f"timing_s/{k}"].mean()) for k in ("gen", "old_log_prob", "adv", "update_actor",
                                                                 "update_weights", "step") if f"timing_s/{k}" in train}
    served = [gen_server.get(s, 0.0) for s in train.index]
    return {"wall_s": wall, "ray_head_s": head_s, "to_first_step_s": first_adv - started,
            "testing_s": float(df["timing_s/testing"].sum()) if "timing_s/testing" in df else float("nan"),
            "phase_s": phase, "server_gen_s": statistics.mean(served) if served else float("nan"),
            "steps_s": float(df.loc[1:steps, "timing_s/step"].sum()), "cpu_s": sampler.by_kind(),
            "val": df.filter(like="val-core").dropna().iloc[:, 0].round(3).to_dict(), "run": str(run.path)}


def lab_arm(steps: int, runs_dir: Path) -> dict:
    from phantom.lab.rl import run_arm
    from phantom.lab.spec import ArmSpec
    from phantom.runs import read_metrics

    os.environ.setdefault("PHANTOM_EVAL0_CACHE", "0")  # the lab evaluates step 0 itself, as verl does
    spec = ArmSpec(arm="none", model="lab_graded", lr=2e-3, steps=steps, seed=0)  # paper.yaml's base, the book cell
    t0, c0 = time.time(), time.process_time()
    run = run_arm(spec, name="bench-lab", root=runs_dir, progress=True, threads=1)
    wall, cpu = time.time() - t0, time.process_time() - c0
    df = read_metrics(run.path)
    return {"wall_s": wall, "cpu_s": cpu, "val": df.filter(like="val-core").dropna().iloc[:, 0].round(3).to_dict()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--own-ray", action="store_true", help="the verl run starts its own Ray (no shared head)")
    ap.add_argument("--runs-dir", default=None)
    ap.add_argument("--skip-lab", action="store_true", help="only the verl arm (no ratio)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a verl Hydra override added to the arm's (repeatable): to measure one of verl's settings")
    a = ap.parse_args(argv)
    runs_dir = Path(a.runs_dir or tempfile.mkdtemp(prefix="bench_verl_cpu_"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs", flush=True)
    v = verl_arm(a.steps, runs_dir, a.own_ray, tuple(a.override))
    load1 = os.getloadavg()
    lab = None if a.skip_lab else lab_arm(a.steps, runs_dir)
    load2 = os.getloadavg()
    print(f"\nverl 0.9.1 on CPU (cpu_lab, cell a, seed 0), {a.steps} steps, "
          f"Ray: {'its own' if a.own_ray else 'a shared head'}")
    print(f"| {'quantity':<46} | {'seconds':>9} |")
    print(f"|{'-' * 48}|{'-' * 11}|")
    rows = [("Ray head start (shared head, once per sweep)", v["ray_head_s"]),
            ("launch -> first step's advantages", v["to_first_step_s"]),
            ("validation (timing_s/testing, summed)", v["testing_s"]),
            ("training steps (timing_s/step, summed)", v["steps_s"]),
            ("whole arm (launch -> done)", v["wall_s"])]
    rows += [(f"per step: timing_s/{k}", s) for k, s in v["phase_s"].items()]
    rows.append(("per step: rollout server generating", v["server_gen_s"]))
    rows.append(("per step: gen minus the server's seconds", v["phase_s"].get("gen", float("nan")) - v["server_gen_s"]))
    for label, s in rows:
        print(f"| {label:<46} | {s:>9.2f} |")
    print("\nCPU seconds by process kind (verl arm):")
    for k, s in v["cpu_s"].items():
        print(f"  {k:<32} {s:8.1f}")
    from phantom.lab.threads import available_cpus

    cores = available_cpus()
    verl_cpu = sum(v["cpu_s"].values())
    print(f"  {'all':<32} {verl_cpu:8.1f}: at least {verl_cpu / cores:.1f} s of wall on {cores} cores for this work, "
          f"{v['wall_s'] / (verl_cpu / cores):.2f}x that measured")
    if a.override:
        print(f"overrides added: {' '.join(a.override)}")
    print(f"\nverl held-out accuracy: {v['val']}")
    if lab is not None:
        print(f"lab loop, same cell: {lab['wall_s']:.1f} s; held-out accuracy {lab['val']}")
        print(f"\nverl / lab wall time: {v['wall_s'] / lab['wall_s']:.2f}x (verl {v['wall_s']:.1f} s, lab {lab['wall_s']:.1f} s)")
        print(f"verl / lab CPU time: {verl_cpu / lab['cpu_s']:.2f}x (verl {verl_cpu:.1f} CPU-s in every process of the "
              f"run, lab {lab['cpu_s']:.1f} CPU-s in one): the figure that moves least with the machine's load")
    print(f"load average after verl: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; after lab: "
          f"{load2[0]:.2f} {load2[1]:.2f} {load2[2]:.2f}; runs kept in {runs_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
