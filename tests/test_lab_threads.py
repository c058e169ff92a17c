"""One arm on more than one torch thread: the count's parsing, the bit-for-bit probe and its fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from phantom.lab import threads as th
from phantom.lab.rl import Trainer, run_arm
from phantom.lab.spec import ArmSpec
from phantom.runs import read_metrics

TINY = dict(model="tiny", steps=3, prompts=4, rollouts=4, eval_n=8, eval_every=2, max_new=24)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from phantom.lab.sft import ensure_sft_model

    mp = pytest.MonkeyPatch()
    mp.setenv("PHANTOM_ARTIFACTS", str(tmp_path_factory.mktemp("artifacts")))
    yield ensure_sft_model("tiny", progress=False)
    mp.undo()


@pytest.mark.parametrize("raw, want", [("1", 1), ("3", 3), (" 2 ", 2), (4, 4)])
def test_thread_counts_parse(raw, want):
    assert th.parse_threads(raw) == want


def test_auto_is_the_usable_cpus_at_most_two(monkeypatch):
    for cpus, want in ((1, 1), (2, 2), (16, 2)):
        monkeypatch.setattr(th, "available_cpus", lambda cpus=cpus: cpus)
        assert th.parse_threads("auto") == want


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", ""])
def test_bad_thread_counts_name_the_value_and_the_allowed_ones(raw):
    with pytest.raises(ValueError, match=r"threads=.*invalid; allowed: a positive integer or 'auto'"):
        th.parse_threads(raw)


def test_the_environment_sets_the_default(monkeypatch):
    monkeypatch.delenv(th.ENV, raising=False)
    assert th.lab_threads() == 1 and th.lab_threads(default=2) == 2
    monkeypatch.setenv(th.ENV, "2")
    assert th.lab_threads() == 2
    monkeypatch.setenv(th.ENV, "many")
    with pytest.raises(ValueError, match="PHANTOM_LAB_THREADS='many' is invalid"):
        th.lab_threads()


def test_sweep_cells_stay_on_one_thread(tmp_path, monkeypatch):
    """Two cells share two cores: a user's PHANTOM_LAB_THREADS=2 must not reach them."""
    from phantom.lab.sweep import _cell_env

    monkeypatch.setenv(th.ENV, "2")
    assert _cell_env(tmp_path)[th.ENV] == "1"


@pytest.mark.slow
def test_probe_leaves_the_model_and_the_thread_count_as_they_were(tiny_ckpt, monkeypatch):
    from phantom.lab.sft import load_sft

    model, tok, _ = load_sft(tiny_ckpt)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(th, "_VERDICTS", {})
    torch.set_num_threads(1)
    rng = torch.get_rng_state()
    verdict = th.threads_agree(model, pad_id=tok.pad_id, eos_id=tok.eos_id, threads=2)
    assert isinstance(verdict, bool) and torch.get_num_threads() == 1
    assert torch.equal(torch.get_rng_state(), rng)  # the probe draws from its own generator only
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert len(th._VERDICTS) == 1  # asked again, it answers from the cache
    assert th.threads_agree(model, pad_id=tok.pad_id, eos_id=tok.eos_id, threads=2) is verdict


@pytest.mark.slow
def test_probe_says_no_when_a_number_differs(tiny_ckpt, monkeypatch):
    from phantom.lab.sft import load_sft

    model, tok, _ = load_sft(tiny_ckpt)
    real = th._fingerprint

    def drifting(*a, threads, **k):  # stands in for a BLAS that splits a sum on two threads
        out = real(*a, threads=threads, **k)
        return out if threads == 1 else [out[0], out[1] + 1, *out[2:]]

    monkeypatch.setattr(th, "_VERDICTS", {})
    monkeypatch.setattr(th, "_fingerprint", drifting)
    assert th.threads_agree(model, pad_id=tok.pad_id, eos_id=tok.eos_id, threads=2) is False
    assert th.threads_agree(model, pad_id=tok.pad_id, eos_id=tok.eos_id, threads=1) is True  # nothing to compare


@pytest.mark.slow
def test_an_arm_falls_back_to_one_thread_when_the_probe_says_no(tiny_ckpt, monkeypatch):
    import phantom.lab.rl as rl

    monkeypatch.setattr(rl, "threads_agree", lambda *a, **k: False)
    with pytest.warns(RuntimeWarning, match="2 torch threads change this model's numbers"):
        tr = Trainer(ArmSpec.from_dict(TINY), tiny_ckpt, threads=2)
    assert (tr.threads_asked, tr.threads, torch.get_num_threads()) == (2, 1, 1)
    with pytest.raises(ValueError, match="threads=0 is invalid; allowed: a positive integer"):
        Trainer(ArmSpec.from_dict(TINY), tiny_ckpt, threads=0)


@pytest.mark.slow
def test_two_threads_log_what_one_logs(tiny_ckpt, tmp_path):
    """The promise the probe guards: a run folder does not depend on the thread count it ran on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        one = run_arm({**TINY, "arm": "none", "seed": 2}, name="one", root=tmp_path, progress=False, threads=1)
        two = run_arm({**TINY, "arm": "none", "seed": 2}, name="two", root=tmp_path, progress=False, threads=2)
    assert one.manifest()["threads"] == {"asked": 1, "used": 1}
    assert two.manifest()["threads"]["asked"] == 2 and two.manifest()["threads"]["used"] in (1, 2)
    a, b = read_metrics(one.path), read_metrics(two.path)
    cols = [c for c in a.columns if not c.startswith("timing_s/")]
    assert list(a.columns) == list(b.columns) and a[cols].equals(b[cols])


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phantom.cli", "lab", "run", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_cli_rejects_bad_thread_counts_before_any_work(tmp_path):
    r = _cli("--threads", "0", "--runs-dir", str(tmp_path))
    assert r.returncode == 2 and "--threads='0' is invalid; allowed: a positive integer or 'auto'" in r.stderr
    r = _cli("--runs-dir", str(tmp_path), env={th.ENV: "lots"})
    assert r.returncode == 2 and "PHANTOM_LAB_THREADS='lots' is invalid" in r.stderr
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_sft_thread_count_takes_the_same_values(monkeypatch):
    from phantom.lab import sft

    monkeypatch.delenv("PHANTOM_SFT_THREADS", raising=False)
    assert sft.sft_threads() == sft.SFT_THREADS
    monkeypatch.setenv("PHANTOM_SFT_THREADS", "1")
    assert sft.sft_threads() == 1
    monkeypatch.setattr(th, "available_cpus", lambda: 1)
    monkeypatch.setenv("PHANTOM_SFT_THREADS", "auto")
    assert sft.sft_threads() == 1
    monkeypatch.setenv("PHANTOM_SFT_THREADS", "0")
    with pytest.raises(ValueError, match=r"PHANTOM_SFT_THREADS='0' is invalid; allowed: a positive integer or 'auto'"):
        sft.sft_threads()


def test_cli_sft_rejects_a_bad_thread_count_before_building(tmp_path):
    r = subprocess.run([sys.executable, "-m", "phantom.cli", "lab", "sft", "--model", "tiny"], capture_output=True,
                       text=True, env={**os.environ, "PHANTOM_SFT_THREADS": "two", "PHANTOM_ARTIFACTS": str(tmp_path)},
                       timeout=120)
    assert r.returncode == 2 and "PHANTOM_SFT_THREADS='two' is invalid" in r.stderr, r.stderr
    assert not any(tmp_path.rglob("*"))  # no lock, no half-built checkpoint
