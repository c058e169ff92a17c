"""A byte-level BPE tokenizer trained locally on the lab task, shaped like Qwen2's.

verl loads the lab checkpoint with ``transformers.AutoTokenizer``, which for ``model_type=qwen2``
rebuilds Qwen2's pipeline (NFC, Qwen2's split regex, byte-level bytes, byte-level decoder) around
the saved vocabulary. Training with exactly that pipeline makes the lab's own encoder and verl's
agree token for token. Qwen2's regex isolates every digit, so no merge ever spans digits: the
model sees numbers digit by digit, which the arithmetic needs. ``"\\n"`` is one token, EOS is
``<|im_end|>``, padding uses ``<|endoftext|>`` (Qwen2.5's conventions). The chat template renders
each message's content verbatim, so a verl prompt built with ``apply_chat_template`` is the lab's
raw prompt.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from phantom.lab.task import TaskConfig, make_split, styled_solution, worked_solution

__all__ = ["SPECIAL_TOKENS", "EOS_TOKEN", "PAD_TOKEN", "CHAT_TEMPLATE", "TokenizerConfig", "LabTokenizer",
           "train_tokenizer", "save_tokenizer"]

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
#: Content of every message, nothing else; ``add_generation_prompt`` adds nothing.
CHAT_TEMPLATE = "{%- for message in messages %}{{- message['content'] }}{%- endfor %}"
# transformers 5.x, models/qwen2/tokenization_qwen2.py
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


@dataclass(frozen=True)
class TokenizerConfig:
    """What the BPE is trained on: ``corpus`` problems of each wording, up to ``vocab_size`` tokens."""

    vocab_size: int = 512
    corpus: int = 3000
    task: TaskConfig = field(default_factory=lambda: TaskConfig(terms=(2, 6), wording="mixed"))


def _empty_qwen2_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(cfg: TokenizerConfig) -> Tokenizer:
    """Train deterministically on prompts and solutions of both splits (no text is downloaded).

    Every problem contributes a terse and a fully worked solution (slack 1), whatever the profile's
    style, so one vocabulary serves every style and slack: profiles that differ only in their answer
    style share a tokenizer, and the prose words are single tokens.
    """
    texts = []
    rng = random.Random(0)
    for split in ("train", "val"):
        for p in make_split(cfg.task, split, cfg.corpus if split == "train" else cfg.corpus // 10):
            texts.append(p.prompt + styled_solution(p.operands, rng, 0.5, 0.5))
            texts.append(p.prompt + worked_solution(p.operands, rng, 1.0))
    tok = _empty_qwen2_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, *, model_max_length: int) -> None:
    """Write the Hugging Face tokenizer files (``tokenizer.json``, config, chat template)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)],
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(model_max_length),
        "split_special_tokens": False,
        "errors": "replace",
        "add_prefix_space": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    special_map = {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN,
                   "additional_special_tokens": config["additional_special_tokens"]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


class LabTokenizer:
    """Thin, fast wrapper over the ``tokenizers`` object (no transformers import on the hot path)."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.eos_id = self._id(EOS_TOKEN)
        self.pad_id = self._id(PAD_TOKEN)
        self.special_ids = frozenset(self._id(t) for t in SPECIAL_TOKENS)

    def _id(self, token: str) -> int:
        i = self.tok.token_to_id(token)
        if i is None:
            raise ValueError(f"tokenizer has no {token!r}; it was not built by phantom.lab.tokenizer")
        return int(i)

    @classmethod
    def load(cls, path: str | Path) -> LabTokenizer:
        p = Path(path)
        return cls(Tokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p)))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self.tok.decode_batch([list(b) for b in batch], skip_special_tokens=True)
