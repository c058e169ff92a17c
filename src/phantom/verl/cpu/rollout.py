"""An ``hf`` rollout backend for verl on CPU: a Hugging Face model behind verl's server-mode interface.

verl 0.9.1's trainers only drive server-mode rollouts (vLLM, SGLang, TensorRT-LLM replicas that an
``AgentLoopWorker`` calls with ``server.generate(prompt_ids, sampling_params, ...)``). This module adds
a fourth backend, ``actor_rollout_ref.rollout.name=hf``:

* :class:`BatchGenerator` - plain torch: left-padded batched sampling with a KV cache, per-request
  temperature / top-k / top-p / max_tokens / EOS, finished rows dropped from the batch as they end.
* :class:`HFServer` - the Ray actor verl talks to. ``generate`` calls arrive concurrently (one per
  rollout); they queue, and a batcher task runs everything that arrived together as one batch of at
  most ``rollout.max_num_seqs`` requests (``max_num_seqs=1`` is the one-at-a-time baseline).
* :class:`HFReplica` (verl's ``RolloutReplica``) starts one server per replica, and
  :class:`HFServerAdapter` (verl's ``BaseRollout``, inside each FSDP worker) pushes the trained
  weights to it after every step through Ray's object store: full weights, merged LoRA weights, or
  (``lora.merge=False``, verl's default) only the LoRA adapters (the base too, once, with
  ``load_format=dummy``), applied unmerged as vLLM does (:mod:`phantom.verl.cpu.lora`).

Returned log-probabilities are ``log_softmax(logits / temperature)`` of the sampled token over the
full vocabulary, the quantity verl's actor recomputes, so the rollout/actor agreement metrics
(``training/rollout_probs_diff_*``) stay meaningful.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

logger = logging.getLogger(__name__)

__all__ = ["BatchGenerator", "HFServer", "HFReplica", "HFServerAdapter", "server_name"]

#: How long the batcher keeps collecting while requests are still arriving (seconds). A step's 160
#: requests come from one agent-loop worker over tens of milliseconds, more on a busy machine; a batch cut
#: early runs the rest as further batches, each with its own prefill and decode loop. The V1 trainer polls
#: for finished groups every 2 s, so a little more waiting here costs nothing.
WINDOW_S = float(os.environ.get("PHANTOM_HF_BATCH_WINDOW_MS", "150")) / 1000.0
MAX_WAIT_S = 1.5
#: When set, every generated batch appends {"step", "requests", "seconds", "tokens", "max_batch"} here.
LOG_ENV = "PHANTOM_ROLLOUT_LOG"
#: When set, every weight update appends {"step", "mode": full|base|adapter, "tensors", "lora_rank", "checksum"}.
SYNC_LOG_ENV = "PHANTOM_SYNC_LOG"


def server_name(replica_rank: int, kind: str = "") -> str:
    return f"phantom_hf_server{kind}_{replica_rank}"


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    logprobs: bool = False
    ignore_eos: bool = False
    future: Any = field(default=None, repr=False)


class BatchGenerator:
    """Batched sampling from a causal LM on CPU (no Ray, no verl: unit-testable on its own)."""

    def __init__(self, model: torch.nn.Module, eos_ids: set[int], pad_id: int, seed: int = 0):
        self.model = model.eval()
        self.eos_ids = torch.tensor(sorted(eos_ids) or [-1], dtype=torch.long)
        self.pad_id = int(pad_id)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.forward_calls = 0

    def _forward(self, **kwargs: Any) -> Any:
        self.forward_calls += 1
        return self.model(use_cache=True, **kwargs)

    def _sample(self, logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
        greedy = temp <= 0
        scaled = logits / torch.where(greedy, torch.ones_like(temp), temp)[:, None]
        logp = torch.log_softmax(scaled, dim=-1)
        vocab = logits.shape[-1]
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        rank = torch.arange(vocab)[None, :]
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        drop = rank >= k[:, None]
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        drop |= (probs.cumsum(-1) - probs) > top_p[:, None]  # keep the smallest prefix with mass >= top_p
        filtered = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
        sampled = torch.multinomial(torch.softmax(filtered, dim=-1), 1, generator=self.generator).squeeze(-1)
        tok = torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    @torch.no_grad()
    def generate(self, requests: list[Request]) -> list[dict]:
        """Sample every request; returns ``{"token_ids", "log_probs"}`` per request, in order."""
        n = len(requests)
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - len(r.prompt_ids):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        temp = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
        top_k = torch.tensor([r.top_k for r in requests], dtype=torch.long)
        top_p = torch.tensor([r.top_p for r in requests], dtype=torch.float32)
        budget = torch.tensor([r.max_tokens for r in requests], dtype=torch.long)
        stop_on_eos = torch.tensor([not r.ignore_eos for r in requests], dtype=torch.bool)
        rows = torch.arange(n)  # original request index of each live row
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]

        out = self._forward(input_ids=ids, attention_mask=mask, position_ids=pos)
        cache, logits, last_pos = out.past_key_values, out.logits[:, -1].float(), pos[:, -1]
        for step in range(int(budget.max())):
            tok, lp = self._sample(logits, temp, top_k, top_p)
            for j, i in enumerate(rows.tolist()):
                tokens[i].append(int(tok[j]))
                logps[i].append(float(lp[j]))
            done = (budget <= step + 1) | (stop_on_eos & torch.isin(tok, self.eos_ids))
            if bool(done.all()):
                break
            if bool(done.any()):  # drop finished rows from the batch and the cache
                keep = (~done).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, tok, mask, last_pos = rows[keep], tok[keep], mask[keep], last_pos[keep]
                temp, top_k, top_p, budget, stop_on_eos = temp[keep], top_k[keep], top_p[keep], budget[keep], stop_on_eos[keep]
            mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype)], dim=-1)
            last_pos = last_pos + 1
            out = self._forward(input_ids=tok[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                                past_key_values=cache)
            cache, logits = out.past_key_values, out.logits[:, -1].float()
        return [{"token_ids": t, "log_probs": lp} for t, lp in zip(tokens, logps)]


class HFServer:
    """verl's token-in/token-out server protocol over a :class:`BatchGenerator` (one Ray actor)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int, max_batch: int | None = None):
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass

        torch.set_num_threads(max(1, int(os.environ.get("PHANTOM_HF_ROLLOUT_THREADS", "1"))))
        self.config = omega_conf_to_dataclass(config)
        path = getattr(model_config, "local_path", None) or model_config.path
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        model.requires_grad_(False)  # inference only: no autograd bookkeeping
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        pad = model.generation_config.pad_token_id
        seed = int(getattr(self.config, "seed", 0) or 0) + 1000 * int(replica_rank)
        self.gen = BatchGenerator(model, eos_ids, pad if pad is not None else next(iter(eos_ids), 0), seed)
        from phantom.verl.cpu import labdecode

        # the lab's own decoder for the lab's checkpoints (same weights and function, several times faster)
        self.lab = (labdecode.LabDecoder(path, eos_ids, self.gen.pad_id, self.gen.generator)
                    if labdecode.usable(path) and len(eos_ids) == 1 else None)
        self.max_batch = max(1, int(max_batch or self.config.max_num_seqs))
        self.max_model_len = int(self.config.max_model_len or (self.config.prompt_length + self.config.response_length))
        self.global_steps: int | None = None
        self.lock = threading.Lock()  # one batch or one weight load at a time
        self.queue: list[Request] = []
        self.arrived = asyncio.Event()
        self.batcher: asyncio.Task | None = None
        self.stats = {"requests": 0, "batches": 0}
        self.peft: Any = None  # the PEFT-wrapped model once LoRA adapters are synced unmerged
        self.syncs: list[str] = []  # mode of every weight update, in order

    def _request(self, prompt_ids: list[int], params: dict[str, Any]) -> Request:
        room = self.max_model_len - len(prompt_ids)
        limit = params.get("max_tokens", params.get("max_new_tokens"))
        if limit is None:
            limit = self.config.response_length
        return Request(
            prompt_ids=list(prompt_ids), max_tokens=max(1, min(int(limit), room, self.config.response_length)),
            temperature=float(params.get("temperature", 1.0) or 0.0), top_k=int(params.get("top_k", -1) or -1),
            top_p=float(params.get("top_p", 1.0) or 1.0), logprobs=bool(params.get("logprobs", False)),
            ignore_eos=bool(params.get("ignore_eos", self.config.ignore_eos)),
        )

    async def generate(self, prompt_ids: Any, sampling_params: dict[str, Any], request_id: str | None = None,
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:
        from verl.utils import normalize_token_ids

        if image_data is not None or video_data is not None:
            raise NotImplementedError("the hf CPU rollout is text-only")
        req = self._request(normalize_token_ids(prompt_ids), sampling_params)
        req.future = asyncio.get_running_loop().create_future()
        self.queue.append(req)
        self.arrived.set()
        if self.batcher is None or self.batcher.done():
            self.batcher = asyncio.create_task(self._batch_loop())
        out = await req.future
        return TokenOutput(token_ids=out["token_ids"], log_probs=out["log_probs"] if req.logprobs else None,
                           stop_reason="completed", num_preempted=0, extra_fields={"global_steps": self.global_steps})

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.arrived.wait()
            self.arrived.clear()
            # Requests of one step arrive over a few milliseconds: collect while they keep coming.
            start = loop.time()
            while len(self.queue) < self.max_batch and loop.time() - start < MAX_WAIT_S:
                before = len(self.queue)
                await asyncio.sleep(WINDOW_S)
                if len(self.queue) == before:
                    break
            while self.queue:
                batch, self.queue = self.queue[: self.max_batch], self.queue[self.max_batch:]
                try:
                    outs = await asyncio.to_thread(self._run, batch)
                except Exception as exc:  # surface the error in every waiting generate() call
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(exc)
                    continue
                for r, o in zip(batch, outs):
                    if not r.future.done():
                        r.future.set_result(o)

    def _run(self, batch: list[Request]) -> list[dict]:
        with self.lock:
            self.stats["requests"] += len(batch)
            self.stats["batches"] += 1
            start = time.perf_counter()
            lab = self.lab is not None and all(self.lab.supports(r) for r in batch)
            outs = self.lab.generate(batch) if lab else self.gen.generate(batch)
            seconds = time.perf_counter() - start
        if path := os.environ.get(LOG_ENV):  # per-batch telemetry (the launcher: runs/<name>/rollout.jsonl)
            rec = {"step": self.global_steps or 0, "requests": len(batch), "seconds": round(seconds, 6),
                   "tokens": sum(len(o["token_ids"]) for o in outs), "max_batch": self.max_batch,
                   "decoder": "lab" if lab else "transformers"}
            with open(path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        return outs

    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None,
                             peft_config: dict | None = None, base_sync_done: bool = True) -> int:
        """Load trained weights. ``peft_config=None``: full (or merged-LoRA) weights. With a ``peft_config``:
        verl's unmerged-adapter protocol (:mod:`phantom.verl.cpu.lora`): adapters (and once a base)."""
        from phantom.verl.cpu import lora

        mode = "full" if peft_config is None else "adapter" if base_sync_done else "base"

        def load() -> None:
            with self.lock:
                if mode != "full":
                    self.lab = None  # unmerged adapters: the PEFT-wrapped transformers model samples
                if mode == "base":
                    if self.peft is None:  # wrap once; the generator then samples the adapted model
                        self.peft = lora.wrap(self.gen.model, peft_config)
                        self.gen.model = self.peft
                    lora.load_base(self.peft, state_dict)
                    return
                if mode == "adapter":
                    if self.peft is None:  # load_format != dummy: the base is what the server read from disk
                        self.peft = lora.wrap(self.gen.model, peft_config)
                        self.gen.model = self.peft
                    lora.load_adapters(self.peft, state_dict)
                    return
                if self.peft is not None:
                    raise RuntimeError("full weights arrived after LoRA adapter sync started")
                model = self.gen.model
                missing, unexpected = model.load_state_dict(state_dict, strict=False)
                missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
                if missing or unexpected:
                    raise RuntimeError(f"weight sync mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
                if getattr(model.config, "tie_word_embeddings", False):
                    model.tie_weights()
                if self.lab is not None:
                    self.lab.load_state_dict(state_dict)

        await asyncio.to_thread(load)
        if global_steps is not None:
            self.global_steps = global_steps
        self.syncs.append(mode)
        if path := os.environ.get(SYNC_LOG_ENV):  # one line per weight update (runs/<name>/sync.jsonl)
            rec = {"step": self.global_steps or 0, "mode": mode, "tensors": len(state_dict),
                   "lora_rank": None if peft_config is None else peft_config.get("r"),
                   "checksum": round(self.weight_checksum(), 6)}
            with open(path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        return len(state_dict)

    def weight_checksum(self) -> float:
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.gen.model.parameters()))

    def get_stats(self) -> dict[str, int]:
        return {**self.stats, "forward_calls": self.gen.forward_calls, "max_batch": self.max_batch,
                "lab_decoder_calls": self.lab.calls if self.lab is not None else 0}

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # Control plane: KV cache and weights live in ordinary CPU memory, so these are no-ops.
    async def wake_up(self, tags: Any = None) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def wait_for_requests_to_drain(self) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...

    async def abort_all_requests(self, reject_request: bool = False, **kwargs: Any) -> dict:
        return {}

    async def abort_request(self, request_id: str, **kwargs: Any) -> dict:
        return {}

    def get_server_address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), 0

    def ping(self) -> int:
        return self.stats["requests"]


class HFReplica(RolloutReplica):
    """One :class:`HFServer` actor per replica; it needs no (logical) GPU."""

    def _kind(self) -> str:
        return "_reward" if self.is_reward_model else "_teacher" if self.is_teacher_model else ""

    async def launch_servers(self) -> None:
        name = server_name(self.replica_rank, self._kind()) + self.name_suffix
        server = ray.remote(HFServer).options(
            name=name, num_cpus=0, num_gpus=0, max_concurrency=self.max_concurrency,
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.ping.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # only used as the load balancer's server id

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """Inside each FSDP worker: gathers the trained weights and ships them to this replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self._server = None

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", peft_config: Any = None,
                             global_steps: int | None = None, base_sync_done: bool = True, **kwargs: Any) -> None:
        from verl.workers.rollout.utils import ensure_async_iterator

        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf CPU rollout takes named tensors, not wire_format={wire_format!r}")
        state: dict[str, torch.Tensor] = {}
        # Every rank must drain the generator: FSDP's full_tensor() gathers are collectives.
        async for name, tensor in ensure_async_iterator(weights):
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if self.rollout_rank == 0:
                state[name] = tensor.detach().to("cpu", dtype=torch.float32).clone()
        if self.rollout_rank == 0:
            if self._server is None:
                self._server = ray.get_actor(server_name(self.replica_rank))
            config = dict(peft_config) if peft_config is not None else None
            await self._server.update_weights.remote(state, global_steps, config, base_sync_done)
