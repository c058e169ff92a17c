"""Real verl 0.9.1 runs: the shaped reward, the gated estimators, specs, the launcher, data, presets.

Modules: :mod:`.reward` (``reward.custom_reward_function.path=pkg://phantom.verl.reward``),
:mod:`.estimators` (the gated advantage estimators, registered through the ``verl.plugins`` entry
point in every process that imports verl), :mod:`.spec` (a validated run spec -> Hydra overrides,
composed against verl's own config), :mod:`.launch` (``phantom verl ...``: run folders, the child
process, telemetry), :mod:`.data` (verl parquet for GSM8K, MATH and the lab task), ``presets/`` (the
paper's and the CPU runs' settings) and :mod:`.cpu` (verl's trainer on a CPU-only machine).

This package imports nothing at import time: verl's plugin hook loads :mod:`.estimators` in every
worker, and that must stay cheap.
"""
