"""phantom.lab tokenizer, Qwen2 model and SFT checkpoint: equal to transformers, loadable by it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from phantom.lab.model import LabQwen2, ModelConfig, load_checkpoint, save_checkpoint
from phantom.lab.sft import ensure_sft_model, load_sft, resolve_sft
from phantom.lab.task import TaskConfig, make_split
from phantom.lab.tokenizer import LabTokenizer, TokenizerConfig, save_tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tok = train_tokenizer(TokenizerConfig(vocab_size=320, corpus=600))
    save_tokenizer(tok, d, model_max_length=128)
    # AutoTokenizer reads model_type from config.json, as verl's loader does
    model = LabQwen2(ModelConfig(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, max_positions=128),
                     tok.get_vocab_size())
    lt = LabTokenizer(tok)
    save_checkpoint(model, d, eos_id=lt.eos_id, pad_id=lt.pad_id)
    return d


def test_tokenizer_contract(tokdir):
    at = transformers.AutoTokenizer.from_pretrained(tokdir)
    lt = LabTokenizer.load(tokdir)
    assert type(at).__name__ == "Qwen2Tokenizer"
    assert at.encode("\n", add_special_tokens=False) == lt.encode("\n") and len(lt.encode("\n")) == 1
    assert at.eos_token == "<|im_end|>" and at.eos_token_id == lt.eos_id
    assert at.pad_token_id == lt.pad_id and at.pad_token_id != at.eos_token_id
    assert at.encode("<|im_end|>", add_special_tokens=False) == [lt.eos_id]
    for p in make_split(TaskConfig(terms=(2, 6), wording="mixed"), "val", 60):
        text = p.prompt + p.solution
        assert at.encode(text, add_special_tokens=False) == lt.encode(text)
        assert lt.decode(lt.encode(text) + [lt.eos_id]) == text
        msgs = [{"role": "user", "content": p.prompt}]
        assert at.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == p.prompt
        ids = at.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert list(ids) == lt.encode(p.prompt)


def test_digits_are_single_tokens(tokdir):
    lt = LabTokenizer.load(tokdir)
    for ch in "0123456789":
        assert len(lt.encode(ch)) == 1
    assert len(lt.encode("12345")) == 5


def test_logits_equal_transformers_qwen2(tokdir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(tokdir).eval()
    assert hf.config.model_type == "qwen2"
    ours = load_checkpoint(tokdir).eval()
    with torch.no_grad():  # perturb all weights so the test cannot pass on a symmetric init
        g = torch.Generator().manual_seed(0)
        for p in ours.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        hf.load_state_dict(ours.state_dict(), strict=False)
        hf.tie_weights()
    ids = torch.randint(3, ours.vocab_size, (3, 17))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, :6] = False  # left padding
    valid[2, :3] = False
    ids[~valid] = 0
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = ours(ids, pos, valid)
        b = hf(input_ids=ids, attention_mask=valid.long(), position_ids=pos).logits
    torch.testing.assert_close(a[valid], b[valid], rtol=1e-5, atol=1e-5)


def test_kv_cache_generation_equals_full_forward_and_hf(tokdir):
    model = load_checkpoint(tokdir).eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tokdir).eval()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [20, 21]]
    toks, _ = model.generate(prompts, max_new=12, eos_id=-1, pad_id=0, greedy=True)
    for p, r in zip(prompts, toks):
        assert len(r) == 12
        with torch.no_grad():
            seq = list(p)
            for _ in range(12):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
            ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        assert seq[len(p):] == r
        assert ref[0, len(p):].tolist() == r


def test_repeated_prompts_share_one_prefill_and_decode_independently(tokdir):
    """A rollout batch repeats each prompt G times; the prefill runs once per distinct prompt and its
    cache rows are copied to the repeats. Greedy rows must equal the distinct prompts' own (a wrong
    copy changes the answer), and sampled repeats must not share one cache (they sample apart)."""
    model = load_checkpoint(tokdir).eval()
    distinct = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
    order = [1, 0, 1, 2, 0, 0, 2, 1]
    prompts = [distinct[k] for k in order]
    alone, _ = model.generate(distinct, max_new=10, eos_id=-1, pad_id=0, greedy=True)
    rep, _ = model.generate(prompts, max_new=10, eos_id=-1, pad_id=0, greedy=True)
    assert rep == [alone[k] for k in order]
    toks, _ = model.generate(prompts, max_new=10, eos_id=-1, pad_id=0, generator=torch.Generator().manual_seed(3))
    assert len({tuple(t) for t in toks}) > len(distinct)


def test_sampling_logprobs_match_response_logprobs(tokdir):
    """Finished rows are dropped from the decode batch mid-way; scores of what was sampled must agree."""
    model = load_checkpoint(tokdir).eval()
    prompts = [[5 + i % 7] * (2 + i % 4) for i in range(24)]
    # the token this random model samples most often serves as EOS, so rows end at different times
    toks, _ = model.generate(prompts, max_new=16, eos_id=-1, pad_id=0, generator=torch.Generator().manual_seed(1))
    eos = int(torch.tensor(sum(toks, [])).bincount().argmax())
    toks, ended = model.generate(prompts, max_new=16, eos_id=eos, pad_id=0, generator=torch.Generator().manual_seed(1))
    assert any(ended) and not all(ended)  # rows finish at different times
    resp = [t + [eos] if e else t for t, e in zip(toks, ended)]
    with torch.no_grad():
        logp, mask, _ = model.response_logprobs(prompts, resp, pad_id=0)
        for i in (0, 5, 11):
            seq = prompts[i] + resp[i]
            full = torch.log_softmax(model(torch.tensor([seq]))[0], -1)
            ref = full[len(prompts[i]) - 1:-1].gather(-1, torch.tensor(resp[i])[:, None])[:, 0]
            torch.testing.assert_close(logp[i, : len(resp[i])], ref, rtol=1e-5, atol=1e-5)
            assert int(mask[i].sum()) == len(resp[i])


@pytest.mark.slow
def test_sft_checkpoint_is_cached_deterministic_and_loadable(tmp_path):
    p1 = ensure_sft_model("tiny", root=tmp_path / "a", progress=False)
    p2 = ensure_sft_model("tiny", root=tmp_path / "b", progress=False)
    assert p1.name == p2.name and p1.name.startswith("sft-tiny-")
    assert (p1 / "model.safetensors").read_bytes() == (p2 / "model.safetensors").read_bytes()
    mtime = (p1 / "model.safetensors").stat().st_mtime_ns
    assert ensure_sft_model("tiny", root=tmp_path / "a", progress=False) == p1
    assert (p1 / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert json.loads((p1 / "generation_config.json").read_text())["eos_token_id"] == LabTokenizer.load(p1).eos_id
    hf = transformers.AutoModelForCausalLM.from_pretrained(p1)
    assert hf.config.model_type == "qwen2" and hf.config.tie_word_embeddings
    model, tok, meta = load_sft(p1)
    assert meta["config"]["profile"] == "tiny" and 0.0 <= meta["val_greedy_acc"] <= 1.0
    other = ensure_sft_model({"profile": "tiny", "seed": 1}, root=tmp_path / "a", progress=False)
    assert other != p1


def test_bad_sft_profile():
    with pytest.raises(ValueError, match="allowed: lab"):
        resolve_sft("huge")
    with pytest.raises(ValueError, match="not allowed"):
        resolve_sft({"profile": "tiny", "hidden": 64})


def test_lora_adapters_start_at_the_base_and_generation_uses_them(tokdir):
    model = load_checkpoint(tokdir).eval()
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    base, _ = model.generate(prompts, max_new=8, eos_id=-1, pad_id=0, greedy=True)
    params = model.enable_lora(rank=4, alpha=8.0)
    assert all(p.requires_grad for p in params) and len(params) == 2 * 7 * model.cfg.layers
    assert [p for p in model.parameters() if p.requires_grad] == params
    assert model.generate(prompts, max_new=8, eos_id=-1, pad_id=0, greedy=True)[0] == base  # B = 0
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g))
    toks, _ = model.generate(prompts, max_new=8, eos_id=-1, pad_id=0, greedy=True)
    assert toks != base
    for p, r in zip(prompts, toks):
        seq = list(p)
        with torch.no_grad():
            for _ in range(8):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert seq[len(p):] == r


def test_bucketed_scoring_equals_one_padded_batch(tokdir):
    """Length buckets change the padding only: every row's log-probs, entropies and gradients agree."""
    model = load_checkpoint(tokdir)
    params = model.enable_lora(rank=2, alpha=4.0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in params:
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    prompts = [[5 + i % 7] * (2 + i % 5) for i in range(70)]
    responses = [[3 + (i * j) % 11 for j in range(i % 23)] for i in range(70)]  # lengths 0..22, one empty
    out, grads = {}, {}
    for nb in (1, 4):
        logp, mask, ent = model.response_logprobs(prompts, responses, pad_id=0, with_entropy=True, buckets=nb)
        model.zero_grad()
        ((logp * mask).sum() + (ent * mask).sum()).backward()
        out[nb] = (logp.detach(), mask, ent.detach())
        grads[nb] = [p.grad.clone() for p in params]
    assert torch.equal(out[1][1], out[4][1]) and out[4][0].shape == (70, 22)
    m = out[1][1]
    torch.testing.assert_close(out[1][0][m], out[4][0][m], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1][2][m], out[4][2][m], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads[1], grads[4]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_sampling_follows_the_softmax_and_never_draws_impossible_tokens():
    from phantom.lab.model import sample_tokens

    logits = torch.tensor([[0.0, 1.0, float("-inf"), 2.0, float("-inf")]]).repeat(20000, 1)
    draws = sample_tokens(logits, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert freq[2] == 0 and freq[4] == 0  # -inf logits: a flat CDF step, unreachable
    torch.testing.assert_close(freq[[0, 1, 3]], torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0), atol=0.01, rtol=0)
    hot = sample_tokens(torch.tensor([[0.0, 3.0, 0.0]]).repeat(5000, 1), 0.25, torch.Generator().manual_seed(1))
    assert (hot == 1).float().mean() > 0.99  # low temperature sharpens


@pytest.mark.slow
def test_a_continuation_profile_starts_from_its_parent(tmp_path, monkeypatch):
    """`init`: the child reuses the parent's tokenizer and weights, and its key follows the parent's."""
    import dataclasses

    from phantom.lab import sft

    child = dataclasses.replace(sft.PROFILES["tiny"], profile="tiny_child", init="tiny", steps=3,
                                task=TaskConfig(style="terse"))
    monkeypatch.setitem(sft.PROFILES, "tiny_child", child)
    path = ensure_sft_model("tiny_child", root=tmp_path, progress=False)
    parent = sft.sft_dir(sft.resolve_sft("tiny"), tmp_path)
    assert (parent / "lab_meta.json").is_file()  # built on the way
    assert (path / "tokenizer.json").read_text() == (parent / "tokenizer.json").read_text()
    meta = json.loads((path / "lab_meta.json").read_text())
    assert meta["init"] == {"profile": "tiny", "key": sft.resolve_sft("tiny").key()} and meta["steps_trained"] == 3
    # another SFT seed continues from the parent built with that seed
    other = sft.resolve_sft({"profile": "tiny_child", "seed": 4})
    assert other.parent().seed == 4 and other.key() != child.key()
    before = child.key()
    monkeypatch.setitem(sft.PROFILES, "tiny", dataclasses.replace(sft.PROFILES["tiny"], lr=1e-3))
    assert child.key() != before  # a changed parent is a new child


@pytest.mark.slow
def test_target_accuracy_stops_training(tmp_path, monkeypatch):
    import dataclasses

    from phantom.lab import sft

    cfg = dataclasses.replace(sft.PROFILES["tiny"], steps=40, target_acc=0.5, check_every=5, check_n=4, min_steps=10)
    calls = []

    def fake_eval(model, tok, problems, **kw):
        calls.append(problems[0].index)
        return sft.EvalResult(texts=[""] * len(problems), correct=np.ones(len(problems), dtype=bool),
                              lengths=np.zeros(len(problems)), tokens=np.zeros(len(problems)),
                              ended=np.ones(len(problems), dtype=bool))

    monkeypatch.setattr(sft, "evaluate", fake_eval)
    meta = sft.train_sft(cfg, tmp_path / "ck", progress=False)
    assert meta["steps_trained"] == 10 and meta["reached_target"] is True  # checks at 5 and 10; min_steps 10
    assert calls[0] == sft.CHECK_START  # the check set is not the RL held-out set (indices 0..eval_n-1)
