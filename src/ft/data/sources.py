"""Reading one ``data.train``/``data.eval`` entry into a ``datasets.Dataset``; mixing and splitting them.

A source is a local file (its suffix picks the ``datasets`` builder, see FILE_BUILDERS; JSON files ft reads itself,
see ``_from_json``), a directory written by ``save_to_disk`` (a Dataset, or a DatasetDict read at ``split``), or a hub
dataset id. Every dataset read gets the int column ``__ft_row``, the row's index in the source before ``fraction``
subsamples it, so a bad row can be reported as ``file:line``. Blank lines of .jsonl and .txt files are not rows.

JSON values are read as written: a string stays a string whatever it looks like ("10", "2021-03-05", "true"), a list
stays a list, and no type inferred across rows decides what a field is. Arrow's JSON reader (and ``datasets``' JSON
builder on top of it) infers one type per column and converts values to it: ISO dates become timestamps, ``1`` next
to ``2.5`` becomes ``1.0``, an object gains the keys other rows' objects have (as nulls), and once a column mixes
kinds ``datasets`` stores it as ``Json``, whose encoder turns the string "10" into the number 10. So ft keeps Arrow's
read only where it provably changed nothing (``_as_written``), and reads every other JSON file with Python's ``json``
module, row by row, into columns of one declared kind each (``_python_read``).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
import uuid
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..recipe.data_section import DataSource
from ..recipe.errors import first_line
from .lazy import LazyModule
from .rows import BLANK, ROW, SHOWN, SOURCE, BadRows, DataError, RowError, bad_rows_error, nonblank_lines

datasets = LazyModule("datasets")  # imported when a dataset is built: `--show` reads rows without it

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
JSON_FILES = (".jsonl", ".json")  # read by ft itself (``_from_json``), not by the datasets builder
ARROW_BLOCK = 4 << 20  # bytes Arrow's JSON reader reads (and infers the column types from) at a time
WRITE_BATCH = 2048  # rows of a JSON file read by Python written to Arrow together
CHUNK = 1 << 20  # bytes of a JSON array file decoded at a time
READER = "ft.json/1"  # part of the name of a JSON file's Arrow copy: bump when the copy's layout changes


def read_source(source: DataSource, *, seed: int, on_bad_row: str, report: BadRows,
                key: str | None = None) -> datasets.Dataset:
    """The rows of ``source`` with ``__ft_row``, subsampled to ``source.fraction`` with ``seed``.

    Only a .jsonl file can hold rows this step finds bad (invalid JSON, a line that is not an object):
    ``on_bad_row="error"`` raises DataError naming them, ``"skip"`` counts them in ``report`` under
    ``key`` (or, without a key, under ``source.path``, which ``normalize`` re-files under its key).
    """
    dataset = _load(source, on_bad_row, report, key)
    if not len(dataset):
        raise DataError(f"{_subject(source, key)} has no rows.")
    if ROW not in dataset.column_names:
        dataset = dataset.add_column(ROW, np.arange(len(dataset), dtype=np.int64))
    return _subsample(dataset, source.fraction, seed)


def mix(parts: list[datasets.Dataset], keys: list[str] | None = None,
        optional: Collection[str] = ()) -> datasets.Dataset:
    """The normalized sources of one split, concatenated in order, each row with its source's index (``__ft_source``);
    they must share one column layout. ``keys`` (``data.train.0``, …) name the sources in the error.

    ``optional``: columns a format writes only for a source that has them (``Format.optional``: a chat's ``tools``).
    One that some sources have and others lack is added to the others empty, None in every row, of the kind the
    first source holding it gives it: a chat row whose ``tools`` is None is rendered with ``data.tools``, or with
    none, as the rows of a source without the column are on their own."""
    names = keys or [f"source {i}" for i in range(len(parts))]
    given = {column: part.features[column] for part in reversed(parts) for column in part.column_names
             if column in optional}
    parts = [_with_columns(part, given).add_column(SOURCE, np.full(len(part), i, dtype=np.int32))
             for i, part in enumerate(parts)]
    first, aligned = parts[0], [parts[0]]
    for name, part in zip(names[1:], parts[1:], strict=True):
        if set(part.column_names) != set(first.column_names):
            raise DataError(f"{name} has the columns {_columns(part)} but {names[0]} has {_columns(first)}: the "
                            "sources of one split must use formats with the same columns (and, for `prompt`, the "
                            "same extra fields).")
        try:
            aligned.append(part if part.features == first.features else part.cast(first.features))
        except Exception:  # arrow cannot turn one layout into the other
            raise DataError(f"{name} and {names[0]} hold different kinds of values ({part.features} vs "
                            f"{first.features}): the sources of one split must agree, e.g. all text or all "
                            "lists of messages.") from None
    return aligned[0] if len(aligned) == 1 else datasets.concatenate_datasets(aligned)


def _with_columns(part: datasets.Dataset, features: dict) -> datasets.Dataset:
    """``part`` with each column of ``features`` (name -> its feature) it lacks added, None in every row."""
    for column, feature in features.items():
        if column not in part.column_names:
            part = part.add_column(column, [None] * len(part), feature=feature)
    return part


def weighted(dataset: datasets.Dataset, weights: list[float], seed: int, stop: str) -> datasets.Dataset:
    """The rows of ``mix``'s concatenation drawn source by source with probabilities ``weights``, seeded, until
    ``stop`` (datasets' stopping strategies, ``data.mix_stop``). datasets' ``interleave_datasets`` draws the order, on
    a column of row positions per source, so the rows themselves are only selected, never copied or re-tokenized."""
    sources = dataset.with_format("arrow")[SOURCE].to_numpy()  # a column at once (a Column object reads row by row)
    positions = [datasets.Dataset.from_dict({"at": np.flatnonzero(sources == i)}) for i in range(len(weights))]
    empty = next((i for i, part in enumerate(positions) if not len(part)), None)
    if empty is not None:
        raise DataError(f"data.train.{empty}: no rows of this source are left (see the counts above), so it cannot "
                        "take its share of the mixture; fix its rows or remove it.")
    drawn = datasets.interleave_datasets(positions, probabilities=weights, seed=seed, stopping_strategy=stop)
    return dataset.select(drawn.with_format("arrow")["at"].to_numpy())


def source_counts(dataset: datasets.Dataset, keys: list[str], length_column: str | None = None) -> dict[str, dict]:
    """``{key: {"rows": n, "tokens": t}}`` per source of ``mix``'s output (tokens from ``length_column`` when the
    rows are tokenized): what the run takes from each source, repeats included."""
    table = dataset.select_columns([SOURCE, *([length_column] if length_column else [])]).with_format("arrow")[:]
    sources = table[SOURCE].to_numpy()
    lengths = table[length_column].to_numpy() if length_column else None
    counts = {}
    for i, key in enumerate(keys):
        chosen = sources == i
        counts[key] = {"rows": int(chosen.sum())}
        if lengths is not None:
            counts[key]["tokens"] = int(lengths[chosen].sum())
    return counts


def split_off(dataset: datasets.Dataset, ratio: float, seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, eval): a seeded ``round(ratio × n)`` rows (at least 1) held out; both keep the rows' order."""
    count = max(1, round(ratio * len(dataset)))
    if count >= len(dataset):
        raise DataError(f"data.eval.split_ratio: holding out {ratio} of {len(dataset)} training rows leaves none to "
                        "train on; add rows or give `data.eval` its own sources.")
    held = np.random.default_rng(seed).choice(len(dataset), size=count, replace=False)
    keep = np.ones(len(dataset), dtype=bool)
    keep[held] = False
    return dataset.select(np.flatnonzero(keep)), dataset.select(np.sort(held))


def source_kind(source: DataSource) -> str:
    """What ``source.path`` names: ``saved`` (a ``save_to_disk`` directory), ``file`` (a local file), ``folder`` (a
    local folder of data files, for ``datasets.load_dataset``), ``missing`` (a local path that does not exist: an
    absolute or ./~ path, or a file name with a data suffix) or ``hub`` (a hub dataset id)."""
    path = Path(source.path)
    if path.is_dir():
        return "saved" if (path / "dataset_dict.json").exists() or (path / "state.json").exists() else "folder"
    if path.is_file():
        return "file"
    if path.is_absolute() or source.path.startswith((".", "~")) or path.suffix.lower() in FILE_BUILDERS:
        return "missing"
    return "hub"


def _load(source: DataSource, on_bad_row: str, report: BadRows, key: str | None) -> datasets.Dataset:
    path, kind = Path(source.path), source_kind(source)
    if kind == "saved":
        return _from_disk(path, source, key)
    if kind == "file":
        return _from_file(path, source, on_bad_row, report, key)
    if kind == "missing":
        raise missing_source(source, key)
    try:  # a hub id, or a local folder of data files
        return datasets.load_dataset(source.path, source.name, split=source.split, revision=source.revision)
    except Exception as exc:
        raise DataError(f"{_subject(source, key)}: could not load split {source.split!r} as a dataset: "
                        f"{first_line(exc)}") from None


def _from_disk(path: Path, source: DataSource, key: str | None) -> datasets.Dataset:
    loaded = datasets.load_from_disk(str(path))
    if not isinstance(loaded, datasets.DatasetDict):
        return loaded
    if source.split not in loaded:
        raise DataError(f"{_subject(source, key)} has no split {source.split!r}; it has {', '.join(loaded)}. "
                        "Set `split:` to one of them.")
    return loaded[source.split]


def _from_file(path: Path, source: DataSource, on_bad_row: str, report: BadRows, key: str | None):
    suffix = path.suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise DataError(f"{_subject(source, key)}: unsupported file type {path.suffix!r}; use one of "
                        f"{', '.join(FILE_BUILDERS)}, a `save_to_disk` directory or a hub dataset id.")
    if suffix in JSON_FILES:
        return _from_json(path, source, on_bad_row, report, key)
    try:
        dataset = datasets.load_dataset(FILE_BUILDERS[suffix], data_files=str(path), split="train")
    except Exception as exc:  # arrow's reader fails on one bad line, with an unhelpful message
        if suffix == ".txt":
            return _text_in_python(path, source, on_bad_row, report, key, exc)
        if _undecoded(exc) is not None:
            raise _not_utf8_file(path, source, key) from None
        raise DataError(f"{_subject(source, key)}: could not read it: {first_line(exc)}") from None
    if suffix == ".txt":  # the text builder keeps blank lines; they are not rows
        dataset = dataset.filter(lambda text: [bool(t and t.strip(BLANK)) for t in text], input_columns="text",
                                 batched=True)
    return dataset


def _from_json(path: Path, source: DataSource, on_bad_row: str, report: BadRows, key: str | None):
    """A .jsonl or .json file with every value as written (the module docstring), on disk in Arrow (memory-mapped, as
    ``datasets`` keeps what it reads): first by Arrow's JSON reader, kept only when ``_as_written`` holds for every
    block it read (the common case: it is fast); else by Python's ``json``, which also names bad rows."""
    target = _arrow_copy(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lines = _json_lines(path)
    if lines and _arrow_read(path, target):
        return datasets.Dataset.from_file(str(target))
    return _python_read(path, lines, target, source, on_bad_row, report, key)


def _arrow_copy(path: Path) -> Path:
    """Where the Arrow copy of a JSON file is written: in ``datasets``' cache, named after the file's path, size and
    modification time (as ``datasets`` names what it reads), so a file read again replaces its own copy, and what is
    cached from the copy (its tokenized rows) is tied to that version of the file."""
    stat = path.stat()
    name = hashlib.sha256(f"{READER}\0{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    return Path(datasets.config.HF_DATASETS_CACHE) / "ft_json" / f"{name[:32]}.arrow"


def _json_lines(path: Path) -> bool:
    """Whether a JSON file holds one value per line (JSON Lines: every .jsonl file, and a .json file that does not
    open with ``[``) rather than one JSON array."""
    if path.suffix.lower() == ".jsonl":
        return True
    with open(path, "rb") as f:
        start = f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n")
    return not start.startswith(b"[")


def _arrow_read(path: Path, target: Path) -> bool:
    """Arrow's JSON reader's copy of a JSON Lines file written to ``target``, when every block it read keeps every
    value as written (``_as_written``) and holds UTF-8 text only; False (nothing written) otherwise, or when Arrow
    cannot read the file (a bad line, a column whose kind changes, a field the first block lacked)."""
    import pyarrow.json as paj
    from datasets.arrow_writer import ArrowWriter

    temporary = target.with_name(f"{target.stem}.{uuid.uuid4().hex}.tmp")
    writer, start = None, 0
    try:
        for batch in paj.open_json(path, read_options=paj.ReadOptions(block_size=ARROW_BLOCK)):
            if not all(_as_written(column, nested=False) for column in batch.columns):
                return False
            batch.validate(full=True)  # arrow's JSON reader keeps bytes that are not UTF-8
            rows = pa.array(np.arange(start, start + batch.num_rows, dtype=np.int64))
            writer = writer or ArrowWriter(path=str(temporary))
            writer.write_table(pa.Table.from_batches([batch]).append_column(ROW, rows))
            start += batch.num_rows
        if writer is None:
            return False
        writer.finalize()
        writer = None
        os.replace(temporary, target)
        return True
    except (pa.ArrowException, ValueError):  # an invalid line, a column that changes kind, text that is not UTF-8
        return False
    finally:
        if writer is not None:
            writer.finalize()
        temporary.unlink(missing_ok=True)


def _as_written(array: pa.Array, nested: bool, in_object: bool = False) -> bool:
    """Whether Arrow's JSON reader read ``array`` as Python's ``json`` would: only text, whole numbers, true/false,
    and lists and objects of them, with no null below the top level (a null there is a value written as null or a key
    an object lacked, which Arrow cannot tell apart) and no object inside an object (whose keys Arrow may reorder).
    Floats (``1`` beside ``2.5`` reads as ``1.0``) and timestamps (strings that look like dates) are not."""
    kind = array.type
    if nested and array.null_count:
        return False
    if pa.types.is_null(kind):  # all null: a column no row of the block has (an empty list's values, nested)
        return True
    if pa.types.is_string(kind) or pa.types.is_int64(kind) or pa.types.is_boolean(kind):
        return True
    if pa.types.is_list(kind):
        return _as_written(array.flatten(), nested=True, in_object=in_object)
    if pa.types.is_struct(kind) and not in_object:
        valid = array.is_valid() if array.null_count else None
        children = (array.field(i) for i in range(kind.num_fields))
        return all(_as_written(child if valid is None else child.filter(valid), nested=True, in_object=True)
                   for child in children)
    return False


def _python_read(path: Path, lines: bool, target: Path, source: DataSource, on_bad_row: str, report: BadRows,
                 key: str | None) -> datasets.Dataset:
    """A JSON file read with Python's ``json``, in bounded memory: the bad rows are reported (or skipped and counted),
    each field's kind is that of all its values (``_column_kind``), and the good rows are written to ``target`` in
    batches, a column per field. The batches are written as the file is read while the kinds stay those its first
    batch showed (the usual case: one pass); a later row that changes a field's kind (or adds a field) stops the
    writing, and a second pass writes the rows with the kinds of the whole file."""
    subject = _subject(source, key)
    kinds: dict[str, set] = {}
    shown: list[tuple[int, RowError]] = []
    counts: Counter = Counter()
    rows, batch = 0, []
    copy = _Copy(target)
    try:
        for index, row in json_rows(path, subject, lines):
            if isinstance(row, RowError):
                counts[row.reason] += 1
                if len(shown) < SHOWN:
                    shown.append((index, row))
                continue
            rows += 1
            for name, value in row.items():
                kinds.setdefault(name, set()).add(_value_kind(value))
            if copy.open:
                batch.append((index, row))
                if len(batch) == WRITE_BATCH:
                    copy.write(batch, kinds)
                    batch = []
        if counts and on_bad_row == "error":
            raise bad_rows_error(key, source, shown, sum(counts.values()))
        for reason, count in counts.items():
            report.add(key or source.path, reason, count)
        if not rows and counts:
            raise DataError(f"{subject}: none of its {sum(counts.values())} rows could be read "
                            f"({', '.join(f'{r}: {n}' for r, n in counts.items())}).")
        if copy.open:
            copy.write(batch, kinds)
        if not copy.open:  # a field changed kind after the first batch: write every row with the file's kinds
            copy, batch = _Copy(target), []
            for index, row in json_rows(path, subject, lines):
                if not isinstance(row, RowError):
                    batch.append((index, row))
                    if len(batch) == WRITE_BATCH:
                        copy.write(batch, kinds)
                        batch = []
            copy.write(batch, kinds)
        return copy.finish()
    except OSError as exc:
        raise DataError(f"{subject}: could not read it: {exc}") from None
    finally:
        copy.discard()


class _Copy:
    """The Arrow copy of a JSON file, written batch by batch under a temporary name with the columns its first batch
    fixes; ``open`` turns False (and the copy is dropped) when a later batch's kinds differ."""

    def __init__(self, target: Path):
        self.target, self.open = target, True
        self.temporary = target.with_name(f"{target.stem}.{uuid.uuid4().hex}.tmp")
        self.columns: dict[str, str] | None = None
        self.writer, self.rows = None, 0

    def write(self, batch: list[tuple[int, dict]], kinds: dict[str, set]) -> None:
        from datasets.arrow_writer import ArrowWriter

        columns = {name: _column_kind(found) for name, found in kinds.items()}
        if self.columns is None:
            self.columns = columns
            features = {**{name: _feature(kind) for name, kind in columns.items()}, ROW: datasets.Value("int64")}
            self.writer = ArrowWriter(features=datasets.Features(features), path=str(self.temporary))
        elif columns != self.columns:
            self.discard()
            self.open = False
            return
        if batch or not self.rows:  # a file without rows still has its (empty) table
            self.writer.write_table(_table(batch, self.columns))
            self.rows += len(batch)

    def finish(self) -> datasets.Dataset:
        self.writer.finalize()
        self.writer = None
        os.replace(self.temporary, self.target)
        return datasets.Dataset.from_file(str(self.target))

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.finalize()
            self.writer = None
        self.temporary.unlink(missing_ok=True)


# a JSON field's kind -> (its feature's dtype, its Arrow type); ``json``: each value stored as its JSON text (see
# ``_table``), a feature of its own (``_feature``)
JSON_KINDS = {"text": ("string", pa.string()), "int": ("int64", pa.int64()), "float": ("float64", pa.float64()),
              "bool": ("bool", pa.bool_()), "json": (None, pa.json_())}


def _feature(kind: str):
    """The ``datasets`` feature a JSON field of ``kind`` (``JSON_KINDS``) is written with: a Value of its dtype, or
    for ``json`` its JSON text, kept undecoded. Built when a copy is written, not at import (``datasets`` is lazy)."""
    dtype = JSON_KINDS[kind][0]
    return datasets.Value(dtype) if dtype else datasets.Json(decode=False)


def _value_kind(value) -> str | None:
    """One value's kind: ``text``, ``int`` (within 64 bits), ``float``, ``bool``, ``json`` (a list, an object, an int
    beyond 64 bits), or None (null: no kind)."""
    if value is None:
        return None
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if -(1 << 63) <= value < 1 << 63 else "json"
    return "float" if isinstance(value, float) else "json"


def _column_kind(kinds: set) -> str:
    """A field's column: the one kind all its values have (text when all are null), else ``json``: each value kept as
    its JSON text, which ``ft.data.formats.normalize`` decodes with Python's ``json`` (``Json(decode=False)``; datasets'
    own decoder reads floats only to within a unit of their last digit)."""
    found = kinds - {None}
    return "text" if not found else next(iter(found)) if len(found) == 1 else "json"


def _table(batch: list[tuple[int, dict]], columns: dict[str, str]) -> pa.Table:
    """Rows as an Arrow table, each field a column of its kind (None where a row lacks the field)."""
    arrays = {}
    for name, kind in columns.items():
        values = [row.get(name) for _, row in batch]
        if kind == "json":
            text = pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values], pa.string())
            arrays[name] = pa.ExtensionArray.from_storage(pa.json_(), text)
        else:
            arrays[name] = pa.array(values, JSON_KINDS[kind][1])
    arrays[ROW] = pa.array([index for index, _ in batch], pa.int64())
    return pa.table(arrays)


def json_rows(path: Path, subject: str, lines: bool | None = None) -> Iterator[tuple[int, dict | RowError]]:
    """(row index, the row, or the RowError that makes it bad) of a JSON file, as Python's ``json`` reads it: a line
    at a time (JSON Lines), or an element at a time (a JSON array; ``lines`` False). Shared by whole-file reading and
    ``ft.data.stream``. A JSON array with a syntax error, or that is not UTF-8, raises DataError: its rows cannot be
    told apart, so they cannot be skipped one by one."""
    if lines is None:
        lines = _json_lines(path)
    if lines:
        for index, (number, line) in enumerate(nonblank_lines(path)):
            yield index, line_row(number, line, ".jsonl")
        return
    with open(path, "rb") as f:
        for index, value in enumerate(_JsonArray(f, subject)):
            if isinstance(value, str):  # an array of strings is an array of texts, as datasets reads one
                value = {"text": value}
            yield index, value if isinstance(value, dict) else _not_an_object(value)


class _JsonArray:
    """The elements of a file holding one JSON array, decoded one at a time from a window of its text: memory holds
    the largest element and a chunk, never the whole file."""

    _SPACE = re.compile(r"[ \t\n\r]*")
    _DECODER = json.JSONDecoder()

    def __init__(self, file, subject: str):
        self.file, self.subject = file, subject
        self.utf8 = codecs.getincrementaldecoder("utf-8-sig")()
        self.text, self.at, self.line, self.eof = "", 0, 1, False

    def __iter__(self) -> Iterator:
        if self._next() != "[":
            raise self._error("a .json file holds one JSON array of rows (or one JSON object per line)")
        self.at += 1
        if self._next() == "]":
            self.at += 1
        else:
            while True:
                yield self._value()
                after = self._next()
                self.at += 1
                if after == "]":
                    break
                if after != ",":
                    self.at -= 1
                    raise self._error("expected ',' or ']' after an element of the array")
        if self._next():
            raise self._error("more data after the array's closing ']'")

    def _more(self) -> bool:
        """Appends the next chunk (at least as much as is left in the window: one element is decoded in a number of
        tries logarithmic in its size); False at the end of the file."""
        if self.eof:
            return False
        chunk = self.file.read(max(CHUNK, len(self.text) - self.at))
        self.eof = not chunk
        self.line += self.text.count("\n", 0, self.at)
        try:
            self.text = self.text[self.at:] + self.utf8.decode(chunk, final=self.eof)
        except UnicodeDecodeError:
            raise DataError(f"{self.subject} is not UTF-8 text: ft reads data files as UTF-8; re-save it as UTF-8, "
                            f"e.g. `iconv -f latin1 -t utf-8 {Path(self.file.name).name}`.") from None
        self.at = 0
        return True

    def _next(self) -> str:
        """The next character that is not whitespace ("" at the end of the file), left unread."""
        while True:
            self.at = self._SPACE.match(self.text, self.at).end()
            if self.at < len(self.text) or not self._more():
                return self.text[self.at:self.at + 1]

    def _value(self):
        self._next()
        while True:
            try:
                value, end = self._DECODER.raw_decode(self.text, self.at)
            except json.JSONDecodeError as exc:
                if not self._more():
                    raise self._error(f"invalid JSON: {exc.msg}", exc.pos) from None
                continue
            if end < len(self.text) or not self._more():  # a number at the window's end may go on in the next chunk
                self.at = end
                return value

    def _error(self, what: str, at: int | None = None) -> DataError:
        at = self.at if at is None else at
        line, start = self.line + self.text.count("\n", 0, at), self.text.rfind("\n", 0, at)
        where = f"line {line}" + (f", column {at - start}" if start >= 0 or self.line == 1 else "")
        return DataError(f"{self.subject}: {where}: {what}. A JSON array file is read whole, so one error in it "
                         "stops the read under either `data.on_bad_row`: fix it, or write the rows one JSON object per "
                         "line (.jsonl), where a bad line is one bad row.")


def _not_an_object(value) -> RowError:
    return RowError("wrong_type", f"a JSON {type(value).__name__} where an object was expected")


def _text_in_python(path: Path, source: DataSource, on_bad_row: str, report: BadRows, key: str | None,
                    failure: Exception) -> datasets.Dataset:
    """A .txt file the text builder could not decode, read line by line: a line that is not UTF-8 is a bad row
    (reported with its line, or skipped); blank lines are not rows."""
    if _undecoded(failure) is None:
        raise DataError(f"{_subject(source, key)}: could not read it: {first_line(failure)}") from None
    texts, indices, bad = [], [], []
    for index, (number, line) in enumerate(nonblank_lines(path)):
        row = line_row(number, line, ".txt")
        if isinstance(row, RowError):
            bad.append((index, row))
            continue
        texts.append(row["text"])
        indices.append(index)
    if bad and on_bad_row == "error":
        raise bad_rows_error(key, source, bad, len(bad))
    for _, error in bad:
        report.add(key or source.path, error.reason)
    return datasets.Dataset.from_dict({"text": texts, ROW: indices})


def line_row(number: int, line: bytes, suffix: str) -> dict | RowError:
    """Line ``number`` of a .jsonl or .txt file (``nonblank_lines``) as a row, or the RowError that makes it bad: not
    UTF-8, invalid JSON, or JSON that is not an object. Shared by whole-file reading and ``ft.data.stream``."""
    try:
        text = (line.removeprefix(codecs.BOM_UTF8) if number == 1 else line).decode("utf-8")
    except UnicodeDecodeError as exc:
        return RowError("not_utf8", _not_utf8(exc))
    if suffix == ".txt":
        return {"text": text.rstrip("\r\n")}
    try:
        row = json.loads(text)
    except ValueError as exc:
        return RowError("invalid_json", f"invalid JSON: {_json_reason(exc)}")
    return row if isinstance(row, dict) else _not_an_object(row)


def missing_source(source: DataSource, key: str | None) -> DataError:
    """The error for a local path that does not exist."""
    return DataError(f"{_subject(source, key)} does not exist (relative paths are read from the recipe's folder).")


def _undecoded(exc: BaseException | None) -> UnicodeDecodeError | None:
    """The UnicodeDecodeError behind ``exc`` (datasets wraps its builders' errors), if any."""
    while exc is not None and not isinstance(exc, UnicodeDecodeError):
        exc = exc.__cause__ or exc.__context__
    return exc


def _not_utf8_file(path: Path, source: DataSource, key: str | None) -> DataError:
    """A file whose rows are not lines (CSV: a quoted value may span lines) that is not UTF-8: refused whole, naming
    its first undecodable line, under either ``on_bad_row``."""
    where = ""
    for number, line in nonblank_lines(path):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = f" (first at {source.path}:{number}, {_byte(exc)}: saved as Latin-1 or Windows-1252?)"
            break
    return DataError(f"{_subject(source, key)} is not UTF-8 text{where}. ft reads data files as UTF-8, and a "
                     f"{path.suffix} file's rows cannot be skipped one by one: re-save it as UTF-8, e.g. "
                     f"`iconv -f latin1 -t utf-8 {path.name} > utf8-{path.name}`.")


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """``not UTF-8 text: byte 0xe9 at column 4 …``: where, and what the fix is."""
    return f"not UTF-8 text: {_byte(exc)} (saved as Latin-1 or Windows-1252? re-save the file as UTF-8)"


def _byte(exc: UnicodeDecodeError) -> str:
    return f"byte 0x{exc.object[exc.start]:02x} at column {exc.start + 1}"


def _subsample(dataset: datasets.Dataset, fraction: float, seed: int) -> datasets.Dataset:
    """A seeded ``round(fraction × n)`` rows (at least 1), kept in the source's order."""
    if fraction >= 1:
        return dataset
    count = max(1, round(fraction * len(dataset)))
    return dataset.select(np.sort(np.random.default_rng(seed).choice(len(dataset), size=count, replace=False)))


def _subject(source: DataSource, key: str | None) -> str:
    return f"{key}.path: {source.path}" if key else f"data source {source.path}"


def _columns(dataset: datasets.Dataset) -> str:
    return ", ".join(c for c in dataset.column_names if c not in (ROW, SOURCE)) or "(none)"


def _json_reason(exc: ValueError) -> str:
    return f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
