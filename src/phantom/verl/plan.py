"""A run's machine-dependent choices, resolved once: the plan the doctor checks and the command is built from.

A :class:`phantom.verl.spec.VerlSpec` names an experiment, not a machine: on a GPU the attention
kernel, the micro-batches and vLLM's memory share stay ``None``/``"auto"`` until the machine is known
(:mod:`phantom.verl.gpu`); on the CPU backend the micro-batches follow the batch. :func:`make_plan`
makes those choices once per launch, from one probe of the machine. The launcher then hands the same
:class:`Plan` to :func:`phantom.verl.spec.to_overrides` (the command), to the doctor
(:func:`phantom.verl.doctor.checks`: what it prints and checks) and to the run's manifest
(``decisions``, ``hardware``), so the three can never disagree and the machine is probed once.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Plan", "make_plan", "cpu_plan"]


@dataclass(frozen=True)
class Plan:
    """The backend's choices for one spec on one machine, and one line per choice saying why."""

    backend: str  # cpu | gpu
    attn: str  # attn_implementation handed to the actor
    remove_padding: bool  # actor_rollout_ref.model.use_remove_padding
    micro: int  # actor.ppo_micro_batch_size_per_gpu
    logprob_micro: int  # rollout / ref log_prob_micro_batch_size_per_gpu
    gpu_memory_utilization: float | None = None  # vLLM's share of the GPU (GPU backend only)
    row: Any = None  # the phantom.verl.gpu.MemoryRow the GPU choices came from
    hw: Any = None  # the phantom.verl.gpu.Hardware they were made for (GPU backend only)
    why: tuple[str, ...] = ()
    ray_address: str | None = None  # CPU backend: a running head to join ($RAY_ADDRESS, phantom.verl.cluster)
    poll_s: float | None = None  # CPU backend, V1 trainer: the replay buffer's poll (phantom.verl.cpu.sampler)
    threads: int | None = None  # CPU backend: torch threads in verl's workers (the FSDP actor's update uses them)

    def manifest(self) -> dict[str, Any]:
        """What a run folder records: the choices, the reasons and (GPU) the machine."""
        return {"decisions": list(self.why),
                "hardware": dataclasses.asdict(self.hw) if self.hw is not None else None,
                "plan": {"backend": self.backend, "attn": self.attn, "remove_padding": self.remove_padding,
                         "micro": self.micro, "logprob_micro": self.logprob_micro,
                         "gpu_memory_utilization": self.gpu_memory_utilization,
                         "memory_row": getattr(self.row, "label", None),
                         "ray": self.ray_address or "a local cluster of its own",
                         "replay_buffer_poll_s": self.poll_s, "torch_threads": self.threads}}


def _auto(value: Any) -> bool:
    return value is None or value == "auto"


def cpu_plan(spec: Any) -> Plan:
    """The CPU backend: sdpa without remove-padding; micro-batches default to the whole batch (one pass);
    a Ray head named by ``$RAY_ADDRESS`` (a sweep's, :mod:`phantom.verl.cluster`) is joined, else verl starts one."""
    whole = spec.train_batch_size * spec.rollout_n
    mini = (spec.mini_batch_size or spec.train_batch_size) * spec.rollout_n  # the actor's update unit
    micro = mini if _auto(spec.micro_batch_size) else int(spec.micro_batch_size)
    lp = whole if _auto(spec.logprob_micro_batch_size) else int(spec.logprob_micro_batch_size)
    address = None if spec.ray_address else (os.environ.get("RAY_ADDRESS") or None)
    # verl's V1 replay buffer polls for finished rollouts every 2 s; a CPU step generates in 1-3 s
    fast = spec.trainer == "v1" and os.environ.get("PHANTOM_VERL_POLL", "fast").strip().lower() != "verl"
    poll = None
    if fast:
        from phantom.verl.cpu.sampler import POLL_S as poll
    threads = cpu_threads()
    return Plan("cpu", "sdpa", False, micro, lp, ray_address=address, poll_s=poll, threads=threads,
                why=("attention: sdpa without remove-padding (the CPU backend: the rmpad path wants flash-attn)",
                     f"micro-batches {micro} / {lp}: " + ("a whole mini-batch / the whole batch in one pass (CPU memory is not the limit)"
                                                           if _auto(spec.micro_batch_size) else "set by the spec"),
                     f"Ray: the running head at {address} ($RAY_ADDRESS)" if address
                     else "Ray: a local cluster started by verl for this run",
                     f"replay buffer: verl's own, polling every {poll} s (was 2 s)" if poll
                     else "replay buffer: verl's default",
                     f"torch threads: {threads} per verl worker (the cores this process may use, at most "
                     f"{MAX_THREADS}): the actor's update runs while the rest of the step waits"))


MAX_THREADS = 8


def cpu_threads() -> int:
    """Torch threads for verl's CPU workers: the cores this process may use, at most :data:`MAX_THREADS`.

    Why not one: verl's sync trainer runs the FSDP actor's update while every other worker waits, so the
    update may take every core; the rollout server sets its own count (``PHANTOM_HF_ROLLOUT_THREADS``).
    ``PHANTOM_VERL_THREADS`` overrides it (a positive integer).
    """
    from phantom.lab.threads import available_cpus, positive_count

    raw = os.environ.get("PHANTOM_VERL_THREADS", "").strip()
    if raw:
        return positive_count(raw, what="PHANTOM_VERL_THREADS")
    return max(1, min(available_cpus(), MAX_THREADS))


def make_plan(spec: Any, hw: Any = None) -> Plan:
    """The plan for ``spec``: on a GPU from ``hw`` (``None``: probe this machine once), on the CPU from the batch.

    Raises ``ValueError`` naming the problem (e.g. ``attention=flash_attention_2`` where flash-attn
    does not import).
    """
    if spec.backend == "cpu":
        return cpu_plan(spec)
    from phantom.verl import gpu

    hw = hw if hw is not None else gpu.probe()
    g = gpu.resolve(spec, hw)
    return Plan("gpu", g["attn"], g["remove_padding"], g["micro"], g["logprob_micro"], g["gpu_memory_utilization"],
                g["row"], hw, tuple(g["why"]))
