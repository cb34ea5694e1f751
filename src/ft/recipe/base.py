"""The base of every recipe section, and input-path resolution relative to the recipe file."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationInfo


class Section(BaseModel):
    """Frozen, strict (no "4" for 4), and unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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
