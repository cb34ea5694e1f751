"""Images stored inside a dataset, offline: TRL's layout (messages whose image parts are bare ``{"type": "image"}``,
or name an ``index``, and an ``images`` column of ``datasets.Image`` values), as HuggingFaceH4/llava-instruct-mix-vsft
and TRL's examples lay their rows out, in a parquet file or a ``save_to_disk`` folder built here with ``datasets`` and
PNG bytes from PIL. The rows are read without decoding the dataset, each stored image written once to a file named
by its bytes' sha256, and the prepared rows name those files: SFT on a tiny random LLaVA trains on batches whose
pixels are the stored images', DPO reads stored prompt images, a count that disagrees and bytes that are no image are
bad rows named by row, and the prepared cache keeps file references that a second read does not rewrite."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import yaml
from conftest import built_trainer
from datasets import Features, Image, List, Value
from PIL import Image as PILImage
from test_vision import COLOURS, _square, build_tiny_llava
from transformers import AutoProcessor

import ft.run.train
from ft import data
from ft.data.formats import normalize
from ft.data.images import ImageSource, load_image, stored_images_folder
from ft.data.rows import BadRows, DataError
from ft.data.sources import read_source
from ft.model import loading
from ft.recipe import load_recipe
from ft.recipe.data_section import DataSource

QUESTION = "What colour is the square?"
NAMES = list(COLOURS)
PART = {"type": Value("string"), "text": Value("string"), "index": Value("int64")}  # one struct for every part
CHAT = Features({"messages": List({"role": Value("string"), "content": List(PART)}), "images": List(Image())})
PAIRS = Features({"prompt": List({"role": Value("string"), "content": List(PART)}),
                  "chosen": List({"role": Value("string"), "content": List(PART)}),
                  "rejected": List({"role": Value("string"), "content": List(PART)}), "images": List(Image())})


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


def _png(folder: Path, i: int, size: tuple[int, int] = (24, 24)) -> bytes:
    """The PNG bytes of picture ``i``: a square of colour ``i`` (of four), each picture's pixels its own (a dot at
    ``i``), so that every stored image is a file of its own."""
    path = _square(folder / f"{i}.png", NAMES[i % 4], size)
    with PILImage.open(path) as image:
        image = image.copy()
    image.putpixel((1 + i % 20, 1), (i % 256, 0, 0))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _text(text: str) -> dict:
    return {"type": "text", "text": text, "index": None}


def _bare(index: int | None = None) -> dict:
    return {"type": "image", "text": None, "index": index}


def _chat(images: list, answer: str, parts: list[dict] | None = None) -> dict:
    """A TRL-layout chat: the user's image parts (bare, one per image, unless ``parts`` says) and question, the
    answer, and the images themselves (``{"bytes", "path"}``, as a dataset stores them)."""
    user = [*(parts if parts is not None else [_bare() for _ in images]), _text(QUESTION)]
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": [_text(answer)]}],
            "images": [{"bytes": raw, "path": None} for raw in images]}


def _columns(rows: list[dict]) -> dict[str, list]:
    return {name: [row[name] for row in rows] for name in rows[0]}


def _parquet(path: Path, rows: list[dict], features: Features = CHAT) -> Path:
    """``rows`` written as a hub dataset's parquet file is: ``datasets`` writes the Image feature in its metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(_columns(rows), features=features).to_parquet(str(path))
    return path


def _normalized(path: Path, fmt: str = "chat", on_bad_row: str = "error", report: BadRows | None = None,
                stored: Path | None = None, images: bool = True):
    source = DataSource(path=str(path), format=fmt)
    report = report if report is not None else BadRows()
    raw = read_source(source, seed=0, on_bad_row=on_bad_row, report=report, key="data.train.0")
    return normalize(raw, source, key="data.train.0", on_bad_row=on_bad_row, report=report, images=images,
                     stored=stored)


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _recipe(tmp_path: Path, model: Path, method: str, train: Path, fmt: str, name: str = "run", **data_changes) -> Path:
    recipe = {"method": method, "model": {"name": str(model), "init": "random"},
              "data": {"train": [{"path": str(train), "format": fmt}], "max_length": 64, **data_changes},
              "optimizer": {"lr": 1e-2},
              "train": {"output_dir": str(tmp_path / name), "max_steps": 2, "per_device_train_batch_size": 4,
                        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _train(path: Path) -> list[dict]:
    """``ft train``'s run (in this process), its log history."""
    result = ft.run.train.train(load_recipe(path), resume="never", say=lambda _: None)
    assert result.summary["status"] == "completed", result.summary
    return json.loads((Path(load_recipe(path).recipe.train_args["output_dir"]) / "log_history.json").read_text())


def _prepare(path: Path, said: list | None = None):
    recipe = load_recipe(path).recipe
    processor = loading.load_processing_class(recipe.model)
    say = said.append if said is not None else (lambda _: None)
    return data.prepare_data(recipe, processor, data.chat_template_for(recipe, processor), say)


# --- SFT -------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sft_trains_on_a_parquet_in_trls_layout_with_the_stored_images_pixels(tmp_path, tiny_llava):
    """The rows name files (in datasets' cache, no data.prepared_path), each the stored bytes as they were; the
    collator's pixel values for a row are the processor's for the stored image; two steps train."""
    pictures = [_png(tmp_path / "pics", i) for i in range(8)]
    train = _parquet(tmp_path / "data" / "train.parquet",
                     [_chat([raw], NAMES[i % 4].capitalize()) for i, raw in enumerate(pictures)])
    path = _recipe(tmp_path, tiny_llava, "sft", train, "chat")
    trainer, _ = built_trainer(path)
    rows = trainer.train_dataset
    store = stored_images_folder(None)
    for row, raw in zip(rows, pictures, strict=True):  # a reference per image, never pixels
        (ref,) = row["images"]
        assert ref == str((store / _digest(raw)[:2] / f"{_digest(raw)}.png").resolve())
        assert Path(ref).read_bytes() == raw
    processor = AutoProcessor.from_pretrained(tiny_llava)
    batch = trainer.data_collator([rows[i] for i in range(2)])
    stored = [PILImage.open(io.BytesIO(raw)).convert("RGB") for raw in pictures[:2]]
    own = processor.image_processor(stored, return_tensors="pt")["pixel_values"]
    assert batch["pixel_values"].shape == (2, 3, 16, 16)
    assert np.allclose(batch["pixel_values"].numpy(), own.numpy())
    assert not np.allclose(batch["pixel_values"][0].numpy(), batch["pixel_values"][1].numpy())  # red, then green
    assert (batch["input_ids"] == processor.image_token_id).sum(1).tolist() == [4, 4]
    log = _train(path)
    losses = [entry["loss"] for entry in log if "loss" in entry]
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_index_parts_take_the_images_they_name_and_a_saved_dataset_reads_the_same(tmp_path):
    """``{"type": "image", "index": k}`` takes image k, whatever the order; the same rows in a ``save_to_disk``
    folder (what a hub dataset is once downloaded) and with the images as raw bytes give the same canonical rows;
    each distinct image is one file, written once however many rows hold it."""
    red, blue = _png(tmp_path / "pics", 0), _png(tmp_path / "pics", 2)
    swapped = _chat([red, blue], "Blue, then red", parts=[_bare(1), _text("and"), _bare(0)])
    again = _chat([red], "Red")
    store = tmp_path / "store"
    rows = _normalized(_parquet(tmp_path / "data" / "index.parquet", [swapped, again]), stored=store)
    red_file, blue_file = (str((store / _digest(raw)[:2] / f"{_digest(raw)}.png").resolve()) for raw in (red, blue))
    assert rows[0]["images"] == [blue_file, red_file] and rows[1]["images"] == [red_file]
    assert rows[0]["messages"][0]["content"] == [{"type": "image", "text": None}, {"type": "text", "text": "and"},
                                                 {"type": "image", "text": None}, {"type": "text", "text": QUESTION}]
    assert sorted(p.name for p in store.rglob("*") if p.is_file()) == sorted(Path(f).name for f in (red_file,
                                                                                                    blue_file))
    saved = tmp_path / "data" / "saved"
    datasets.Dataset.from_dict(_columns([swapped, again]), features=CHAT).save_to_disk(str(saved))
    assert _normalized(saved, stored=store).remove_columns("__ft_row").to_list() == \
        rows.remove_columns("__ft_row").to_list()
    raw_bytes = Features({**CHAT, "images": List(Value("binary"))})
    as_bytes = [{**row, "images": [image["bytes"] for image in row["images"]]} for row in (swapped, again)]
    datasets.Dataset.from_dict(_columns(as_bytes), features=raw_bytes).save_to_disk(str(tmp_path / "data" / "bytes"))
    assert _normalized(tmp_path / "data" / "bytes", stored=store)["images"] == rows["images"]


def test_a_pil_image_or_a_path_alone_is_read_and_a_store_that_cannot_be_written_is_named(tmp_path):
    """A PIL image (what ``datasets`` hands out for an Image feature it decodes) is written as ``datasets.Image``
    encodes it, and reads back with the same pixels; an Image value that holds a path and no bytes is a path, read
    from the data's folder; a folder the images cannot be written to stops, naming it and how to move it."""
    picture = PILImage.new("RGB", (10, 6), (200, 30, 40))
    ref = ImageSource(None).take(picture, "images[0]")
    assert ref.endswith(".png") and Path(ref).parent.parent == stored_images_folder(None).resolve()
    assert np.array_equal(np.asarray(load_image(ref, None)), np.asarray(picture))
    red = _square(tmp_path / "pics" / "red.png", "red")
    assert ImageSource(tmp_path).take({"bytes": None, "path": "pics/red.png"}, "images[0]") == str(red)
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(DataError, match=r"^could not write the image stored in a row \(images\[0\]\) to "
                       rf"{tmp_path / 'taken'}/\w\w \(Not a directory\): .* data.prepared_path .* HF_DATASETS_CACHE"):
        ImageSource(tmp_path, store=tmp_path / "taken").take(red.read_bytes(), "images[0]")


def test_a_count_mismatch_and_bytes_that_are_no_image_are_bad_rows_named_by_row(tmp_path):
    """Two image parts for one image, an index past the list, an image no part takes, and stored bytes that do not
    decode: each is a bad row named by the file's row and the part or image, and the undecodable bytes are never
    written; under ``on_bad_row: skip`` they are dropped and counted."""
    red = _png(tmp_path / "pics", 0)
    good = _chat([red], "Red")
    two_places = _chat([red], "Red", parts=[_bare(), _bare()])
    past = _chat([red], "Red", parts=[_bare(1)])
    unplaced = _chat([red, red], "Red", parts=[_bare(0), _bare(0)])
    broken = _chat([b"not an image at all"], "Red")
    path = _parquet(tmp_path / "data" / "bad.parquet", [good, two_places, past, unplaced, broken])
    store = tmp_path / "store"
    with pytest.raises(DataError) as caught:
        _normalized(path, stored=store)
    message = str(caught.value)
    assert message.startswith(f"data.train.0: 4 bad rows in {path} (format `chat`):")
    assert (f'{path}:row 2: images: the messages hold 2 image parts without an image of their own ({{"type": '
            '"image"}) and `images` lists 1 image; each image needs one place where it goes in the messages')\
        in message
    assert (f"{path}:row 3: messages[0].content[0].index: the image part names index 1, and `images` lists 1 image "
            "(indices from 0) (image_count)") in message
    assert (f"{path}:row 4: images: no image place in the messages takes `images[1]` (by their position or `index`, "
            "the places take [0, 0]); each image goes in exactly one place (image_count)") in message
    assert (f"{path}:row 5: images[0]: the image stored in the row (19 bytes) cannot be read as an image (cannot "
            "identify image file") in message and message.count("(image_unreadable)") == 1
    assert "data.on_bad_row: skip" in message
    report = BadRows()
    kept = _normalized(path, on_bad_row="skip", report=report, stored=store)
    assert len(kept) == 1 and kept[0]["__ft_row"] == 0
    assert report.as_dict() == {"data.train.0": {"image_count": 3, "image_unreadable": 1}}
    assert [p.name for p in store.rglob("*") if p.is_file()] == [f"{_digest(red)}.png"]


def test_a_bare_image_part_without_images_and_stored_images_for_a_text_model_are_bad_rows(tmp_path):
    red = _png(tmp_path / "pics", 0)
    path = _parquet(tmp_path / "data" / "rows.parquet", [_chat([red], "Red")])
    with pytest.raises(DataError, match=r"rows.parquet:row 1: messages\[0\].content\[0\]: an 'image' part: images "
                       r"need a vision-language model, and this run trains on text .*\(image_content\)"):
        _normalized(path, images=False)
    bare = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
                         {"role": "assistant", "content": "Red"}]}
    jsonl = tmp_path / "data" / "bare.jsonl"
    jsonl.write_text(json.dumps(bare) + "\n")
    with pytest.raises(DataError, match=r"bare.jsonl:1: messages\[0\].content\[0\]: an image part without its image "
                       r"\(a path or URL under 'image', 'path' or 'url'\), in a row with no `images` column of images "
                       r"to take it from \(missing_field\)"):
        _normalized(jsonl, stored=tmp_path / "store")


# --- DPO -------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_dpo_reads_stored_prompt_images(tmp_path, tiny_llava):
    """A preference dataset in TRL's layout (HuggingFaceH4/rlaif-v_formatted's: a prompt whose image part is bare,
    answers of text parts, an ``images`` column): the trainer's rows keep the stored images' files and yield their
    pixels, TRL's collator puts them in the batch, and two steps train."""
    pictures = [_png(tmp_path / "pics", i) for i in range(8)]
    rows = [{"prompt": [{"role": "user", "content": [_bare(), _text(QUESTION)]}],
             "chosen": [{"role": "assistant", "content": [_text(NAMES[i % 4].capitalize())]}],
             "rejected": [{"role": "assistant", "content": [_text(NAMES[(i + 1) % 4].capitalize())]}],
             "images": [{"bytes": raw, "path": None}]} for i, raw in enumerate(pictures)]
    path = _recipe(tmp_path, tiny_llava, "dpo", _parquet(tmp_path / "data" / "pairs.parquet", rows, PAIRS),
                   "preference", image={"size": [16, 16]})
    trainer, _ = built_trainer(path)
    (ref,) = trainer.train_dataset.with_format(None)[0]["images"]
    assert Path(ref).read_bytes() == pictures[0]  # a file holding the stored bytes, not pixels
    row = trainer.train_dataset[0]
    stored = PILImage.open(io.BytesIO(pictures[0])).convert("RGB").resize((16, 16), PILImage.Resampling.BICUBIC)
    assert np.array_equal(np.asarray(row["images"][0]), np.asarray(stored))
    processor = AutoProcessor.from_pretrained(tiny_llava)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    own = processor.image_processor([stored], return_tensors="pt")["pixel_values"][0]
    assert batch["pixel_values"].shape == (4, 3, 16, 16) and np.allclose(batch["pixel_values"][0].numpy(), own.numpy())
    log = _train(path)
    assert len([entry for entry in log if "loss" in entry]) == 2


# --- the prepared cache ----------------------------------------------------------------------------------------------


def test_the_prepared_cache_names_the_stored_images_files_beside_it_and_a_second_read_writes_none(tmp_path,
                                                                                                   tiny_llava):
    """With data.prepared_path the images are written beside it (``<prepared_path>.images``), even where the same
    rows were read before without it (into datasets' cache), and its rows hold their files' paths (strings, no
    pixels); reusing the cache, and rebuilding it from the parquet file, write no image again."""
    pictures = [_png(tmp_path / "pics", i) for i in range(4)]
    train = _parquet(tmp_path / "data" / "train.parquet",
                     [_chat([raw], NAMES[i % 4].capitalize()) for i, raw in enumerate(pictures)])
    in_memory = _prepare(_recipe(tmp_path, tiny_llava, "sft", train, "chat", name="in-memory"))
    assert all(Path(ref).is_relative_to(stored_images_folder(None).resolve()) for (ref,) in in_memory.train["images"])
    prepared_path = tmp_path / "prepared"
    path = _recipe(tmp_path, tiny_llava, "sft", train, "chat", prepared_path=str(prepared_path))
    built = _prepare(path)
    folder = tmp_path / "prepared.images"
    expected = [[str((folder / _digest(raw)[:2] / f"{_digest(raw)}.png").resolve())] for raw in pictures]
    assert built.stats["prepared"] == f"built {prepared_path}" and built.train["images"] == expected
    assert built.train.features["images"].feature == Value("string")
    written = {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in folder.rglob("*.png")}
    assert len(written) == 4
    reused = _prepare(path)
    assert reused.stats["prepared"] == f"reused {prepared_path}" and reused.train["images"] == expected
    resized = _recipe(tmp_path, tiny_llava, "sft", train, "chat", prepared_path=str(prepared_path),
                      image={"size": [16, 16]})
    said: list[str] = []
    rebuilt = _prepare(resized, said)
    assert any("stale (changed: data settings)" in line for line in said)
    assert rebuilt.stats["prepared"] == f"rebuilt {prepared_path}" and rebuilt.train["images"] == expected
    assert {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in folder.rglob("*.png")} == written
    assert not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]
