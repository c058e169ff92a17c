"""DAPO dynamic sampling: physical deletion of no-contrast groups and refill (paper §8).

Follows the control flow of verl's ``recipe/dapo`` trainer, which the paper's §8 ran: generate a
batch of ``gen_prompts`` prompts, delete every group whose filter metric is identical across its
rollouts (``np.std == 0``; ``metric="score"`` reads the shaped score, ``metric="acc"`` the reported
binary outcome), and generate further batches until ``prompts`` groups survive or
``max_gen_batches`` batches were spent; surplus survivors are discarded. The surviving batch then
gets plain (ungated) group advantages. One difference: where verl raises once it runs out of
generation batches, the lab trains on the survivors it has (none: the step is skipped) and logs
``phantom/dapo/exhausted``, so a collapsing arm is recorded instead of crashing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from phantom.advantages import GateStats, group_advantages
from phantom.lab.rollouts import Rollouts
from phantom.lab.spec import ArmSpec

__all__ = ["dapo_collect", "no_contrast_groups"]


def no_contrast_groups(group: np.ndarray, metric: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group labels in first-appearance order and, per label, whether DAPO deletes it."""
    labels, first, inv = np.unique(group, return_index=True, return_inverse=True)
    order = np.argsort(first)
    delete = np.zeros(len(labels), dtype=bool)
    for g in range(len(labels)):
        vals = metric[inv == g]
        delete[g] = len(vals) > 1 and float(np.std(vals)) == 0.0
    return labels[order], delete[order]


def dapo_collect(s: ArmSpec, rollout: Callable[..., Rollouts], step: int,
                 ) -> tuple[Rollouts, np.ndarray, GateStats, dict[str, Any], None]:
    """The step's training batch assembled by deletion and refill, with its advantages and telemetry.

    ``rollout(n_prompts, step, tag=...)`` generates and scores one generation batch (the trainer's
    own sampler), so this module needs nothing else of the training loop.
    """
    generated: list[Rollouts] = []
    survivors: list[Rollouts] = []
    n_survivors = evicted = batches = 0
    while batches < s.max_gen_batches and n_survivors < s.prompts:
        b = rollout(s.gen_prompts, step, tag=f"g{batches}")
        batches += 1
        generated.append(b)
        metric = b.score if s.dapo_metric == "score" else b.outcome
        labels, delete = no_contrast_groups(b.group, metric)
        evicted += int(delete.sum())
        keep = labels[~delete]
        if len(keep):
            survivors.append(b.select(np.flatnonzero(np.isin(b.group, keep))))
            n_survivors += len(keep)
    pool = Rollouts.concat(survivors) if survivors else generated[0].select(np.array([], dtype=int))
    labels = np.unique(pool.group)  # ascending label == generation order
    train_labels = labels[: s.prompts]
    batch = pool.select(np.flatnonzero(np.isin(pool.group, train_labels)))
    everything = Rollouts.concat(generated)
    _, stats = group_advantages(everything.score.astype(np.float32), everything.group, outcomes=everything.outcome,
                                gate=s.arm, norm=s.norm)
    if len(batch):
        adv, kept_stats = group_advantages(batch.score.astype(np.float32), batch.group, outcomes=batch.outcome,
                                           gate="none", norm=s.norm)
        kept_phantom, kept_degenerate = kept_stats.phantom or 0, kept_stats.degenerate_live or 0
    else:
        adv, kept_phantom, kept_degenerate = np.zeros(0, dtype=np.float32), 0, 0
    extra = {
        "phantom/gen_batches": float(batches),
        # verl 0.9.1 counts uids (groups) under these "samples" names (v1/replay_buffer.py:374); so do we
        "training/filter_groups/evicted_samples": float(evicted),
        "training/filter_groups/discarded_surplus_samples": float(max(0, len(labels) - s.prompts)),
        "phantom/dapo/train_groups": float(len(train_labels)),
        "phantom/dapo/exhausted": float(len(train_labels) < s.prompts),
        "phantom/dapo/train_phantom_groups": float(kept_phantom),
        "phantom/dapo/train_degenerate_groups": float(kept_degenerate),
    }
    return batch, adv, stats, extra, None
