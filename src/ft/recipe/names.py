"""The names the recipe language offers for things built in a heavier layer.

Validation must not import torch, datasets or TRL, so the schema cannot read the registries that implement these
names (``ft.data.formats.FORMATS``, ``ft.trainers.metrics.METRICS``, ``ft.trainers.callbacks.BUILTIN``,
``ft.trainers.rewards.BUILTINS``). The names live here instead, and ``tests/test_methods.py`` checks that each list
equals its registry's keys, so neither can gain or lose a name alone; ``ft.data.formats.register`` also refuses a
format whose name is not in ``FORMATS`` here, when it is registered.
"""

from __future__ import annotations

FORMATS = ("chat", "instruction", "text", "preference", "prompt")
METRICS = ("token_accuracy", "perplexity")
BUILTIN_CALLBACKS = ("early_stopping",)
BUILTIN_REWARDS = ("exact_match", "numeric_match", "format", "length_penalty")
