"""How many torch threads one arm trains on, and the check that lets it use more than one.

A sweep runs its cells two at a time on one thread each, which keeps both cores of the 2-core target
machine busy. One arm run alone (``phantom lab run``) would leave the second core idle: on the AVX2 EPYC
of ``benchmarks/results_lab.md`` round 12 two threads take a 40-step outcome arm from 107 s to 76 s.

More threads are only worth having if they change no number. A run folder is reused by spec (a sweep
takes a finished ``phantom lab run`` as its cell), so a run on two threads must log what the same spec
logs on one. torch 2.13's CPU kernels do that on the machines measured here, but nothing promises it:
BLAS libraries may split a long inner sum between threads, and then the rounding changes. So before an
arm uses ``n`` threads, :func:`threads_agree` trains and decodes a copy of its model on a synthetic
batch of the lab's real shapes, on one thread and on ``n``, and compares every gradient, log-probability
and token bit for bit. If anything differs, the arm runs on one thread and says so. This checks the
kernels at one step's shapes; it is a check, not a proof, and the benchmark compares whole arms.
"""

from __future__ import annotations

import copy
import json
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from phantom.lab.model import LabQwen2

__all__ = ["ENV", "AUTO_MAX", "available_cpus", "auto_threads", "positive_count", "parse_threads", "lab_threads", "threads_agree"]

#: overrides the thread count of every arm trained in this process (a positive integer or ``auto``)
ENV = "PHANTOM_LAB_THREADS"
#: ``auto`` takes at most this many: measured on 2 cores only; the lab's small matmuls are not known
#: to gain from more
AUTO_MAX = 2

#: the probe's decode repeats each prompt this often (the lab's group size)
GROUP = 5

_VERDICTS: dict[str, bool] = {}


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_threads() -> int:
    """``auto``: the CPUs this process may use, at most :data:`AUTO_MAX`."""
    return max(1, min(AUTO_MAX, available_cpus()))


def positive_count(raw: str | int, *, what: str, allowed: str = "a positive integer") -> int:
    """A count from text that must be a positive integer; else a ValueError naming ``what``, the value and
    ``allowed`` (the project's bad-input convention)."""
    text = str(raw).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{what}={raw!r} is invalid; allowed: {allowed}")
    return int(text)


def parse_threads(raw: str | int, *, what: str = "threads") -> int:
    """A thread count from text: a positive integer, or ``auto`` (:func:`auto_threads`)."""
    if str(raw).strip() == "auto":
        return auto_threads()
    return positive_count(raw, what=what, allowed="a positive integer or 'auto'")


def lab_threads(default: int = 1) -> int:
    """Threads for an arm: ``$PHANTOM_LAB_THREADS`` if set, else ``default`` (one: sweeps share cores)."""
    raw = os.environ.get(ENV, "").strip()
    return parse_threads(raw, what=ENV) if raw else default


def _probe_batch(vocab: int, special: int, rows: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """``rows`` prompts and responses of the lab's lengths (prompts 20-60 tokens, responses 1-150) in
    random ids."""
    g = torch.Generator().manual_seed(seed)

    def ids(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return torch.randint(special, vocab, (n,), generator=g).tolist()

    prompts = [ids(20, 60) for _ in range(rows)]
    return prompts, [ids(1, 150) for _ in range(rows)]


def _fingerprint(model: LabQwen2, prompts: list[list[int]], responses: list[list[int]], *, pad_id: int,
                 eos_id: int, threads: int) -> list[torch.Tensor]:
    """Log-probabilities, every gradient and a greedy decode of a copy of ``model`` on ``threads``."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        m = copy.deepcopy(model).train()
        params = [p for p in m.parameters() if p.requires_grad]
        logp, mask, _ = m.response_logprobs(prompts, responses, pad_id=pad_id)
        (logp * mask).sum().backward()
        m.eval()
        toks, _ = m.generate([p for p in prompts for _ in range(GROUP)], max_new=16, eos_id=eos_id, pad_id=pad_id,
                             greedy=True)
        longest = max(map(len, toks))
        decoded = torch.tensor([t + [-1] * (longest - len(t)) for t in toks])
        return [logp.detach(), *(p.grad for p in params if p.grad is not None), decoded]
    finally:
        torch.set_num_threads(before)


def threads_agree(model: LabQwen2, *, pad_id: int, eos_id: int, threads: int) -> bool:
    """Does training and decoding ``model`` on ``threads`` threads give one thread's numbers, bit for bit?

    Probed once per process, model shape and thread count (2.4 s on the lab model on the AVX2 EPYC, much
    of it first-call warm-up that the arm would pay anyway), on random token ids and a copy of the
    model (the model, its gradients and every random generator are left as they were): a forward and backward of 40 rows (scored in buckets of 20, as each quarter of the lab's
    80-row mini-batch is) and a greedy decode of their prompts in groups of 5 (a rollout batch of 200
    rows, prefilled once per distinct prompt, as the lab's 160 rows are).
    """
    if threads <= 1:
        return True
    key = json.dumps({"cfg": vars(model.cfg), "vocab": model.vocab_size, "threads": threads,
                      "lora": any("lora" in n for n, _ in model.named_parameters())}, sort_keys=True, default=str)
    if key not in _VERDICTS:
        prompts, responses = _probe_batch(model.vocab_size, max(pad_id, eos_id) + 1, rows=40)
        one = _fingerprint(model, prompts, responses, pad_id=pad_id, eos_id=eos_id, threads=1)
        many = _fingerprint(model, prompts, responses, pad_id=pad_id, eos_id=eos_id, threads=threads)
        _VERDICTS[key] = len(one) == len(many) and all(torch.equal(a, b) for a, b in zip(one, many))
    return _VERDICTS[key]
