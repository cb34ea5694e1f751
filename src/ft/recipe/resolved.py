"""The resolved recipe as YAML (defaults filled in, secrets replaced): what ``ft validate`` prints, what a run saves
as ``recipe.yaml`` and what a resumed run is compared with."""

from __future__ import annotations

from .redact import redact
from .schema import Recipe
from .yaml_io import dump_yaml


def resolved_dict(recipe: Recipe) -> dict:
    """All sections with their defaults; ``train:`` only with the keys the recipe set."""
    data = recipe.model_dump(mode="json", exclude={"train"}, by_alias=True)  # `class:`, as the recipe writes it
    data["train"] = recipe.train_args
    return data


def resolved_recipe_yaml(recipe: Recipe) -> str:
    return dump_yaml(redact(resolved_dict(recipe)))
