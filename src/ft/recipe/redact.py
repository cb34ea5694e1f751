"""The resolved recipe as YAML, with secrets (tokens, API keys, passwords) replaced."""

from __future__ import annotations

import re

from .schema import Recipe
from .yaml_io import dump_yaml

# names of credentials, not of vocabulary tokens (eos_token, max_new_tokens stay visible)
SECRET_KEY = re.compile(
    r"^(token|hub_token|hf_token|access_token|auth_token|api_key|apikey|secret|password)$"
    r"|_(api_key|secret|password)$",
    re.IGNORECASE,
)
REDACTED = "<redacted>"


def redact(value, key: str = ""):
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if value is not None and SECRET_KEY.search(key) and not isinstance(value, bool):
        return REDACTED
    return value


def resolved_dict(recipe: Recipe) -> dict:
    """All sections with their defaults; ``train:`` only with the keys the recipe set."""
    data = recipe.model_dump(mode="json", exclude={"train"}, by_alias=True)  # `class:`, as the recipe writes it
    data["train"] = recipe.train_args
    return data


def resolved_recipe_yaml(recipe: Recipe) -> str:
    return dump_yaml(redact(resolved_dict(recipe)))
