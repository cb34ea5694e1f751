"""The data ``--smoke`` trains on: each source's first rows, or rows generated in its format when it cannot be read.

A local source's first rows are copied (a .jsonl or .txt file line for line, blank lines included, so an error about
the copy keeps the original's line numbers); a ``save_to_disk`` folder's first rows of each split; a hub dataset's
first rows from the cache (offline) or a stream (online). A source that cannot be read gets arithmetic rows generated
in its format and ``fields:``/``roles:`` layout, so the mapping is exercised all the same.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..data.formats import FORMATS, Names
from ..data.sources import source_kind
from ..recipe import Recipe
from ..recipe.data_section import DataSource
from ..recipe.errors import first_line


def head(source: DataSource, rows: int, stem: Path) -> tuple[Path | None, str | None]:
    """(copy of the source's first ``rows`` rows, why) — (None, None): use the source as it is (it has no more rows,
    or it is a local path whose reading the real pipeline reports); (None, reason): unreachable, generate rows."""
    kind = source_kind(source)
    try:
        if kind == "file":
            return _file_head(Path(source.path), rows, stem)
        if kind == "saved":
            return _disk_head(Path(source.path), rows, stem)
    except Exception:  # unreadable: the real pipeline reads it whole and reports it
        return None, None
    if kind == "missing":
        return None, None  # the real pipeline says so
    return _dataset_head(source, rows, stem, local=kind == "folder")


def _file_head(path: Path, rows: int, stem: Path) -> tuple[Path | None, str | None]:
    suffix = path.suffix.lower()
    copy = stem.with_name(f"{stem.name}.{path.name}")
    why = f"the first {rows} rows of {path}"
    if suffix in (".jsonl", ".txt"):  # line for line, blank lines included: errors keep their line numbers
        written = 0
        with open(path, "rb") as f, open(copy, "wb") as g:
            for line in f:
                if written == rows:
                    return copy, why
                g.write(line)
                written += bool(line.strip())
        copy.unlink()
        return None, None
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        if parquet.metadata.num_rows <= rows:
            return None, None
        pq.write_table(next(parquet.iter_batches(batch_size=rows)), copy)
        return copy, why
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            records = [record for _, record in zip(range(rows + 2), csv.reader(f), strict=False)]
        if len(records) <= rows + 1:
            return None, None
        with open(copy, "w", newline="", encoding="utf-8") as g:
            csv.writer(g).writerows(records[: rows + 1])
        return copy, why
    if suffix == ".json":
        text = path.read_text(encoding="utf-8-sig")
        if not text.lstrip().startswith("["):  # JSON lines in a .json file
            lines = [line for line in text.splitlines(keepends=True)]
            kept, count = [], 0
            for line in lines:
                if count == rows:
                    copy.write_text("".join(kept), encoding="utf-8")
                    return copy, why
                kept.append(line)
                count += bool(line.strip())
            return None, None
        items = json.loads(text)
        if not isinstance(items, list) or len(items) <= rows:
            return None, None
        copy.write_text(json.dumps(items[:rows], ensure_ascii=False), encoding="utf-8")
        return copy, why
    return None, None


def _disk_head(path: Path, rows: int, stem: Path) -> tuple[Path | None, str | None]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    parts = loaded if isinstance(loaded, datasets.DatasetDict) else {"": loaded}
    if all(len(part) <= rows for part in parts.values()):
        return None, None
    heads = {name: part.select(range(min(rows, len(part)))) for name, part in parts.items()}
    copy = stem.with_name(f"{stem.name}.{path.name}")
    (datasets.DatasetDict(heads) if isinstance(loaded, datasets.DatasetDict) else heads[""]).save_to_disk(str(copy))
    return copy, f"the first {rows} rows of {path}"


def _dataset_head(source: DataSource, rows: int, stem: Path, local: bool) -> tuple[Path | None, str | None]:
    """A hub dataset (or a local folder of data files): its first rows from the cache when offline, from a stream
    when online, saved as a one-split DatasetDict (so a bad row is reported as ``path[split]:index``)."""
    import datasets
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE
    try:
        if offline or local:
            head = datasets.load_dataset(source.path, source.name, split=f"{source.split}[:{rows}]",
                                         revision=source.revision)
        else:
            stream = datasets.load_dataset(source.path, source.name, split=source.split, revision=source.revision,
                                           streaming=True)
            head = datasets.Dataset.from_list(list(stream.take(rows)))
    except Exception as exc:
        return (None, None) if local else (None, first_line(exc))
    copy = stem.with_name(f"{stem.name}.dataset")
    datasets.DatasetDict({source.split: head}).save_to_disk(str(copy))
    where = "the HF cache" if offline else "a stream"
    return copy, f"the first {len(head)} rows of {source.path} [{source.split}], from {where}"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def generated(source: DataSource, split: str, count: int, recipe: Recipe, chat: bool) -> list[dict]:
    """``count`` arithmetic rows in ``source.format`` (its ``Format.example_rows``), laid out as the source's
    ``fields:`` and ``roles:`` say its rows are (so the mapping is exercised); prompt rows carry every field the
    rewards read. Evaluation rows ask other sums than training rows."""
    start = 0 if split == "train" else 1000
    return FORMATS[source.format].example_rows(count, Names(source.fields, source.roles), start=start, chat=chat,
                                               answer_fields=reward_fields(recipe))


def reward_fields(recipe: Recipe) -> list[str]:
    """The row fields the rewards of a generating method (GRPO) read: the built-ins' ``field`` (``answer`` by
    default), and ``answer`` for user functions (which fields those read cannot be known). The rewards are those the
    method's section declares for its generation (``MethodSection.generation``)."""
    from ..recipe.methods import generation_of

    generation = generation_of(recipe)
    fields = ["answer"]
    for spec in generation.rewards if generation is not None else ():
        if spec.name in ("exact_match", "numeric_match"):
            fields.append(str(spec.args.get("field", "answer")))
    return list(dict.fromkeys(fields))
