"""``phantom verl smoke``: the first run on a new machine, all three arms, and a table of checks.

Each arm is a normal run folder (``phantom.verl.launch.launch``: the doctor's table first on a GPU).
:func:`run_checks` then reads what the run logged and says whether the paper's structure worked:

* **finished**: status ``done`` and every training step logged, validation at step 0;
* **reference = adapters off** (KL loss with LoRA): verl computes the reference inside the actor
  with the adapters disabled. LoRA's B matrices start at zero, so at step 1 the policy *is* the
  reference and ``actor/kl_loss`` is 0; after an update it must be > 0. A KL that stays 0 means the
  reference saw the adapters (or nothing was trained);
* **rollout = actor**: ``training/rollout_probs_diff_mean`` at the last step, the rollout engine's
  log-probs against the actor's recomputation after the trained weights (or adapters) were synced;
* **adapter sync** (CPU backend): ``sync.jsonl`` shows adapters only (after the base once, with
  ``load_format=dummy``), never full weights.

The same checks run on the CPU (``--preset cpu_lora_kl``, in the test suite) and on a GPU
(``gpu_smoke``), so the GPU user's first command runs code that is tested here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["SmokeCheck", "run_checks", "summary", "main", "ARMS_ALL"]

ARMS_ALL = ("none", "score", "outcome")
#: rollout/actor mean probability difference above which the sync is called broken (bf16 vLLM vs FSDP ~1e-3).
PROBS_DIFF_MAX = 0.02


@dataclass(frozen=True)
class SmokeCheck:
    name: str
    ok: bool
    value: str


def _num(df: Any, step: int, key: str) -> float:
    if key not in df.columns or step not in df.index:
        return float("nan")
    v = df.loc[step, key]
    return float(v) if isinstance(v, (int, float)) and v == v else float("nan")


def run_checks(run: Any, spec: Any) -> list[SmokeCheck]:
    """The smoke checks of one finished (or failed) run folder."""
    from phantom.verl.launch import read_run_metrics

    m = run.manifest()
    df = read_run_metrics(run.path)
    steps = list(range(1, spec.steps + 1))
    out = [SmokeCheck("finished", m.get("status") == "done" and all(s in df.index for s in steps),
                      f"status {m.get('status')}, steps logged {sorted(int(s) for s in df.index)}")]
    val = [c for c in df.columns if c.startswith("val-core/") and c.endswith("/acc/mean@1")]
    out.append(SmokeCheck("validation at step 0", bool(val) and 0 in df.index and not math.isnan(_num(df, 0, val[0])),
                          f"{val[0]} = {_num(df, 0, val[0]):.3f}" if val else "no val-core/.../acc/mean@1 key"))
    if spec.kl_loss_coef > 0:
        kl = [_num(df, s, "actor/kl_loss") for s in steps]
        if spec.lora_rank > 0:
            # One update per step: step 1's loss is computed before any update, on zero-initialised
            # adapters, so it is exactly 0. With several mini-batches only the later ones move.
            one_update = (spec.mini_batch_size or spec.train_batch_size) >= spec.train_batch_size
            ok = (abs(kl[0]) < 1e-6 or not one_update) and kl[-1] > 0
            out.append(SmokeCheck("reference = adapters off", ok, f"actor/kl_loss {', '.join(f'{x:.3g}' for x in kl)} "
                                  + ("(0 at step 1: zero-initialised adapters; > 0 once they trained)" if one_update
                                     else "(> 0 once the adapters trained)")))
        else:
            out.append(SmokeCheck("KL loss", all(not math.isnan(x) for x in kl), f"actor/kl_loss {kl}"))
    diff = _num(df, spec.steps, "training/rollout_probs_diff_mean")
    out.append(SmokeCheck("rollout = actor", not math.isnan(diff) and diff < PROBS_DIFF_MAX,
                          f"training/rollout_probs_diff_mean at step {spec.steps} = {diff:.2e} (< {PROBS_DIFF_MAX})"))
    merge = next((o.split("=", 1)[1] for o in m.get("overrides", []) if o.startswith("actor_rollout_ref.model.lora.merge=")),
                 None)
    if spec.lora_rank > 0:
        sync = run.path / "sync.jsonl"
        if sync.is_file():
            modes = [json.loads(x)["mode"] for x in sync.read_text().splitlines() if x.strip()]
            want = merge == "False"
            # base once first only with rollout.load_format=dummy; otherwise the base is read from disk
            ok = set(modes[1:] if modes[:1] == ["base"] else modes) == {"adapter"} if want else set(modes) == {"full"}
            out.append(SmokeCheck("adapter sync" if want else "merged sync", ok and len(modes) >= spec.steps,
                                  f"sync.jsonl modes: {modes}"))
        else:
            out.append(SmokeCheck("adapter sync", merge != "True",
                                  f"lora.merge={merge or 'False (verl default)'}: adapters go to vLLM unmerged"))
    return out


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per arm, then every check that failed."""
    head = f"{'arm':<8} {'status':<7} {'val@0':>6} {'val@end':>7} {'zeroed':>7} {'kl@1':>8} {'kl@end':>8} " \
           f"{'probs diff':>10} {'wall s':>7}  checks"
    lines = [head, "-" * len(head)]
    bad = []
    for r in rows:
        n_ok = sum(c.ok for c in r["checks"])
        lines.append(f"{r['arm']:<8} {r['status']:<7} {r['val0']:>6.3f} {r['val_end']:>7.3f} {r['zeroed']:>7.2f} "
                     f"{r['kl1']:>8.2g} {r['kl_end']:>8.2g} {r['diff']:>10.2e} {r['wall']:>7.0f}  "
                     f"{n_ok}/{len(r['checks'])} passed")
        bad += [f"  {r['arm']}: {c.name}: {c.value}" for c in r["checks"] if not c.ok]
    lines.append("all checks passed" if not bad else "failed checks:\n" + "\n".join(bad))
    return "\n".join(lines)


def _row(arm: str, run: Any, spec: Any, wall: float) -> dict[str, Any]:
    from phantom.verl.launch import read_run_metrics

    df = read_run_metrics(run.path)
    val = next((c for c in df.columns if c.startswith("val-core/") and c.endswith("/acc/mean@1")), None)
    last_val = df[val].dropna() if val else None
    return {"arm": arm, "status": run.manifest().get("status"), "checks": run_checks(run, spec), "wall": wall,
            "val0": _num(df, 0, val) if val else float("nan"),
            "val_end": float(last_val.iloc[-1]) if last_val is not None and len(last_val) else float("nan"),
            "zeroed": float(df.loc[1:, "phantom/frac/zeroed"].mean()) if "phantom/frac/zeroed" in df else float("nan"),
            "kl1": _num(df, 1, "actor/kl_loss"), "kl_end": _num(df, spec.steps, "actor/kl_loss"),
            "diff": _num(df, spec.steps, "training/rollout_probs_diff_mean")}


def main(argv: list[str] | None = None) -> int:
    from phantom.cli import parse_sets
    from phantom.runs import spec_hash
    from phantom.verl.launch import launch
    from phantom.verl.spec import make_spec

    p = argparse.ArgumentParser(prog="phantom verl smoke", description="the first run: all arms, 2 steps, checks")
    p.add_argument("--preset", default="gpu_smoke")
    p.add_argument("--arms", default="none,score,outcome", help="comma list of arms (default: all three)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="spec field (repeatable)")
    p.add_argument("--runs-dir", default=None)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per arm before it is stopped")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS_ALL] or sorted({a for a in arms if arms.count(a) > 1})
    if not arms or bad:  # before any spec is made: a valid first arm must not build a model for nothing
        print(f"phantom verl smoke: --arms {args.arms!r}: " + (f"{', '.join(map(repr, bad))} unknown or repeated; "
              if bad else "no arm given; ") + f"allowed: a comma list of {', '.join(ARMS_ALL)}", file=sys.stderr)
        return 2
    rows = []
    try:
        sets = parse_sets(args.set)
        for arm in arms:  # every field of every arm checked, nothing built or written
            make_spec(args.preset, check_inputs=False, **{**sets, "arm": arm})
        specs = [(arm, make_spec(args.preset, **{**sets, "arm": arm})) for arm in arms]
    except (ValueError, FileNotFoundError) as exc:
        print(f"phantom verl smoke: {exc}", file=sys.stderr)
        return 2
    for arm, spec in specs:
        name = f"smoke-{args.preset}-{arm}-{spec_hash(spec.to_dict())[:6]}"
        start = time.time()
        try:
            run = launch(spec, name, runs_dir=args.runs_dir, timeout=args.timeout)
        except Exception as exc:  # report the arm, go on with the others: the table is the point
            print(f"phantom verl smoke: arm {arm}: {type(exc).__name__}: {str(exc)[-2000:]}", file=sys.stderr)
            from phantom.runs import RunDir, runs_root

            run = RunDir(runs_root(args.runs_dir) / name)
            if not run.manifest_path.is_file():
                return 1  # failed before the run started (the doctor's table says why)
        rows.append(_row(arm, run, spec, time.time() - start))
        print(f"{arm}: {run.path}", file=sys.stderr)
    print(summary(rows))
    return 0 if all(c.ok for r in rows for c in r["checks"]) else 1
