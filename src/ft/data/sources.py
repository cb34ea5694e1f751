"""Reading one ``data.train``/``data.eval`` entry into a ``datasets.Dataset``."""

from __future__ import annotations

from pathlib import Path

from ..recipe.schema import DataSource

# file suffix -> datasets builder name
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


class SourceError(Exception):
    pass


def read_source(source: DataSource):
    import datasets

    path = Path(source.path)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        return loaded[source.split] if isinstance(loaded, datasets.DatasetDict) else loaded
    if path.is_file():
        builder = BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise SourceError(f"unsupported file type {path.suffix!r}; use one of {', '.join(BUILDERS)}")
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_absolute() or source.path.startswith((".", "~")) or path.suffix.lower() in BUILDERS:
        raise SourceError(f"{source.path!r} does not exist (relative paths are read from the recipe's folder)")
    return datasets.load_dataset(source.path, source.name, split=source.split, revision=source.revision)
