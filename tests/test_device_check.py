"""scripts/device_check.py in its CPU dry-run mode: the same code a lent GPU machine runs, at toy shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run_writes_every_part_as_json(tmp_path):
    out = tmp_path / "dc"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), str(out), "--dry-run"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["device"] == "cpu"
    assert {k: v["status"] for k, v in summary["parts"].items()} == dict.fromkeys(
        ("inventory", "parity", "attention", "memory"), "ok")
    inv = json.loads((out / "inventory.json").read_text())
    assert inv["torch"] and inv["cuda_available"] is False and "installed" in inv["vllm"]
    att = json.loads((out / "attention.json").read_text())
    assert att["sdpa"]["loaded"] and att["sdpa"]["forward"]
    assert att["flash_attention_2"]["loaded"] is False and "FlashAttention2" in att["flash_attention_2"]["error"]
    mem = json.loads((out / "memory.json").read_text())
    cases = [c for c in mem["cases"] if "loss" in c]
    assert {(c["model"], c["micro"]) for c in cases} == {(m, b) for m in ("qwen2.5-1.5b", "qwen2.5-7b") for b in (8, 2)}
    assert all(c["lora_layers"] == 14 and c["trainable_params"] > 0 for c in cases)  # 7 linears x 2 layers
    par = json.loads((out / "parity.json").read_text())
    assert par["all_equal"] and par["group_advantages/outcome/std"]["phantom_groups"] > 0
    assert par["compute_score"]["right"]["acc"] == 1 and par["compute_score"]["wrong"]["acc"] == 0


def test_without_cuda_and_without_dry_run_it_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run for real")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
