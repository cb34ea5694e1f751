"""The data ``--smoke`` trains on: each source's first rows, or rows generated in its format when it cannot be read.

A local source's first rows are copied (a .jsonl or .txt file line for line, blank lines included, so an error about
the copy keeps the original's line numbers); a ``save_to_disk`` folder's first rows of each split; a hub dataset's
first rows from the cache (offline) or a stream (online). A source that cannot be read gets arithmetic rows generated
in its format and ``fields:``/``roles:`` layout, so the mapping is exercised all the same.

For a vision-language model, a copy's relative image paths are made absolute (``ImagePaths``: a relative path is read
from the data file's folder, which the copy is not in), and a chat source that cannot be read gets chats about small
generated pictures (``generated_with_images``), their PNG files next to the rows.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..data.formats import FORMATS, IMAGE_PARTS, Names
from ..data.images import REMOTE, ImageSource
from ..data.sources import source_kind
from ..recipe import Recipe
from ..recipe.data_section import DataSource
from ..recipe.errors import first_line

Relocate = Callable[[dict], dict]  # a row as a copy of it elsewhere holds it (``ImagePaths``)


def head(source: DataSource, rows: int, stem: Path, images: bool = False) -> tuple[Path | None, str | None]:
    """(copy of the source's first ``rows`` rows, why) — (None, None): use the source as it is (it has no more rows,
    or it is a local path whose reading the real pipeline reports); (None, reason): unreachable, generate rows.
    ``images``: the model reads images, and the copy's image paths are made absolute (``ImagePaths``)."""
    kind = source_kind(source)
    relocate = ImagePaths.of(source) if images else None
    try:
        if kind == "file":
            return _file_head(Path(source.path), rows, stem, relocate)
        if kind == "saved":
            return _disk_head(Path(source.path), rows, stem, relocate)
    except Exception:  # unreadable: the real pipeline reads it whole and reports it
        return None, None
    if kind == "missing":
        return None, None  # the real pipeline says so
    return _dataset_head(source, rows, stem, local=kind == "folder", relocate=relocate)


@dataclass(frozen=True)
class ImagePaths:
    """The image paths of a source's rows made absolute, for a copy of the rows kept elsewhere: ft reads a relative
    image path from the data file's folder (a saved dataset's own: ``ft.data.images.ImageSource``), which the copy
    is not in. The paths are where ft reads images: the image parts (``IMAGE_PARTS``) of the messages' contents and
    the ``images`` column, under the source's ``fields:`` names. URLs, ``data:`` URIs and absolute paths stay."""

    folder: Path
    names: Names

    @classmethod
    def of(cls, source: DataSource) -> ImagePaths | None:
        """The rewriting of ``source``'s rows; None for a source whose relative paths are read from nowhere (a hub
        dataset's rows name their images by absolute path or URL)."""
        folder = ImageSource.of(source.path).folder
        return cls(folder, Names(source.fields, source.roles)) if folder is not None else None

    def __call__(self, row: dict) -> dict:
        column = self.names("images")
        listed = row.get(column)
        if isinstance(listed, (str, list)):
            row[column] = self.path(listed) if isinstance(listed, str) else [self.path(ref) for ref in listed]
        messages = row.get(self.names("messages"))
        for message in messages if isinstance(messages, list) else ():
            content = message.get(self.names("content")) if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else ():
                if isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                    self._part(part)
        return row

    def _part(self, part: dict) -> None:
        for key in ("image", "path", "url"):
            if key in part:
                part[key] = self.path(part[key])
        nested = part.get("image_url")
        if isinstance(nested, dict) and "url" in nested:
            nested["url"] = self.path(nested["url"])
        elif isinstance(nested, str):
            part["image_url"] = self.path(nested)

    def path(self, ref):
        """``ref`` read from the source's folder, as ft reads a relative image path."""
        if not isinstance(ref, str) or not ref.strip() or ref.startswith((*REMOTE, "data:")) or \
                Path(ref).expanduser().is_absolute():
            return ref
        return str(self.folder / ref)


def _file_head(path: Path, rows: int, stem: Path, relocate: Relocate | None = None) -> tuple[Path | None, str | None]:
    suffix = path.suffix.lower()
    copy = stem.with_name(f"{stem.name}.{path.name}")
    why = f"the first {rows} rows of {path}" + (", their image paths made absolute" if relocate else "")
    if suffix in (".jsonl", ".txt"):  # line for line, blank lines included: errors keep their line numbers
        written = 0
        with open(path, "rb") as f, open(copy, "wb") as g:
            for line in f:
                if written == rows:
                    return copy, why
                g.write(_relocated(line, relocate) if relocate and suffix == ".jsonl" else line)
                written += bool(line.strip())
        copy.unlink()
        return None, None
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        if parquet.metadata.num_rows <= rows:
            return None, None
        batch = next(parquet.iter_batches(batch_size=rows))
        table = (pa.Table.from_pylist([relocate(row) for row in batch.to_pylist()], schema=batch.schema) if relocate
                 else pa.Table.from_batches([batch]))
        pq.write_table(table, copy)
        return copy, why
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            records = [record for _, record in zip(range(rows + 2), csv.reader(f), strict=False)]
        if len(records) <= rows + 1:
            return None, None
        header, kept = records[0], records[1: rows + 1]
        if relocate:
            kept = [[relocate(dict(zip(header, record, strict=False))).get(name) for name in header]
                    for record in kept]
        with open(copy, "w", newline="", encoding="utf-8") as g:
            csv.writer(g).writerows([header, *kept])
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
                kept.append(_relocated(line.encode(), relocate).decode() if relocate else line)
                count += bool(line.strip())
            return None, None
        items = json.loads(text)
        if not isinstance(items, list) or len(items) <= rows:
            return None, None
        kept = [relocate(item) if relocate and isinstance(item, dict) else item for item in items[:rows]]
        copy.write_text(json.dumps(kept, ensure_ascii=False), encoding="utf-8")
        return copy, why
    return None, None


def _relocated(line: bytes, relocate: Relocate) -> bytes:
    """A JSON line with its row's image paths made absolute, on one line still (its line ending kept); a line that is
    not a JSON object is copied as it is, for the real pipeline to report at its line."""
    body = line.rstrip(b"\r\n")
    try:
        row = json.loads(body)
    except ValueError:
        return line
    if not isinstance(row, dict):
        return line
    return json.dumps(relocate(row), ensure_ascii=False).encode() + line[len(body):]


def _disk_head(path: Path, rows: int, stem: Path, relocate: Relocate | None = None) -> tuple[Path | None, str | None]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    parts = loaded if isinstance(loaded, datasets.DatasetDict) else {"": loaded}
    if all(len(part) <= rows for part in parts.values()):
        return None, None
    heads = {name: _relocated_rows(part.select(range(min(rows, len(part)))), relocate) for name, part in parts.items()}
    copy = stem.with_name(f"{stem.name}.{path.name}")
    (datasets.DatasetDict(heads) if isinstance(loaded, datasets.DatasetDict) else heads[""]).save_to_disk(str(copy))
    return copy, f"the first {rows} rows of {path}" + (", their image paths made absolute" if relocate else "")


def _relocated_rows(dataset, relocate: Relocate | None):
    """``dataset``'s rows with their image paths made absolute, in memory (no cache file is written next to the
    source's own files)."""
    return dataset if relocate is None else dataset.map(relocate, keep_in_memory=True, load_from_cache_file=False)


def _dataset_head(source: DataSource, rows: int, stem: Path, local: bool,
                  relocate: Relocate | None = None) -> tuple[Path | None, str | None]:
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
    datasets.DatasetDict({source.split: _relocated_rows(head, relocate)}).save_to_disk(str(copy))
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


# the generated pictures: a coloured square on white, in two sizes (so that more than one image size is prepared)
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230), "yellow": (240, 220, 40)}
PICTURE_SIZES = ((32, 32), (40, 24))
QUESTION = "What colour is the square?"


def generated_with_images(source: DataSource, split: str, count: int, path: Path) -> str:
    """Writes ``count`` chats about small generated pictures to ``path`` (a .jsonl) in the source's layout, their PNG
    files in the folder ``<path stem>.images`` next to it, named by relative paths (as a local data set's rows name
    theirs, read from the data file's folder): an image part ``{"type": "image", "image": …}`` before the question,
    or, where the source maps an ``images`` column (``fields: {images: …}``, LLaMA-Factory's layout), the paths in
    that column and an ``<image>`` placeholder in the question. Every third chat asks a second, text-only question.
    Evaluation rows pair colours and sizes otherwise than training rows. Returns what it wrote, for the log."""
    from PIL import Image, ImageDraw

    folder = path.with_suffix(".images")
    folder.mkdir(parents=True, exist_ok=True)
    names, colours = Names(source.fields, source.roles), list(COLOURS)
    listed, placeholder = "images" in source.fields, ImageSource(None).placeholder
    start = 0 if split == "train" else 1
    rows, pictures = [], set()
    for i in range(start, start + count):
        colour, (width, height) = colours[i % len(colours)], PICTURE_SIZES[i // len(colours) % len(PICTURE_SIZES)]
        ref = f"{folder.name}/{colour}-{width}x{height}.png"
        if ref not in pictures:
            picture = Image.new("RGB", (width, height), (255, 255, 255))
            ImageDraw.Draw(picture).rectangle([4, 4, width - 5, height - 5], fill=COLOURS[colour])
            picture.save(path.parent / ref)
            pictures.add(ref)
        question = (placeholder + QUESTION if listed
                    else [{"type": "image", "image": ref}, {"type": "text", "text": QUESTION}])
        turns = [names.message("user", question), names.message("assistant", colour.capitalize())]
        if i % 3 == 2:
            turns += [names.message("user", "And the background?"), names.message("assistant", "White")]
        rows.append({names("messages"): turns, **({names("images"): [ref]} if listed else {})})
    write_jsonl(path, rows)
    sizes = " and ".join(f"{w}x{h}" for w, h in PICTURE_SIZES)
    return f"{len(pictures)} PNG pictures of {sizes} pixels in {folder.name}/"


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
