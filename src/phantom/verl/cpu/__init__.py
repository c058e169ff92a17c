"""verl 0.9.1 on a CPU-only machine: a platform, a batching ``hf`` rollout server, tiny local assets.

Importing this package does nothing to verl. The launcher makes verl load
:mod:`phantom.verl.cpu.plugin` in every process through verl's own hook
(``VERL_USE_EXTERNAL_MODULES=phantom.verl.cpu.plugin``); that module registers the pieces and applies
the three monkeypatches. :mod:`phantom.verl.cpu.assets` builds a tiny random Qwen2 model, a byte-level
tokenizer and parquet data locally (nothing is downloaded).
"""

#: The only verl release this backend is written against (private symbols are used; see plugin.py).
VERL_VERSION = "0.9.1"
#: What ``VERL_USE_EXTERNAL_MODULES`` must name for the CPU backend.
PLUGIN_MODULE = "phantom.verl.cpu.plugin"

__all__ = ["VERL_VERSION", "PLUGIN_MODULE"]
