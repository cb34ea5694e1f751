"""The images of a vision-language model's rows: where each one is, whether it can be read, the size it is trained at,
the tokens it becomes, and the collator that turns a batch's images into the model's pixel inputs.

ft prepares a row with images the way it prepares a text row, once, before training (``ft.data.tokenize``): the chat
rendered with its template, tokenized and masked, then each image's placeholder token replaced by the tokens the
model's own processor writes for an image of that size (``ImageTokens``). The prepared row keeps its images' paths,
never their pixels. While training, ``ImageBatches`` reads a batch's images, resizes them as ``data.image`` says and
runs the processor on them, as TRL's ``DataCollatorForVisionLanguageModeling`` does at batch time (TRL 1.16): memory
holds one batch of images, whatever the dataset's size.

A row names an image by a path (read relative to its data file), an ``http(s)://`` URL (fetched when the data is
prepared, to check it, and again for each batch that uses it) or a ``data:`` URI (the image itself, base64); or it
holds the image itself, as a dataset with an ``Image`` feature does (TRL's layout: a parquet file, a ``save_to_disk``
folder, a hub dataset). Such an image is written once to a file named by the sha256 of its bytes
(``ImageSource.stored``, in ``stored_images_folder``), and the row keeps that file's path: the prepared rows and the
collator read every image by reference, whatever the row held.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_to_bytes

import numpy as np

from ..errors import FtError
from ..recipe.data_section import ImageSettings
from .rows import DataError, RowError, kind_of

REMOTE = ("http://", "https://")
URL_SECONDS = 30  # how long a fetch of an image URL may take before the row (or the batch) fails
_ROTATED = {5, 6, 7, 8}  # EXIF orientations that swap width and height (transposed or turned by 90 degrees)
STORED = "ft_images"  # the folder, in datasets' cache, of the images stored inside datasets (no data.prepared_path)
SEEN = 100_000  # images an ImageSource remembers as checked; past that it checks again (memory stays bounded)


def stored_images_folder(prepared_path: str | None) -> Path:
    """Where the images stored inside a dataset are written as files, one per distinct image (its bytes' sha256).

    Beside ``data.prepared_path`` (``<prepared_path>.images``) when the rows are prepared there: the prepared rows
    name these files, so they live and are moved or deleted with it (``ft.data.cache`` swaps the prepared folder in
    whole, so they cannot be inside it). Otherwise in ``datasets``' cache (``HF_DATASETS_CACHE/ft_images``), where
    ``datasets`` keeps its own copy of the dataset (a parquet file's Arrow copy, a hub download) and the rows ft
    derives from it: the files are cleaned with that cache, shared by every run and recipe that reads the same images
    (content-addressed, so no run writes another's image twice), and no run's output folder, which ``ft train
    --overwrite`` deletes, holds images that another run's rows name."""
    if prepared_path:
        path = Path(prepared_path)
        return path.with_name(path.name + ".images")
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / STORED


def _open(ref: str):
    """The PIL image ``ref`` names (a path, a URL or a data: URI), opened lazily: its pixels are decoded on ``load``."""
    from PIL import Image

    if ref.startswith(REMOTE):
        from urllib.request import urlopen

        with urlopen(ref, timeout=URL_SECONDS) as response:  # noqa: S310 (http and https only: REMOTE)
            return Image.open(io.BytesIO(response.read()))
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        raw = base64.b64decode(payload) if header.endswith(";base64") else unquote_to_bytes(payload)
        return Image.open(io.BytesIO(raw))
    return Image.open(ref)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class ImageSource:
    """Where the images of one data source are: a relative path is read from ``folder`` (the data file's folder, or a
    saved dataset's own; None for a hub dataset, whose rows must give absolute paths or URLs). ``placeholder`` marks
    an image in the text of a row laid out with an ``images`` column (LLaMA-Factory's ``<image>``). ``store``: the
    folder the images a row holds (an ``Image`` feature's bytes) are written to; None: ``stored_images_folder(None)``,
    found when first needed (``store_folder``: it imports ``datasets``, which reading rows for ``--show`` does not)."""

    folder: Path | None
    placeholder: str = "<image>"
    store: Path | None = None
    _seen: dict = field(default_factory=dict, compare=False, repr=False)  # checked: ref (or sha256:…) -> resolved

    @classmethod
    def of(cls, path: str, store: Path | None = None) -> ImageSource:
        """The images of the source at ``path`` (``data.*.path``, resolved against the recipe's folder); those stored
        inside it are written to ``store`` (default: ``stored_images_folder(None)``, ``store_folder``)."""
        local = Path(path)
        return cls(local.parent if local.is_file() else local if local.is_dir() else None, store=store)

    def store_folder(self) -> Path:
        """The folder the images stored inside the source are written to: ``store``, else
        ``stored_images_folder(None)``."""
        return self.store if self.store is not None else stored_images_folder(None)

    def take(self, image, where: str) -> str:
        """The reference a prepared row keeps for ``image`` as a row gives it: a path, URL or data: URI (``check``),
        or the image itself, as a dataset stores one: ``datasets.Image``'s ``{"bytes", "path"}`` (read undecoded; a
        path alone when the dataset names its files), raw bytes, or a PIL image (encoded as ``datasets.Image``
        encodes one), written to a file of its own (``stored``). Anything else makes the row bad (``wrong_type``)."""
        if isinstance(image, dict):  # datasets.Image's storage: the bytes, or the path alone
            raw, path = image.get("bytes"), image.get("path")
            if raw is None and not (isinstance(path, str) and path.strip()):
                raise RowError("missing_field", "a stored image with neither bytes nor a path", where)
            image = path if raw is None else raw
        if isinstance(image, str):
            if not image.strip():
                raise RowError("wrong_type", "expected an image path or URL, got empty text", where)
            return self.check(image, where)
        if isinstance(image, (bytes, bytearray, memoryview)):
            return self.stored(bytes(image), where)
        from PIL import Image

        if isinstance(image, Image.Image):
            import datasets

            return self.take(datasets.Image().encode_example(image), where)
        raise RowError("wrong_type", "expected an image (a path, a URL, a data: URI, or an image stored in the "
                       f"dataset), got {kind_of(image)}", where)

    def stored(self, raw: bytes, where: str) -> str:
        """The path of the file that holds the image ``raw`` (its encoded bytes, as a dataset stores them), written
        once: the file is named by the sha256 of the bytes (``<store>/ab/abcd….png``), so the same image, in any row
        or any dataset, is one file, and reading the data again writes nothing. The bytes are decoded first: bytes
        that are not an image make the row bad (``image_unreadable``), and are never written. Written under a
        temporary name and renamed, so a file that exists is whole, even with several processes writing at once."""
        digest = hashlib.sha256(raw).hexdigest()
        seen = f"sha256:{digest}"  # not a reference any row could give (a path, a URL, a data: URI)
        if seen in self._seen:
            return self._seen[seen]
        from PIL import Image

        try:
            with Image.open(io.BytesIO(raw)) as image:
                kind = (image.format or "img").lower()
                path = self.store_folder() / digest[:2] / f"{digest}.{kind}"
                if not path.is_file():  # written only after a whole decode: a file there was checked then
                    image.load()
        except Exception as exc:  # PIL's errors, and a decompression bomb: the image cannot be used
            raise RowError("image_unreadable", f"the image stored in the row ({len(raw)} bytes) cannot be read as an "
                           f"image ({_first_line(exc)})", where) from None
        if not path.is_file():
            _write(raw, path, where)
        resolved = str(path.resolve())
        if len(self._seen) < SEEN:
            self._seen[seen] = resolved
        return resolved

    def check(self, ref: str, where: str) -> str:
        """``ref`` resolved (an absolute path, or the URL), once its image is read whole: a missing file
        (``image_missing``) or one that does not decode (``image_unreadable``) makes the row bad, named ``where``. An
        image is decoded here once, so that a damaged file stops the data's preparation and not training."""
        if ref in self._seen:
            return self._seen[ref]
        resolved = ref
        if not ref.startswith((*REMOTE, "data:")):
            path = Path(ref).expanduser()
            if not path.is_absolute():
                if self.folder is None:
                    raise RowError("image_missing", f"{ref!r} is a relative path in a dataset that is not a local file "
                                   "or folder, so there is nothing to read it from; give absolute paths or URLs", where)
                path = self.folder / path
            if not path.is_file():
                raise RowError("image_missing", f"{_shown(ref)} does not exist (read as {path}, relative to the data "
                               "file's folder)" if str(path) != ref else f"{_shown(ref)} does not exist", where)
            resolved = str(path)
        try:
            with _open(resolved) as image:
                image.load()
        except Exception as exc:  # PIL's and urllib's errors, and a decompression bomb: the image cannot be used
            raise RowError("image_unreadable", f"{_shown(ref)} cannot be read as an image ({_first_line(exc)})",
                           where) from None
        if len(self._seen) < SEEN:  # images shared by many rows are read once; memory stays bounded
            self._seen[ref] = resolved
        return resolved


def _write(raw: bytes, path: Path, where: str) -> None:
    """``raw`` written to ``path`` under a temporary name, then renamed; a folder that cannot be written (full, read
    only, not a folder) stops the data's preparation, naming it and the settings that move it."""
    temporary = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(raw)
        os.replace(temporary, path)
    except OSError as exc:
        raise DataError(f"could not write the image stored in a row ({where}) to {path.parent} ({exc.strerror or exc})"
                        ": ft writes each image stored inside a dataset there once, as the file its prepared rows "
                        "name. Free space there or make it writable, or move it: it is beside data.prepared_path "
                        "(`<prepared_path>.images`) when that is set, else the `ft_images` folder of the datasets "
                        "cache (the HF_DATASETS_CACHE environment variable).") from None
    finally:
        with contextlib.suppress(OSError):  # gone once renamed; never made when its folder could not be
            temporary.unlink(missing_ok=True)


def _shown(ref: str) -> str:
    """An image reference as messages quote it: a data: URI is shortened."""
    return repr(ref if not ref.startswith("data:") else ref[:40] + "…")


def sized(width: int, height: int, sizing: ImageSettings | None) -> tuple[int, int]:
    """The (width, height) an image of this size is trained at: ``data.image.size``, or scaled down to at most
    ``data.image.max_pixels`` with its aspect ratio kept, or as it is."""
    if sizing is None:
        return width, height
    if sizing.size is not None:
        return sizing.size[0], sizing.size[1]
    if sizing.max_pixels is not None and width * height > sizing.max_pixels:
        scale = math.sqrt(sizing.max_pixels / (width * height))
        return max(1, int(width * scale)), max(1, int(height * scale))
    return width, height


def image_size(ref: str, sizing: ImageSettings | None) -> tuple[int, int]:
    """The size ``ref`` is trained at, read from its header (no pixels decoded), upright as its EXIF orientation
    says (``load_image`` turns it so)."""
    with _open(ref) as image:
        width, height = image.size
        if image.getexif().get(0x0112) in _ROTATED:
            width, height = height, width
    return sized(width, height, sizing)


def load_image(ref: str, sizing: ImageSettings | None):
    """The image ``ref`` names as the model sees it: decoded, upright (EXIF orientation), RGB, resized as
    ``data.image`` says."""
    from PIL import Image, ImageOps

    with _open(ref) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")
    size = sized(*image.size, sizing)
    return image if size == image.size else image.resize(size, Image.Resampling.BICUBIC)


class ImageTokens:
    """The tokens an image becomes for ``processor`` (a vision-language model's processor): its placeholder token
    (``image_token``, which a chat template writes once per image) expanded the way the processor expands it for an
    image of that size (LLaVA: a fixed count; Qwen2-VL: one per patch group; Idefics3/SmolVLM: tiles with their row
    and column tokens). Each expansion is the processor's own, asked once per image size (on a blank image of that
    size: the expansion depends on the size alone), so ft never re-implements a family's arithmetic."""

    def __init__(self, processor, sizing: ImageSettings | None):
        token = getattr(processor, "image_token", None)
        tokenizer = processor.tokenizer
        if not isinstance(token, str) or tokenizer(token, add_special_tokens=False)["input_ids"] != \
                [tokenizer.convert_tokens_to_ids(token)]:
            raise DataError(f"model.name: the processor ({type(processor).__name__}) has no image token that its "
                            "tokenizer reads as one token, so ft cannot tell where a row's images go; ft trains "
                            "vision-language models whose processor expands an image token (LLaVA, Qwen2-VL, "
                            "Idefics3/SmolVLM and their kin). docs/vision.md")
        self.processor, self.sizing, self.token = processor, sizing, token
        self.id = tokenizer.convert_tokens_to_ids(token)
        self._expansions: dict[tuple[int, int], np.ndarray] = {}

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    def expansion(self, size: tuple[int, int]) -> np.ndarray:
        """The token ids one image of ``size`` (width, height) becomes, as int32."""
        if size not in self._expansions:
            from PIL import Image

            ids = self.processor(text=self.token, images=[Image.new("RGB", size)],
                                 add_special_tokens=False)["input_ids"][0]
            self._expansions[size] = np.asarray(ids, dtype=np.int32)
        return self._expansions[size]

    def of(self, ref: str) -> np.ndarray:
        """The token ids the image ``ref`` becomes."""
        return self.expansion(image_size(ref, self.sizing))


class ImageChanged(FtError, exit_code=1):
    """An image a prepared row names is gone or differs from the one its tokens were counted for (exit code 1)."""


@dataclass
class ImageBatches:
    """The collator of a vision-language model's prepared rows: input_ids and labels padded on the right (labels with
    -100, so padding is never trained), an attention mask, and what the processor makes of the batch's images
    (``pixel_values``, and per family ``image_grid_thw``, ``pixel_attention_mask``, ``image_sizes``, …), read from disk
    here, a batch at a time. The processor is handed each row's images and its placeholders (as TRL's collator hands
    them), and must expand them into as many image tokens as the prepared row holds: an image replaced since the
    data was prepared is stopped here, by name, instead of failing inside the model."""

    tokens: ImageTokens
    pad_token_id: int
    per_token: tuple[str, ...] = ("token_type_ids", "mm_token_type_ids")  # 1 on image tokens, from the row's own ids

    def __call__(self, rows: list[dict]) -> dict:
        import torch

        longest = max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((len(rows), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), longest), -100, dtype=torch.long)
        attention = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            input_ids[i, :n] = torch.as_tensor(row["input_ids"])
            labels[i, :n] = torch.as_tensor(row["labels"])
            attention[i, :n] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
        refs = [list(row.get("images") or ()) for row in rows]
        if not any(refs):
            return batch
        images = [[self._load(ref) for ref in row] for row in refs]
        out = self.tokens.processor(images=images, text=[self.tokens.token * len(row) for row in refs],
                                    add_special_tokens=False, padding=True, return_tensors="pt")
        made, held = (out["input_ids"] == self.tokens.id).sum(1), (input_ids == self.tokens.id).sum(1)
        for i in torch.nonzero(made != held).flatten().tolist():
            raise ImageChanged(f"the images {refs[i]} of a training row become {int(made[i])} image tokens now, and "
                               f"{int(held[i])} when the data was prepared: an image was replaced by one of another "
                               "size since. Prepare the data again (delete data.prepared_path, or run `ft "
                               "preprocess`), or put the original images back.")
        for key, value in out.items():
            if key in ("input_ids", "attention_mask"):
                continue
            batch[key] = (input_ids == self.tokens.id).long() if key in self.per_token else value
        return batch

    def _load(self, ref: str):
        try:
            return load_image(ref, self.tokens.sizing)
        except Exception as exc:  # a file deleted or damaged since the data was prepared
            raise ImageChanged(f"the image {_shown(ref)} of a training row cannot be read any more "
                               f"({_first_line(exc)}); it could when the data was prepared. Put it back, or prepare "
                               "the data again without it.") from None
