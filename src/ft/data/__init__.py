"""Datasets for a run: read each source, convert its rows to the columns TRL expects, concatenate."""

from .build import DataError, build_datasets

__all__ = ["DataError", "build_datasets"]
