"""``data.streaming``: training rows read, checked, tokenized (and, with ``packing``, packed by TRL) as the trainer
consumes them, so a corpus never has to fit in memory or on a cache disk.

The stream is a ``datasets.IterableDataset`` built from a generator ft writes, not from ``datasets``' own streaming
readers, for what those cannot give: every row keeps its place in its file (bad rows are named ``file:line``, or
counted under ``on_bad_row: skip``, exactly as without streaming), a line that is not UTF-8 is a bad row, and a source
that disappears or fails mid-stream raises ``StreamFailed``, which the trainer turns into a checkpoint and a stop.
Local .jsonl and .txt files are read line by line, a .json file element by element (``ft.data.sources.json_rows``:
JSON values as written, as without streaming), .parquet by record batch; other files, folders and hub datasets go
through ``datasets.load_dataset(..., streaming=True)`` and are numbered as read.

Three properties the trainer relies on:

- **It never ends.** Each source starts again from its first row when it runs out (the console says so), so
  ``train.max_steps`` alone ends training and the Trainer's resume (which skips the batches the checkpoint's steps
  consumed) replays exactly the stream an uninterrupted run reads: a stopped-and-resumed run trains on the same rows
  in the same order. Bad rows are counted on a source's first pass only.
- **Shards by process.** With N processes the stream has N shards; shard r holds the rows whose index in their source
  is r modulo N, and accelerate gives shard r to rank r (``dispatch_batches`` off: each process reads its own rows,
  no two ranks train on the same row). Every process reads every line, and parses and tokenizes only its own (a .json
  array's elements it parses all of: they cannot be told apart without it).
- **Counts as it goes.** Rows read, skipped, cut and dropped go into the run's ``stats`` dict (summary.json ``data``)
  while training reads them (the DataLoader reads in the training process: no workers).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import datasets

from ..recipe import Recipe
from ..recipe.data_section import DataSource
from .formats import FORMATS, Names
from .rows import ROW, BadRows, DataError, RowError, bad_rows_error, nonblank_lines
from .sources import FILE_BUILDERS, json_rows, line_row, missing_source, source_kind
from .tokenize import TokenizeSettings, tokenize_batch

READ_BATCH = 256  # rows tokenized together (one datasets.map batch)


class StreamFailed(DataError):
    """A source could not be read mid-stream, or held a bad row under ``on_bad_row: error``: the trainer stops at
    the last finished step and saves a checkpoint there (``FtTrainerMixin.get_batch_samples``)."""


def streamed_train(recipe: Recipe, tokenizer, template: str | None, world_size: int, say: Callable[[str], None],
                   stats: dict) -> datasets.IterableDataset:
    """The training rows of ``recipe`` as an endless, tokenized IterableDataset with ``world_size`` shards (see the
    module docstring); ``stats`` is updated as rows are read."""
    data = recipe.data
    report = BadRows()
    stats.update(streaming=True, skipped_rows={}, train_rows_tokenized=0, train_rows_truncated=0,
                 train_rows_dropped_as_too_long=0, train_rows_dropped_with_no_trained_tokens=0, passes={})
    keys = [f"data.train.{i}" for i in range(len(data.train))]
    for key, source in zip(keys, data.train, strict=True):
        if source_kind(source) == "missing":
            raise missing_source(source, key)
    features = _features(data.train[0].format)
    for key, source in zip(keys[1:], data.train[1:], strict=True):
        if _features(source.format) != features:
            raise DataError(f"{key} has format `{source.format}`, whose rows have other columns than {keys[0]}'s "
                            f"(`{data.train[0].format}`): the streamed sources of one run must give the same kind of "
                            "rows (chat and instruction both give chats).")

    def source_stream(key: str, source: DataSource) -> datasets.IterableDataset:
        return datasets.IterableDataset.from_generator(
            _canonical_rows, features=features,
            gen_kwargs={"part": list(range(world_size)), "parts": world_size, "source": source, "key": key,
                        "columns": tuple(features), "on_bad_row": data.on_bad_row, "report": report, "stats": stats,
                        "say": say})

    streams = [source_stream(key, source) for key, source in zip(keys, data.train, strict=True)]
    if data.weights is None:
        rows = streams[0] if len(streams) == 1 else datasets.interleave_datasets(streams, seed=data.seed)
    else:
        rows = datasets.interleave_datasets(streams, probabilities=data.weights, seed=data.seed)
    settings = TokenizeSettings.of(data, template)
    length_column = recipe.train_args.get("length_column_name", "length")
    return rows.map(_tokenized, batched=True, batch_size=READ_BATCH, remove_columns=list(features),
                    fn_kwargs={"tokenizer": tokenizer, "settings": settings, "stats": stats,
                               "length_column": length_column})


def _features(format_name: str) -> datasets.Features:
    """The canonical columns a format's rows stream as: chats (``Format.conversations``) as a ``chat`` source's rows
    are stored without streaming (``Chat.typed``: each message as its JSON text, so its tool calls and reasoning stay,
    and the row's ``tools``, None where it has none: the sources of one stream give the same columns), or texts."""
    fmt = FORMATS[format_name]
    if fmt.conversations:
        return datasets.Features(FORMATS["chat"].typed(Names({}, {})))
    return datasets.Features(dict.fromkeys(fmt.columns, datasets.Value("string")))


def _canonical_rows(part: list[int], parts: int, source: DataSource, key: str, columns: tuple[str, ...],
                    on_bad_row: str, report: BadRows, stats: dict, say: Callable[[str], None]) -> Iterator[dict]:
    """This shard's canonical rows of ``source`` in ``columns`` (an optional one a row lacks, a chat's ``tools``, as
    None), pass after pass, without end."""
    fmt, names = FORMATS[source.format], Names(source.fields, source.roles)
    mine = part[0]
    for passes in itertools.count(1):
        first = passes == 1
        given = 0
        for index, raw in _raw_rows(source, key, lambda i: i % parts == mine):
            try:
                if isinstance(raw, RowError):
                    raise raw
                row = fmt.convert(raw, names)
            except RowError as error:
                if on_bad_row == "error":
                    raise StreamFailed(str(bad_rows_error(key, source, [(index, error)], 1))) from None
                if first:
                    report.add(key, error.reason)
                    stats["skipped_rows"] = report.as_dict()
                continue
            given += 1
            yield {name: row.get(name) for name in columns}
        if not given:
            raise StreamFailed(f"{key}: {source.path} gave no usable rows to this process (shard {mine + 1} of "
                               f"{parts}); check the source and its format.")
        stats["passes"][key] = passes
        if first:
            say(f"data: {key} ({source.path}) ran out after {given} rows of this process's share; it starts again "
                "from its first row (training ends at train.max_steps)")


def _raw_rows(source: DataSource, key: str, mine: Callable[[int], bool]) -> Iterator[tuple[int, dict | RowError]]:
    """(row index, the row as read, or the RowError that makes it bad) for the rows ``mine`` keeps; a source that
    cannot be read raises StreamFailed."""
    path, kind = Path(source.path), source_kind(source)
    suffix = path.suffix.lower()
    try:
        if kind == "file" and suffix in (".jsonl", ".txt"):
            yield from _lines(path, suffix, mine)
        elif kind == "file" and suffix == ".json":
            yield from ((index, row) for index, row in json_rows(path, f"{key}.path: {source.path}") if mine(index))
        elif kind == "file" and suffix == ".parquet":
            yield from _parquet(path, mine)
        elif kind == "missing":  # it was there when the run started (streamed_train checks)
            raise OSError(f"{source.path} does not exist")
        else:
            yield from _through_datasets(source, kind, mine)
    except StreamFailed:
        raise
    except DataError as exc:  # a JSON array file with a syntax error: its rows cannot be told apart
        raise StreamFailed(str(exc)) from None
    except Exception as exc:  # a file deleted or unreadable mid-stream, a hub connection lost, …
        raise StreamFailed(f"{key}: {source.path} could not be read mid-stream ({type(exc).__name__}: {exc}).") \
            from None


def _lines(path: Path, suffix: str, mine: Callable[[int], bool]) -> Iterator[tuple[int, dict | RowError]]:
    for index, (number, line) in enumerate(nonblank_lines(path)):
        if mine(index):
            yield index, line_row(number, line, suffix)


def _parquet(path: Path, mine: Callable[[int], bool]) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            if mine(index):
                yield index, row
            index += 1


def _through_datasets(source: DataSource, kind: str, mine: Callable[[int], bool]) -> Iterator[tuple[int, dict]]:
    if kind == "file":
        rows = datasets.load_dataset(FILE_BUILDERS[Path(source.path).suffix.lower()], data_files=source.path,
                                     split="train", streaming=True)
    else:
        rows = datasets.load_dataset(source.path, source.name, split=source.split, revision=source.revision,
                                     streaming=True)
    for index, row in enumerate(rows):
        if mine(index):
            yield index, {name: value for name, value in row.items() if name != ROW}


def _tokenized(batch: dict, tokenizer, settings: TokenizeSettings, stats: dict, length_column: str) -> dict:
    """One batch of canonical rows as input_ids, labels and length; rows too long (``truncation: drop``) or left with
    no trained token are dropped and counted, as without streaming."""
    out = tokenize_batch(batch, tokenizer, settings)
    keep = [not (too_long or no_loss) for too_long, no_loss in zip(out["ft_too_long"], out["ft_no_loss"],
                                                                     strict=True)]
    stats["train_rows_tokenized"] += len(keep)
    stats["train_rows_truncated"] += sum(out["ft_truncated"])
    stats["train_rows_dropped_as_too_long"] += sum(out["ft_too_long"])
    stats["train_rows_dropped_with_no_trained_tokens"] += sum(
        no_loss and not too_long for too_long, no_loss in zip(out["ft_too_long"], out["ft_no_loss"], strict=True))
    columns = {"input_ids": out["input_ids"], "labels": out["labels"], length_column: out["length"]}
    return {name: [value for value, kept in zip(values, keep, strict=True) if kept] for name, values in columns.items()}
