"""Row formats, as a registry: format name -> the ``Format`` that owns everything ft knows of that format.

A format is one class, registered in ``FORMATS`` with ``@register``; it owns its name, its canonical columns, how a
source row becomes a canonical row (``convert``, and ``columnar`` where Arrow can do it for a whole column), the rows
``ft train --smoke`` generates in it (``example_rows``) and where the prompt and the expected answer of a canonical
row are for ``data.eval_exact_match`` (``prompt_and_answer``). Its name is also listed in ``recipe/names.py``, which
validation reads (it may not import this module): ``register`` refuses a name that list lacks, and
``tests/test_methods.py`` checks that the list has no name without a format.

Canonical layouts (what TRL's trainers read):

- ``chat`` and ``instruction`` -> ``messages``: a list of ``{"role", "content"}``; a content given as a list of parts
  (``[{"type": "text", "text": …}, …]``, as OpenAI's and multimodal chat templates write it) becomes the text of its
  text parts, joined as those templates join them (with nothing between); an image part makes the row bad
  (``image_content``): the canonical chat holds text, for text models. A ``chat`` message also keeps what chat
  templates render beside the text (``CHAT_KEYS``, each only where given): an assistant's ``tool_calls`` (OpenAI's
  ``[{"id", "type": "function", "function": {"name", "arguments"}}]``, arguments given as an object or as a JSON string
  and kept as the object) and ``reasoning_content`` (its thinking; a source's ``thinking`` or ``reasoning`` is read
  through ``fields:``), a ``tool`` message's ``tool_call_id`` and ``name``; and a row's ``tools`` (JSON-schema function
  definitions, ``{"type": "function", "function": {…}}``) become the ``tools`` column. Other message keys are dropped.
  Tool calls' arguments and tools' schemas differ in shape from row to row, which no one Arrow struct holds, so each
  message is stored as its JSON text (``datasets.Json``: read back exactly as written, no key added) and ``tools`` too;
  ``ft.data.templates.render`` hands them to the template;
- for a vision-language model (``Names.images`` set) the same formats -> ``messages`` whose every content is a list
  of parts, ``{"type": "text", "text": …}`` or ``{"type": "image", "text": None}``, and ``images``: the images' paths
  (or URLs), resolved and checked, in the order of their parts. Images come as content parts (``{"type": "image",
  "image": PATH_OR_URL}``, OpenAI's ``{"type": "image_url", …}``) or as an ``images`` column whose paths fill the
  ``<image>`` placeholders of the messages' text in order (LLaMA-Factory's layout), or whose images, stored in the
  dataset (an ``Image`` feature), fill the image parts that hold none (``{"type": "image"}``, or with an ``index``:
  TRL's layout); a stored image is written to a file of its own (``ImageSource.stored``) and named by its path;
- ``text`` -> ``prompt`` and ``completion`` (a plain ``text`` field becomes prompt ``""``);
- ``preference`` -> ``prompt``, ``chosen``, ``rejected``: all text or all lists of messages;
- ``prompt`` -> ``prompt`` (text or messages) plus every other field of the row, for GRPO reward functions;
- for a vision-language model the same two formats take images in their prompt, in the same two layouts as a chat
  (content parts, or an ``images`` column filling the prompt's ``<image>`` placeholders): their messages become
  lists of parts and ``images`` the prompt's checked paths, which TRL's trainers read into the prompt
  (``with_images_read`` hands them over decoded, a row at a time). An image in an answer, or images with a prompt
  given as text, make the row bad (``image_place``): TRL reads images in a conversational prompt only.

``fields`` (canonical name -> the source's name) renames columns and message keys; ``roles`` (the
source's role -> canonical role) renames roles. A row that does not fit raises ``RowError``.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from ..recipe import names as offered
from ..recipe.data_section import DataSource, ImageSettings, function_schemas
from .images import ImageChanged, ImageSource, load_image
from .lazy import LazyModule
from .rows import ROW, SHOWN, BadRows, DataError, RowError, bad_rows_error, kind_of, text_of, value_of
from .templates import template_messages

datasets = LazyModule("datasets")  # imported when a dataset is built: `--show` converts rows without it
Row = dict
ROLES = ("system", "user", "assistant", "tool")
CHAT_KEYS = ("tool_calls", "reasoning_content", "tool_call_id", "name")  # what a chat message keeps beside its text
REASONING_ALIASES = ("thinking", "reasoning")  # other datasets' names for reasoning_content, read through `fields:`


@dataclass(frozen=True)
class Names:
    """A source's ``fields:`` and ``roles:``; ``names("messages")`` is the source's name for ``messages``. ``images``
    is set when the model reads images (a vision-language model): where the source's images are; unset, an image in
    a row makes it bad (``image_content``)."""

    fields: Mapping[str, str]
    roles: Mapping[str, str]
    images: ImageSource | None = None

    def __call__(self, canonical: str) -> str:
        return self.fields.get(canonical, canonical)

    def role(self, canonical: str) -> str:
        """The source's name for a canonical role: the first ``roles:`` entry mapped to it, else the role itself."""
        return next((theirs for theirs, ours in self.roles.items() if ours == canonical), canonical)

    def message(self, role: str, content: str) -> dict:
        """A message as the source writes one (its key and role names), for rows generated in its layout."""
        return {self("role"): self.role(role), self("content"): content}


@dataclass(frozen=True)
class Sum:
    """Generated example ``i``: a sum of two numbers below 50, its answer and a wrong answer, the same for every
    format (``Format.example_rows``), so a smoke run's rows of each format ask the same questions."""

    i: int

    @property
    def a(self) -> int:
        return (7 * self.i + 3) % 50

    @property
    def b(self) -> int:
        return (13 * self.i + 5) % 50

    @property
    def question(self) -> str:
        return f"What is {self.a} + {self.b}?"

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def wrong(self) -> str:
        return str(self.a + self.b + 1 + self.i % 5)


class Format(ABC):
    """One data format. A subclass sets ``name`` and ``columns`` and implements ``convert``, ``example`` and
    ``prompt_and_answer``; ``@register`` puts an instance in ``FORMATS``."""

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]  # the canonical columns it writes
    keeps_extra: ClassVar[bool] = False  # every other column of the source passes through (``prompt``)
    conversations: ClassVar[bool] = False  # its rows are always chats (``messages``), rendered with the chat template
    holds_images: ClassVar[bool] = False  # read for a vision-language model, its rows keep their images (``images``)
    optional: ClassVar[tuple[str, ...]] = ()  # canonical columns written only for a source that has them (a chat's
    # ``tools``): where sources of one split differ in them, ``ft.data.sources.mix`` gives the others the column empty

    @abstractmethod
    def convert(self, row: Row, names: Names) -> Row:
        """The canonical row of a source row laid out as ``names`` says; raises RowError when it does not fit."""

    def columnar(self, dataset: datasets.Dataset, names: Names) -> datasets.Dataset | None:
        """The whole canonical dataset when Arrow alone can tell every row is good, else None (the row-by-row
        ``convert`` then runs, and names the bad rows). None unless a format has such a fast path."""
        return None

    def typed(self, names: Names) -> dict:
        """The ``datasets`` features of the canonical columns this format types itself (others follow its first good
        row, or the source)."""
        return {}

    def output_columns(self, source_columns: list[str], names: Names) -> list[str]:
        if not self.keeps_extra:
            return list(self.columns)
        taken = {*self.columns, *(names(c) for c in self.columns), ROW}
        if names.images is not None:  # the source's images become the checked ``images`` column
            taken |= {"images", names("images")}
        return [*self.columns, *(c for c in source_columns if c not in taken)]

    @abstractmethod
    def example(self, case: Sum, names: Names, chat: bool, answer_fields: Sequence[str]) -> Row:
        """``case`` as a source row of this format laid out as ``names`` says: prompts as messages when ``chat``
        (the tokenizer has a chat template); ``answer_fields`` are the fields rows carry the answer in for reward
        functions (the formats that have such fields)."""

    def example_rows(self, count: int, names: Names, *, start: int = 0, chat: bool = True,
                     answer_fields: Sequence[str] = ("answer",)) -> list[Row]:
        """``count`` generated arithmetic rows (sums ``start`` to ``start + count - 1``) in this format, laid out as
        the source's ``fields:`` and ``roles:`` say its rows are, so that ``--smoke`` exercises the mapping when it
        cannot read the source."""
        return [self.example(Sum(i), names, chat, answer_fields) for i in range(start, start + count)]

    @abstractmethod
    def prompt_and_answer(self, row: Row, field: str = "answer") -> tuple[str | list, str | dict] | None:
        """(the prompt, text or a list of ``{role, content}`` messages; the expected answer: text, or an assistant
        message whose tool calls are the answer) of a canonical row, for ``data.eval_exact_match``; None when the row
        has no prompt or no answer. ``field`` is the setting's ``field``: the column holding the answer, for a format
        that has no answer of its own."""


FORMATS: dict[str, Format] = {}


def register(cls: type[Format]) -> type[Format]:
    """Class decorator: ``FORMATS[cls.name]`` is an instance of ``cls``. The name must be one ``recipe/names.py``
    offers, or no recipe could name it."""
    if cls.name not in offered.FORMATS:
        raise ValueError(f"format {cls.name!r} is not in recipe/names.py FORMATS, the names validation accepts; "
                         "add it there")
    FORMATS[cls.name] = cls()
    return cls


class Conversation(Format):
    """A format whose canonical row is one chat (``messages``): the prompt of its held-out rows is the conversation
    up to its last assistant turn, and the expected answer that turn's content, or the turn itself when it calls
    tools."""

    columns = ("messages",)
    conversations = True
    holds_images = True

    def typed(self, names: Names) -> dict:
        """A text model's messages are stored each as its JSON text (the module's docstring); a vision-language model's
        (lists of parts) follow the first good row."""
        return {} if names.images is not None else {"messages": datasets.List(datasets.Json())}

    def prompt_and_answer(self, row: Row, field: str = "answer") -> tuple[list, str | dict] | None:
        """The messages before the last assistant turn (their tool calls and results kept) and that turn's text, or,
        when the turn calls tools, the turn (the message, its calls decoded: exact match compares calls, not text);
        None when the turn has nothing before it."""
        messages = row["messages"]
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if not last:
            return None
        if messages[last].get("tool_calls"):
            return [dict(m) for m in messages[:last]], template_messages(messages[last:last + 1])[0]
        return [dict(m) for m in messages[:last]], _content(messages[last])


@register
class Chat(Conversation):
    name = "chat"
    optional = ("tools",)

    def typed(self, names: Names) -> dict:
        return {**super().typed(names), **({"tools": datasets.Json()} if names.images is None else {})}

    def output_columns(self, source_columns: list[str], names: Names) -> list[str]:
        """``messages``, and ``tools`` when the source has a column of them (``fields:`` may name it)."""
        has_tools = names.images is None and names("tools") in source_columns
        return [*self.columns, *(["tools"] if has_tools else [])]

    def convert(self, row: Row, names: Names) -> Row:
        field = names("messages")
        if names.images is not None:
            _no_tool_fields(row, names, field)
            return _seeing_chat(row, names, field)
        messages = _chat_messages(value_of(row, field, list), names, field)
        _needs_assistant(messages, field)
        _no_listed_images(row, names)
        tools = _row_tools(row, names)
        return {"messages": messages, **({"tools": tools} if tools else {})}

    def example(self, case: Sum, names: Names, chat: bool, answer_fields: Sequence[str]) -> Row:
        """One question and its answer; every third chat asks a second question."""
        turns = [names.message("user", case.question), names.message("assistant", case.answer)]
        if case.i % 3 == 2:
            turns += [names.message("user", f"And {case.a} - {case.b}?"),
                      names.message("assistant", str(case.a - case.b))]
        return {names("messages"): turns}


def instruction_text(instruction: str, given: str | None = None) -> str:
    """The user turn of an instruction row: the instruction, then a blank line and the input when there is one (not
    blank). One layout for training, exact match and ``ft generate --input``, so a model is asked as it was taught."""
    return f"{instruction}\n\n{given}" if given is not None and given.strip() else instruction


@register
class Instruction(Conversation):
    name = "instruction"

    def convert(self, row: Row, names: Names) -> Row:
        """User turn: ``instruction_text`` of the instruction and input; assistant: the output."""
        given = row.get(names("input"))
        user = instruction_text(text_of(row, names("instruction")),
                                text_of(row, names("input"), empty_ok=True) if given is not None else None)
        return {"messages": [{"role": "user", "content": user},
                             {"role": "assistant", "content": text_of(row, names("output"))}]}

    def example(self, case: Sum, names: Names, chat: bool, answer_fields: Sequence[str]) -> Row:
        """Every other row has an input (the two numbers); the others an empty one."""
        return {names("instruction"): "Add the two numbers.",
                names("input"): f"{case.a} and {case.b}" if case.i % 2 else "", names("output"): case.answer}


@register
class Text(Format):
    name = "text"
    columns = ("prompt", "completion")

    def convert(self, row: Row, names: Names) -> Row:
        """A ``text`` field is all completion (the whole text is learned); else ``prompt`` + ``completion``."""
        if row.get(names("text")) is None and row.get(names("completion")) is None:
            raise RowError("missing_field", f"no {names('text')!r} field (nor {names('prompt')!r} and "
                           f"{names('completion')!r})", names("text"))
        if row.get(names("text")) is not None:
            return {"prompt": "", "completion": text_of(row, names("text"))}
        return {"prompt": text_of(row, names("prompt"), empty_ok=True),
                "completion": text_of(row, names("completion"))}

    def columnar(self, dataset: datasets.Dataset, names: Names) -> datasets.Dataset | None:
        """Rows straight from Arrow when the ``text`` column is all non-blank strings (the common case of a
        plain-text corpus): what ``convert`` would return for every row, without a Python call per row."""
        field = names("text")
        if field not in dataset.column_names or not _is_text(dataset.features[field]):
            return None
        column = dataset.with_format("arrow")[field]
        if column.null_count or pc.any(pc.equal(pc.utf8_trim_whitespace(column), "")).as_py():
            return None
        canonical = dataset.select_columns([field, ROW]).rename_column(field, "completion")
        canonical = canonical.add_column("prompt", pa.array([""] * len(canonical), pa.string()))
        return canonical.select_columns(["prompt", "completion", ROW])

    def example(self, case: Sum, names: Names, chat: bool, answer_fields: Sequence[str]) -> Row:
        """Prompt and completion when the source maps either of them, else one plain text."""
        if "prompt" in names.fields or "completion" in names.fields:
            return {names("prompt"): case.question, names("completion"): f" {case.answer}"}
        return {names("text"): f"{case.question} {case.answer}"}

    def prompt_and_answer(self, row: Row, field: str = "answer") -> tuple[str, str] | None:
        """The prompt and its completion; a plain text row has no prompt, and no answer to score."""
        return (row["prompt"], row["completion"]) if row["prompt"] else None


@register
class Preference(Format):
    name = "preference"
    columns = ("prompt", "chosen", "rejected")
    holds_images = True
    ANSWERS: ClassVar[dict[str, str]] = {"chosen": "empty_chosen", "rejected": "empty_rejected"}  # -> empty reason

    def convert(self, row: Row, names: Names) -> Row:
        """The three texts or lists of messages (one kind for all three); read for a vision-language model, with the
        prompt's images (``_seeing_prompted``)."""
        if names.images is not None:
            out = _seeing_prompted(row, names, self.ANSWERS)
        else:
            out = {"prompt": _text_or_messages(row, names, "prompt", "empty_content"),
                   **{name: _text_or_messages(row, names, name, empty) for name, empty in self.ANSWERS.items()}}
        texts = {name: out[name] for name in self.columns}
        if len({isinstance(value, list) for value in texts.values()}) > 1:
            raise RowError("wrong_type", "prompt, chosen and rejected must be all text or all lists of messages, got "
                           + ", ".join(f"{name}: {kind_of(value)}" for name, value in texts.items()), names("prompt"))
        if isinstance(out["chosen"], list):
            _needs_assistant(out["chosen"], names("chosen"))
            _needs_assistant(out["rejected"], names("rejected"))
        if names.images is None:
            _no_listed_images(row, names)
        return out

    def example(self, case: Sum, names: Names, chat: bool, answer_fields: Sequence[str]) -> Row:
        """The right answer chosen, a wrong one rejected: messages when ``chat``, else texts."""
        if chat:
            return {names("prompt"): [names.message("user", case.question)],
                    names("chosen"): [names.message("assistant", case.answer)],
                    names("rejected"): [names.message("assistant", case.wrong)]}
        return {names("prompt"): case.question, names("chosen"): f" {case.answer}", names("rejected"): f" {case.wrong}"}

    def prompt_and_answer(self, row: Row, field: str = "answer") -> tuple[str | list, str]:
        """The prompt and the ``chosen`` answer."""
        return _prompt(row["prompt"]), _content(row["chosen"])


@register
class Prompt(Format):
    name = "prompt"
    columns = ("prompt",)
    keeps_extra = True
    holds_images = True

    def convert(self, row: Row, names: Names) -> Row:
        """The prompt (text or messages) and every other field of the row, which reward functions receive; read for a
        vision-language model, with the prompt's images (``_seeing_prompted``) in place of the source's column."""
        if names.images is not None:
            extra = {name: value for name, value in row.items() if name not in (names("prompt"), names("images"), ROW)}
            return {**extra, **_seeing_prompted(row, names, {})}
        _no_listed_images(row, names)
        extra = {name: value for name, value in row.items() if name not in (names("prompt"), ROW)}
        return {**extra, "prompt": _text_or_messages(row, names, "prompt", "empty_content")}

    def example(self, case: Sum, names: Names, chat: bool, answer_fields: Sequence[str]) -> Row:
        """The question (a user message when ``chat``), and its answer in every field of ``answer_fields``."""
        prompt = [names.message("user", case.question)] if chat else case.question
        return {names("prompt"): prompt, **dict.fromkeys(answer_fields, case.answer)}

    def prompt_and_answer(self, row: Row, field: str = "answer") -> tuple[str | list, str] | None:
        """The prompt, and the row's ``field`` (``answer`` unless the setting names another); None without it."""
        if row.get(field) is None:
            return None
        return _prompt(row["prompt"]), str(row[field])


def _is_text(feature) -> bool:
    kind = getattr(feature, "pa_type", None)
    return kind is not None and (pa.types.is_string(kind) or pa.types.is_large_string(kind))


def normalize(dataset: datasets.Dataset, source: DataSource, *, key: str, on_bad_row: str,
              report: BadRows, images: bool = False, stored: Path | None = None) -> datasets.Dataset:
    """``dataset`` (from ``read_source``) in its format's canonical columns, then ``__ft_row``.

    Bad rows raise one DataError listing the first few (``on_bad_row="error"``), or are dropped and
    counted in ``report`` under ``key`` (``"skip"``); counts ``read_source`` filed under the source's
    path move to ``key``. Text-or-messages columns take the kind of the first good row.

    ``images``: the model reads images (a vision-language model): a chat's (or a prompt's) contents become lists of
    parts and its images a column of checked paths (``Names.images``), for every format that holds images
    (``Format.holds_images``). Images stored inside the dataset (an ``Image`` feature) are read undecoded, a few rows
    at a time (``_Undecoded``), and written to files in ``stored`` (``ImageSource.stored``; default
    ``stored_images_folder(None)``): the canonical rows name every image by reference.
    """
    from datasets.fingerprint import Hasher

    report.rekey(source.path, key)
    fmt = FORMATS[source.format]
    seeing = images and fmt.holds_images
    names = Names(source.fields, source.roles, ImageSource.of(source.path, stored) if seeing else None)
    if ROW not in dataset.column_names:
        dataset = dataset.add_column(ROW, list(range(len(dataset))))
    fast = fmt.columnar(dataset, names)
    if fast is not None:
        return fast
    columns = fmt.output_columns(dataset.column_names, names) + (["images"] if seeing else [])
    rows = _Undecoded.of(dataset, _json_columns(dataset))
    kinds, features = _layout(rows, fmt, names, columns)
    as_json = {name for name in columns if features is not None and isinstance(features[name], datasets.Json)}
    counts: Counter = Counter()
    shown: list[tuple[int, RowError]] = []

    def convert(batch):
        out: dict[str, list] = {name: [] for name in (*columns, ROW)}
        for row in rows.read(batch):
            try:
                converted = _converted(fmt, row, names)
                _check_kinds(converted, fmt.columns, kinds, names)
            except RowError as error:
                counts[error.reason] += 1
                if len(shown) < SHOWN:
                    shown.append((row[ROW], error))
                continue
            for name in columns:
                value = converted.get(name)  # an optional column (a chat's ``tools``) a row may not give
                out[name].append(json.dumps(value) if name in as_json and value is not None else value)
            out[ROW].append(row[ROW])
        return out

    # convert() counts bad rows as it runs, so it must run: no cache reuse, and an explicit fingerprint (with the
    # folder stored images are written to, which the rows name: what is cached from them must not outlive a move)
    shaped = [dataset._fingerprint, source.model_dump(), "ft.normalize/1"] + (
        ["images", str(names.images.store_folder())] if seeing else [])
    result = rows.dataset.map(convert, batched=True, batch_size=rows.batch, remove_columns=dataset.column_names,
                              load_from_cache_file=False, features=features, desc=f"formatting {key}",
                              new_fingerprint=Hasher.hash(shaped)).with_format(dataset.format["type"])
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


def _converted(fmt: Format, row: Row, names: Names) -> Row:
    """``fmt.convert``, with a chat of a format that holds no images laid out as a vision model's rows are (parts,
    no images) when the source is read for one."""
    converted = fmt.convert(row, names)
    return as_parts(converted) if names.images is not None and "images" not in converted else converted


def _json_columns(dataset: datasets.Dataset) -> list[str]:
    """The columns that hold each value as its JSON text (``Json(decode=False)``: what ``ft.data.sources`` writes for a
    JSON field whose values are of several kinds, or lists and objects), which ``normalize`` decodes with Python's
    ``json``: every value as written."""
    return [name for name, feature in dataset.features.items()
            if isinstance(feature, datasets.Json) and not feature.decode]


IMAGE_ROWS = 8  # rows of a dataset with stored images converted together: memory holds their images' bytes


@dataclass(frozen=True)
class _Undecoded:
    """A source's rows as ``normalize`` reads them: every value as stored, images included. ``datasets`` decodes an
    ``Image`` feature into a PIL image as a row is read; ft wants the stored bytes (``ImageSource.stored`` writes them
    as they are, decoded once to check them), so the rows are read as Arrow (``dataset``) and turned into Python with
    the features' ``Image`` set to ``decode=False`` (``features``: ``{"bytes", "path"}``), as ``cast_column(…,
    Image(decode=False))`` would give them, without the copy of the whole dataset that cast writes for an ``Image``
    inside a list. ``encoded``: the columns holding JSON text (``_json_columns``), decoded with Python's ``json``.
    ``batch``: the rows read together (``IMAGE_ROWS`` when the rows hold images)."""

    dataset: datasets.Dataset
    features: datasets.Features
    encoded: tuple[str, ...]
    batch: int

    @classmethod
    def of(cls, dataset: datasets.Dataset, encoded: list[str]) -> _Undecoded:
        features, images = _undecoded(dataset.features)
        return cls(dataset.with_format("arrow"), features, tuple(encoded), IMAGE_ROWS if images else 1000)

    def read(self, table: pa.Table) -> list[Row]:
        """The rows of an Arrow batch of ``dataset``, as Python values."""
        batch = self.features.decode_batch(table.to_pydict())
        for name in self.encoded:
            batch[name] = [None if text is None else json.loads(text) for text in batch[name]]
        return [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]

    def __iter__(self):
        for table in self.dataset.iter(batch_size=self.batch):
            yield from self.read(table)


def _undecoded(feature) -> tuple[object, bool]:
    """(``feature`` with every ``datasets.Image`` in it, at any depth, set to ``decode=False``; whether it holds
    one)."""
    if isinstance(feature, datasets.Image):
        return dataclasses.replace(feature, decode=False), True
    if isinstance(feature, dict):  # Features, or a struct's fields
        read = {name: _undecoded(value) for name, value in feature.items()}
        return type(feature)({name: value for name, (value, _) in read.items()}), any(f for _, f in read.values())
    if isinstance(feature, (datasets.List, datasets.LargeList)):
        inner, found = _undecoded(feature.feature)
        return dataclasses.replace(feature, feature=inner), found
    if isinstance(feature, (list, tuple)):
        inner, found = _undecoded(feature[0])
        return [inner], found
    return feature, False


def _layout(rows: _Undecoded, fmt: Format, names: Names, columns: list[str]):
    """(kinds, features) from the first good row: per canonical column whether it holds messages, and the output
    features (extra columns as in the source; a JSON-text one becomes ``Json``, which its consumers decode); (None,
    None) when no row is good."""
    dataset = rows.dataset
    for row in rows:
        try:
            converted = _converted(fmt, row, names)
        except RowError:
            continue
        kinds = tuple(isinstance(converted[c], list) for c in fmt.columns)
        text = datasets.Value("string")
        content = [{"type": text, "text": text}] if names.images is not None else text  # parts, for a vision model
        typed = {c: [{"role": text, "content": content}] if k else text
                 for c, k in zip(fmt.columns, kinds, strict=True)}
        typed.update(fmt.typed(names))
        if names.images is not None:
            typed["images"] = datasets.List(text)
        features = {c: typed[c] if c in typed else datasets.Json() if isinstance(dataset.features[c], datasets.Json)
                    else dataset.features[c] for c in columns}
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
    content_key = names("content")
    messages = []
    for i, message in enumerate(value):
        where = f"{field}[{i}]"
        role = _role(message, names, where)
        if isinstance(message.get(content_key), list):
            content = _parts_text(message[content_key], f"{where}.{content_key}")
        else:
            content = value_of(message, content_key, str, f"{where}.{content_key}")
        if role != "system" and not content.strip():
            raise RowError("empty_content", "is empty", f"{where}.{content_key}")
        messages.append({"role": role, "content": content})
    return messages


def _chat_messages(value: list, names: Names, field: str) -> list[dict]:
    """A ``chat`` row's canonical messages (``_messages``), each with the keys of ``CHAT_KEYS`` it carries: an
    assistant's tool calls (its content may then be empty or null) and reasoning, a tool message's ``tool_call_id`` and
    ``name``. What a template would silently drop is refused, named: tool calls or reasoning on another role,
    reasoning under a name ``fields:`` does not map."""
    if not value:
        raise RowError("empty_chat", "has no messages", field)
    content_key = names("content")
    messages = []
    for i, message in enumerate(value):
        where = f"{field}[{i}]"
        role = _role(message, names, where)
        calls = _tool_calls(message, names, where, role)
        reasoning = _reasoning(message, names, where, role)
        raw = message.get(content_key)
        if isinstance(raw, list):
            content = _parts_text(raw, f"{where}.{content_key}")
        elif raw is None and calls:
            content = ""
        else:
            content = value_of(message, content_key, str, f"{where}.{content_key}")
        if role != "system" and not content.strip() and not calls:
            raise RowError("empty_content", "is empty", f"{where}.{content_key}")
        out = {"role": role, "content": content}
        if calls:
            out["tool_calls"] = calls
        if reasoning:
            out["reasoning_content"] = reasoning
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if message.get(names(key)) is not None:
                    out[key] = value_of(message, names(key), str, f"{where}.{names(key)}")
        messages.append(out)
    return messages


def _tool_calls(message: dict, names: Names, where: str, role: str) -> list[dict] | None:
    """An assistant message's tool calls as ``[{"id"?, "type": "function", "function": {"name", "arguments"}}]``, the
    arguments an object (a JSON string is parsed); None when it has none. A call of another shape, arguments that are
    not a JSON object, or calls on a message of another role make the row bad (``bad_tool_call``)."""
    key = names("tool_calls")
    value = message.get(key)
    if value is None or value == []:
        return None
    at = f"{where}.{key}"
    if role != "assistant":
        raise RowError("bad_tool_call", f"a {role} message with tool calls: only assistant messages make them", at)
    if not isinstance(value, list):
        raise RowError("bad_tool_call", f"expected a list of tool calls, got {kind_of(value)}", at)
    calls = []
    for j, call in enumerate(value):
        here = f"{at}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function" \
                or not isinstance(function.get("name"), str) or not function["name"].strip():
            raise RowError("bad_tool_call", 'expected {"type": "function", "function": {"name": …, "arguments": …}} '
                           f"(OpenAI's layout), got {json.dumps(call)[:120]}", here)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise RowError("bad_tool_call", f"the arguments are a string that is not valid JSON ({exc}): "
                               f"{function['arguments'][:80]!r}", f"{here}.function.arguments") from None
        if not isinstance(arguments, dict):
            raise RowError("bad_tool_call", f"the arguments must be a JSON object (name -> value), got "
                           f"{kind_of(arguments)}", f"{here}.function.arguments")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise RowError("bad_tool_call", f"a call's id must be text, got {kind_of(call['id'])}", f"{here}.id")
        calls.append({**({"id": call["id"]} if call.get("id") is not None else {}), "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})
    return calls


def _reasoning(message: dict, names: Names, where: str, role: str) -> str | None:
    """An assistant message's reasoning (``reasoning_content``, or the source's name for it in ``fields:``); None when
    it has none. Reasoning under another common name that ``fields:`` does not map would be dropped, so it makes the
    row bad (``unmapped_reasoning``), as does reasoning on a message of another role."""
    key = names("reasoning_content")
    for alias in REASONING_ALIASES:
        if alias != key and isinstance(message.get(alias), str) and message[alias].strip():
            raise RowError("unmapped_reasoning", f"reasoning under {alias!r}, which ft reads only when the source's "
                           f"`fields:` maps it: fields: {{reasoning_content: {alias}}}", f"{where}.{alias}")
    value = message.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RowError("wrong_type", f"expected text, got {kind_of(value)}", f"{where}.{key}")
    if value.strip() and role != "assistant":
        raise RowError("wrong_type", f"reasoning on a {role} message: only assistant turns carry it", f"{where}.{key}")
    return value if value.strip() else None


def _row_tools(row: Row, names: Names) -> list[dict] | None:
    """A row's tool definitions (a list, or its JSON text) as ``function_schemas`` gives them; None without."""
    key = names("tools")
    value = row.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except ValueError as exc:
            raise RowError("bad_tools", f"a string that is not valid JSON ({exc})", key) from None
    if not value:
        return None
    try:
        return function_schemas(value)
    except ValueError as exc:
        raise RowError("bad_tools", str(exc), key) from None


def _no_tool_fields(row: Row, names: Names, field: str) -> None:
    """A vision-language model's chat with tool calls, tools or reasoning is bad (``vision_tools``): its canonical
    messages hold parts only, and would drop them."""
    if row.get(names("tools")):
        raise RowError("vision_tools", "tools in a vision-language model's chat: ft reads tools, tool calls and "
                       "reasoning in text models' chats only", names("tools"))
    for i, message in enumerate(row.get(field) or ()):
        for key in (names("tool_calls"), names("reasoning_content"), *REASONING_ALIASES):
            if isinstance(message, dict) and message.get(key):
                raise RowError("vision_tools", "a vision-language model's chat message with tool calls or reasoning: "
                               "ft reads them in text models' chats only", f"{field}[{i}].{key}")


def _role(message, names: Names, where: str) -> str:
    """The canonical role of ``message`` (``where``: its place, ``messages[i]``), mapped through ``roles:``."""
    role_key = names("role")
    if not isinstance(message, dict):
        raise RowError("wrong_type", f"expected a message object, got {kind_of(message)}", where)
    role = value_of(message, role_key, str, f"{where}.{role_key}", missing="missing_role")
    role = names.roles.get(role, role)
    if role not in ROLES:
        raise RowError("unknown_role", f"{message[role_key]!r} is not one of {', '.join(ROLES)}; map it with "
                       "`roles:`", f"{where}.{role_key}")
    return role


IMAGE_PARTS = ("image", "image_url")  # the part types of an image in a message's content (HF, OpenAI)
IMAGE_PART = {"type": "image", "text": None}  # an image's place in a canonical vision chat (its path: ``images``)


def _seeing_chat(row: Row, names: Names, field: str) -> Row:
    """The canonical row of a chat for a vision-language model: every content a list of text and image parts, and
    ``images``, the paths (or URLs) of its images in the order of their parts, each resolved against the data file's
    folder and read once (``ImageSource.take``). Images are given one of two ways: as content parts, each with its
    own image, or as an ``images`` column whose images fill the messages' image places in order: the ``<image>``
    placeholders of their text (LLaMA-Factory's layout) and their image parts without an image of their own (TRL's
    layout, ``{"type": "image"}``, each taking the next image or the one its ``index`` names; the column then holds
    the images themselves, as a dataset's ``Image`` feature stores them). A row whose places and images differ in
    number is bad (``image_count``)."""
    value = value_of(row, field, list)
    listed = _listed_images(row, names("images"))
    messages, found = _parts_messages(value, names, field, listed)
    refs = found if listed is None else _listed_refs(found, listed, names)
    _needs_assistant(messages, field)
    return {"messages": messages, "images": refs}


def _seeing_prompted(row: Row, names: Names, answers: Mapping[str, str]) -> Row:
    """The prompt, the ``answers`` (canonical name -> the reason it is bad when empty: a preference row's ``chosen``
    and ``rejected``, none for a prompt row) and ``images`` of a row read for a vision-language model. The prompt
    takes its images as a chat does (content parts, or the ``images`` column's images in its image places: ``<image>``
    placeholders and image parts without an image, each checked); lists of messages become lists of parts. TRL's DPO,
    KTO, GRPO and RLOO trainers put a row's images into its prompt's messages alone, so an image in an answer, or
    images beside a prompt given as text (no chat template renders it, so nothing writes the model's image token),
    make the row bad (``image_place``)."""
    listed, column = _listed_images(row, names("images")), names("images")
    field = names("prompt")
    prompt = value_of(row, field, (str, list))
    if not (prompt.strip() if isinstance(prompt, str) else prompt):
        raise RowError("empty_content", "is empty", field)
    refs: list[str] = []
    if isinstance(prompt, list):
        prompt, found = _parts_messages(prompt, names, field, listed)
        refs = found if listed is None else _listed_refs(found, listed, names)
    elif listed:
        raise RowError("image_place", f"`{column}` lists images and the prompt is text; images go in a prompt given "
                       "as a list of messages (the chat template writes the model's image token where each one goes):"
                       f" write it as [{{role: user, content: ...}}] with an {names.images.placeholder} placeholder "
                       "per image", column)
    out = {"prompt": prompt}
    for name, empty_reason in answers.items():
        answer = names(name)
        value = value_of(row, answer, (str, list))
        if not (value.strip() if isinstance(value, str) else value):
            raise RowError(empty_reason, "is empty", answer)
        out[name] = value if isinstance(value, str) else _parts_messages(value, names, answer, listed, answer=True)[0]
    return {**out, "images": refs}


@dataclass(frozen=True)
class _Place:
    """Where one image of a row's ``images`` column goes in its messages: ``at`` (``messages[i].content[j]``);
    ``part``: an image part without an image of its own (TRL's layout), else an ``<image>`` placeholder of the text;
    ``index``: the position in the column of the image the part names (``{"type": "image", "index": 0}``), or None:
    the image at the place's own position."""

    at: str
    part: bool = False
    index: int | None = None


def _parts_messages(value: list, names: Names, field: str, listed: list | None,
                    answer: bool = False) -> tuple[list[dict], list]:
    """(the messages of ``field``, each content a list of text and image parts; their images in order). The images
    are, without an ``images`` column (``listed`` None), the references of the image parts, each checked as it is
    met; with one, the ``_Place`` of each image: each ``<image>`` placeholder of the text and each image part without
    an image of its own (``{"type": "image"}``), which ``_listed_refs`` fills from the column; an image part with its
    own image is then refused (``image_count``: a row gives its images one way). ``answer``: the messages are a
    preference row's answer, which holds no image (``image_place``)."""
    if not value:
        raise RowError("empty_chat", "has no messages", field)
    source, content_key, column = names.images, names("content"), names("images")
    messages, found = [], []
    for i, message in enumerate(value):
        where = f"{field}[{i}]"
        role = _role(message, names, where)
        content = message.get(content_key)
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                at = f"{where}.{content_key}[{j}]"
                text = _part(part, at)
                if text is None:
                    if answer:
                        raise RowError("image_place", _IN_ANSWER, at)
                    found.append(_image_of(part, at, source, listed, column))
                    parts.append(dict(IMAGE_PART))
                elif listed is not None:
                    placed = _placed(text, source.placeholder)
                    found += [_Place(at) for p in placed if p["type"] == "image"]
                    parts += placed
                else:
                    parts.append(_text_part(text))
        else:
            at = f"{where}.{content_key}"
            text = value_of(message, content_key, str, at)
            parts = _placed(text, source.placeholder) if listed is not None else [_text_part(text)]
            found += [_Place(at) for p in parts if p["type"] == "image"]
        if answer and any(p["type"] == "image" for p in parts):  # a placeholder in an answer's text
            raise RowError("image_place", _IN_ANSWER, f"{where}.{content_key}")
        if role != "system" and not any(p["type"] == "image" or p["text"].strip() for p in parts):
            raise RowError("empty_content", "is empty", f"{where}.{content_key}")
        messages.append({"role": role, "content": parts})
    return messages, found


def _image_of(part: dict, at: str, source: ImageSource, listed: list | None, column: str):
    """An image part's image: without an ``images`` column, its checked reference (``ImageSource.take``); with one,
    its ``_Place``, when the part holds no image of its own (TRL's layout)."""
    image = _image_ref(part)
    if listed is None:
        if image is None:
            raise RowError("missing_field", "an image part without its image (a path or URL under 'image', 'path' or "
                           f"'url'), in a row with no `{column}` column of images to take it from", at)
        return source.take(image, at)
    if image is not None:
        raise RowError("image_count", f"an image part with its own image in a row that also has an `{column}` list; "
                       "give a row's images one way: as parts, or as the list with a place for each in the messages",
                       at)
    index = part.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise RowError("wrong_type", f"expected the position of an image in `{column}`, got {kind_of(index)}",
                       f"{at}.index")
    return _Place(at, part=True, index=index)


_IN_ANSWER = ("an image in an answer: TRL's preference trainers read a row's images into its prompt only; move it to "
              "the prompt")


def _listed_refs(places: list[_Place], listed: list, names: Names) -> list[str]:
    """The references of the ``images`` column's images (``ImageSource.take``: a path checked, a stored image written
    to its file), in the order of their ``places`` in the messages: a place takes the image its ``index`` names, or
    the one at its own position. Each image goes in exactly one place: places and images that differ in number, an
    index past the list, or an image no place takes make the row bad (``image_count``)."""
    column, placeholder = names("images"), names.images.placeholder
    if len(places) != len(listed):
        raise RowError("image_count", f"the messages hold {_places(places, placeholder)} and `{column}` "
                       f"lists {len(listed)} image{'' if len(listed) == 1 else 's'}; each image needs one place where "
                       f"it goes in the messages (an {placeholder} placeholder in the text, or an image part "
                       '{"type": "image"}), in the order of the list', column)
    order = [k if place.index is None else place.index for k, place in enumerate(places)]
    for place, k in zip(places, order, strict=True):
        if not 0 <= k < len(listed):
            raise RowError("image_count", f"the image part names index {k}, and `{column}` lists {len(listed)} "
                           f"image{'' if len(listed) == 1 else 's'} (indices from 0)", f"{place.at}.index")
    unplaced = sorted(set(range(len(listed))) - set(order))
    if unplaced:
        raise RowError("image_count", f"no image place in the messages takes `{column}[{unplaced[0]}]` (by their "
                       f"position or `index`, the places take {order}); each image goes in exactly one place", column)
    refs = [names.images.take(image, f"{column}[{k}]") for k, image in enumerate(listed)]
    return [refs[k] for k in order]


def _places(places: list[_Place], placeholder: str) -> str:
    """``2 <image> placeholders``, ``1 image part without an image``, or both: a row's image places, counted."""
    parts = sum(place.part for place in places)
    counts = ([f"{len(places) - parts} {placeholder} placeholder{'' if len(places) - parts == 1 else 's'}"]
              if len(places) > parts or not parts else [])
    counts += [f"{parts} image part{'' if parts == 1 else 's'} without an image of {'its' if parts == 1 else 'their'} "
               'own ({"type": "image"})'] if parts else []
    return " and ".join(counts)


def _no_listed_images(row: Row, names: Names) -> None:
    """A row read for a text model that lists images (LLaMA-Factory's ``images`` column) is bad (``image_content``):
    its images would be dropped without a word."""
    if row.get(names("images")):
        raise RowError("image_content", f"the row lists images under `{names('images')}`: images need a "
                       "vision-language model, and this run trains on text; drop the column or the row",
                       names("images"))


def _listed_images(row: Row, column: str) -> list | None:
    """The ``images`` column of a row (a list of images: paths, as LLaMA-Factory's layout gives them, or the images
    themselves, as a dataset's ``Image`` feature stores them; one image alone counts as a list of one), or None when
    the row has none (no such column, or a null: its images, if any, are content parts). Each image is read by
    ``ImageSource.take``, which names the one it cannot read."""
    listed = row.get(column)
    if listed is None:
        return None
    return listed if isinstance(listed, list) else [listed]


def _part(part, at: str) -> str | None:
    """The text of a content part, or None for an image part; any other part makes the row bad."""
    if not isinstance(part, dict):
        raise RowError("wrong_type", f'expected a content part ({{"type": "text", "text": …}}), got {kind_of(part)}',
                       at)
    kind = part.get("type")
    if kind in IMAGE_PARTS:
        return None
    if kind != "text":
        raise RowError("wrong_type", f"a part of type {kind!r}: a message's content parts can be text "
                       '({"type": "text", "text": …}) or images ({"type": "image", "image": PATH_OR_URL})', at)
    return value_of(part, "text", str, f"{at}.text")


def _image_ref(part: dict):
    """The image of an image part, or None when it holds none (TRL's layout's ``{"type": "image"}``, whose image is
    the row's ``images`` column's): HF's ``{"type": "image", "image" | "path" | "url": …}`` or OpenAI's ``{"type":
    "image_url", "image_url": {"url": …}}``. The image is a reference, or an image stored in the dataset
    (``ImageSource.take`` reads either)."""
    if part["type"] == "image_url":
        ref = part.get("image_url")
        return ref.get("url") if isinstance(ref, dict) else ref
    return next((part[k] for k in ("image", "path", "url") if part.get(k) is not None), None)


def _text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def _placed(text: str, placeholder: str) -> list[dict]:
    """A text with image placeholders as parts: each placeholder an image part, the text between as text parts."""
    pieces = text.split(placeholder)
    parts = [_text_part(pieces[0])] if pieces[0] else []
    for piece in pieces[1:]:
        parts.append(dict(IMAGE_PART))
        if piece:
            parts.append(_text_part(piece))
    return parts


def as_parts(row: Row) -> Row:
    """A canonical chat of a format that holds no images (``instruction``) as a vision-language model's rows are laid
    out: every content a list of parts, and no images."""
    return {**row, "messages": [{"role": m["role"], "content": [_text_part(m["content"])]} for m in row["messages"]],
            "images": []}


def with_images_read(dataset, sizing: ImageSettings | None):
    """``dataset`` (canonical rows of a vision-language model, or None) as TRL's DPO, KTO, GRPO and RLOO trainers
    read it: each row's ``images`` the decoded images (``ImagesRead``), not their paths. The rows stay as stored
    (paths), and a row's images are read when the trainer takes the row, so memory holds a batch's images whatever
    the dataset's size, as ``ImageBatches`` does for SFT. Rows without an ``images`` column are returned as they are."""
    if dataset is None or "images" not in dataset.column_names:
        return dataset
    return dataset.with_transform(ImagesRead(sizing))


def check_every_prompt_sees(dataset, split: str, trainer: str) -> None:
    """Refuse (DataError, naming ``data.<split>``) prompt rows of which some hold images and others none: TRL's
    generating trainers (``trainer``: GRPOTrainer, RLOOTrainer; TRL 1.16) hand the processor ``None`` for a prompt
    without images in a batch that has some, and fail building its pixel values. A dataset of text prompts alone, or
    of prompts that each hold an image, trains. Counted in Arrow, without reading a row in Python."""
    if dataset is None or "images" not in dataset.column_names:
        return
    counts = pc.list_value_length(dataset.with_format("arrow")["images"])
    without, total = int(pc.sum(pc.equal(counts, 0)).as_py() or 0), len(dataset)
    if 0 < without < total:
        raise DataError(f"data.{split}: {without} of the {total} prompts hold no image and the others hold images; "
                        f"TRL's {trainer} cannot batch the two kinds together (it fails building the pixel values of "
                        "a batch where a prompt has no image). Give every prompt its image, or train on the prompts "
                        "with images and those without in separate runs.")


@dataclass(frozen=True)
class ImagesRead:
    """A ``datasets`` transform (``Dataset.with_transform``): the ``images`` of the rows taken (paths, URLs or data:
    URIs, as the rows were checked with) replaced by the images, decoded, upright, RGB and sized as ``data.image``
    says (``load_image``), the way TRL's vision collators and GRPO's generation take them (PIL images). A class, not
    a closure, so that a dataset handed to DataLoader workers pickles."""

    sizing: ImageSettings | None

    def __call__(self, batch: dict) -> dict:
        if "images" in batch:
            batch["images"] = [[self._read(ref) for ref in refs or ()] for refs in batch["images"]]
        return batch

    def _read(self, ref: str):
        try:
            return load_image(ref, self.sizing)
        except Exception as exc:  # a file deleted or damaged since the rows were read and checked
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ImageChanged(f"the image {ref[:60]!r} of a training row cannot be read any more ({detail}); it "
                               "could when the data was read. Put it back, or remove its row from the data.") from None


def _parts_text(parts: list, where: str) -> str:
    """The text of a content given as parts: its text parts' texts, joined with nothing between (as chat templates
    that take parts write them). Any other part makes the row bad, named ``messages[i].content[j]``."""
    texts = []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise RowError("wrong_type", f'expected a content part ({{"type": "text", "text": …}}), got '
                           f"{kind_of(part)}", at)
        kind = part.get("type")
        if kind in IMAGE_PARTS:
            raise RowError("image_content", f"an {kind!r} part: images need a vision-language model, and this "
                           "run trains on text (a chat's content is text, or text parts); drop the image parts or the "
                           "row", at)
        if kind != "text":
            raise RowError("wrong_type", f"a part of type {kind!r}: a message's content parts can be text "
                           '({"type": "text", "text": …})', at)
        texts.append(value_of(part, "text", str, f"{at}.text"))
    return "".join(texts)


def _needs_assistant(messages: list[dict], field: str) -> None:
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no_assistant_turn", "has no assistant message to learn from", field)


def _prompt(value):
    """A prompt as exact match reads it: text, or its messages as ``{role, content}``."""
    return value if isinstance(value, str) else [{"role": m["role"], "content": m["content"]} for m in value]


def _content(value) -> str:
    """A completion's text: a string, or the content of its assistant messages."""
    if isinstance(value, str):
        return value
    messages = [value] if isinstance(value, dict) else value
    return "".join(_text(m.get("content")) for m in messages if m.get("role", "assistant") == "assistant")


def _text(content) -> str:
    """A message's text: its string, or its text parts joined (a vision-language model's chat holds parts)."""
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if part.get("type") == "text")
    return content or ""
