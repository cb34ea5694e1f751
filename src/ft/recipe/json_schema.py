"""JSON Schema of recipes: one branch per method (each with its own ``train:`` fields)."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, TypeAdapter

from .schema import METHODS, recipe_model


def recipe_json_schema() -> dict:
    union = Annotated[Union[tuple(recipe_model(m) for m in METHODS)], Field(discriminator="method")]
    schema = TypeAdapter(union).json_schema()
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema["title"] = "ft recipe"
    return schema
