"""Why a phantom advantage becomes a collapse: the feedback loop, in a toy policy over lengths.

Chapter 2 computes the phantom *advantage* of one group. This module follows it through training
with the smallest policy that has the loop in it. The policy has one parameter, the mean ``mu`` of
its log-length: a response is ``L = exp(mu + sigma z)`` characters long, ``z ~ N(0, 1)``. A prompt
is solved with probability ``q * sigmoid((L - len_need) / width)``: the policy knows the answer with
probability ``q`` (per prompt, Beta-distributed around ``skill``), but an answer shorter than about
``len_need`` characters has no room for its working and its ``#### n`` marker, and fails.

Each step samples a batch, scores it with :func:`phantom.rewards.length_short`, computes advantages
with :func:`phantom.advantages.group_advantages` (any gate, GRPO or Dr. GRPO) and takes one
policy-gradient step on ``mu``: the score function of ``L`` with respect to ``mu`` is ``z / sigma``,
so ``mu += lr * mean(A * z)`` (``1 / sigma`` folded into ``lr``). The loop the chapter derives:

1. in an all-fail group GRPO's advantage is ``-(l_i - mean l) / std l``, whatever ``lambda``: the
   group pushes ``mu`` down at full size (:func:`allfail_push`);
2. shorter answers fail more often, because they lose the working and the marker;
3. more all-fail groups per batch (a larger dose) push harder: the drift accelerates.

Mixed groups push back only where length decides success (near ``len_need``). Pure numpy plus the
package's reward and advantage functions; a run of 80 steps takes well under a second.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from phantom.advantages import GATES, NORMS, group_advantages
from phantom.rewards import length_short

__all__ = ["LoopSpec", "simulate_loop", "allfail_push", "TRACE_KEYS"]

#: Columns of :func:`simulate_loop`'s trace, one value per step (before that step's update).
TRACE_KEYS: tuple[str, ...] = (
    "step", "median_len", "mean_len", "acc", "dose", "phantom_frac", "zeroed_frac", "live_frac",
    "allfail_abs_adv", "push", "push_allfail", "push_mixed",
)


@dataclass(frozen=True)
class LoopSpec:
    """Every knob of the toy loop (defaults: the paper's λ, G and batch; lengths in characters)."""

    lam: float = 0.3            # shaping weight of length_short
    cap: int = 512              # characters where the length term saturates
    gate: str = "none"          # which groups get zero advantage: none | score | outcome
    norm: str = "std"           # std (GRPO) | none (Dr. GRPO)
    eps: float = 1e-6           # std floor (verl's)
    group_size: int = 5         # G
    prompts: int = 32           # groups per batch
    steps: int = 80
    lr: float = 0.15            # step on mu per unit of mean(A * z)
    len0: float = 260.0         # median length at step 0 (characters)
    sigma: float = 0.35         # spread of log-length
    len_need: float = 120.0     # characters an answer needs for its working and its marker
    width: float = 60.0         # softness of that need (characters)
    skill: float = 0.5          # mean per-prompt pass rate of long-enough answers (sets the dose)
    concentration: float = 2.0  # Beta concentration of per-prompt pass rates
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("gate", self.gate in GATES, f"one of {', '.join(GATES)}"),
            ("norm", self.norm in NORMS, f"one of {', '.join(NORMS)}"),
            ("lam", 0 <= self.lam < 1, "0 <= lam < 1"),
            ("group_size", self.group_size >= 2, ">= 2"),
            ("prompts", self.prompts >= 1, ">= 1"),
            ("steps", self.steps >= 1, ">= 1"),
            ("lr", self.lr >= 0 and math.isfinite(self.lr), "a finite lr >= 0"),
            ("len0", self.len0 > 0, "> 0"),
            ("sigma", self.sigma > 0, "> 0"),
            ("width", self.width > 0, "> 0"),
            ("skill", 0 < self.skill < 1, "0 < skill < 1"),
            ("concentration", self.concentration > 0, "> 0"),
            ("cap", self.cap > 0, "> 0"),
            ("eps", self.eps >= 0, ">= 0"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid; allowed: {allowed}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def allfail_push(group_size: int) -> float:
    """Expected ``mean(A * z)`` of an all-fail group under GRPO when length is linear in ``z``.

    In an all-fail group ``A_i = -(l_i - mean l) / std l`` (λ cancels). With ``l`` linear in ``z``
    that is ``-(z_i - mean z) / s_z``, so ``sum_i A_i z_i = -(G - 1) s_z`` and the per-response mean
    is ``-(G - 1) E[s_z] / G``, where ``E[s_z] = c4(G)``, the mean sample std of G standard normals.
    """
    g = int(group_size)
    if g < 2:
        raise ValueError(f"group_size={group_size!r} is invalid; allowed: >= 2")
    c4 = math.sqrt(2.0 / (g - 1)) * math.exp(math.lgamma(g / 2) - math.lgamma((g - 1) / 2))
    return -(g - 1) * c4 / g


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def simulate_loop(spec: LoopSpec | None = None, **overrides: Any) -> dict[str, np.ndarray]:
    """Run the toy loop; returns the trace, one array per :data:`TRACE_KEYS` entry (length ``steps``).

    ``dose`` is the all-fail fraction of the batch, ``push`` the update's ``mean(A * z)`` and
    ``push_allfail`` / ``push_mixed`` the parts of it that all-fail and mixed groups contribute
    (all-pass groups make up the rest). Deterministic for a given spec.
    """
    spec = LoopSpec(**{**(spec.to_dict() if spec else {}), **overrides})
    rng = np.random.default_rng(spec.seed)
    g, n = spec.group_size, spec.prompts
    idx = np.repeat(np.arange(n), g)
    a = spec.skill * spec.concentration
    b = (1 - spec.skill) * spec.concentration
    mu = math.log(spec.len0)
    rows: dict[str, list[float]] = {k: [] for k in TRACE_KEYS}
    for step in range(spec.steps):
        q = rng.beta(a, b, n)
        z = rng.standard_normal((n, g))
        length = np.rint(np.exp(mu + spec.sigma * z))
        p = q[:, None] * _sigmoid((length - spec.len_need) / spec.width)
        outcome = (rng.random((n, g)) < p).astype(float)
        scores = length_short(outcome.ravel(), length.ravel(), lam=spec.lam, cap=spec.cap)
        adv, st = group_advantages(scores, idx, outcomes=outcome.ravel(), gate=spec.gate, norm=spec.norm,
                                   eps=spec.eps)
        contrib = (np.asarray(adv) * z.ravel()).reshape(n, g).sum(axis=1) / (n * g)  # per group
        fails = outcome.sum(axis=1) == 0
        mixed = (outcome.sum(axis=1) > 0) & (outcome.sum(axis=1) < g)
        push = float(contrib.sum())
        fail_adv = np.abs(np.asarray(adv).reshape(n, g)[fails])
        for key, value in (
            ("step", step), ("median_len", math.exp(mu)), ("mean_len", float(length.mean())),
            ("acc", float(outcome.mean())), ("dose", st.all_fail / st.groups),
            ("phantom_frac", st.phantom / st.groups), ("zeroed_frac", st.zeroed / st.groups),
            ("live_frac", st.live_frac), ("allfail_abs_adv", float(fail_adv.mean()) if fail_adv.size else 0.0),
            ("push", push), ("push_allfail", float(contrib[fails].sum())), ("push_mixed", float(contrib[mixed].sum())),
        ):
            rows[key].append(value)
        mu += spec.lr * push
    return {k: np.asarray(v, dtype=float) for k, v in rows.items()}
