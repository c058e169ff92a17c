"""``phantom verl doctor`` on this CPU machine, and the launcher's GPU preflight built on it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer")

from phantom.verl import gpu  # noqa: E402
from phantom.verl.doctor import Check, checks, failed, main, table  # noqa: E402
from phantom.verl.launch import launch  # noqa: E402
from phantom.verl.spec import make_spec  # noqa: E402


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    """No network, an empty HF cache, an empty artifacts cache and a working directory without data."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PHANTOM_ARTIFACTS", str(tmp_path / "artifacts"))  # not the checkout's cache


def _line(out: str, name: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(name + " "))


def test_doctor_on_this_cpu_machine_says_no_cuda_and_the_fix(offline, capsys):
    assert main(["--preset", "gpu_smoke"]) == 1
    out = capsys.readouterr().out
    cuda = _line(out, "CUDA")
    assert "FAIL" in cuda and "no CUDA" in cuda
    fix = out[out.index(cuda):].splitlines()[1]
    assert "-> fix:" in fix and "cpu_tiny" in fix and "pip install -e '.[gpu]'" in fix
    assert "FAIL" in _line(out, "vLLM") and "OK" in _line(out, "plugin") and "OK" in _line(out, "reward")
    assert "INFO" in _line(out, "attention") and "sdpa without remove-padding" in _line(out, "attention")
    assert "memory row 24 GB (no GPU on this machine" in out
    assert "HF_HUB_OFFLINE is set" in _line(out, "hub")  # the model is neither local nor cached
    assert "phantom data gsm8k" in out  # the data is not built here
    assert out.rstrip().endswith("check(s) failed")


def test_doctor_for_a_cpu_preset_passes_and_skips_the_gpu_lines(offline, capsys):
    assert main(["--preset", "cpu_tiny", "--json"]) == 0
    items = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert items["CUDA"]["status"] == "SKIP" and "no CUDA" in items["CUDA"]["found"]
    assert items["plugin"]["status"] == "OK" and "device cpu" in items["plugin"]["found"]
    assert items["model"]["status"] == "INFO" and "does not exist yet" in items["model"]["found"]  # built on first run


def test_doctor_reads_a_gpu_machine(offline):
    """The same checks on a described machine: an 80 GB card with an old driver and flash-attn."""
    spec = make_spec("gpu_smoke", check_inputs=False)
    hw = gpu.Hardware(gpus=(("NVIDIA A100-SXM4-80GB", 79.2),), flash_attn="2.8.3", flash_attn_error=None,
                      torch_cuda="13.0", driver="570.124", probed=True)
    items = {c.name: c for c in checks(spec, hw=hw, plugin=False) if c.name in ("CUDA", "driver", "attention")}
    assert items["CUDA"].status == "OK" and "A100" in items["CUDA"].found
    assert items["driver"].status == "FAIL" and "driver >= 580" in items["driver"].fix
    assert "flash_attention_2 with remove-padding" in items["attention"].found
    mem = [c for c in checks(spec, hw=hw, plugin=False) if c.name == "memory"][0]
    assert "memory row 80+ GB" in mem.found and "micro-batch 8" in mem.found


def test_table_format():
    text = table([Check("a", "OK", "fine"), Check("bb", "FAIL", "broken", "do this")])
    assert text.splitlines()[-1] == "1 check(s) failed" and "-> fix: do this" in text
    assert failed([Check("a", "WARN", "x", "y")]) == []


def test_gpu_launch_on_this_cpu_machine_fails_in_the_doctor_before_ray(offline, tmp_path, monkeypatch):
    from phantom.verl import launch as launch_mod

    def boom(*a, **k):
        raise AssertionError("verl was started")

    monkeypatch.setattr(launch_mod.subprocess, "Popen", boom)
    spec = make_spec("paper_gsm8k", check_inputs=False)
    with pytest.raises(RuntimeError, match="no CUDA") as err:
        launch(spec, "gpu_here", runs_dir=tmp_path / "runs", progress=False)
    assert "phantom data gsm8k" in str(err.value) and not (tmp_path / "runs" / "gpu_here").exists()
