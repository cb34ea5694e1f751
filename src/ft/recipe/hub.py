"""The ``train:`` keys that write to the Hugging Face Hub, and those transformers reads only when it pushes.

Read by the rules (hub settings without a push), the machine check before a run (``ft.run.hub``: a token and the
Hub reachable) and ``--smoke`` (which pushes nothing).
"""

from __future__ import annotations

from .schema import Recipe

# keys that make the trainer write to the Hub: the model repository (transformers), GRPO's completions dataset (TRL
# creates it when the trainer is built)
PUSHING = ("push_to_hub", "log_completions_hub_repo")

# keys transformers reads when it pushes (and TRL's GRPO for log_completions_hub_repo); without a push they do nothing
HUB_SETTINGS = ("hub_model_id", "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision")


def pushing_keys(recipe: Recipe) -> list[str]:
    """The ``train.*`` keys of ``recipe`` that push to the Hub."""
    return [f"train.{key}" for key in PUSHING if recipe.train_args.get(key)]
