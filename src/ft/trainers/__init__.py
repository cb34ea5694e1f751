"""Trainers: one module per method (``sft``, ``dpo``, ``kto``, ``orpo``, ``grpo``), built from the recipe.

Importing this package imports no TRL: ``build_trainer`` imports the chosen method's module when it builds.
"""

from .build import TrainerInputs, build_trainer
from .hooks import Hooks, resolve_hooks

__all__ = ["Hooks", "TrainerInputs", "build_trainer", "resolve_hooks"]
