"""The book's warm start ships under data/warmstart/ (issue 45): it loads, its files are the ones its
manifest records, its held-out accuracy is the recorded one, its recipe is the one the code would run
today, and lab runs start from it without training anything."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from phantom.lab.sft import (  # noqa: E402
    CODE_VERSION,
    ensure_sft_model,
    evaluate,
    load_sft,
    locate_sft,
    resolve_sft,
    shipped_sft,
)
from phantom.lab.task import TaskConfig, make_split  # noqa: E402
from phantom.lab.warmstart import checkpoint_hashes, compare_with_shipped, ship_warm_start  # noqa: E402
from phantom.paths import artifacts_base, checkout, shipped_warmstarts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "warmstart"
MANIFEST = json.loads((SHIPPED / "manifest.json").read_text())


def _book_profile() -> str:
    from phantom.lab.sweep import load_sweep

    return load_sweep("paper")["base"]["model"]


def test_the_book_sweep_starts_from_a_shipped_warm_start():
    cfg = resolve_sft(_book_profile())
    path = shipped_sft(cfg)
    assert path is not None and path.parent == SHIPPED
    assert path.name in MANIFEST
    assert locate_sft(cfg) == path


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_shipped_files_are_the_recorded_ones(name):
    entry = MANIFEST[name]
    assert checkpoint_hashes(SHIPPED / name) == entry["sha256"]
    assert (SHIPPED / name / "model.safetensors").stat().st_size < 2_000_000  # ~1.4 MB: 0.35M float32


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_recorded_recipe_is_the_one_the_code_runs(name):
    entry = MANIFEST[name]
    cfg = resolve_sft({"profile": entry["profile"], "seed": entry["seed"]})
    assert entry["key"] == cfg.key() and name == f"sft-{cfg.profile}-{cfg.key()}"
    assert entry["code_version"] == CODE_VERSION
    assert entry["config"] == json.loads(json.dumps(asdict(cfg), default=list))
    parent = cfg.parent()
    assert entry["init"] == ({"profile": parent.profile, "key": parent.key()} if parent else None)
    assert entry["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert entry["rebuild"] == f"phantom lab sft --profile {cfg.profile} --seed {cfg.seed}"
    assert {"cpu", "arch"} <= set(entry["machine"])


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_shipped_checkpoint_loads_and_scores_as_recorded(name):
    entry = MANIFEST[name]
    model, tok, meta = load_sft(SHIPPED / name)
    assert sum(p.numel() for p in model.parameters()) == entry["params"] == meta["params"]
    val = make_split(TaskConfig.from_dict(meta["val_task"]), "val", entry["val_n"])
    res = evaluate(model, tok, val, max_new=entry["config"]["max_new"])
    # greedy decoding of the same weights: the same answers on any CPU (a tie in the last bit aside)
    assert res.acc == pytest.approx(entry["val_greedy_acc"], abs=2 / entry["val_n"])
    assert res.mean_len == pytest.approx(entry["val_greedy_len_chars"], rel=0.02)


def test_ensure_returns_the_shipped_copy_without_building(tmp_path, monkeypatch):
    monkeypatch.setenv("PHANTOM_ARTIFACTS", str(tmp_path / "art"))
    cfg = resolve_sft(_book_profile())
    assert ensure_sft_model(cfg, progress=False) == shipped_sft(cfg)
    assert not (tmp_path / "art").exists()  # nothing built, nothing cached


def test_ship_and_compare_round_trip(tmp_path, monkeypatch):
    """ship_warm_start records the files it copies; compare_with_shipped sees a copy as identical."""
    src = next(p for p in SHIPPED.iterdir() if p.is_dir())
    dest = tmp_path / "warmstart"
    out = ship_warm_start(src, dest)
    entry = json.loads((dest / "manifest.json").read_text())[src.name]
    assert entry["sha256"] == checkpoint_hashes(out) == MANIFEST[src.name]["sha256"]
    monkeypatch.setattr("phantom.lab.warmstart.shipped_warmstarts", lambda: dest)
    cmp = compare_with_shipped(src)
    assert cmp is not None and cmp["identical"] is True


def test_artifacts_cache_does_not_depend_on_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PHANTOM_ARTIFACTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert checkout() == ROOT
    assert artifacts_base() == ROOT / "artifacts"  # the checkout's, wherever the shell is
    assert shipped_warmstarts() == SHIPPED
    monkeypatch.setenv("PHANTOM_ARTIFACTS", "rel/art")
    assert artifacts_base() == (tmp_path / "rel" / "art").resolve()
    assert artifacts_base(tmp_path / "given") == (tmp_path / "given").resolve()


def test_artifacts_without_a_checkout_go_to_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("PHANTOM_ARTIFACTS", raising=False)
    monkeypatch.setattr("phantom.paths.checkout", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert artifacts_base() == (tmp_path / "cache" / "phantom").resolve()


def test_a_build_announces_itself_and_leaves_no_lock(tmp_path, capsys):
    """A warm start that is not shipped is trained once; the user is told what, how long and where."""
    path = ensure_sft_model("tiny", root=tmp_path)
    err = capsys.readouterr().err
    assert "building the warm start 'tiny'" in err and str(path) in err and "under a minute" in err
    assert not list(path.parent.glob(".*.lock")) and not list(path.parent.glob(".*.tmp*"))
    assert ensure_sft_model("tiny", root=tmp_path) == path  # reused: no second announcement
    assert "building" not in capsys.readouterr().err
