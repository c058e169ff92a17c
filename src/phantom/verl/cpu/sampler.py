"""verl's own V1 replay buffer, polling every 0.2 s instead of 2 s: ``trainer.v1.sampler.custom_sampler``.

The sync V1 trainer waits for a step's rollouts in ``ReplayBuffer.sample`` (``trainer/ppo/v1/
replay_buffer.py``): it checks the TransferQueue for finished groups, and when too few are finished it
sleeps ``poll_interval``, 2 s by default, a constructor argument no config key reaches. Generation is
dispatched just before the first check, so every training step and every validation waits at least
one full poll, and a step whose rollouts finish after 2.1 s waits 4 s. On a GPU that is noise; on the
CPU backend a step's generation takes one to three seconds and the poll is a large share of the step.

verl's documented extension point for the replay buffer is ``trainer.v1.sampler.custom_sampler.{path,
name}``, which ``PPOTrainer._build_replay_buffer`` calls with its keyword arguments. The factory here
takes the trainer from those arguments (``refill_fn`` is its bound method), lets verl's own
``_build_replay_buffer`` build verl's own :class:`ReplayBuffer` with the custom sampler switched off
for that call (so the filter's metric, refill credits, in-flight bound and generation unit are exactly
verl's), and sets that object's ``poll_interval``. Nothing else differs: same class, same constructor,
same arguments, and the filtering code that runs is verl's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["POLL_S", "fast_poll_replay_buffer", "PATH", "NAME"]

POLL_S = 0.2
PATH, NAME = "pkg://phantom.verl.cpu.sampler", "fast_poll_replay_buffer"


def fast_poll_replay_buffer(**kwargs: Any) -> Any:
    """verl's own replay buffer (built by verl's ``_build_replay_buffer``), with ``poll_interval`` = :data:`POLL_S`."""
    from omegaconf import open_dict

    trainer = getattr(kwargs.get("refill_fn"), "__self__", None)
    if trainer is None or not hasattr(trainer, "_build_replay_buffer"):
        raise RuntimeError("fast_poll_replay_buffer must be built by verl's PPOTrainer._build_replay_buffer "
                           "(trainer.v1.sampler.custom_sampler)")
    custom = trainer.config.trainer.v1.sampler.custom_sampler
    path, name = custom.path, custom.name
    with open_dict(custom):
        custom.path = None  # this one call builds the built-in buffer, with verl's own arguments
    try:
        buffer = trainer._build_replay_buffer()
    finally:
        with open_dict(custom):
            custom.path, custom.name = path, name
    buffer.poll_interval = POLL_S
    return buffer
