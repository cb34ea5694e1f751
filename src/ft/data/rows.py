"""Bad rows: the errors that name them, where they are in their file, and the skip counts.

Every row keeps an int column ``__ft_row``: its index in the source before any subsampling. That index
is all a report needs to point the user at the row (``file.jsonl:7``, ``file.csv:row 3``, ``org/set[train]:12``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import FtError

ROW = "__ft_row"
BAD = ("ft_bad_reason", "ft_bad_detail")  # tokenized chat rows the template cannot render whole (ft.data.tokenize)
SOURCE = "__ft_source"  # the row's source: its index in data.train (or data.eval)
SHOWN = 5  # bad rows listed in an error; the rest are only counted
BLANK = " \t\n\r\x0b\x0c"  # a line of only these is not a row (ASCII whitespace, as arrow's JSON reader)

# The closed set of reasons a row is bad (the keys of summary.json's skipped_rows counts).
REASONS = {
    "invalid_json": "a line of a .jsonl file is not valid JSON",
    "not_utf8": "a line of a .jsonl or .txt file is not UTF-8 text (e.g. saved as Latin-1 or Windows-1252)",
    "missing_field": "a field the format needs is absent or null",
    "wrong_type": "a field has the wrong type (e.g. a list where text is expected)",
    "empty_chat": "a list of messages is empty",
    "missing_role": "a message has no role",
    "unknown_role": "a role is not system, user, assistant or tool (after `roles:` mapping)",
    "no_assistant_turn": "a chat has no assistant message to learn from",
    "empty_content": "a message, prompt, output or text is empty",
    "empty_chosen": "`chosen` is empty",
    "empty_rejected": "`rejected` is empty",
    "mixed_kinds": "a field is text in some rows of a source and a list of messages in others",
    "image_content": "a message holds an image part, which needs a vision-language model (model.name is a text model)",
    "image_missing": "an image a row names does not exist (a path is read relative to the data file's folder)",
    "image_unreadable": "an image a row names cannot be read or decoded (damaged, or not an image)",
    "image_count": "a row's `<image>` placeholders and its `images` list disagree in number",
    "image_place": "a preference or prompt row has an image where TRL reads none: in an answer, or beside a prompt "
                   "given as text (images go in a prompt given as messages)",
    "bad_tool_call": "an assistant's `tool_calls` is not a list of OpenAI tool calls ({type: function, function: "
                     "{name, arguments}}), or a call's arguments are not a JSON object (an unparsable JSON string)",
    "bad_tools": "a row's `tools` is not a list of tool definitions ({type: function, function: {name, ...}})",
    "unmapped_reasoning": "a message carries reasoning under `thinking` or `reasoning`, which ft reads only through "
                          "`fields:` (e.g. fields: {reasoning_content: thinking})",
    "vision_tools": "a vision-language model's chat carries tool calls, tools or reasoning, which ft reads in text "
                    "models' chats only",
    "template_drops": "the chat template does not write a row's tool call, tool definitions, reasoning, or an "
                      "assistant's text beside its tool calls: the row would train without them",
    "template_error": "the chat template refuses the row (its own error, e.g. roles that must alternate, or a tool "
                      "call id of the wrong length)",
}
FIX = "Fix these rows, map the fields with `fields:`/`roles:`, or set `data.on_bad_row: skip`."


class DataError(FtError):
    """A data source or row the recipe points at cannot be used (exit code 2). The message is for the user."""


class RowError(ValueError):
    """One row does not fit its format: ``reason`` is a code from REASONS, ``field`` the source's field path."""

    def __init__(self, reason: str, detail: str, field: str | None = None):
        if reason not in REASONS:
            raise ValueError(f"unknown bad-row reason {reason!r}")
        super().__init__(detail)
        self.reason, self.detail, self.field = reason, detail, field

    def render(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{where}{self.detail} ({self.reason})"


def value_of(row: dict, field: str, kind, where: str | None = None, missing: str = "missing_field"):
    """``row[field]``, which must be present and of ``kind`` (a type or tuple of types); ``where`` is its place
    in messages (default ``field``), ``missing`` the reason when it is absent or null."""
    value = row.get(field)
    if value is None:
        raise RowError(missing, f"no {field!r} {'key' if where else 'field'}", where or field)
    if not isinstance(value, kind):
        raise RowError("wrong_type", f"expected {_KINDS[kind]}, got {kind_of(value)}", where or field)
    return value


def text_of(row: dict, field: str, empty_ok: bool = False) -> str:
    """``row[field]`` as non-blank text (blank allowed with ``empty_ok``)."""
    value = value_of(row, field, str)
    if not empty_ok and not value.strip():
        raise RowError("empty_content", "is empty", field)
    return value


def kind_of(value) -> str:
    """``text``, ``messages``, ``a number``… — a value's kind in the words of bad-row messages."""
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        return "messages"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    return _KINDS.get(type(value), type(value).__name__)


_KINDS = {str: "text", list: "a list", dict: "an object", (str, list): "text or a list of messages"}


class BadRows:
    """Skipped-row counts per recipe key and reason, e.g. ``{"data.train.0": {"no_assistant_turn": 3}}``."""

    def __init__(self) -> None:
        self._counts: dict[str, Counter] = {}

    def add(self, key: str, reason: str, count: int = 1) -> None:
        if count:
            self._counts.setdefault(key, Counter())[reason] += count

    def rekey(self, old: str, new: str) -> None:
        """File the counts recorded under a provisional key (a source's path) under its recipe key."""
        if old != new and old in self._counts:
            for reason, count in self._counts.pop(old).items():
                self.add(new, reason, count)

    @property
    def total(self) -> int:
        return sum(sum(counts.values()) for counts in self._counts.values())

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {key: dict(_ordered(counts)) for key, counts in self._counts.items()}

    def describe(self) -> str:
        """``skipped 3 rows of data.train.0 (no_assistant_turn: 2, invalid_json: 1)``."""
        parts = [(sum(c.values()), key, ", ".join(f"{r}: {n}" for r, n in _ordered(c)))
                 for key, c in self._counts.items()]
        if not parts:
            return "no rows skipped"
        if len(parts) == 1:
            count, key, reasons = parts[0]
            return f"skipped {_rows(count)} of {key} ({reasons})"
        return f"skipped {_rows(self.total)}: " + ", ".join(f"{n} of {key} ({why})" for n, key, why in parts)


def bad_rows_error(key: str | None, source, bad: list[tuple[int, RowError]], total: int) -> DataError:
    """The user-facing error for ``total`` bad rows of ``source``; ``bad`` holds the first few (row, error)."""
    shown = bad[:SHOWN]
    places = locate(source, [row for row, _ in shown])
    listed = "\n".join(f"  {places[row]}: {error.render()}" for row, error in shown)
    first = f"; the first {len(shown)}" if total > len(shown) else ""
    head = f"{key}: " if key else ""
    return DataError(f"{head}{_rows(total, 'bad row')} in {source.path} (format `{source.format}`){first}:\n"
                     f"{listed}\n{FIX}")


def refused_rendered(tokenized, dataset, sources: list, split: str, on_bad_row: str, report: BadRows,
                     say: Callable[[str], None]):
    """The rows of ``tokenized`` (a split tokenized by ``ft.data.tokenize.tokenize_arrays``, with its ``BAD`` columns)
    that may train, and the position in ``dataset`` (its canonical rows, in the same order, with ``__ft_row`` and
    ``__ft_source``; ``sources``: the split's ``DataSource`` list) of each, or None when all may.

    A chat row whose template cannot render it whole (a tool call, the tools, a reasoning or an assistant's text it
    does not write: ``template_drops``; its own error: ``template_error``) is a bad row like a malformed one: under
    ``on_bad_row: error`` a DataError lists the first few by ``file:line`` with the fix, under ``skip`` they are
    dropped and counted in ``report`` per source and reason. Read in Arrow: a split of good rows costs one scan."""
    import pyarrow.compute as pc

    reasons = tokenized.with_format("arrow")[BAD[0]]
    bad = np.flatnonzero(np.asarray(pc.not_equal(reasons, "").to_numpy(zero_copy_only=False)))
    if not len(bad):
        return tokenized, None

    def place(index: int) -> str:
        row = dataset[index]
        return locate(sources[row[SOURCE]], [row[ROW]])[row[ROW]]

    if on_bad_row == "error":
        shown = bad[:SHOWN].tolist()
        listed = "\n".join(f"  {place(i)}: {tokenized[i][BAD[1]]}" for i in shown)
        first = f"; the first {len(shown)}" if len(bad) > len(shown) else ""
        raise DataError(f"data.{split}: {_rows(len(bad), 'row')} the chat template cannot render whole{first}:\n"
                        f"{listed}\nUse a chat template that writes them (data.chat_template), fix these rows, or set "
                        "`data.on_bad_row: skip` to drop them (counted).")
    kinds = tokenized.select(bad)[BAD[0]][:]  # a list at once (iterating a Column reads row by row)
    origins = dataset.select(bad)[SOURCE][:]
    for (source, reason), count in Counter(zip(origins, kinds, strict=True)).items():
        report.add(f"data.{split}.{source}", reason, count)
    say(f"data: {split}: skipped {_rows(len(bad))} the chat template cannot render whole ("
        + ", ".join(f"{reason}: {count}" for reason, count in _ordered(Counter(kinds))) + ")")
    kept = np.flatnonzero(np.asarray(pc.equal(reasons, "").to_numpy(zero_copy_only=False)))
    return tokenized.select(kept), kept


def locate(source, rows: list[int]) -> dict[int, str]:
    """``row index -> place`` for messages: ``file:line`` for line-based files (blank lines counted),
    ``file:row n`` (1-based) for other files, ``path[split]:index`` (0-based) for hub datasets and dataset
    dicts, ``path:index`` for a saved Dataset."""
    path = Path(source.path)
    if path.is_file() and path.suffix.lower() in (".jsonl", ".txt"):
        lines = line_numbers(path, set(rows))
        return {row: f"{source.path}:{lines.get(row, '?')}" for row in rows}
    if path.is_file():
        return {row: f"{source.path}:row {row + 1}" for row in rows}
    split = "" if (path / "state.json").exists() else f"[{source.split}]"  # a saved Dataset has no splits
    return {row: f"{source.path}{split}:{row}" for row in rows}


def nonblank_lines(path: Path):
    """``(line number, bytes)`` of each line with something on it: the rows of a .jsonl or .txt file.
    Binary, split at ``\\n`` only, as arrow's readers do."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip(BLANK.encode()):
                yield number, line


def line_numbers(path: Path, rows: set[int]) -> dict[int, int]:
    """1-based line numbers of the given rows, read lazily up to the last one wanted."""
    found: dict[int, int] = {}
    for index, (number, _) in enumerate(nonblank_lines(path)):
        if index in rows:
            found[index] = number
            if len(found) == len(rows):
                break
    return found


def _ordered(counts: Counter) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _rows(count: int, noun: str = "row") -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
