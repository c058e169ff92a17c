"""Loaded by ``import verl`` in every process of a CPU run (``VERL_USE_EXTERNAL_MODULES``).

It pins verl to 0.9.1 (the rollout backend relies on private registries that change between
releases), selects the CPU platform, registers the ``hf`` rollout backend and applies the three
patches in :func:`phantom.verl.cpu.platform.apply_patches`. verl's hook raises on an import error,
so a broken install fails loudly in the first process instead of hanging a Ray actor.
"""

from __future__ import annotations

import os

import verl

from phantom.verl.cpu import VERL_VERSION

_version = getattr(verl, "__version__", "unknown")
if _version != VERL_VERSION:
    raise ImportError(
        f"phantom's CPU backend supports verl {VERL_VERSION} only, found verl {_version}; "
        f"install it with `pip install verl=={VERL_VERSION}` or use backend=gpu"
    )

# Read lazily by verl, so setting them while verl is still importing is early enough:
# VERL_PLATFORM picks the platform registered below; VERL_ENGINE_DEVICE is verl's documented
# override for EngineRegistry, whose FSDP engine is registered for devices "cuda" and "npu" only.
os.environ.setdefault("VERL_PLATFORM", "cpu")
os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")

from verl.workers.rollout import base as _rollout_base  # noqa: E402
from verl.workers.rollout.replica import RolloutReplicaRegistry  # noqa: E402

from phantom.verl.cpu import platform as _platform  # noqa: E402,F401  (registers PlatformCPU)

_platform.apply_patches()


def _load_replica():
    from phantom.verl.cpu.rollout import HFReplica

    return HFReplica


# verl keeps two process-local registries for rollouts: the replica (server) class used by the
# TaskRunner, and the in-worker adapter class looked up by (name, mode) in the FSDP workers. The
# second has no public register function in 0.9.1, so the entry is added to the dict directly.
RolloutReplicaRegistry.register("hf", _load_replica)
_rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = "phantom.verl.cpu.rollout.HFServerAdapter"
