"""Row formats, as a registry: format name -> a converter from a source row to ft's canonical columns.

Canonical layouts (what TRL's trainers read):

- ``chat`` and ``instruction`` -> ``messages``: a list of ``{"role", "content"}`` (other message keys are dropped);
- ``text`` -> ``prompt`` and ``completion`` (a plain ``text`` field becomes prompt ``""``);
- ``preference`` -> ``prompt``, ``chosen``, ``rejected``: all text or all lists of messages;
- ``prompt`` -> ``prompt`` (text or messages) plus every other field of the row, for GRPO reward functions.

``fields`` (canonical name -> the source's name) renames columns and message keys; ``roles`` (the
source's role -> canonical role) renames roles. A row that does not fit raises ``RowError``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from datasets.fingerprint import Hasher

from ..recipe.data_section import DataSource
from .rows import ROW, SHOWN, BadRows, DataError, RowError, bad_rows_error, kind_of, text_of, value_of

Row = dict
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Names:
    """A source's ``fields:`` and ``roles:``; ``names("messages")`` is the source's name for ``messages``."""

    fields: Mapping[str, str]
    roles: Mapping[str, str]

    def __call__(self, canonical: str) -> str:
        return self.fields.get(canonical, canonical)


@dataclass(frozen=True)
class Format:
    """A converter (row, names) -> canonical row, raising RowError, and the columns it writes."""

    convert: Callable[[Row, Names], Row]
    columns: tuple[str, ...]  # the canonical columns it writes
    keeps_extra: bool = False  # every other column of the source passes through (``prompt``)
    # optional whole-column conversion: the canonical dataset when Arrow alone can tell every row is good,
    # else None (the row-by-row ``convert`` then runs, and names the bad rows)
    columnar: Callable[[datasets.Dataset, Names], datasets.Dataset | None] | None = None

    def output_columns(self, source_columns: list[str], names: Names) -> list[str]:
        if not self.keeps_extra:
            return list(self.columns)
        taken = {*self.columns, *(names(c) for c in self.columns), ROW}
        return [*self.columns, *(c for c in source_columns if c not in taken)]


FORMATS: dict[str, Format] = {}


def register(name: str, *columns: str, keeps_extra: bool = False, columnar=None):
    def add(convert: Callable[[Row, Names], Row]):
        FORMATS[name] = Format(convert, columns, keeps_extra, columnar)
        return convert

    return add


@register("chat", "messages")
def chat(row: Row, names: Names) -> Row:
    field = names("messages")
    messages = _messages(value_of(row, field, list), names, field)
    _needs_assistant(messages, field)
    return {"messages": messages}


@register("instruction", "messages")
def instruction(row: Row, names: Names) -> Row:
    """User turn: the instruction, plus a blank line and the input when there is one; assistant: the output."""
    user = text_of(row, names("instruction"))
    if row.get(names("input")) is not None and text_of(row, names("input"), empty_ok=True).strip():
        user = f"{user}\n\n{row[names('input')]}"
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": text_of(row, names("output"))}]}


def _text_columns(dataset: datasets.Dataset, names: Names) -> datasets.Dataset | None:
    """``text`` rows straight from Arrow when the ``text`` column is all non-blank strings (the common case
    of a plain-text corpus): what ``text()`` would return for every row, without a Python call per row."""
    field = names("text")
    if field not in dataset.column_names or not _is_text(dataset.features[field]):
        return None
    column = dataset.with_format("arrow")[field]
    if column.null_count or pc.any(pc.equal(pc.utf8_trim_whitespace(column), "")).as_py():
        return None
    canonical = dataset.select_columns([field, ROW]).rename_column(field, "completion")
    canonical = canonical.add_column("prompt", pa.array([""] * len(canonical), pa.string()))
    return canonical.select_columns(["prompt", "completion", ROW])


def _is_text(feature) -> bool:
    kind = getattr(feature, "pa_type", None)
    return kind is not None and (pa.types.is_string(kind) or pa.types.is_large_string(kind))


@register("text", "prompt", "completion", columnar=_text_columns)
def text(row: Row, names: Names) -> Row:
    """A ``text`` field is all completion (the whole text is learned); else ``prompt`` + ``completion``."""
    if row.get(names("text")) is None and row.get(names("completion")) is None:
        raise RowError("missing_field", f"no {names('text')!r} field (nor {names('prompt')!r} and "
                       f"{names('completion')!r})", names("text"))
    if row.get(names("text")) is not None:
        return {"prompt": "", "completion": text_of(row, names("text"))}
    return {"prompt": text_of(row, names("prompt"), empty_ok=True), "completion": text_of(row, names("completion"))}


@register("preference", "prompt", "chosen", "rejected")
def preference(row: Row, names: Names) -> Row:
    out = {"prompt": _text_or_messages(row, names, "prompt", "empty_content"),
           "chosen": _text_or_messages(row, names, "chosen", "empty_chosen"),
           "rejected": _text_or_messages(row, names, "rejected", "empty_rejected")}
    if len({isinstance(value, list) for value in out.values()}) > 1:
        raise RowError("wrong_type", "prompt, chosen and rejected must be all text or all lists of messages, got "
                       + ", ".join(f"{name}: {kind_of(value)}" for name, value in out.items()), names("prompt"))
    if isinstance(out["chosen"], list):
        _needs_assistant(out["chosen"], names("chosen"))
        _needs_assistant(out["rejected"], names("rejected"))
    return out


@register("prompt", "prompt", keeps_extra=True)
def prompt(row: Row, names: Names) -> Row:
    """The prompt (text or messages) and every other field of the row, which reward functions receive."""
    extra = {name: value for name, value in row.items() if name not in (names("prompt"), ROW)}
    return {**extra, "prompt": _text_or_messages(row, names, "prompt", "empty_content")}


def normalize(dataset: datasets.Dataset, source: DataSource, *, key: str, on_bad_row: str,
              report: BadRows) -> datasets.Dataset:
    """``dataset`` (from ``read_source``) in its format's canonical columns, then ``__ft_row``.

    Bad rows raise one DataError listing the first few (``on_bad_row="error"``), or are dropped and
    counted in ``report`` under ``key`` (``"skip"``); counts ``read_source`` filed under the source's
    path move to ``key``. Text-or-messages columns take the kind of the first good row.
    """
    report.rekey(source.path, key)
    fmt, names = FORMATS[source.format], Names(source.fields, source.roles)
    if ROW not in dataset.column_names:
        dataset = dataset.add_column(ROW, list(range(len(dataset))))
    fast = fmt.columnar(dataset, names) if fmt.columnar else None
    if fast is not None:
        return fast
    columns = fmt.output_columns(dataset.column_names, names)
    kinds, features = _layout(dataset, fmt, names, columns)
    counts: Counter = Counter()
    shown: list[tuple[int, RowError]] = []

    def convert(batch):
        out: dict[str, list] = {name: [] for name in (*columns, ROW)}
        for values in zip(*batch.values(), strict=True):
            row = dict(zip(batch.keys(), values, strict=True))
            try:
                converted = fmt.convert(row, names)
                _check_kinds(converted, fmt.columns, kinds, names)
            except RowError as error:
                counts[error.reason] += 1
                if len(shown) < SHOWN:
                    shown.append((row[ROW], error))
                continue
            for name in columns:
                out[name].append(converted[name])
            out[ROW].append(row[ROW])
        return out

    # convert() counts bad rows as it runs, so it must run: no cache reuse, and an explicit fingerprint
    result = dataset.map(convert, batched=True, remove_columns=dataset.column_names, load_from_cache_file=False,
                         features=features, desc=f"formatting {key}",
                         new_fingerprint=Hasher.hash([dataset._fingerprint, source.model_dump(), "ft.normalize/1"]))
    total = sum(counts.values())
    if total and on_bad_row == "error":
        raise bad_rows_error(key, source, shown, total)
    for reason, count in counts.items():
        report.add(key, reason, count)
    if not len(result):
        raise DataError(f"{key}: none of the {len(dataset)} rows of {source.path} fit format `{source.format}` "
                        f"({', '.join(f'{r}: {n}' for r, n in counts.items())}); check `format:`, `fields:` and "
                        "`roles:`.")
    return result


def _layout(dataset: datasets.Dataset, fmt: Format, names: Names, columns: list[str]):
    """(kinds, features) from the first good row: per canonical column whether it holds messages, and the output
    features (extra columns as in the source); (None, None) when no row is good."""
    for row in dataset:
        try:
            converted = fmt.convert(row, names)
        except RowError:
            continue
        kinds = tuple(isinstance(converted[c], list) for c in fmt.columns)
        text = datasets.Value("string")
        typed = {c: [{"role": text, "content": text}] if k else text for c, k in zip(fmt.columns, kinds, strict=True)}
        features = {c: typed[c] if c in typed else dataset.features[c] for c in columns}
        return kinds, datasets.Features({**features, ROW: datasets.Value("int64")})
    return None, None


def _check_kinds(converted: Row, columns: tuple[str, ...], kinds: tuple[bool, ...] | None, names: Names) -> None:
    """One source, one kind per column: text in every row, or lists of messages in every row."""
    word = {True: "a list of messages", False: "text"}
    for column, first in zip(columns, kinds or (), strict=False):
        if isinstance(converted[column], list) != first:
            raise RowError("mixed_kinds", f"is {word[not first]} but the source's first rows have {word[first]}; "
                           "use one kind per source", names(column))


def _text_or_messages(row: Row, names: Names, canonical: str, empty_reason: str):
    field = names(canonical)
    value = value_of(row, field, (str, list))
    if not (value.strip() if isinstance(value, str) else value):
        raise RowError(empty_reason, "is empty", field)
    return value if isinstance(value, str) else _messages(value, names, field)


def _messages(value: list, names: Names, field: str) -> list[dict]:
    """Canonical ``{"role", "content"}`` messages; roles mapped through ``roles:`` and checked."""
    if not value:
        raise RowError("empty_chat", "has no messages", field)
    role_key, content_key = names("role"), names("content")
    messages = []
    for i, message in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise RowError("wrong_type", f"expected a message object, got {kind_of(message)}", where)
        role = value_of(message, role_key, str, f"{where}.{role_key}", missing="missing_role")
        role = names.roles.get(role, role)
        if role not in ROLES:
            raise RowError("unknown_role", f"{message[role_key]!r} is not one of {', '.join(ROLES)}; map it with "
                           "`roles:`", f"{where}.{role_key}")
        content = value_of(message, content_key, str, f"{where}.{content_key}")
        if role != "system" and not content.strip():
            raise RowError("empty_content", "is empty", f"{where}.{content_key}")
        messages.append({"role": role, "content": content})
    return messages


def _needs_assistant(messages: list[dict], field: str) -> None:
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no_assistant_turn", "has no assistant message to learn from", field)
