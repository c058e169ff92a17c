"""A tiny Qwen2 in plain torch: the same weights as ``transformers.Qwen2ForCausalLM``, faster on CPU.

The lab trains and samples with this module because, at 0.3M parameters, per-op overhead rather
than arithmetic sets the speed: the forward here fuses the q/k/v and gate/up projections during
generation, keeps a preallocated KV cache, drops finished rows from the batch, and computes logits
only where they are used. Parameter names, RoPE, RMSNorm and GQA follow transformers' Qwen2
(tests compare logits), and checkpoints are written in Hugging Face format so
``AutoModelForCausalLM.from_pretrained`` and verl's CPU backend load the same directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from phantom.lab.decode_kernel import kernel_for

__all__ = ["ModelConfig", "LabQwen2", "LoRALinear", "save_checkpoint", "load_checkpoint",
           "train_flops_per_token", "sample_tokens"]


@dataclass(frozen=True)
class ModelConfig:
    """Qwen2 shape. ``vocab_size`` comes from the tokenizer; embeddings are tied."""

    hidden: int = 96
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    max_positions: int = 256
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden={self.hidden} must split into {self.heads} heads of even size")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def hf_config(self, vocab_size: int, *, eos_id: int, pad_id: int) -> dict[str, Any]:
        """Keyword arguments for ``transformers.Qwen2Config``."""
        return dict(vocab_size=vocab_size, hidden_size=self.hidden, intermediate_size=self.intermediate,
                    num_hidden_layers=self.layers, num_attention_heads=self.heads,
                    num_key_value_heads=self.kv_heads, max_position_embeddings=self.max_positions,
                    rms_norm_eps=self.rms_eps, rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
                    tie_word_embeddings=True, initializer_range=self.init_std, use_sliding_window=False,
                    hidden_act="silu", attention_dropout=0.0, eos_token_id=eos_id, pad_token_id=pad_id,
                    bos_token_id=None, torch_dtype="float32", architectures=["Qwen2ForCausalLM"])

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ModelConfig:
        rope = d.get("rope_parameters") or {}
        return cls(hidden=d["hidden_size"], layers=d["num_hidden_layers"], heads=d["num_attention_heads"],
                   kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                   intermediate=d["intermediate_size"], max_positions=d["max_position_embeddings"],
                   rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
                   rms_eps=d["rms_norm_eps"], init_std=d.get("initializer_range", 0.02))


def train_flops_per_token(cfg: ModelConfig, vocab: int, ctx: float, *, head: bool = True) -> float:
    """Forward FLOPs of one token: 2 x matmul weights, attention over ``ctx`` keys, the LM head if used."""
    kv = cfg.kv_heads * cfg.head_dim
    per_layer = 2 * (cfg.hidden * (cfg.hidden + 2 * kv) + cfg.hidden * cfg.hidden + 3 * cfg.hidden * cfg.intermediate)
    attn = 4 * cfg.heads * cfg.head_dim * ctx
    return cfg.layers * (per_layer + attn) + (2 * cfg.hidden * vocab if head else 0)


class LoRALinear(nn.Linear):
    """``nn.Linear`` plus a low-rank update ``(alpha/r) B A`` (B starts at 0, so training starts at the base)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None)
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=5**0.5)  # PEFT's default
        self.scale = alpha / rank

    def effective_weight(self) -> torch.Tensor:
        return self.weight + self.scale * (self.lora_B @ self.lora_A)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # merged: one matmul with W + s·BA. On a CPU the rank-r matmuls of the unmerged form are
        # memory-bound (a (tokens x r) intermediate written and read back per projection); forming
        # the full weight gradient once and chaining it to A and B is ~16% faster forward+backward.
        return F.linear(x, self.effective_weight(), self.bias)


def sample_tokens(logits: torch.Tensor, temperature: float = 1.0,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from ``softmax(logits / temperature)`` by inverse-CDF sampling.

    One uniform per row and a binary search: at the lab's sizes ``torch.multinomial`` costs about ten
    times more per decode step. ``right=True`` makes a zero-probability token (a flat step of the CDF)
    unreachable, ``u < 1`` keeps the index in range.
    """
    cdf = torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1).cumsum_(-1)
    u = torch.rand(logits.shape[0], 1, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)


def _w(lin: nn.Linear) -> torch.Tensor:
    return lin.effective_weight() if isinstance(lin, LoRALinear) else lin.weight


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class _Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=True)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=True)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=True)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)


class _Layer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)
        self.input_layernorm = _RMSNorm(c.hidden, c.rms_eps)
        self.post_attention_layernorm = _RMSNorm(c.hidden, c.rms_eps)


class _Backbone(nn.Module):
    def __init__(self, c: ModelConfig, vocab: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, c.hidden)
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.layers))
        self.norm = _RMSNorm(c.hidden, c.rms_eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class LabQwen2(nn.Module):
    """Qwen2ForCausalLM's computation with HF parameter names (``model.layers.0.self_attn.q_proj``...)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg, self.vocab_size = cfg, int(vocab_size)
        self.model = _Backbone(cfg, self.vocab_size)
        self.lm_head = nn.Linear(cfg.hidden, self.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied, as in the saved config
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
        freqs = torch.arange(cfg.max_positions, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=self.cfg.init_std)

    # ---------------------------------------------------------------------------------------
    # full-sequence forward (training, scoring, prefill)
    # ---------------------------------------------------------------------------------------
    def hidden_states(self, ids: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor,
                      cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                      keys_transposed: bool = False) -> torch.Tensor:
        """Final-norm hidden states of ``ids`` (B, T) at positions ``pos``; ``valid`` marks real tokens.

        Keys are masked causally and by ``valid``; a padded query attends to itself only, so no row
        is empty. With ``cache``, each layer's rotated keys and values are written to ``cache[i]``:
        keys (B, KV, L, D), or (B, KV, D, L) with ``keys_transposed`` (the C decode kernel's layout).
        """
        c = self.cfg
        B, T = ids.shape
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        mask = (causal[None] & valid[:, None, :]) | torch.eye(T, dtype=torch.bool, device=ids.device)[None]
        mask = mask[:, None]
        cos, sin = self.rope_cos[pos][:, None], self.rope_sin[pos][:, None]
        x = self.model.embed_tokens(ids)
        for li, layer in enumerate(self.model.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).view(B, T, c.heads, c.head_dim).transpose(1, 2)
            k = a.k_proj(h).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
            v = a.v_proj(h).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            if cache is not None:
                if keys_transposed:
                    cache[li][0][:, :, :, :T] = k.transpose(-1, -2)
                else:
                    cache[li][0][:, :, :T] = k
                cache[li][1][:, :, :T] = v
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=c.heads != c.kv_heads)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, c.hidden))
            m = layer.mlp
            h = layer.post_attention_layernorm(x)
            x = x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))
        return self.model.norm(x)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V); by default no padding and positions ``0..T-1``."""
        if valid is None:
            valid = torch.ones_like(ids, dtype=torch.bool)
        if pos is None:
            pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        return self.lm_head(self.hidden_states(ids, pos, valid))

    # ---------------------------------------------------------------------------------------
    # sampling with a KV cache
    # ---------------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], *, max_new: int, eos_id: int, pad_id: int,
                 temperature: float = 1.0, greedy: bool = False,
                 generator: torch.Generator | None = None) -> tuple[list[list[int]], list[bool]]:
        """Responses (token ids, EOS excluded) and whether each ended with EOS within ``max_new``."""
        c = self.cfg
        B, P = len(prompts), max(map(len, prompts))
        if P + max_new > c.max_positions:
            raise ValueError(f"prompt {P} + max_new {max_new} tokens exceeds max_positions={c.max_positions}")
        ids = torch.full((B, P), pad_id, dtype=torch.long)
        valid = torch.zeros(B, P + max_new, dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[i, P - len(p):P] = True
        pos = (valid[:, :P].long().cumsum(-1) - 1).clamp(min=0)
        # A rollout batch repeats each prompt once per group member: the prefill runs on the distinct
        # prompts and their cache rows are copied out (5x less prefill at group size 5).
        distinct: dict[tuple[int, ...], int] = {}
        owner = torch.tensor([distinct.setdefault(tuple(p), i) for i, p in enumerate(prompts)], dtype=torch.long)
        heads = torch.tensor(sorted(distinct.values()), dtype=torch.long)
        U, ctx = len(heads), P + max_new
        # the C kernel (bit-identical to the torch ops below, checked per shape) keeps keys transposed
        kern = kernel_for(c.heads, c.kv_heads, c.head_dim, c.max_positions)
        key_shape = (U, c.kv_heads, c.head_dim, ctx) if kern else (U, c.kv_heads, ctx, c.head_dim)
        cache = [(torch.zeros(key_shape), torch.zeros(U, c.kv_heads, ctx, c.head_dim)) for _ in range(c.layers)]
        last = self.hidden_states(ids[heads], pos[heads], valid[heads, :P], cache, keys_transposed=kern is not None)[:, -1]
        if U < B:
            at = torch.searchsorted(heads, owner)  # each row's index among the distinct prompts
            last, cache = last[at], [(k[at], v[at]) for k, v in cache]
        logits = self.lm_head(last)
        # per layer: fused q/k/v and gate/up weights, o and down, and the two norms' weights
        fused = [(torch.cat([_w(L.self_attn.q_proj), _w(L.self_attn.k_proj), _w(L.self_attn.v_proj)]),
                  torch.cat([L.self_attn.q_proj.bias, L.self_attn.k_proj.bias, L.self_attn.v_proj.bias]),
                  torch.cat([_w(L.mlp.gate_proj), _w(L.mlp.up_proj)]), _w(L.self_attn.o_proj), _w(L.mlp.down_proj),
                  L.input_layernorm.weight, L.post_attention_layernorm.weight) for L in self.model.layers]
        out = torch.full((B, max_new), pad_id, dtype=torch.long)
        rows = torch.arange(B)  # original row of each active row (the kernel's caches keep every row)
        alive = torch.ones(B, dtype=torch.bool)  # per active row: no EOS yet
        cur = pos[:, -1].clone()
        # additive key mask: 0 where a key is a real token, -inf at padding and not-yet-written slots
        bias = torch.zeros(B, ctx).masked_fill_(~valid, float("-inf"))
        H, KV, D, g = c.heads, c.kv_heads, c.head_dim, c.heads // c.kv_heads
        nq, nkv, scale = H * D, KV * D, D ** -0.5
        # the modules' own functional calls, without nn.Module's per-call overhead (~100 calls a token)
        emb, hid, eps = self.model.embed_tokens.weight, (c.hidden,), c.rms_eps
        for t in range(max_new):
            nxt = logits.argmax(-1) if greedy else sample_tokens(logits, temperature, generator)
            out[rows, t] = nxt
            alive &= nxt != eos_id
            if t == max_new - 1 or not alive.any():
                break
            dead = len(rows) - int(alive.sum())
            if dead and (dead * 4 >= len(rows) or len(rows) - dead < 8):
                # Drop finished rows (torch's ops: one copy of the cache); below the threshold they ride along.
                idx = alive.nonzero()[:, 0]
                rows, nxt, cur, alive = rows[idx], nxt[idx], cur[idx], alive[idx]
                if kern is None:
                    bias, cache = bias[idx], [(k[idx], v[idx]) for k, v in cache]
            n = len(rows)
            slot = P + t
            bias[:, slot] = 0.0  # (every row of the kernel's bias: a finished row's is never read again)
            cur = cur + 1
            if kern is None:
                cos, sin = self.rope_cos[cur][:, None], self.rope_sin[cur][:, None]  # (n, 1, D)
                keys = bias[:, None, None, :slot + 1]
            x = F.embedding(nxt, emb)
            for li in range(c.layers):
                wqkv, bqkv, wgu, wo, wd, n1, n2 = fused[li]
                qkv = F.linear(F.rms_norm(x, hid, n1, eps), wqkv, bqkv)
                kc, vc = cache[li]
                if kern is not None:
                    att = kern.scores(qkv, self.rope_cos, self.rope_sin, cur, rows, kc, vc, bias, slot, H, scale,
                                      torch.empty(n, KV, g, slot + 1))
                    o = kern.mix(torch.softmax(att, dim=-1), rows, vc, torch.empty(n, nq))
                else:
                    qk = _rotate(qkv[:, :nq + nkv].view(n, H + KV, D), cos, sin)  # q and k heads in one go
                    kc[:, :, slot] = qk[:, H:]
                    vc[:, :, slot] = qkv[:, nq + nkv:].view(n, KV, D)
                    # one query per row: two batched matmuls (query heads grouped by their kv head, as
                    # transformers' repeat_kv pairs them) beat SDPA's flash kernel at this size
                    att = torch.matmul(qk[:, :H].view(n, KV, g, D), kc[:, :, :slot + 1].transpose(-1, -2))
                    att = torch.softmax(att.mul_(scale).add_(keys), dim=-1)
                    o = torch.matmul(att, vc[:, :, :slot + 1]).view(n, nq)
                x = x + F.linear(o, wo)
                gu = F.linear(F.rms_norm(x, hid, n2, eps), wgu)
                x = x + F.linear(F.silu(gu[:, :c.intermediate]) * gu[:, c.intermediate:], wd)
            logits = F.linear(F.rms_norm(x, hid, self.model.norm.weight, eps), emb)
        sampled = out.tolist()
        ended = [eos_id in r for r in sampled]
        return [r[:r.index(eos_id)] if e else r for r, e in zip(sampled, ended)], ended

    def enable_lora(self, rank: int, alpha: float,
                    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj")) -> list[nn.Parameter]:
        """Freeze the model and wrap the target projections with LoRA adapters; returns the new parameters."""
        for p in self.parameters():
            p.requires_grad_(False)
        new: list[nn.Parameter] = []
        for layer in self.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name in targets:
                    lin = getattr(parent, name, None)
                    if isinstance(lin, nn.Linear) and not isinstance(lin, LoRALinear):
                        wrapped = LoRALinear(lin, rank, alpha)
                        setattr(parent, name, wrapped)
                        new += [wrapped.lora_A, wrapped.lora_B]
        return new

    # ---------------------------------------------------------------------------------------
    # scoring responses (the policy-gradient forward)
    # ---------------------------------------------------------------------------------------
    def response_logprobs(self, prompts: list[list[int]], responses: list[list[int]], *, pad_id: int,
                          with_entropy: bool = False, buckets: int | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Per-token log-probabilities (B, R) of ``responses`` given ``prompts``, the response mask and
        (optionally) the per-token entropy; R is the longest response.

        Rows are sorted by length and scored in ``buckets`` groups, each padded only to its own
        longest prompt and response (default: one bucket per 20 rows, at most 8): response lengths
        spread widely, and padding every row to the longest one wasted about half of the forward and
        backward. Each row's values do not depend on the bucketing (tests compare with transformers).
        """
        B = len(prompts)
        R = max(1, max(map(len, responses)))
        if buckets is None:
            buckets = max(1, min(8, B // 20))
        order = sorted(range(B), key=lambda i: (len(prompts[i]) + len(responses[i]), i))
        parts = [order[round(k * B / buckets):round((k + 1) * B / buckets)] for k in range(buckets)]
        logps, ents, rows = [], [], []
        for part in (p for p in parts if p):
            lp, en = self._score([prompts[i] for i in part], [responses[i] for i in part], pad_id, with_entropy)
            logps.append(F.pad(lp, (0, R - lp.shape[1])))
            if en is not None:
                ents.append(F.pad(en, (0, R - en.shape[1])))
            rows += part
        inverse = torch.empty(B, dtype=torch.long)
        inverse[torch.tensor(rows, dtype=torch.long)] = torch.arange(B)
        logp = torch.cat(logps)[inverse]
        ent = torch.cat(ents)[inverse] if with_entropy else None
        lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)
        mask = torch.arange(R)[None, :] < lengths[:, None]
        return logp, mask, ent

    def _score(self, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
               with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One bucket of :meth:`response_logprobs`: left-padded prompt, response, right padding."""
        B, P = len(prompts), max(map(len, prompts))
        R = max(1, max(map(len, responses)))
        ids = torch.full((B, P + R), pad_id, dtype=torch.long)
        valid = torch.zeros(B, P + R, dtype=torch.bool)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
            valid[i, P - len(p):P] = True
            if r:
                ids[i, P:P + len(r)] = torch.tensor(r, dtype=torch.long)
                valid[i, P:P + len(r)] = True
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        h = self.hidden_states(ids[:, :-1], pos[:, :-1], valid[:, :-1])[:, P - 1:]
        logp_all = torch.log_softmax(self.lm_head(h).float(), dim=-1)
        logp = logp_all.gather(-1, ids[:, P:, None])[..., 0]
        ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
        return logp, ent


# -------------------------------------------------------------------------------------------
# checkpoints in Hugging Face format
# -------------------------------------------------------------------------------------------
def save_checkpoint(model: LabQwen2, out_dir: Path, *, eos_id: int, pad_id: int,
                    meta: dict[str, Any] | None = None) -> None:
    """``config.json``, ``generation_config.json``, ``model.safetensors`` (+ ``lab_meta.json``)."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Qwen2Config

    out_dir.mkdir(parents=True, exist_ok=True)
    Qwen2Config(**model.cfg.hf_config(model.vocab_size, eos_id=eos_id, pad_id=pad_id)).save_pretrained(out_dir)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True, temperature=1.0,
                     top_k=0, top_p=1.0).save_pretrained(out_dir)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    if meta is not None:
        (out_dir / "lab_meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def load_checkpoint(path: str | Path) -> LabQwen2:
    """The lab model of a checkpoint directory (config.json + model.safetensors), in train mode."""
    from safetensors.torch import load_file

    p = Path(path)
    hf = json.loads((p / "config.json").read_text())
    if hf.get("model_type") != "qwen2":
        raise ValueError(f"{p} holds model_type={hf.get('model_type')!r}; allowed: qwen2")
    model = LabQwen2(ModelConfig.from_hf(hf), hf["vocab_size"])
    state = load_file(str(p / "model.safetensors"))
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    return model


def config_dict(cfg: ModelConfig) -> dict[str, Any]:
    return asdict(cfg)
