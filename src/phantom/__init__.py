"""phantom: phantom advantages in group-relative RL (GRPO, DAPO, GSPO, Dr. GRPO).

The package holds the one trusted implementation of the shaped rewards (:mod:`phantom.rewards`),
the group-relative advantage estimators and gates (:mod:`phantom.advantages`), the CPU lab,
the verl integration and the tools the book uses.
"""

__version__ = "0.1.0"
