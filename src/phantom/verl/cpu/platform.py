"""A verl platform for CPU-only machines (gloo collectives, logical Ray "GPU"s), and the patches it needs.

verl 0.9.1 registers CUDA, NPU and ROCm platforms and falls back to CUDA when none is found. This
platform is selected by ``VERL_PLATFORM=cpu`` (set by :mod:`phantom.verl.cpu.plugin`). Its device
module is ``torch.cpu`` plus the ``torch.cuda``-style calls verl makes (``empty_cache``,
``mem_get_info``, RNG state, ...).

Ray: verl's ``ResourcePoolManager`` hard-codes ``use_gpu=True`` and places each FSDP rank in a bundle
``{"CPU": 3, "GPU": 1}``. The platform therefore names its Ray resource ``"GPU"`` and the launcher
declares that many *logical* GPUs with ``+ray_kwargs.ray_init.num_gpus=N`` (no GPU is touched;
the CPU build of torch ignores the ``CUDA_VISIBLE_DEVICES`` Ray exports).
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["PlatformCPU", "apply_patches", "dedupe_backend"]


def _rss() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # psutil missing or the process is going away
        return 0


def _mem_get_info(*_: Any, **__: Any) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _device_module() -> types.ModuleType:
    """``torch.cpu`` with the ``torch.cuda`` API surface verl calls; memory numbers are process RSS."""
    m = types.ModuleType("phantom_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(m, name, getattr(torch.cpu, name))
    noop = lambda *a, **k: None  # noqa: E731
    # verl does model.to(get_device_id()); an integer id would be read as an accelerator index.
    m.current_device = lambda: "cpu"
    m.device_count = lambda: 1
    m.is_available = lambda: True
    for name in ("set_device", "synchronize", "empty_cache", "ipc_collect", "set_per_process_memory_fraction",
                 "reset_peak_memory_stats"):
        setattr(m, name, noop)
    m.memory_stats = lambda *a, **k: {}
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(m, name, lambda *a, **k: _rss())
    m.mem_get_info = _mem_get_info
    m.get_rng_state = lambda *a, **k: torch.get_rng_state()
    m.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    m.manual_seed = m.manual_seed_all = torch.manual_seed
    m.get_device_name = lambda *a, **k: "cpu"
    m.get_device_capability = lambda *a, **k: (None, None)
    return m


_DEVICE = _device_module()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """Device ``cpu``, backend ``gloo``, Ray resource ``GPU`` (logical)."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only an explicit VERL_PLATFORM=cpu selects it.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def dedupe_backend(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: keep the first backend named for each device type."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    seen: set[str] = set()
    parts = []
    for part in backend.split(","):
        device = part.split(":")[0].strip()
        if device not in seen:
            seen.add(device)
            parts.append(part)
    return ",".join(parts)


def apply_patches() -> None:
    """The three monkeypatches the CPU path needs (idempotent). Each is a no-op on a GPU machine."""
    # 1. verl.utils.distributed.initialize_global_process_group(_ray) builds
    #    f"cpu:gloo,{device}:{ccl}", i.e. "cpu:gloo,cpu:gloo" on this platform, and torch rejects
    #    a device type named twice ("Duplicate device type cpu in backend string").
    if not getattr(dist.init_process_group, "_phantom_cpu", False):
        original = dist.init_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            if "backend" in kwargs:
                kwargs["backend"] = dedupe_backend(kwargs["backend"])
            elif args:
                args = (dedupe_backend(args[0]), *args[1:])
            return original(*args, **kwargs)

        init_process_group._phantom_cpu = True  # type: ignore[attr-defined]
        dist.init_process_group = init_process_group

    # 2. verl's FSDP2 engine gives forward-only models (the reference policy used by the KL loss)
    #    CPUOffloadPolicy(pin_memory=True) (workers/engine/fsdp/transformer_impl.py); pinning host
    #    memory needs an accelerator, so on a CPU-only process it raises. Pinning is meaningless here.
    from torch.distributed.fsdp import CPUOffloadPolicy

    if not getattr(CPUOffloadPolicy.__init__, "_phantom_cpu", False):
        original_init = CPUOffloadPolicy.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            object.__setattr__(self, "pin_memory", False)

        __init__._phantom_cpu = True  # type: ignore[attr-defined]
        CPUOffloadPolicy.__init__ = __init__

    # 3. verl's FSDP engine (models/transformers/monkey_patch.py) imports TRL's
    #    AutoModelForCausalLMWithValueHead whenever `trl` is importable; TRL 1.x has no such class,
    #    so with TRL 1.16 in the same environment every actor init fails with an ImportError. The
    #    class only matters for value-head critics, so "TRL available" is narrowed to "TRL with it".
    #    Patched where verl reads it, before the engine module binds the name.
    import sys

    from verl.utils import import_utils

    from phantom.verl.doctor import trl_has_value_head

    if not getattr(import_utils.is_trl_available, "_phantom_cpu", False):
        def is_trl_available() -> bool:
            return trl_has_value_head()

        is_trl_available._phantom_cpu = True  # type: ignore[attr-defined]
        import_utils.is_trl_available = is_trl_available
        for name in ("verl.models.transformers.monkey_patch", "verl.utils.model"):
            if name in sys.modules:
                sys.modules[name].is_trl_available = is_trl_available
