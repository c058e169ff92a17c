"""Tiny local assets for verl runs on CPU: a random Qwen2 model, a byte-level BPE tokenizer, parquet.

Built deterministically from seeds (same bytes on every machine), never downloaded. verl's
agent loop needs a Qwen-style tokenizer: ``<|im_end|>`` as EOS and ``"\\n"`` as a single token
(``QwenContinuousTokenBuilder``), and transformers 5 re-imposes a byte-level pipeline on any
``model_type=qwen2`` tokenizer, so the vocabulary is byte-level BPE trained on the task's own text.

The data is a small addition task in verl's row schema (``data_source="phantom_arith"``, scored by
the numeric checker). A random model almost never solves it; the point is the plumbing, not learning.
The lab's SFT-trained model (``phantom.lab.sft.ensure_sft_model``) is the one that learns.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from phantom.verl.data import verl_row, write_parquet

__all__ = ["TinySpec", "build_tiny", "ensure_tiny", "SPECIALS", "CHAT_TEMPLATE", "DATA_SOURCE"]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DATA_SOURCE = "phantom_arith"
VERSION = 1  # bump when the recipe changes: cached assets with another version are rebuilt


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny model and data (defaults: ~100k parameters, 64 train / 16 test rows)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 320  # byte-level BPE vocabulary, special tokens included
    n_train: int = 64
    n_test: int = 16
    seed: int = 0


def _problem(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(0, 20), r.randint(0, 20)
    return f"What is {a}+{b}? End with #### and the number.", a + b


def _tokenizer(spec: TinySpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    r = random.Random(spec.seed + 1)
    corpus = []
    for _ in range(2000):
        q, ans = _problem(r)
        corpus.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{ans} #### {ans}<|im_end|>\n")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                 bos_token=None, model_max_length=1024)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_tiny(out: str | os.PathLike[str], spec: TinySpec = TinySpec()) -> dict[str, Path]:
    """Build ``out/model`` and ``out/data/{train,test}.parquet``; returns their paths."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    model_dir, data_dir = out / "model", out / "data"
    tok = _tokenizer(spec)
    newline = tok.encode("\n", add_special_tokens=False)
    if len(newline) != 1:  # verl's Qwen token builder requires it
        raise RuntimeError(f"newline tokenizes to {newline}, expected one token")
    tok.save_pretrained(model_dir)
    torch.manual_seed(spec.seed)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=spec.hidden, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, intermediate_size=spec.intermediate,
        max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(model_dir)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     bos_token_id=cfg.bos_token_id).save_pretrained(model_dir)
    paths = {"model": model_dir}
    for split, n, seed in (("train", spec.n_train, spec.seed + 2), ("test", spec.n_test, spec.seed + 3)):
        r = random.Random(seed)
        rows = [verl_row(DATA_SOURCE, *_problem(r), split, i) for i in range(n)]
        paths[split] = write_parquet(rows, data_dir / f"{split}.parquet")
    return paths


def ensure_tiny(root: str | os.PathLike[str] = "artifacts/verl_cpu/tiny", spec: TinySpec = TinySpec()) -> dict[str, Path]:
    """The tiny assets under ``root``, built once (into a temporary folder, renamed when complete)."""
    root = Path(root).resolve()
    stamp = {"version": VERSION, **asdict(spec)}
    marker = root / "assets.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return {"model": root / "model", "train": root / "data" / "train.parquet", "test": root / "data" / "test.parquet"}
    tmp = root.with_name(f".{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny(tmp, spec)
    (tmp / "assets.json").write_text(json.dumps(stamp, indent=2) + "\n")
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, root)
    return ensure_tiny(root, spec)
