"""A batch of scored rollouts: what the lab's samplers hand to the update.

Its own module so that both samplers, the plain one in :mod:`.rl` and DAPO's deletion and refill in
:mod:`.dapo`, build and merge batches without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Rollouts"]


@dataclass
class Rollouts:
    """A batch of scored responses, ``rollouts`` consecutive rows per group."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]  # EOS appended where the model emitted it (it is trained on)
    texts: list[str]
    group: np.ndarray  # int label per row
    true_outcome: np.ndarray  # float 0/1
    outcome: np.ndarray  # what the (possibly noisy) verifier reports
    score: np.ndarray  # shaped score from the reported outcome
    chars: np.ndarray
    ended: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, rows: np.ndarray) -> Rollouts:
        r = [int(i) for i in rows]
        return Rollouts([self.prompt_ids[i] for i in r], [self.response_ids[i] for i in r],
                        [self.texts[i] for i in r], self.group[r], self.true_outcome[r], self.outcome[r],
                        self.score[r], self.chars[r], self.ended[r])

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        return Rollouts(sum((p.prompt_ids for p in parts), []), sum((p.response_ids for p in parts), []),
                        sum((p.texts for p in parts), []), np.concatenate([p.group for p in parts]),
                        *(np.concatenate([getattr(p, f) for p in parts])
                          for f in ("true_outcome", "outcome", "score", "chars", "ended")))
