"""phantom.verl.cpu without Ray: the batched generator, the batching server, the platform, the assets."""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl.workers.rollout.replica")

from phantom.verl.cpu.assets import ensure_tiny  # noqa: E402
from phantom.verl.cpu.platform import dedupe_backend  # noqa: E402
from phantom.verl.cpu.rollout import BatchGenerator, HFServer, Request  # noqa: E402
from phantom.verl.spec import tiny_root  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = ensure_tiny(tiny_root())
    model = AutoModelForCausalLM.from_pretrained(paths["model"], dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(paths["model"])
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {i}+{2 * i % 9}?"}],
                                       add_generation_prompt=True, tokenize=True)["input_ids"] for i in range(12)]
    return SimpleNamespace(paths=paths, model=model, tok=tok, prompts=prompts)


def test_assets_are_deterministic_and_verl_ready(tiny, tmp_path):
    again = ensure_tiny(tmp_path / "tiny")
    a = (tiny.paths["model"] / "model.safetensors").read_bytes()
    assert (again["model"] / "model.safetensors").read_bytes() == a
    assert tiny.tok.encode("\n", add_special_tokens=False).__len__() == 1  # verl's Qwen token builder
    assert tiny.tok.convert_tokens_to_ids("<|im_end|>") == tiny.tok.eos_token_id
    assert json.loads((tiny.paths["model"] / "config.json").read_text())["model_type"] == "qwen2"


def test_batched_greedy_equals_one_at_a_time(tiny):
    gen = BatchGenerator(tiny.model, {tiny.tok.eos_token_id}, tiny.tok.pad_token_id)
    reqs = [Request(p, max_tokens=5 + i % 7, temperature=0.0, logprobs=True) for i, p in enumerate(tiny.prompts)]
    batched = gen.generate(reqs)
    single = [gen.generate([r])[0] for r in reqs]
    assert [b["token_ids"] for b in batched] == [s["token_ids"] for s in single]
    for b, s, r in zip(batched, single, reqs):
        assert len(b["token_ids"]) <= r.max_tokens
        assert max(abs(x - y) for x, y in zip(b["log_probs"], s["log_probs"])) < 1e-4


def test_logprobs_are_the_actors_quantity(tiny):
    """log_softmax(logits / T) of the sampled token over the full vocabulary (what verl's actor recomputes)."""
    gen = BatchGenerator(tiny.model, set(), tiny.tok.pad_token_id, seed=3)
    p = tiny.prompts[0]
    out = gen.generate([Request(p, max_tokens=4, temperature=0.7, top_k=20, top_p=0.9)])[0]
    ids = torch.tensor([p + out["token_ids"]])
    with torch.no_grad():
        logits = tiny.model(input_ids=ids).logits[0, len(p) - 1:-1].float() / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out["token_ids"])[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(out["log_probs"]), ref, rtol=0, atol=1e-4)


def test_eos_and_top_k_one(tiny):
    gen = BatchGenerator(tiny.model, {tiny.tok.eos_token_id}, tiny.tok.pad_token_id)
    greedy = gen.generate([Request(tiny.prompts[1], max_tokens=8, temperature=0.0)])[0]["token_ids"]
    top1 = gen.generate([Request(tiny.prompts[1], max_tokens=8, temperature=1.3, top_k=1)])[0]["token_ids"]
    assert top1 == greedy
    eos = greedy[2]  # pretend the third greedy token is EOS: generation must stop right there
    stopped = BatchGenerator(tiny.model, {eos}, tiny.tok.pad_token_id).generate(
        [Request(tiny.prompts[1], max_tokens=8, temperature=0.0)])[0]["token_ids"]
    assert stopped == greedy[: greedy.index(eos) + 1]
    ignored = BatchGenerator(tiny.model, {eos}, tiny.tok.pad_token_id).generate(
        [Request(tiny.prompts[1], max_tokens=8, temperature=0.0, ignore_eos=True)])[0]["token_ids"]
    assert ignored == greedy


def _server(tiny, max_batch):
    from verl.workers.config import RolloutConfig

    cfg = RolloutConfig(name="hf", prompt_length=64, response_length=6, max_num_seqs=max_batch,
                        tensor_model_parallel_size=1)
    return HFServer(cfg, SimpleNamespace(path=str(tiny.paths["model"]), local_path=None), replica_rank=0)


@pytest.mark.parametrize("max_batch", [1024, 4, 1])
def test_server_batches_concurrent_requests(tiny, max_batch):
    server = _server(tiny, max_batch)
    params = {"temperature": 0, "logprobs": True, "top_p": 1.0, "top_k": -1}

    async def many():
        return await asyncio.gather(*(server.generate(p, params, request_id=str(i))
                                      for i, p in enumerate(tiny.prompts)))

    outs = asyncio.run(many())
    stats = server.get_stats()
    assert stats["requests"] == len(tiny.prompts)
    assert stats["batches"] == -(-len(tiny.prompts) // min(max_batch, len(tiny.prompts)))
    assert all(1 <= len(o.token_ids) <= 6 and len(o.log_probs) == len(o.token_ids) for o in outs)
    solo = BatchGenerator(server.gen.model, server.gen.eos_ids.tolist(), tiny.tok.pad_token_id)
    assert outs[5].token_ids == solo.generate([Request(tiny.prompts[5], max_tokens=6, temperature=0)])[0]["token_ids"]


def test_server_weight_sync(tiny):
    server = _server(tiny, 8)
    state = {k: v * 0 for k, v in server.gen.model.state_dict().items() if not k.endswith("lm_head.weight")}
    assert asyncio.run(server.update_weights(state, global_steps=3)) == len(state)
    assert server.weight_checksum() == 0.0 and server.global_steps == 3
    with pytest.raises(RuntimeError, match="weight sync mismatch"):
        asyncio.run(server.update_weights({"bogus": torch.zeros(1)}))


def test_dedupe_backend():
    assert dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert dedupe_backend("gloo") == "gloo" and dedupe_backend(None) is None

# The plugin loading in a fresh process (device cpu, gloo, the hf backend) is checked by the launcher's
# preflight: tests/test_verl_launch.py::test_preflight_checks_a_fresh_interpreter.


def _actor_with_trained_adapters(tiny):
    """A PEFT LoRA copy of the tiny model with non-zero adapters: what verl's FSDP actor holds after a step."""
    import copy

    from peft import LoraConfig, get_peft_model

    actor = get_peft_model(copy.deepcopy(tiny.model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                 task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    return actor.eval()


def test_server_takes_unmerged_lora_adapters_as_verl_sends_them(tiny, tmp_path, monkeypatch):
    from peft.utils.save_and_load import get_peft_model_state_dict

    monkeypatch.setenv("PHANTOM_SYNC_LOG", str(tmp_path / "sync.jsonl"))
    server = _server(tiny, 8)
    actor = _actor_with_trained_adapters(tiny)
    cfg = actor.peft_config["default"].to_dict()
    # verl's base sync (base_sync_done=False): frozen weights, wrapped layers named ...base_layer.weight
    base = {k: v.clone() for k, v in actor.base_model.model.state_dict().items() if "lora_" not in k}
    assert any(".base_layer." in k for k in base)
    asyncio.run(server.update_weights(base, global_steps=1, peft_config=cfg, base_sync_done=False))
    before = server.weight_checksum()
    adapters = get_peft_model_state_dict(actor)  # then adapters only (base_sync_done=True), every step
    assert all("lora_" in k for k in adapters)
    asyncio.run(server.update_weights(adapters, global_steps=1, peft_config=cfg, base_sync_done=True))
    assert server.weight_checksum() != before and server.syncs == ["base", "adapter"]
    prompt = tiny.prompts[3]
    out = asyncio.run(server.generate(prompt, {"temperature": 0, "logprobs": True, "max_tokens": 6}))
    ids = torch.tensor([prompt + out.token_ids[:-1]])
    with torch.no_grad():
        want = torch.log_softmax(actor(input_ids=ids).logits[0, len(prompt) - 1:], -1)
        plain = torch.log_softmax(tiny.model(input_ids=ids).logits[0, len(prompt) - 1:], -1)
    idx = torch.tensor(out.token_ids)[:, None]
    got = torch.tensor(out.log_probs)
    assert torch.allclose(got, want.gather(-1, idx).squeeze(-1), atol=1e-4)  # the adapted policy samples
    assert not torch.allclose(got, plain.gather(-1, idx).squeeze(-1), atol=1e-3)  # not the base model
    lines = [json.loads(x) for x in (tmp_path / "sync.jsonl").read_text().splitlines()]
    assert [x["mode"] for x in lines] == ["base", "adapter"] and lines[1]["lora_rank"] == 4
    with pytest.raises(RuntimeError, match="adapter sync mismatch"):
        asyncio.run(server.update_weights({"bogus.lora_A.weight": torch.zeros(1)}, peft_config=cfg))
    with pytest.raises(RuntimeError, match="full weights arrived after LoRA"):
        asyncio.run(server.update_weights(base))
    # load_format != dummy (verl's base_sync_done starts True): adapters only, on the base read from disk
    disk = _server(tiny, 8)
    asyncio.run(disk.update_weights(adapters, peft_config=cfg, base_sync_done=True))
    again = asyncio.run(disk.generate(prompt, {"temperature": 0, "logprobs": True, "max_tokens": 6}))
    assert disk.syncs == ["adapter"] and again.token_ids == out.token_ids
    assert torch.allclose(torch.tensor(again.log_probs), got, atol=1e-5)


def test_lab_decoder_samples_the_transformers_model(tmp_path):
    """For a checkpoint the lab wrote, the server's lab decoder gives transformers' greedy tokens and the
    log-probabilities transformers' Qwen2 assigns to what it samples (the quantity verl's actor recomputes)."""
    from transformers import AutoModelForCausalLM

    from phantom.lab.model import LabQwen2, ModelConfig, save_checkpoint
    from phantom.verl.cpu.labdecode import LabDecoder, usable

    torch.manual_seed(0)
    torch.set_num_threads(1)
    lab_model = LabQwen2(ModelConfig(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, max_positions=64), 40)
    save_checkpoint(lab_model, tmp_path, eos_id=1, pad_id=0, meta={"profile": "test"})
    assert usable(tmp_path) and not usable(tmp_path / "missing")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="sdpa")
    dec = LabDecoder(tmp_path, {1}, 0, torch.Generator().manual_seed(0))
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    greedy = [Request(p, max_tokens=12, temperature=0.0, logprobs=True) for p in prompts]
    want = BatchGenerator(hf, {1}, 0).generate(greedy)
    got = dec.generate(greedy)
    assert [g["token_ids"] for g in got] == [w["token_ids"] for w in want]
    for g, w in zip(got, want):
        assert max(abs(x - y) for x, y in zip(g["log_probs"], w["log_probs"])) < 1e-5
    sampled = dec.generate([Request(p, max_tokens=10, temperature=1.0, logprobs=True) for p in prompts * 5])
    for p, s in zip(prompts * 5, sampled):
        ids = torch.tensor([p + s["token_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(hf(input_ids=ids).logits[0, len(p) - 1:-1].float(), dim=-1)
        ref = logp.gather(-1, torch.tensor(s["token_ids"])[:, None])[:, 0]
        assert torch.allclose(torch.tensor(s["log_probs"]), ref, atol=1e-5)
    assert not dec.supports(Request([5], max_tokens=4, temperature=0.7))  # other temperatures: transformers' path
    assert not dec.supports(Request([5], max_tokens=4, temperature=1.0, top_k=20))


@pytest.mark.parametrize("dapo_metric", [None, "default", "acc"])
def test_fast_poll_sampler_is_verls_own_buffer(dapo_metric, tmp_path):
    """trainer.v1.sampler.custom_sampler -> verl's ReplayBuffer built by verl's own _build_replay_buffer, the
    same in every attribute but poll_interval (the filter's metric, refill and generation unit are verl's)."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from phantom.verl.cpu.sampler import POLL_S
    from phantom.verl.spec import compose, make_spec, to_overrides

    fields = {"dapo": True, "dapo_metric": dapo_metric} if dapo_metric else {}
    spec = make_spec("cpu_tiny", check_inputs=False, arm="none", **fields)
    o = to_overrides(spec, tmp_path / "r", "r")
    assert "trainer.v1.sampler.custom_sampler.name=fast_poll_replay_buffer" in o

    class Trainer:  # the three members _build_replay_buffer reads, taken from verl's own PPOTrainer
        _build_replay_buffer = PPOTrainer._build_replay_buffer
        _resolve_filter_groups_metric = PPOTrainer._resolve_filter_groups_metric

        def __init__(self, cfg):
            self.config, self.trainer_mode = cfg, "sync"

        def _add_prompts_to_generate(self, n):
            return n

    ours = Trainer(compose(o))._build_replay_buffer()
    verls = Trainer(compose([x for x in o if ".custom_sampler." not in x]))._build_replay_buffer()
    assert type(ours) is type(verls) is ReplayBuffer
    a, b = dict(vars(ours)), dict(vars(verls))
    assert (a.pop("poll_interval"), b.pop("poll_interval")) == (POLL_S, 2.0)
    a.pop("refill_fn"), b.pop("refill_fn")
    assert a.keys() == b.keys() and all(repr(a[k]) == repr(b[k]) for k in a)
    assert a["filter_groups_metric"] == ({"default": "reward", "acc": "acc"}[dapo_metric] if dapo_metric else None)


def test_cpu_workers_environment_reaches_ray_as_strings(tmp_path, monkeypatch):
    """The CPU backend's worker environment (torch threads, the transfer queue's threads and log level) is
    composed into verl's ray_kwargs and accepted by Ray's own runtime-env validation (strings only)."""
    from omegaconf import OmegaConf
    from ray.runtime_env import RuntimeEnv

    from phantom.verl.plan import make_plan
    from phantom.verl.spec import compose, make_spec, to_overrides

    monkeypatch.setenv("PHANTOM_VERL_THREADS", "3")
    spec = make_spec("cpu_tiny", check_inputs=False)
    plan = make_plan(spec)
    assert plan.threads == 3 and plan.manifest()["plan"]["torch_threads"] == 3
    env = OmegaConf.to_container(compose(to_overrides(spec, tmp_path / "r", "r", plan)).ray_kwargs.ray_init.runtime_env)
    RuntimeEnv(**env)  # raises TypeError on a non-string value
    assert {k: env["env_vars"][k] for k in ("OMP_NUM_THREADS", "TQ_NUM_THREADS", "TQ_CLIENT_ZMQ_IO_THREADS")} == \
        {"OMP_NUM_THREADS": "3", "TQ_NUM_THREADS": "1", "TQ_CLIENT_ZMQ_IO_THREADS": "1"}


@pytest.mark.parametrize("raw", ["0", "two", "-1"])
def test_bad_thread_count_names_the_value(raw, monkeypatch):
    from phantom.verl.plan import cpu_threads

    monkeypatch.setenv("PHANTOM_VERL_THREADS", raw)
    with pytest.raises(ValueError, match=rf"PHANTOM_VERL_THREADS='{raw}' is invalid; allowed: a positive integer"):
        cpu_threads()


def test_default_threads_are_the_usable_cores_capped(monkeypatch):
    from phantom.verl.plan import MAX_THREADS, cpu_threads

    monkeypatch.delenv("PHANTOM_VERL_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)))
    assert cpu_threads() == MAX_THREADS == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert cpu_threads() == 2


def test_rollout_logprobs_override_in_results_verl_composes(tmp_path):
    """benchmarks/results_verl.md prints verl's bypass mode (π_old = the rollout server's log-probs) as an
    opt-in: it composes with the CPU backend's overrides, and the default still recomputes π_old."""
    import re
    from pathlib import Path

    from phantom.verl.spec import compose, make_spec, to_overrides

    doc = (Path(__file__).resolve().parents[1] / "benchmarks" / "results_verl.md").read_text()
    printed = re.search(r'--set "extra_overrides=\[(.+?)\]"', doc).group(1)
    assert printed == "algorithm.rollout_correction.bypass_mode=True"
    on = make_spec("cpu_lab", check_inputs=False, extra_overrides=(printed,))
    assert compose(to_overrides(on, tmp_path / "r", "r")).algorithm.rollout_correction.bypass_mode is True
    off = make_spec("cpu_lab", check_inputs=False)
    assert compose(to_overrides(off, tmp_path / "r", "r")).algorithm.rollout_correction.bypass_mode is False
