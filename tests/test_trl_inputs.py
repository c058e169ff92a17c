"""phantom.trl on bad input: clear errors naming what was given, before any optimizer step."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from phantom.trl import check_config, outcome_gated  # noqa: E402
from phantom.trl.lab import LengthPenalty, accuracy_reward  # noqa: E402


def _texts(n):
    return [f"{'1+1=2 ' * i}\n#### {i % 2}" for i in range(n)]


def test_no_outcome_function():
    with pytest.raises(ValueError, match="outcome_fn=None"):
        outcome_gated(num_generations=8)
    with pytest.raises(ValueError, match="outcome_fn=None"):
        outcome_gated(None, LengthPenalty(), num_generations=8)


@pytest.mark.parametrize("bad, msg", [
    ("accuracy_reward", "not a callable"),
    ([accuracy_reward], "is a list"),
])
def test_not_a_function(bad, msg):
    with pytest.raises(ValueError, match=msg):
        outcome_gated(bad, num_generations=8)


@pytest.mark.parametrize("g", [1, 0, "8", 2.0, True, None])
def test_bad_num_generations(g):
    with pytest.raises(ValueError, match=f"num_generations={g!r} is invalid"):
        outcome_gated(accuracy_reward, num_generations=g)


def test_non_binary_outcome_named_with_values_and_rows():
    def graded(completions, **kw):
        return [0.5 if i == 2 else 1.0 for i in range(len(completions))]

    rf = outcome_gated(graded, LengthPenalty(), num_generations=4)
    with pytest.raises(ValueError, match=r"outcome function 'graded' returned non-binary values \(0.5 at rows \[2\]"):
        rf[0](prompts=["p"] * 8, completions=_texts(8))
    assert rf.records == []


def test_batch_not_a_multiple_of_num_generations():
    rf = outcome_gated(accuracy_reward, LengthPenalty(), num_generations=4)
    with pytest.raises(ValueError, match="batch holds 6 completions, which is not a multiple of num_generations=4"):
        rf[0](prompts=["p"] * 6, completions=_texts(6), answer=[1] * 6)


def test_wrong_number_of_values():
    def short(completions, **kw):
        return [1.0]

    rf = outcome_gated(short, num_generations=2)
    with pytest.raises(ValueError, match="'short' returned 1 values for 4 completions"):
        rf[0](prompts=["p"] * 4, completions=_texts(4))


def test_shaping_term_called_alone():
    rf = outcome_gated(accuracy_reward, LengthPenalty(), num_generations=2)
    with pytest.raises(RuntimeError, match="without its outcome term first"):
        rf[1](prompts=["p"] * 4, completions=_texts(4))


def test_config_checks():
    from trl import GRPOConfig

    rf = outcome_gated(accuracy_reward, LengthPenalty(), num_generations=8)
    kw = dict(output_dir="/tmp/phantom-trl-cfg", use_cpu=True, report_to=[], per_device_train_batch_size=8)
    with pytest.raises(ValueError, match=r"GRPOConfig\(num_generations=4\) differs from outcome_gated\(num_generations=8\)"):
        check_config(rf, GRPOConfig(num_generations=4, **kw))
    with pytest.raises(ValueError, match=r"has 3 weights for 2 reward functions \(accuracy_reward, length_penalty\)"):
        check_config(rf, GRPOConfig(num_generations=8, reward_weights=[1.0, 1.0, 1.0], **kw))
    with pytest.raises(ValueError, match="outcome function weight 0"):
        check_config(rf, GRPOConfig(num_generations=8, reward_weights=[0.0, 1.0], **kw))
    check_config(rf, GRPOConfig(num_generations=8, reward_weights=[2.0, 0.5], **kw))


#: groups of 4 over 2 processes x 6: 0-3 mixed, 4-7 all pass and straddling both processes, 8-11 all fail
ANSWERS = [0] * 4 + [i % 2 for i in range(4, 8)] + [9] * 4


def _gloo_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        texts = _texts(12)
        answers = ANSWERS
        lo, hi = rank * 6, (rank + 1) * 6
        rf = outcome_gated(accuracy_reward, LengthPenalty(), num_generations=4)
        cols = [rf[0](prompts=["p"] * 6, completions=texts[lo:hi], answer=answers[lo:hi]),
                rf[1](prompts=["p"] * 6, completions=texts[lo:hi], answer=answers[lo:hi])]
        np.save(os.path.join(out_dir, f"rank{rank}.npy"), np.array(cols, dtype=float))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_groups_straddling_processes_are_gated_as_one(tmp_path):
    """Two gloo processes with 6 completions each and groups of 4: the middle group spans both; each
    process must flatten it as the single-process gate does (TRL normalizes the gathered batch)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gloo_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    got = np.concatenate([np.load(tmp_path / f"rank{r}.npy") for r in (0, 1)], axis=1)
    texts = _texts(12)
    answers = ANSWERS
    rf = outcome_gated(accuracy_reward, LengthPenalty(), num_generations=4)
    want = np.array([rf[0](prompts=["p"] * 12, completions=texts, answer=answers),
                     rf[1](prompts=["p"] * 12, completions=texts, answer=answers)], dtype=float)
    np.testing.assert_array_equal(got, want)
    assert list(want[0]) == [1, 0, 1, 0] + [1] * 4 + [0] * 4
    assert len(set(want[1, 4:8])) == 1 and len(set(want[1, 8:])) == 1 and len(set(want[1, :4])) == 4
