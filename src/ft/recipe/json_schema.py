"""JSON Schema of recipes: one branch per method (each with its own ``train:`` fields)."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, TypeAdapter

from .methods import METHODS
from .schema import recipe_model


def recipe_json_schema() -> dict:
    union = Annotated[Union[tuple(recipe_model(m) for m in METHODS)], Field(discriminator="method")]
    schema = TypeAdapter(union).json_schema()
    for method in METHODS:  # `extends:` is resolved before validation, so it is not a model field
        branch = schema["$defs"][f"{method.upper()}Recipe"]
        branch["properties"]["extends"] = {"type": "string", "description": "Another recipe (relative path) "
                                           "this one builds on; maps merge deeply, lists are replaced."}
        required = branch.pop("required", [])
        if required:  # a recipe that extends another may leave the required sections to its base
            branch["if"] = {"not": {"required": ["extends"]}}
            branch["then"] = {"required": required}
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema["title"] = "ft recipe"
    return schema
