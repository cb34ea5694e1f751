"""Reading one ``data.train``/``data.eval`` entry into a ``datasets.Dataset``; mixing and splitting them.

A source is a local file (its suffix picks the ``datasets`` builder, see FILE_BUILDERS), a directory
written by ``save_to_disk`` (a Dataset, or a DatasetDict read at ``split``), or a hub dataset id. Every
dataset read gets the int column ``__ft_row``, the row's index in the source before ``fraction``
subsamples it, so a bad row can be reported as ``file:line``. Blank lines of .jsonl and .txt files are
not rows.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import datasets
import numpy as np

from ..recipe.data_section import DataSource
from ..recipe.errors import first_line
from .rows import BLANK, ROW, SOURCE, BadRows, DataError, RowError, bad_rows_error, nonblank_lines

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


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


def mix(parts: list[datasets.Dataset], keys: list[str] | None = None) -> datasets.Dataset:
    """The normalized sources of one split, concatenated in order, each row with its source's index (``__ft_source``);
    they must share one column layout. ``keys`` (``data.train.0``, …) name the sources in the error."""
    names = keys or [f"source {i}" for i in range(len(parts))]
    parts = [part.add_column(SOURCE, np.full(len(part), i, dtype=np.int32)) for i, part in enumerate(parts)]
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


def weighted(dataset: datasets.Dataset, weights: list[float], seed: int, stop: str) -> datasets.Dataset:
    """The rows of ``mix``'s concatenation drawn source by source with probabilities ``weights``, seeded, until
    ``stop`` (datasets' stopping strategies, ``data.mix_stop``). datasets' ``interleave_datasets`` draws the order, on
    a column of row positions per source, so the rows themselves are only selected, never copied or re-tokenized."""
    sources = np.asarray(dataset.with_format("numpy")[SOURCE])
    positions = [datasets.Dataset.from_dict({"at": np.flatnonzero(sources == i)}) for i in range(len(weights))]
    empty = next((i for i, part in enumerate(positions) if not len(part)), None)
    if empty is not None:
        raise DataError(f"data.train.{empty}: no rows of this source are left (see the counts above), so it cannot "
                        "take its share of the mixture; fix its rows or remove it.")
    drawn = datasets.interleave_datasets(positions, probabilities=weights, seed=seed, stopping_strategy=stop)
    return dataset.select(drawn.with_format("numpy")["at"])


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
    try:
        dataset = datasets.load_dataset(FILE_BUILDERS[suffix], data_files=str(path), split="train")
    except Exception as exc:  # arrow's reader fails on one bad line, with an unhelpful message
        if suffix in LINE_READERS:
            return LINE_READERS[suffix](path, source, on_bad_row, report, key, exc)
        if _undecoded(exc) is not None:
            raise _not_utf8_file(path, source, key) from None
        raise DataError(f"{_subject(source, key)}: could not read it: {first_line(exc)}") from None
    if suffix == ".jsonl" and not _valid_utf8(dataset):  # arrow's JSON reader keeps bytes that are not UTF-8
        return _jsonl_in_python(path, source, on_bad_row, report, key, None)
    if suffix == ".txt":  # the text builder keeps blank lines; they are not rows
        dataset = dataset.filter(lambda text: [bool(t and t.strip(BLANK)) for t in text], input_columns="text",
                                 batched=True)
    return dataset


def _jsonl_in_python(path: Path, source: DataSource, on_bad_row: str, report: BadRows, key: str | None,
                     failure: Exception | None) -> datasets.Dataset:
    """A .jsonl file arrow could not read (or read with text that is not UTF-8), read line by line: bad lines are
    reported (or skipped), and the rest stored with ``Json`` columns where values change type, for ``normalize`` to
    judge row by row."""
    rows, indices, bad = [], [], []
    try:
        for index, (number, line) in enumerate(nonblank_lines(path)):
            row = line_row(number, line, ".jsonl")
            if isinstance(row, RowError):
                bad.append((index, row))
                continue
            rows.append(row)
            indices.append(index)
    except OSError as exc:
        raise DataError(f"{_subject(source, key)}: could not read it: {exc}") from None
    if bad and on_bad_row == "error":
        raise bad_rows_error(key, source, bad, len(bad))
    for _, error in bad:
        report.add(key or source.path, error.reason)
    columns = dict.fromkeys(name for row in rows for name in row)
    table = {name: [row.get(name) for row in rows] for name in columns}
    try:
        return datasets.Dataset.from_dict({**table, ROW: indices}, on_mixed_types="use_json")
    except Exception as exc:
        raise DataError(f"{_subject(source, key)}: could not read it: {first_line(failure or exc)}") from None


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
    return row if isinstance(row, dict) else RowError("wrong_type", f"a JSON {type(row).__name__} where an object "
                                                                    "was expected")


def missing_source(source: DataSource, key: str | None) -> DataError:
    """The error for a local path that does not exist."""
    return DataError(f"{_subject(source, key)} does not exist (relative paths are read from the recipe's folder).")


LINE_READERS = {".jsonl": _jsonl_in_python, ".txt": _text_in_python}  # files whose bad rows are lines


def _undecoded(exc: BaseException | None) -> UnicodeDecodeError | None:
    """The UnicodeDecodeError behind ``exc`` (datasets wraps its builders' errors), if any."""
    while exc is not None and not isinstance(exc, UnicodeDecodeError):
        exc = exc.__cause__ or exc.__context__
    return exc


def _valid_utf8(dataset: datasets.Dataset) -> bool:
    """Whether every string in the table is UTF-8 (a full validation, in Arrow: linear and fast)."""
    try:
        dataset.data.table.validate(full=True)
    except Exception:
        return False
    return True


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
