"""The base of every recipe section, and input-path resolution relative to the recipe file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator


def drop_nulls(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the fields of ``model`` that are null: ``key: null`` reads as if the key were not
    written, so the field's default applies (a required key is then reported as required). Only the
    model's own fields: an unknown key stays to be reported, and nulls inside free-form maps
    (``optimizer.args``, ``kwargs``, ``fields``) are values, passed on untouched."""
    if not isinstance(data, dict):
        return data
    return {key: value for key, value in data.items() if value is not None or key not in model.model_fields}


class Section(BaseModel):
    """Frozen, strict (no "4" for 4), and unknown keys are errors; ``key: null`` means the default."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        return drop_nulls(cls, data)


def resolve_input_path(value: str | None, info: ValidationInfo) -> str | None:
    """``value`` made absolute when it names something next to the recipe (or in the cwd); hub ids
    and other names pass through unchanged."""
    if value is None:
        return None
    base = Path((info.context or {}).get("base_dir", "."))
    for candidate in (base / value, Path(value)):
        if candidate.exists():
            return str(candidate.resolve())
    return value
