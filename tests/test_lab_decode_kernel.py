"""phantom.lab.decode_kernel: the C decode-step attention gives torch's numbers bit for bit, or is not used."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

from phantom.lab import decode_kernel as dk
from phantom.lab.model import LabQwen2, ModelConfig
from phantom.lab.sft import PROFILES

needs_cc = pytest.mark.skipif(dk._compiler() is None, reason="no C compiler")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state with no library loaded and no shape checked, building into a temporary folder."""
    monkeypatch.setenv("PHANTOM_ARTIFACTS", str(tmp_path))
    monkeypatch.setattr(dk, "_LIB", None)
    monkeypatch.setattr(dk, "_LIB_ERROR", None)
    monkeypatch.setattr(dk, "_CHECKED", {})
    return tmp_path


@needs_cc
def test_kernel_reproduces_torch_for_every_profile_shape(fresh):
    lib = dk._library()
    assert lib is not None and lib.path.is_relative_to(fresh)
    shapes = {(p.model.heads, p.model.kv_heads, p.model.head_dim, p.model.max_positions) for p in PROFILES.values()}
    assert (4, 2, 24, 256) in shapes  # the lab's model
    for shape in shapes:
        assert dk.matches_torch(lib, *shape), shape


@needs_cc
def test_a_shape_it_does_not_reproduce_is_left_to_torch(fresh):
    """Four query heads per kv head: torch's bmm sums in another order there; the check must say so."""
    lib = dk._library()
    assert not dk.matches_torch(lib, 4, 1, 24, 64)
    with pytest.warns(RuntimeWarning, match="does not reproduce torch"):
        assert dk.kernel_for(4, 1, 24, 64) is None
    assert dk.describe(4, 1, 24, 64) == "torch"
    assert dk.describe(4, 2, 24, 64) == "c"


@needs_cc
def test_the_library_is_built_once_per_source_and_cpu(fresh):
    cc = dk._compiler()
    path = dk._build(cc)
    stamp = path.stat().st_mtime_ns
    assert dk._build(cc) == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def _model(cfg: ModelConfig, vocab: int = 60) -> LabQwen2:
    torch.manual_seed(0)
    m = LabQwen2(cfg, vocab).eval()
    with torch.no_grad():  # large weights: confident, varied logits, so rows end at different steps
        for p in m.parameters():
            p.add_(torch.randn(p.shape) * 0.3)
    return m


@needs_cc
@pytest.mark.parametrize("cfg", [ModelConfig(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, max_positions=96),
                                 ModelConfig(hidden=96, layers=3, heads=4, kv_heads=2, intermediate=256)])
def test_generation_is_identical_with_and_without_the_kernel(fresh, monkeypatch, cfg):
    """Sampled and greedy generation, repeated prompts of different lengths, rows ending (and leaving
    the batch) at different steps: the same tokens from both paths."""
    model = _model(cfg)
    prompts = [[3 + (i * 7) % 50] * (1 + i % 5) + [7, 8] for i in range(10) for _ in range(4)]
    runs = {}
    for path in ("torch", "c"):
        monkeypatch.setenv("PHANTOM_DECODE", path)
        sampled = model.generate(prompts, max_new=40, eos_id=5, pad_id=0, generator=torch.Generator().manual_seed(1))
        greedy = model.generate(prompts, max_new=40, eos_id=5, pad_id=0, greedy=True)
        runs[path] = (sampled, greedy)
    assert dk.kernel_for(cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.max_positions) is not None
    (toks, ended), _ = runs["c"]
    assert any(ended) and not all(ended) and len({len(t) for t in toks}) > 3  # rows did leave at different steps
    assert runs["c"] == runs["torch"]


def test_without_a_compiler_sampling_takes_torchs_path(fresh, monkeypatch):
    monkeypatch.setattr(dk, "_compiler", lambda: None)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        assert dk.kernel_for(4, 2, 24, 256) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not at every call
        assert dk.describe(4, 2, 24, 256) == "torch"
    model = _model(ModelConfig(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, max_positions=64))
    toks, _ = model.generate([[3, 4], [5]], max_new=6, eos_id=-1, pad_id=0, greedy=True)
    assert [len(t) for t in toks] == [6, 6]


def test_a_failing_build_falls_back_and_leaves_nothing(fresh, monkeypatch, tmp_path):
    bad = tmp_path / "cc"
    bad.write_text("#!/bin/sh\necho 'cc: broken' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setattr(dk, "_compiler", lambda: str(bad))
    with pytest.warns(RuntimeWarning, match="broken"):
        assert dk.kernel_for(4, 2, 24, 256) is None
    assert not list((fresh / "lab" / "kernels").glob("*"))


def test_phantom_decode_names_the_allowed_values(monkeypatch):
    monkeypatch.setenv("PHANTOM_DECODE", "cuda")
    with pytest.raises(ValueError, match=r"PHANTOM_DECODE='cuda' is unknown; allowed: c, torch"):
        dk.choice()
    monkeypatch.setenv("PHANTOM_DECODE", "torch")
    assert dk.kernel_for(4, 2, 24, 256) is None


@needs_cc
def test_the_zygote_warm_up_checks_every_profile_shape_in_one_thread(fresh, monkeypatch):
    from phantom.lab.sweep import PRELOAD, prepare_zygote

    assert "phantom.lab.sweep:prepare_zygote" in PRELOAD
    monkeypatch.setenv("PHANTOM_DECODE", "c")
    before = torch.get_num_threads()
    prepare_zygote()
    assert torch.get_num_threads() == before
    assert set(dk._CHECKED) == {(p.model.heads, p.model.kv_heads, p.model.head_dim, p.model.max_positions)
                                for p in PROFILES.values()}
    assert all(dk._CHECKED.values())


def test_compiler_lookup_honours_cc(monkeypatch):
    monkeypatch.setenv("CC", "definitely-not-a-compiler")
    found = dk._compiler()
    assert found != "definitely-not-a-compiler"
    assert found is None or shutil.which(found)
