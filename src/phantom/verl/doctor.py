"""``phantom verl doctor``: everything a verl run needs, checked in seconds and printed as one table.

The launcher runs the same checks before every GPU run (:func:`preflight_gpu`), so a missing vLLM,
a CPU build of torch, a driver too old for CUDA 13 wheels, a data file not built yet or an offline
machine without the model in its cache fails before Ray starts, with the fix on the failing line.
It also prints the two decisions the GPU backend makes from the machine (:mod:`phantom.verl.gpu`):
the attention kernel and the memory row. Nothing here downloads anything; the Hub is only pinged
(HEAD, 5 s) when the model is neither local nor cached and ``HF_HUB_OFFLINE`` is not set.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["Check", "checks", "trl_has_value_head", "run_env", "table", "failed", "plugin_check", "preflight_gpu", "main", "VERL", "VLLM", "TORCH"]

VERL, VLLM, TORCH = "0.9.1", "0.24.0", "2.11.0"  # verl 0.9.1 and what its [vllm] extra pins
CPU_PRESETS = "cpu_tiny, cpu_lora_kl, cpu_lab"
GPU_EXTRA = "pip install -e '.[gpu]' in a Python 3.10-3.12 venv (verl[vllm]: torch 2.11.0 CUDA 13 wheels, vLLM 0.24.0)"
STATUS = ("OK", "INFO", "WARN", "FAIL", "SKIP")


@dataclass(frozen=True)
class Check:
    """One line of the table: ``status`` is OK, INFO, WARN, FAIL or SKIP; ``fix`` is set on WARN and FAIL."""

    name: str
    status: str
    found: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def trl_has_value_head() -> bool:
    """Whether ``trl`` imports and still has ``AutoModelForCausalLMWithValueHead`` (TRL 1.x removed it)."""
    import warnings

    if importlib.util.find_spec("trl") is None:
        return False
    with warnings.catch_warnings():  # TRL warns on any trl.experimental import
        warnings.simplefilter("ignore")
        try:
            from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            try:
                from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
            except ImportError:
                return False
    return True


def _trl(gpu: bool) -> Check | None:
    v = _version("trl")
    if v is None or trl_has_value_head():
        return None
    if not gpu:
        return Check("trl", "INFO", f"trl {v} has no AutoModelForCausalLMWithValueHead: the CPU backend narrows "
                     "verl's TRL check (phantom.verl.cpu.platform, patch 3)")
    return Check("trl", "FAIL", f"trl {v} is installed but has no AutoModelForCausalLMWithValueHead: verl 0.9.1's "
                 "actor init imports it whenever trl is importable (models/transformers/monkey_patch.py)",
                 "pip uninstall trl in the verl environment (keep TRL runs in their own venv), or trl==0.27.0 "
                 "(verl[fsdp]'s pin)")


def _gpu_needed(status: str, gpu: bool) -> str:
    return status if gpu else "SKIP"


PLUGIN_PROBE = """
import json, sys
import verl
from verl.trainer.ppo import core_algos
from verl.utils.device import get_device_name, get_nccl_backend
from verl.workers.rollout.replica import RolloutReplicaRegistry
names = sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith("phantom_grpo_"))
json.dump({"verl": verl.__version__, "estimators": names, "device": get_device_name(), "ccl": get_nccl_backend(),
           "rollouts": sorted(RolloutReplicaRegistry._registry)}, sys.stdout)
"""


def plugin_check(env: dict[str, str] | None = None, timeout: float = 300) -> tuple[Check, dict[str, Any] | None]:
    """In a fresh interpreter with ``env``: does ``import verl`` register the phantom estimators?

    verl swallows entry-point import errors (logged at DEBUG), so without this check a broken
    install would surface only as "unknown advantage estimator" deep inside a Ray actor.
    """
    try:
        proc = subprocess.run([sys.executable, "-c", PLUGIN_PROBE], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return Check("plugin", "FAIL", f"`import verl` took over {timeout:.0f} s", "check the install"), None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return Check("plugin", "FAIL", f"`import verl` failed: {tail[0][:200]}",
                     "pip install -e . into the interpreter that runs verl"), None
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if len(info["estimators"]) < 3:
        return Check("plugin", "FAIL", f"import verl registers {info['estimators'] or 'no phantom estimator'}",
                     "pip install -e . (the verl.plugins entry point) and leave VERL_USE_EXTERNAL_PLUGINS unset"), info
    return Check("plugin", "OK", f"import verl registers {', '.join(info['estimators'])} (device {info['device']})"), info


def _reward() -> Check:
    try:
        from verl.utils.import_utils import load_extern_object

        fn = load_extern_object("pkg://phantom.verl.reward", "compute_score")  # verl's own loader
        right = fn("openai/gsm8k", "6 * 7 = 42\n#### 42", "42", lam=0.3)
        wrong = fn("openai/gsm8k", "#### 41", "42", lam=0.3)
    except Exception as exc:  # the reward must load and run the way verl's RewardLoopWorker calls it
        return Check("reward", "FAIL", f"pkg://phantom.verl.reward: {type(exc).__name__}: {exc}",
                     "pip install -e . (phantom must import where verl runs)")
    ok = right.get("acc") == 1 and wrong.get("acc") == 0 and wrong["score"] < 0 < right["score"]
    return Check("reward", "OK" if ok else "FAIL",
                 f"pkg://phantom.verl.reward:compute_score -> score {right['score']:.3f} / {wrong['score']:.3f}, "
                 f"acc {right['acc']} / {wrong['acc']}", "" if ok else "the reward's acc must be the binary outcome")


def _hub(model: str) -> Check:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return Check("hub", "FAIL", f"HF_HUB_OFFLINE is set and {model} is not in the Hugging Face cache",
                     f"on a machine with network: huggingface-cli download {model}; or --set model=<local folder>")
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/models/{model}", method="HEAD"), timeout=5)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Check("hub", "FAIL", f"{endpoint} not reachable ({type(exc).__name__}); {model} is not cached",
                     f"download it where there is network (huggingface-cli download {model}), copy the HF cache, "
                     "or set HF_ENDPOINT to a mirror")
    return Check("hub", "OK", f"{endpoint} reachable: verl downloads {model} at start")


def _inputs(spec: Any, root: Path) -> list[Check]:
    from phantom.verl.inputs import inputs_status

    out = []
    for item in inputs_status(spec, root):
        label = {"model": "model", "train_files": "train data", "val_files": "held-out data"}[item["input"]]
        if item["state"] in ("ok", "cached"):
            out.append(Check(label, "OK", f"{item['path']}" + (" (in the HF cache)" if item["state"] == "cached" else "")))
        elif item["state"] == "hub":
            out.append(Check(label, "INFO", f"{item['path']}: Hub id, not in the HF cache"))
            out.append(_hub(item["path"]))
        else:
            built = item["fix"].startswith("built on first run")
            out.append(Check(label, "INFO" if built else "FAIL", f"{item['path']} does not exist yet",
                             item["fix"] if not built else ""))
    return out


def _disk(root: Path, gpu: bool) -> Check:
    cache = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    probe = next((p for p in (root, cache) if p.exists()), Path.cwd())
    free = shutil.disk_usage(probe).free / 2**30
    need_fail, need_warn = (10, 30) if gpu else (1, 3)
    status = "FAIL" if free < need_fail else "WARN" if free < need_warn else "OK"
    return Check("disk", status, f"{free:.0f} GiB free at {probe}",
                 "" if status == "OK" else f"free space: a GPU run wants >= {need_warn} GiB (model, vLLM and HF caches)"
                 if gpu else f"free space: >= {need_warn} GiB")


def _gpu_lines(spec: Any, hw: Any, gpu: bool, plan: Any = None, plan_error: str | None = None) -> list[Check]:
    from phantom.verl import gpu as g

    tv = _version("torch")
    out = []
    if not hw.gpus:
        why = "torch is a CPU build" if hw.torch_cuda is None else f"torch built for CUDA {hw.torch_cuda} sees no GPU"
        out.append(Check("CUDA", _gpu_needed("FAIL", gpu), f"no CUDA: {why}, no nvidia-smi" if not hw.driver
                         else f"no CUDA: {why} (nvidia-smi reports driver {hw.driver})",
                         f"this machine cannot run backend=gpu; on a GPU machine: {GPU_EXTRA}. Here: a CPU preset "
                         f"({CPU_PRESETS})" if gpu else ""))
    else:
        names = ", ".join(f"{n} ({m:.0f} GiB)" for n, m in hw.gpus)
        short = len(hw.gpus) < spec.n_gpus_per_node
        out.append(Check("CUDA", "FAIL" if short else "OK", f"torch {tv} CUDA {hw.torch_cuda}; {len(hw.gpus)} GPU(s): {names}",
                         f"n_gpus_per_node={spec.n_gpus_per_node} but {len(hw.gpus)} visible: --set n_gpus_per_node="
                         f"{len(hw.gpus)}" if short else ""))
    if gpu and tv and tv.split("+")[0] != TORCH:
        out.append(Check("torch", "WARN", f"torch {tv}", f"verl[vllm] 0.9.1 pins torch {TORCH}: {GPU_EXTRA}"))
    if hw.driver:
        major = int(hw.driver.split(".")[0]) if hw.driver.split(".")[0].isdigit() else 0
        needs = 580 if (hw.torch_cuda or "").startswith("13") else 0
        bad = major < needs
        out.append(Check("driver", "FAIL" if bad else "OK", f"NVIDIA driver {hw.driver}" +
                         (f" (torch built for CUDA {hw.torch_cuda})" if hw.torch_cuda else ""),
                         "CUDA 13 wheels need driver >= 580: upgrade the driver" if bad else ""))
    for dist, want, label in (("vllm", VLLM, "vLLM"), ("ray", None, "Ray")):
        v = _version(dist)
        if v is None:
            out.append(Check(label, _gpu_needed("FAIL", gpu) if dist == "vllm" else "FAIL", "not installed",
                             GPU_EXTRA if (gpu or dist == "ray") else ""))
        else:
            warn = want and v != want
            out.append(Check(label, "WARN" if warn else "OK", f"{dist} {v}",
                             f"verl[vllm] 0.9.1 pins {dist} {want}" if warn else ""))
    fa = "not installed" if hw.flash_attn is None else f"flash-attn {hw.flash_attn}"
    out.append(Check("flash-attn", _gpu_needed("INFO", gpu), fa + ("" if hw.flash_attn is None else " imports"),
                     ""))
    if gpu and plan is not None:
        out.append(Check("attention", "INFO", plan.why[0].split(": ", 1)[1]))
        out.append(Check("memory", "INFO", f"{plan.why[1]}: micro-batch {plan.micro}, log-prob micro-batch "
                         f"{plan.logprob_micro}, gpu_memory_utilization {plan.gpu_memory_utilization}"))
        params = g.model_params(spec.model)
        if hw.gpus and params and params > g.BIG_MODEL_PARAMS and hw.min_memory < 30:
            out.append(Check("memory", "FAIL", f"{params / 1e9:.1f}B parameters on {hw.min_memory:.0f} GiB",
                             "a 7B-class model needs a 48 GB card or more with these settings"))
    elif gpu:
        out.append(Check("attention", "FAIL", plan_error or "no plan", "--set attention=auto"))
    return out


def checks(spec: Any, *, hw: Any = None, plan: Any = None, root: str | os.PathLike[str] | None = None,
           env: dict[str, str] | None = None, plugin: bool = True) -> list[Check]:
    """All checks for ``spec`` (a :class:`phantom.verl.spec.VerlSpec`, possibly with inputs not built yet).

    ``plan``: the launch's :class:`phantom.verl.plan.Plan` (its machine is the one checked); without
    one the machine (``hw``, else a probe) is planned for here, once.
    """
    from phantom.verl import gpu as g
    from phantom.verl.plan import make_plan

    gpu = spec.backend == "gpu"
    plan_error = None
    if plan is not None and plan.hw is not None:
        hw = plan.hw
    hw = hw if hw is not None else g.probe()
    if plan is None and gpu:
        try:
            plan = make_plan(spec, hw)
        except ValueError as exc:
            plan_error = str(exc)
    root = Path(root or os.getcwd())
    py = sys.version_info[:2]
    out = [Check("python", "OK" if (3, 10) <= py < (3, 13) else "FAIL", f"Python {py[0]}.{py[1]} ({sys.executable})",
                 "" if (3, 10) <= py < (3, 13) else "verl 0.9.1 needs Python >=3.10,<3.13: make a 3.10-3.12 venv")]
    v = _version("verl")
    out.append(Check("verl", "OK" if v == VERL else "FAIL", f"verl {v}" if v else "not installed",
                     "" if v == VERL else f"pip install -e '.[{'gpu' if gpu else 'verl'}]' (pins verl=={VERL})"))
    mods = ["cachetools", "fastapi", "uvicorn", "orjson"] + (["transfer_queue"] if spec.trainer == "v1" else [])
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    out.append(Check("verl extras", "FAIL" if missing else "OK", f"missing: {', '.join(missing)}" if missing else
                     f"{', '.join(mods)} import", f"pip install -e '.[{'gpu' if gpu else 'verl'}]'" if missing else ""))
    out += _gpu_lines(spec, hw, gpu, plan, plan_error)
    trl = _trl(gpu)
    if trl is not None:
        out.append(trl)
    if plugin and v:
        out.append(plugin_check(env)[0])
    if v:
        out.append(_reward())
    out += _inputs(spec, root)
    out.append(_disk(root, gpu))
    return out


def failed(items: list[Check]) -> list[Check]:
    return [c for c in items if c.status == "FAIL"]


def table(items: list[Check]) -> str:
    """One aligned table: check | status | found | fix."""
    w1 = max(len(c.name) for c in items)
    lines = [f"{'check':<{w1}}  status  found" + " " * 2, "-" * (w1 + 8 + 60)]
    for c in items:
        lines.append(f"{c.name:<{w1}}  {c.status:<6}  {c.found}" + (f"\n{'':<{w1}}  {'':<6}  -> fix: {c.fix}" if c.fix else ""))
    bad = failed(items)
    lines.append(f"{len(bad)} check(s) failed" if bad else "all checks passed")
    return "\n".join(lines)


def preflight_gpu(spec: Any, env: dict[str, str], plan: Any, root: str | os.PathLike[str] | None = None,
                  echo: bool = True, plugin: bool = False) -> list[Check]:
    """The doctor before a GPU run, on the launch's plan; raises ``RuntimeError`` with the table if anything fails.

    ``plugin=False``: the launcher's own preflight has just run the fresh-interpreter probe.
    """
    items = checks(spec, plan=plan, root=root, env=env, plugin=plugin)
    text = table(items)
    if failed(items):
        raise RuntimeError(f"phantom verl doctor: the GPU run cannot start\n{text}")
    if echo:
        print(text, file=sys.stderr)
    return items


def run_env(spec: Any, run: Path) -> dict[str, str]:
    """Environment of the verl process (a local Ray cluster and all its actors inherit it)."""
    env = dict(os.environ)
    env.update({
        "VERL_FILE_LOGGER_PATH": str(run / "metrics.jsonl"), "PHANTOM_GATE_LOG": str(run / "gate.jsonl"),
        "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1", "WANDB_MODE": "disabled", "RAY_DEDUP_LOGS": "0",
        "TOKENIZERS_PARALLELISM": "false",
    })
    if env.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower() not in ("auto", ""):
        names = {n.strip() for n in env["VERL_USE_EXTERNAL_PLUGINS"].split(",")}
        if "phantom" not in names:  # an explicit list without us would silently drop the estimators
            env["VERL_USE_EXTERNAL_PLUGINS"] = ",".join(sorted(names - {"none"} | {"phantom"}))
    if spec.backend == "cpu":
        from phantom.verl.cpu import PLUGIN_MODULE

        env["PHANTOM_ROLLOUT_LOG"] = str(run / "rollout.jsonl")
        env["PHANTOM_SYNC_LOG"] = str(run / "sync.jsonl")

        mods = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        env["VERL_USE_EXTERNAL_MODULES"] = ",".join([*mods, PLUGIN_MODULE] if PLUGIN_MODULE not in mods else mods)
        env["VERL_PLATFORM"] = "cpu"
        env["OMP_NUM_THREADS"] = "1"
        if env.get("CUDA_VISIBLE_DEVICES") == "":
            del env["CUDA_VISIBLE_DEVICES"]  # Ray refuses logical GPUs when it is set but empty
    return env


def main(argv: list[str] | None = None) -> int:
    from phantom.cli import parse_sets
    from phantom.verl.spec import make_spec

    p = argparse.ArgumentParser(prog="phantom verl doctor", description="check this machine for a verl run")
    p.add_argument("--preset", default="gpu_smoke", help="the run to check for (default: gpu_smoke)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="spec field (repeatable)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--no-plugin", action="store_true", help="skip the fresh-interpreter `import verl` check")
    args = p.parse_args(argv)
    try:
        spec = make_spec(args.preset, check_inputs=False, **parse_sets(args.set))
    except (ValueError, FileNotFoundError) as exc:
        print(f"phantom verl doctor: {exc}", file=sys.stderr)
        return 2
    env = run_env(spec, Path(os.getcwd()) / "runs" / "_doctor")
    items = checks(spec, env=env, plugin=not args.no_plugin)
    if args.json:
        print(json.dumps([asdict(c) for c in items], indent=1))
    else:
        print(f"phantom verl doctor: preset {args.preset} (backend={spec.backend}, trainer={spec.trainer}, "
              f"model {spec.model})")
        print(table(items))
    return 1 if failed(items) else 0
