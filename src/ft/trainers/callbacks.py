"""Callbacks from the recipe: built-ins by name, user classes by ``module:Class``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..recipe import Problem, Recipe
from ..recipe.hooks import CallbackSpec
from .plugins import PluginError, resolve


def _early_stopping(spec: CallbackSpec):
    from transformers import EarlyStoppingCallback

    return EarlyStoppingCallback(early_stopping_patience=spec.patience, early_stopping_threshold=spec.threshold)


BUILTIN = {"early_stopping": _early_stopping}


def build_callbacks(recipe: Recipe, folders: Path | Sequence[Path]) -> list:
    """The recipe's ``callbacks:``, built, in order; a user class is looked up in ``folders`` (``plugins.resolve``)."""
    if not recipe.callbacks:
        return []  # importing transformers' TrainerCallback alone takes seconds
    from transformers import TrainerCallback

    callbacks = []
    for i, spec in enumerate(recipe.callbacks):
        key = f"callbacks.{i}"
        if spec.name is not None:
            callbacks.append(BUILTIN[spec.name](spec))
            continue
        cls = resolve(spec.cls, f"{key}.cls", folders, "a transformers.TrainerCallback subclass")
        if not (isinstance(cls, type) and issubclass(cls, TrainerCallback)):
            raise PluginError(Problem(f"{key}.cls", f"`{spec.cls}` is not a transformers.TrainerCallback subclass."))
        try:
            callbacks.append(cls(**spec.kwargs))
        except TypeError as exc:
            raise PluginError(Problem(f"{key}.kwargs", f"`{spec.cls}` rejected these arguments: {exc}")) from None
    return callbacks
