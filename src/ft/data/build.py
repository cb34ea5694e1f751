"""All sources of a split, formatted and concatenated."""

from __future__ import annotations

from ..recipe import Recipe
from ..recipe.schema import DataSource
from .formats import FORMATS, RowError
from .sources import SourceError, read_source


class DataError(Exception):
    """A data source or row the recipe points at cannot be used (exit code 2)."""


def build_datasets(recipe: Recipe) -> tuple[object, object | None]:
    """(train, eval) datasets in TRL's column layout; eval is None when the recipe has none."""
    train = _split(recipe.data.train, "train")
    evaluation = _split(recipe.data.eval_sources, "eval") if recipe.data.eval_sources else None
    return train, evaluation


def _split(sources: list[DataSource], split: str):
    import datasets

    parts = [_formatted(source, f"data.{split}.{i}") for i, source in enumerate(sources)]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _formatted(source: DataSource, key: str):
    try:
        raw = read_source(source)
    except SourceError as exc:
        raise DataError(f"{key}.path: {exc}.") from None
    except Exception as exc:  # datasets raises many types for unreadable files
        raise DataError(f"{key}.path: could not read {source.path!r}: {_first_line(exc)}") from None
    convert = FORMATS[source.format]

    def checked(row, index):
        try:
            return convert(row)
        except (RowError, KeyError, TypeError) as exc:
            raise DataError(f"{key}: row {index} of {source.path} does not fit format "
                            f"`{source.format}`: {exc}. Fix the row or choose another `format`.") from None

    return raw.map(checked, with_indices=True, remove_columns=raw.column_names, desc=f"formatting {key}")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
