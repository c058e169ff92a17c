"""A bound on V1's refill: stop a run whose group filter keeps sampling without finding a batch.

verl 0.9.1's V1 trainer refills a step until ``train_batch_size`` groups pass the filter, with no upper
bound (it ignores ``algorithm.filter_groups.max_num_gen_batches``). When a policy collapses to one short
answer, every group's shaped score is flat, the default-metric filter evicts them all, and the step never
ends: on the CPU lab a collapsed run generated 43,845 sequences (274 generation batches) in step 38 and
was still sampling. verl-recipe's DAPO trainer stops such a run with an error once it has generated
``max_num_gen_batches`` batches in one step (the paper's §8 runs used 10).

:class:`RefillGuard` applies the same bound from outside verl: it tails the CPU rollout server's
``rollout.jsonl`` (one line per generated batch, labelled with the step) and raises :class:`Starved`
when one step label has generated more than ``batches`` generation batches plus the validation pass
that shares its label. The launcher then stops verl and marks the folder ``starved``: a finished
outcome (the run collapsed far enough to starve its filter), reused by a resumed sweep, not retried.
On the GPU backend there is no per-batch log; the launcher's ``timeout`` is the bound there.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

__all__ = ["Starved", "RefillGuard", "check_bound", "val_rows"]


class Starved(RuntimeError):
    """One step generated more than the bound allows (attributes ``step``, ``sequences``, ``limit``)."""

    def __init__(self, step: int, sequences: int, limit: int) -> None:
        super().__init__(f"step {step} generated {sequences} sequences without filling its batch "
                         f"(bound: {limit}); the group filter starved")
        self.step, self.sequences, self.limit = step, sequences, limit


def check_bound(batches: object) -> None:
    """``ValueError`` naming a bound that is not None or an integer >= 1 (checked before a run folder exists)."""
    if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int) or batches < 1):
        raise ValueError(f"starve_batches={batches!r} is invalid; allowed: an integer >= 1, or None")


def val_rows(files: tuple[str, ...] | list[str], cap: int | None = None) -> int:
    """Rows of the held-out parquet files (``cap``: ``data.val_max_samples``); 0 if none can be read."""
    try:
        import pyarrow.parquet as pq

        n = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except (ImportError, OSError, ValueError):
        return 0
    return min(n, cap) if cap else n


class RefillGuard:
    """Tails ``rollout.jsonl``; :meth:`check` raises :class:`Starved` past ``batches`` generation batches.

    ``per_batch``: sequences in one generation batch (``train_batch_size * rollout_n``); ``val``:
    sequences of one validation pass, allowed on top because it shares the step's label.
    """

    def __init__(self, path: Path, batches: int, per_batch: int, val: int = 0) -> None:
        check_bound(batches)
        if batches is None:
            raise ValueError("starve_batches=None is invalid here; allowed: an integer >= 1")
        self.path, self.limit = Path(path), batches * per_batch + val
        self.counts: Counter[int] = Counter()
        self._offset = 0

    def check(self) -> None:
        """Read the lines appended since the last call; raise :class:`Starved` if a step is over the bound."""
        if not self.path.is_file():
            return
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
                self.counts[int(rec["step"])] += int(rec["requests"])
            except (ValueError, KeyError, TypeError):
                continue
        for step, n in self.counts.items():
            if n > self.limit:
                raise Starved(step, n, self.limit)
