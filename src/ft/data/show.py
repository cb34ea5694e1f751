"""``--show N``: the first training rows as the model sees them, with the tokens that carry loss marked.

Only the first ``N`` rows of ``data.train`` are read (source after source, in order, before ``fraction``, weights or
shuffling), converted by their format and tokenized by the same code as training (``tokenize_arrays``: the same
template, masks, ``max_length`` and image tokens), so what is shown is what would train, without preparing the dataset.
Each row is printed as its rendered text with the trained tokens marked (colour on a terminal, ``[[...]]`` in plain
text), each image's tokens as one marker (``<image×K>``), then its tokens per role, trained and not, and whether each
trained turn ends with the token generation stops on. A bad row among them is shown as the error that names it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..recipe import Recipe
from ..recipe.data_section import DataSource
from .formats import FORMATS, Names, as_parts
from .images import ImageSource, ImageTokens
from .labels import IGNORE_INDEX
from .rows import DataError, RowError, locate, nonblank_lines
from .sources import FILE_BUILDERS, json_rows, line_row, missing_source, source_kind
from .templates import TemplateError, check_image_template, end_of_turn, render, template_tools
from .tokenize import BAD, TokenizeSettings, stop_token_id, tokenize_arrays

TRAINED, IMAGE, RESET = "\x1b[1;32m", "\x1b[36m", "\x1b[0m"  # ANSI: trained tokens bold green, images cyan
OPEN, CLOSE = "[[", "]]"  # trained tokens in plain text


def wants_colour(stream) -> bool:
    """Colour on a terminal, unless NO_COLOR is set to anything (https://no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def show_rows(recipe: Recipe, processing_class, template: str | None, count: int, colour: bool = False) -> str:
    """The first ``count`` training rows of ``recipe`` as the model sees them (the module's docstring), as text.
    ``processing_class`` is the model's tokenizer, or a vision-language model's processor; ``template`` is
    ``chat_template_for(recipe, processing_class)``."""
    data = recipe.data
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    images = _image_tokens(processing_class, template, recipe)
    settings = TokenizeSettings.of(data, template, parts=images is not None)
    stop = stop_token_id(settings, tokenizer)
    stop_name = repr(tokenizer.convert_ids_to_tokens(stop)) if stop is not None else "(the tokenizer has no EOS)"
    shown = _Shown(tokenizer, template, settings, images, colour, stop_name)
    rows = first_rows(recipe, count, images is not None)
    blocks = [shown.row(number, where, row) for number, (where, row) in enumerate(rows, 1)]
    blocks.append(shown.totals())
    return "\n\n".join(blocks) + "\n"


def first_rows(recipe: Recipe, count: int, images: bool = False) -> list[tuple[str, dict | RowError]]:
    """(where it is, ``file:line (data.train.i)``; the canonical row, or the RowError that makes it bad) of the first
    ``count`` training rows, reading no more of the sources than that. ``images``: read for a vision-language model."""
    found: list[tuple[int, int, dict | RowError]] = []
    for i, source in enumerate(recipe.data.train):
        key, fmt = f"data.train.{i}", FORMATS[source.format]
        names = Names(source.fields, source.roles, ImageSource.of(source.path) if images and fmt.holds_images else None)
        for index, raw in itertools.islice(_raw_rows(source, key), count - len(found)):
            found.append((i, index, raw if isinstance(raw, RowError) else _converted(fmt, raw, names)))
        if len(found) == count:
            break
    places = {i: locate(recipe.data.train[i], [index for j, index, _ in found if j == i])
              for i in {j for j, *_ in found}}
    return [(f"{places[i][index]} (data.train.{i})", row) for i, index, row in found]


def _converted(fmt, raw: dict, names: Names) -> dict | RowError:
    try:
        row = fmt.convert(raw, names)
    except RowError as error:
        return error
    return as_parts(row) if names.images is not None and "images" not in row else row


def _raw_rows(source: DataSource, key: str) -> Iterator[tuple[int, dict | RowError]]:
    """(row index, the row as read, or the RowError that makes it bad) of ``source``, in order, read lazily: a .jsonl
    or .txt file line by line, a .json file element by element, a .parquet file by record batch, a saved dataset by
    index, any other file or a hub dataset as a ``datasets`` stream (``datasets`` is imported for those alone)."""
    path, kind = Path(source.path), source_kind(source)
    suffix = path.suffix.lower()
    if kind == "missing":
        raise missing_source(source, key)
    if kind == "file" and suffix in (".jsonl", ".txt"):
        lines = enumerate(nonblank_lines(path))
        yield from ((index, line_row(number, line, suffix)) for index, (number, line) in lines)
    elif kind == "file" and suffix == ".json":
        yield from json_rows(path, f"{key}.path: {source.path}")
    elif kind == "file" and suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = (row for batch in pq.ParquetFile(path).iter_batches(batch_size=64) for row in batch.to_pylist())
        yield from enumerate(rows)
    elif kind == "saved":
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if source.split not in loaded:
                raise DataError(f"{key}: {source.path} has no split {source.split!r}; it has {', '.join(loaded)}. "
                                "Set `split:` to one of them.")
            loaded = loaded[source.split]
        yield from enumerate(loaded)
    else:
        import datasets

        try:
            rows = (datasets.load_dataset(FILE_BUILDERS[suffix], data_files=source.path, split="train", streaming=True)
                    if kind == "file" else
                    datasets.load_dataset(source.path, source.name, split=source.split, revision=source.revision,
                                          streaming=True))
            yield from enumerate(rows)
        except Exception as exc:  # noqa: BLE001 (whatever the reader says, named with the source)
            raise DataError(f"{key}: could not read the first rows of {source.path}: {exc}") from None


def _image_tokens(processing_class, template: str | None, recipe: Recipe) -> ImageTokens | None:
    """A vision-language model's image tokens (its processor has an image processor), once its template is seen to
    write the image token for an image part; None for a text model or rows that are not chats."""
    if getattr(processing_class, "image_processor", None) is None or template is None:
        return None
    tokens = ImageTokens(processing_class, recipe.data.image)
    try:
        check_image_template(template, tokens.tokenizer, tokens.token)
    except TemplateError as exc:
        raise DataError(str(exc)) from None
    return tokens


@dataclass
class _Unit:
    """One token of the rendered text (before images are expanded): its text, its message's role, and the tokens it
    is in the row as trained (an image placeholder: all of the image's tokens)."""

    piece: str
    role: str
    start: int
    end: int
    image: bool = False


@dataclass
class _Shown:
    """The rows' printer: how a row is tokenized and rendered, and the totals of the rows shown so far."""

    tokenizer: object
    template: str | None
    settings: TokenizeSettings
    images: ImageTokens | None
    colour: bool
    stop_name: str  # the token a trained turn must end with, as the tokenizer writes it
    counted: dict = field(default_factory=lambda: {"rows": 0, "tokens": 0, "trained": 0, "turns": 0, "stopped": 0})

    def row(self, number: int, where: str, row: dict | RowError) -> str:
        """Row ``number`` (``where``: its place) marked, its notes, its tokens per role and its stop check."""
        if isinstance(row, RowError):
            return f"row {number}, {where}: a bad row: {row.render()}"
        batch = {name: [value] for name, value in row.items()}
        out = tokenize_arrays(batch, self.tokenizer, self.settings, self.images)
        ids, labels = out["input_ids"][0], out["labels"][0]
        trained = len(ids) if labels is ids else int(np.count_nonzero(labels != IGNORE_INDEX))
        units = self._units(row, out["ft_full_length"][0])
        turns, stopped = out["ft_turns"][0], out["ft_turns_stopped"][0]
        self.counted.update(rows=self.counted["rows"] + 1, tokens=self.counted["tokens"] + len(ids),
                            trained=self.counted["trained"] + trained, turns=self.counted["turns"] + turns,
                            stopped=self.counted["stopped"] + stopped)
        lines = [f"row {number}, {where}: {len(ids)} tokens, {trained} trained"]
        if units is None:  # the text could not be lined up with the tokens: shown token by token instead
            units = [_Unit(self.tokenizer.decode([int(t)]), "?", i, i + 1) for i, t in enumerate(ids)]
        lines.append(self._marked(units, labels, len(ids)))
        lines += [f"  {note}" for note in self._notes(out, len(ids))]
        lines += self._roles(units, labels, len(ids))
        if turns:
            verdict = "" if stopped == turns else ": a model trained on it may not learn to stop (data.on_missing_stop)"
            lines.append(f"  stop: {stopped} of {turns} trained turns end with {self.stop_name}{verdict}")
        return "\n".join(lines)

    def totals(self) -> str:
        """The last line: the rows shown, their tokens, trained tokens and trained turns that stop."""
        c = self.counted
        share = f" ({c['trained'] / c['tokens']:.1%})" if c["tokens"] else ""
        rows = f"{c['rows']} row{'s' if c['rows'] != 1 else ''}"
        return (f"{rows} shown: {c['tokens']} tokens, {c['trained']} trained{share}; {c['stopped']} of {c['turns']} "
                f"trained turns end with {self.stop_name}")

    def _units(self, row: dict, full_length: int) -> list[_Unit] | None:
        """The row's rendered text as tokens with their roles, lined up with the tokens as trained (each image
        placeholder spans its image's tokens); None when they do not line up."""
        tokenizer = self.tokenizer
        if "messages" in row:
            tools = row.get("tools") or self.settings.tools
            try:
                text = render(tokenizer, self.template, row["messages"], tools)
            except Exception:  # noqa: BLE001 (a row the template refuses: a bad row, said by the notes)
                return None
            encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ends, roles = self._regions(row["messages"], text, tools)
            ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        else:
            text = row["prompt"] + row["completion"]
            encoding = tokenizer(text, return_offsets_mapping=True)
            ids, offsets = list(encoding["input_ids"]), list(encoding["offset_mapping"])
            if tokenizer.eos_token_id is not None and not (ids and ids[-1] == tokenizer.eos_token_id):
                ids, offsets = ids + [tokenizer.eos_token_id], offsets + [(len(text), len(text))]
            ends, roles = ([len(row["prompt"]), len(text)], ["prompt", "completion"]) if row["prompt"] else \
                ([len(text)], ["text"])
        sizes = self._image_sizes(ids, row.get("images"))
        special = set(tokenizer.all_special_ids)
        units, at = [], 0
        starts = [0, *(start for start, _ in offsets[1:])]
        for i, (token, start) in enumerate(zip(ids, starts, strict=True)):
            stop = starts[i + 1] if i + 1 < len(ids) else len(text)
            piece = text[start:stop] if stop > start else ""
            if not piece and token in special:
                piece = tokenizer.convert_ids_to_tokens(token)
            role = roles[next((r for r, end in enumerate(ends) if end > start), len(ends) - 1)]
            size = sizes.get(i, 1)
            units.append(_Unit(piece, role, at, at + size, image=i in sizes))
            at += size
        return units if at == full_length else None

    def _image_sizes(self, ids: list[int], refs: list | None) -> dict[int, int]:
        """token index -> the tokens its image becomes, for each image placeholder (as ``tokenize_arrays`` expands
        them: only when the placeholders and the row's images agree in number)."""
        if self.images is None or not refs:
            return {}
        places = [i for i, token in enumerate(ids) if token == self.images.id]
        if len(places) != len(refs):
            return {}
        return {place: len(self.images.of(ref)) for place, ref in zip(places, refs, strict=True)}

    def _regions(self, messages: list[dict], text: str, tools) -> tuple[list[int], list[str]]:
        """(where each part of ``text`` ends, whose part it is): each message's, ending after ``messages[:i + 1]``
        rendered alone where that is a prefix of the whole, else after the message's text and the end-of-turn after it
        (found in order); first, ``tools``: the tool definitions a template writes before the first message."""
        eot = end_of_turn(self.template, self.tokenizer, self.settings.parts).strip()
        cursor = self._tools_preamble(messages, text, tools)
        ends, roles = ([cursor], ["tools"]) if cursor else ([], [])
        for i, message in enumerate(messages):
            try:
                prefix = render(self.tokenizer, self.template, messages[:i + 1], tools)
            except Exception:  # noqa: BLE001 (a template may refuse a prefix)
                prefix = None
            if prefix is not None and len(prefix) >= cursor and text.startswith(prefix):
                cursor = len(prefix)
            else:
                cursor = _after_content(message, text, cursor, eot)
            ends.append(cursor)
            roles.append(message["role"])
        return ends[:-1] + [len(text)], roles

    def _tools_preamble(self, messages: list[dict], text: str, tools) -> int:
        """Where the tool definitions end when the template writes them before the first message (``messages[:1]``
        rendered with the tools is its rendering without them, after them); 0 otherwise (e.g. written into the
        system message: counted as the system's)."""
        if not template_tools(tools):
            return 0
        try:
            with_tools = render(self.tokenizer, self.template, messages[:1], tools)
            without = render(self.tokenizer, self.template, messages[:1])
        except Exception:  # noqa: BLE001 (a template may refuse a prefix)
            return 0
        head = len(with_tools) - len(without)
        return head if head > 0 and with_tools.endswith(without) and text.startswith(with_tools[:head]) else 0

    def _marked(self, units: list[_Unit], labels, length: int) -> str:
        """The row's text, its trained tokens marked; the tokens ``max_length`` cut off are not shown."""
        pieces, open_ = [], False
        for unit in units:
            if unit.start >= length:
                break
            on = not unit.image and bool(np.any(labels[unit.start:min(unit.end, length)] != IGNORE_INDEX))
            if on != open_:
                pieces.append((TRAINED if on else RESET) if self.colour else (OPEN if on else CLOSE))
                open_ = on
            if unit.image:
                marker = f"<image×{unit.end - unit.start}>"
                pieces.append(f"{IMAGE}{marker}{RESET}" if self.colour else marker)
            else:
                pieces.append(unit.piece)
        if open_:
            pieces.append(RESET if self.colour else CLOSE)
        return "".join(pieces).removesuffix("\n")  # the template's last newline, when untrained: the lines below say

    def _notes(self, out: dict, length: int) -> list[str]:
        """What the row's flags say: cut by max_length, dropped, bad (its reason)."""
        notes = []
        full, bad = out["ft_full_length"][0], out.get(BAD[0], [""])[0]
        if out["ft_truncated"][0]:
            notes.append(f"cut at data.max_length {self.settings.max_length}: the last {full - length} of its {full} "
                         "tokens are not trained (data.truncation: truncate)")
        if out["ft_too_long"][0]:
            notes.append(f"dropped: {full} tokens, longer than data.max_length {self.settings.max_length} "
                         "(data.truncation: drop)")
        elif out["ft_no_loss"][0] and not bad:
            notes.append("dropped: no token of it carries loss")
        if bad:
            notes.append(f"a bad row: {out[BAD[1]][0]}")
        if out.get("ft_image_mismatch", [False])[0]:
            notes.append("a bad row: its image placeholders and its images disagree in number once rendered "
                         "(image_count)")
        return notes

    def _roles(self, units: list[_Unit], labels, length: int) -> list[str]:
        """Tokens per role, trained and not (image tokens counted apart, with their message's role)."""
        counts: dict[str, list[int]] = {}
        pictured = 0
        for unit in units:
            end = min(unit.end, length)
            if unit.start >= end:
                break
            on = int(np.count_nonzero(labels[unit.start:end] != IGNORE_INDEX))
            count = counts.setdefault(unit.role, [0, 0])
            count[0] += on
            count[1] += end - unit.start - on
            pictured += (end - unit.start) if unit.image else 0
        width = max(len(role) for role in [*counts, "tokens"])
        lines = [f"  {'tokens':<{width}}  trained  not trained"]
        lines += [f"  {role:<{width}}  {on:>7}  {off:>11}" for role, (on, off) in counts.items()]
        if pictured:
            lines.append(f"  ({pictured} of them image tokens, never trained)")
        return lines


def _after_content(message: dict, text: str, cursor: int, eot: str) -> int:
    """Where ``message``'s text ends in ``text`` (searched from ``cursor``), with the end-of-turn ``eot`` after it;
    without a text that can be found, where the next ``eot`` ends (``cursor`` when there is none)."""
    content = message.get("content")
    texts = [content] if isinstance(content, str) else [part.get("text") or "" for part in content or ()
                                                        if isinstance(part, dict)]
    needle = "".join(texts).strip() if isinstance(content, str) else (texts[-1].strip() if texts else "")
    at = text.find(needle, cursor) if needle else -1
    if at < 0:  # no text of its own (a turn of tool calls alone), or rewritten: up to the next end-of-turn
        found = text.find(eot, cursor) if eot else -1
        return found + len(eot) if found >= 0 else cursor
    end = at + len(needle)
    after = len(text) - len(text[end:].lstrip())
    return after + len(eot) if eot and text.startswith(eot, after) else end
