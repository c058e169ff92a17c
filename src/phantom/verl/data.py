"""verl parquet for the experiments: GSM8K, MATH (the paper's 500-item split) and the CPU lab's task.

``phantom data gsm8k|math|lab [--out DIR] ...`` writes ``<out>/train.parquet`` and ``<out>/test.parquet``
in the row schema verl's ``RLHFDataset`` reads::

    data_source, prompt=[{"role": "user", "content": ...}], ability,
    reward_model={"style": "rule", "ground_truth": ...}, extra_info={"split", "index", ...}

GSM8K and MATH come from the Hugging Face Hub through ``datasets`` (needs internet once), or from
``--source DIR`` holding ``train.parquet`` / ``test.parquet`` in the Hub dataset's own schema (the
tests use tiny fixtures of that kind). ``extra_info.split`` matters: :mod:`phantom.verl.reward`
applies verifier noise to ``train`` rows only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["GSM8K", "MATH", "verl_row", "write_parquet", "build_gsm8k", "build_math", "build_lab", "main"]

GSM8K = {"hub": "openai/gsm8k", "config": "main", "data_source": "openai/gsm8k"}
MATH = {"hub": "DigitalLearningGmbH/MATH-lighteval", "config": None, "data_source": "DigitalLearningGmbH/MATH-lighteval"}
#: The paper's MATH held-out set: 500 test items sampled at seed 42, overlong prompts dropped.
MATH_VAL_N, MATH_VAL_SEED = 500, 42
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def verl_row(data_source: str, content: str, gold: Any, split: str, index: int, *, ability: str = "math",
             **extra: Any) -> dict:
    """One row of verl's RL dataset schema (``extra`` goes into ``extra_info``)."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(gold)},
        "extra_info": {"split": split, "index": int(index), **extra},
    }


def write_parquet(rows: list[dict], path: Path) -> Path:
    """Write rows atomically (temporary file, then rename): a crash never leaves half a parquet."""
    import pandas as pd

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path


def _load(hub: dict, split: str, source: str | None):
    """A split as a DataFrame: from ``source/<split>.parquet`` when given, else from the Hub."""
    import pandas as pd

    if source is not None:
        path = Path(source) / f"{split}.parquet"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (expected {split}.parquet in --source {source})")
        return pd.read_parquet(path)
    import datasets  # needs internet the first time; cached by datasets afterwards

    return datasets.load_dataset(hub["hub"], hub["config"], split=split).to_pandas()


def _gsm8k_answer(solution: str) -> str:
    if "####" not in solution:
        raise ValueError(f"GSM8K answer without '####': {solution[-80:]!r}")
    return solution.split("####")[-1].strip().replace(",", "")


def build_gsm8k(out: Path, source: str | None = None) -> dict[str, Path]:
    """GSM8K: all 7,473 train and 1,319 test items (the paper's held-out set is the full test split)."""
    paths = {}
    for split in ("train", "test"):
        df = _load(GSM8K, split, source)
        rows = [verl_row(GSM8K["data_source"], f"{q} {GSM8K_INSTRUCTION}", _gsm8k_answer(a), split, i,
                         question=q, answer=a)
                for i, (q, a) in enumerate(zip(df["question"], df["answer"]))]
        paths[split] = write_parquet(rows, out / f"{split}.parquet")
    return paths


def _boxed(solution: str) -> str | None:
    from verl.utils.reward_score import math_reward

    boxed = math_reward.last_boxed_only_string(solution)
    try:
        return None if boxed is None else math_reward.remove_boxed(boxed)
    except (AssertionError, IndexError):
        return None


def _prompt_tokens(tokenizer: Any, content: str) -> int:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return len(ids)


def build_math(out: Path, source: str | None = None, tokenizer: str | None = "Qwen/Qwen2.5-1.5B-Instruct",
               max_prompt_length: int = 512, n_val: int = MATH_VAL_N, seed: int = MATH_VAL_SEED) -> dict[str, Path]:
    """MATH: the train split, and ``n_val`` test items drawn by ``DataFrame.sample(n_val, random_state=seed)``.

    Prompts longer than ``max_prompt_length`` tokens (chat template applied, ``tokenizer``) are dropped
    from both splits, as verl would otherwise filter or truncate them at load time; the paper reports
    two such items in its 500, i.e. n=498. ``tokenizer=None`` keeps every item.
    """
    frames = {split: _load(MATH, split, source) for split in ("train", "test")}  # missing input fails first
    tok = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(tokenizer)
        except OSError as exc:
            raise RuntimeError(f"could not load tokenizer {tokenizer!r} for the overlong filter ({exc}); "
                               "give a local path with --tokenizer, or --tokenizer none") from None
    paths = {}
    for split, df in frames.items():
        if split == "test":
            if len(df) < n_val:
                raise ValueError(f"MATH test split has {len(df)} items, fewer than n_val={n_val}")
            df = df.sample(n=n_val, random_state=seed)
        rows, dropped = [], 0
        for i, (problem, solution) in enumerate(zip(df["problem"], df["solution"])):
            answer = _boxed(solution)
            content = f"{problem} {MATH_INSTRUCTION}"
            if answer is None or (tok is not None and _prompt_tokens(tok, content) > max_prompt_length):
                dropped += 1
                continue
            rows.append(verl_row(MATH["data_source"], content, answer, split, i, problem=problem))
        print(f"MATH {split}: {len(rows)} items ({dropped} dropped: no boxed answer or prompt > "
              f"{max_prompt_length} tokens)", file=sys.stderr)
        paths[split] = write_parquet(rows, out / f"{split}.parquet")
    return paths


def lab_rows(problems: Iterable[Any], split: str) -> list[dict]:
    """The CPU lab's problems (``.prompt``, ``.solution``, ``.answer``) as verl rows (``phantom_lab``)."""
    return [verl_row("phantom_lab", p.prompt, p.answer, split, i, solution=p.solution)
            for i, p in enumerate(problems)]


def build_lab(out: Path, n_train: int = 2048, n_test: int = 256, profile: str = "lab") -> dict[str, Path]:
    """The lab's task (``phantom.lab.task.make_split``) in verl form: ``train`` and the lab's ``val`` split.

    The held-out file is named ``test.parquet`` like the other datasets; its rows keep the lab's split
    name (``val``). The task settings are those the lab's SFT ``profile`` was trained on.
    """
    try:
        from phantom.lab import task
    except ImportError as exc:
        raise RuntimeError(f"the CPU lab (phantom.lab.task) is not available: {exc}") from None
    from phantom.lab.sft import resolve_sft

    cfg = resolve_sft(profile).task
    return {name: write_parquet(lab_rows(task.make_split(cfg, split, n), split), out / f"{name}.parquet")
            for name, split, n in (("train", "train", n_train), ("test", "val", n_test))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="phantom data", description="build verl parquet for phantom runs")
    sub = parser.add_subparsers(dest="dataset", required=True)
    for name in ("gsm8k", "math", "lab"):
        p = sub.add_parser(name)
        p.add_argument("--out", default=None, help=f"output folder (default artifacts/data/{name})")
        if name != "lab":
            p.add_argument("--source", default=None, help="local folder with the Hub schema's <split>.parquet")
        if name == "math":
            p.add_argument("--tokenizer", default="Qwen/Qwen2.5-1.5B-Instruct",
                           help="tokenizer for the overlong filter ('none' keeps every item)")
            p.add_argument("--max-prompt-length", type=int, default=512)
        if name == "lab":
            p.add_argument("--n-train", type=int, default=2048)
            p.add_argument("--n-test", type=int, default=256)
            p.add_argument("--profile", default="lab", help="the lab SFT profile whose task to use")
    args = parser.parse_args(argv)
    out = Path(args.out or f"artifacts/data/{args.dataset}")
    try:
        if args.dataset == "gsm8k":
            paths = build_gsm8k(out, args.source)
        elif args.dataset == "math":
            tok = None if str(args.tokenizer).lower() == "none" else args.tokenizer
            paths = build_math(out, args.source, tok, args.max_prompt_length)
        else:
            paths = build_lab(out, args.n_train, args.n_test, args.profile)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"phantom data: {exc}", file=sys.stderr)
        return 2
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0
