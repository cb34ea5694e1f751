"""Fine-tuning a vision-language model on chats with images, offline: rows with image parts (or LLaMA-Factory's
``images`` column) read for a vision model with their images checked, the masks of two families checked token by token
against their processors' own tokens, the placeholder and truncation checks, and ``ft train`` of a tiny random LLaVA
on coloured squares. Real transformers processors and models, built here from the shipped tiny tokenizer."""

from __future__ import annotations

import base64
import importlib.resources
import io
import json
import re
from pathlib import Path

import pytest
import transformers
from conftest import ASSETS, run_ft
from PIL import Image, ImageDraw
from transformers import AutoProcessor, AutoTokenizer

from ft import data
from ft.data.formats import normalize
from ft.data.images import ImageBatches, ImageChanged, ImageTokens, image_size, load_image
from ft.data.labels import IGNORE_INDEX
from ft.data.rows import BadRows, DataError
from ft.data.sources import read_source
from ft.data.tokenize import TokenizeSettings, tokenize_arrays
from ft.model import loading
from ft.recipe import RecipeError, load_recipe
from ft.recipe.data_section import DataSource, ImageSettings
from ft.recipe.methods import METHODS
from ft.recipe.rules import check_modality

# the chat template of Qwen2-VL's kind (ChatML, an image part written as the image token), with `<image>` as LLaVA's
CHATML_IMAGES = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# SmolVLM's own template (Idefics3): no end-of-turn token of ChatML's, no {% generation %} markers
SMOLVLM = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230), "yellow": (240, 220, 40)}


def _tokenizer(*tokens: str):
    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    return tokenizer


def build_tiny_llava(folder: Path, chat_template: str | None = CHATML_IMAGES) -> Path:
    """A tiny random LLaVA's folder: config and processor (the shipped tiny tokenizer plus `<image>`, CLIP's image
    processor at 16x16, 4 tokens an image) with ``chat_template`` (one that takes image parts by default). What a
    vision-language model on the hub holds, less the weights; the vision tests build theirs here."""
    tokenizer = _tokenizer("<image>")
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8,
                                chat_template=chat_template).save_pretrained(folder)
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=16, patch_size=8)
    text = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2, vocab_size=len(tokenizer))
    transformers.LlavaConfig(vision_config=vision, text_config=text,
                             image_token_index=tokenizer.convert_tokens_to_ids("<image>")).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="module")
def tiny_smolvlm(tmp_path_factory) -> Path:
    """A tiny Idefics3 (SmolVLM) processor: images split into tiles, each tile and a global view written with their
    row/column tokens, so an image's token count depends on its size; SmolVLM's own chat template."""
    folder = tmp_path_factory.mktemp("tiny-smolvlm")
    tokenizer = _tokenizer("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>")
    image_processor = transformers.Idefics3ImageProcessor(size={"longest_edge": 32},
                                                          max_image_size={"longest_edge": 16}, do_image_splitting=True)
    transformers.Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                                   chat_template=SMOLVLM).save_pretrained(folder)
    return folder


def _square(path: Path, colour: str, size: tuple[int, int] = (24, 24)) -> Path:
    """A white picture with a coloured square in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(image).rectangle([4, 4, size[0] - 5, size[1] - 5], fill=COLOURS[colour])
    image.save(path)
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _asked(image: str, colour: str) -> dict:
    """One question about one picture, in OpenAI-style content parts (the image's path relative to the data file)."""
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                      {"type": "text", "text": "What colour is the square?"}]},
                         {"role": "assistant", "content": colour.capitalize()}]}


def _canonical(path: Path, images: bool = True, on_bad_row: str = "error", report: BadRows | None = None, **source):
    source = DataSource(path=str(path), format="chat", **source)
    report = report if report is not None else BadRows()
    raw = read_source(source, seed=0, on_bad_row=on_bad_row, report=report, key="data.train.0")
    return normalize(raw, source, key="data.train.0", on_bad_row=on_bad_row, report=report, images=images)


# --- 1. rows with images, for a vision model ------------------------------------------------------------------------


def test_image_parts_and_the_images_column_give_the_same_rows_with_paths_read_from_the_data_file(tmp_path):
    """The data sits in a folder of its own, its images beside it: each path is read relative to the data file, not
    to the recipe or the working directory; OpenAI's parts and LLaMA-Factory's ShareGPT layout (``images`` and
    ``<image>`` placeholders, mapped with ``fields:``) become the same canonical rows."""
    pics = tmp_path / "set" / "pics"
    red, blue = _square(pics / "red.png", "red"), _square(pics / "b.png", "blue")
    parts = _jsonl(tmp_path / "set" / "parts.jsonl", [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Compare "},
                                                   {"type": "image", "image": "pics/red.png"},
                                                   {"type": "text", "text": " and "},
                                                   {"type": "image_url", "image_url": {"url": "pics/b.png"}}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Red, then blue."}]}]}])
    sharegpt = _jsonl(tmp_path / "set" / "sharegpt.jsonl", [
        {"conversations": [{"from": "human", "value": "Compare <image> and <image>"},
                           {"from": "gpt", "value": "Red, then blue."}],
         "pictures": ["pics/red.png", str(blue)]}])
    from_parts = _canonical(parts)[0]
    from_sharegpt = _canonical(sharegpt, fields={"messages": "conversations", "role": "from", "content": "value",
                                                 "images": "pictures"}, roles={"human": "user", "gpt": "assistant"})[0]
    image, text = {"type": "image", "text": None}, (lambda t: {"type": "text", "text": t})
    expected = [{"role": "user", "content": [text("Compare "), image, text(" and "), image]},
                {"role": "assistant", "content": [text("Red, then blue.")]}]
    assert from_parts["messages"] == expected and from_sharegpt["messages"] == expected
    assert from_parts["images"] == from_sharegpt["images"] == [str(red), str(blue)]
    # an instruction row holds no images, and is laid out as the chats are, so the two formats mix
    written = _jsonl(tmp_path / "set" / "instr.jsonl", [{"instruction": "Say red", "output": "Red"}])
    source = DataSource(path=str(written), format="instruction")
    instruction = normalize(read_source(source, seed=0, on_bad_row="error", report=BadRows(), key="k"), source,
                            key="k", on_bad_row="error", report=BadRows(), images=True)
    assert instruction[0]["messages"] == [{"role": "user", "content": [text("Say red")]},
                                          {"role": "assistant", "content": [text("Red")]}]
    assert instruction[0]["images"] == [] and instruction.features == _canonical(parts).features


def test_a_data_uri_image_is_read_where_it_is_written(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), COLOURS["green"]).save(buffer, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    path = _jsonl(tmp_path / "uri.jsonl", [_asked(uri, "green")])
    assert _canonical(path)[0]["images"] == [uri]
    assert image_size(uri, None) == (8, 8)


def test_an_image_url_is_fetched_to_be_checked_and_kept_as_a_url(tmp_path):
    """A URL is read where it points (here a server on this machine): kept in the row as written, fetched again for
    each batch; one that answers 404 is a bad row like a missing file."""
    import functools
    import http.server
    import threading

    _square(tmp_path / "www" / "red.png", "red")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "www"))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        path = _jsonl(tmp_path / "rows.jsonl", [_asked(f"{base}/red.png", "red"), _asked(f"{base}/gone.png", "red")])
        report = BadRows()
        kept = _canonical(path, on_bad_row="skip", report=report)
        assert kept["images"] == [[f"{base}/red.png"]] and report.as_dict() == {"data.train.0": {"image_unreadable": 1}}
        assert image_size(f"{base}/red.png", None) == (24, 24) and load_image(f"{base}/red.png", None).size == (24, 24)
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_or_unreadable_image_is_a_bad_row_named_by_file_and_line(tmp_path):
    _square(tmp_path / "red.png", "red")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    path = _jsonl(tmp_path / "rows.jsonl", [
        _asked("red.png", "red"),
        _asked("gone.png", "red"),
        {"messages": [{"role": "user", "content": "<image>What colour is the square?"},
                      {"role": "assistant", "content": "Red"}], "images": ["broken.png"]},
        {"messages": [{"role": "user", "content": "<image><image>Which?"}, {"role": "assistant", "content": "Red"}],
         "images": ["red.png"]},
    ])
    with pytest.raises(DataError) as caught:
        _canonical(path)
    message = str(caught.value)
    assert message.startswith(f"data.train.0: 3 bad rows in {path}")
    assert f"{path}:2: messages[0].content[0]: 'gone.png' does not exist (read as {tmp_path / 'gone.png'}" in message
    assert f"{path}:3: images[0]: 'broken.png' cannot be read as an image" in message
    assert "(image_unreadable)" in message
    assert (f"{path}:4: images: the messages hold 2 <image> placeholders and `images` lists 1 image" in message
            and "(image_count)" in message)
    report = BadRows()
    kept = _canonical(path, on_bad_row="skip", report=report)
    assert len(kept) == 1 and kept[0]["images"] == [str(tmp_path / "red.png")]
    assert report.as_dict() == {"data.train.0": {"image_missing": 1, "image_unreadable": 1, "image_count": 1}}


def test_a_text_model_still_refuses_images_in_either_layout(tmp_path):
    _square(tmp_path / "red.png", "red")
    path = _jsonl(tmp_path / "rows.jsonl", [
        _asked("red.png", "red"),
        {"messages": [{"role": "user", "content": "<image>Which?"}, {"role": "assistant", "content": "Red"}],
         "images": ["red.png"]}])
    with pytest.raises(DataError) as caught:
        _canonical(path, images=False)
    message = str(caught.value)
    assert f"{path}:1: messages[0].content[0]: an 'image' part: images need a vision-language model" in message
    assert f"{path}:2: images: the row lists images under `images`: images need a vision-language model" in message


# --- 2. tokens and masks --------------------------------------------------------------------------------------------


def _tokenized(processor, rows: list[tuple[list, list[str]]], template: str, **settings):
    kw = {"max_length": 10_000, "truncation": "truncate", "train_on": "assistant", **settings}
    tokens = ImageTokens(processor, None)
    batch = {"messages": [messages for messages, _ in rows], "images": [paths for _, paths in rows]}
    return tokenize_arrays(batch, processor.tokenizer, TokenizeSettings(template=template, parts=True, **kw), tokens)


def _parts(*items):
    return [{"type": "image", "text": None} if item is None else {"type": "text", "text": item} for item in items]


def _two_turns(first: str, second: str) -> list[dict]:
    return [{"role": "system", "content": _parts("Answer with a colour.")},
            {"role": "user", "content": _parts(None, "What colour is the square?")},
            {"role": "assistant", "content": _parts(first)},
            {"role": "user", "content": _parts("And here?", None)},
            {"role": "assistant", "content": _parts(second)}]


def _between(ids: list[int], opener: list[int], closer: int) -> list[int]:
    """Labels as a hand-written ChatML mask would give them: the tokens after each ``opener`` (the assistant header)
    up to and including ``closer`` (its end-of-turn), the rest -100."""
    labels, i = [IGNORE_INDEX] * len(ids), 0
    while i < len(ids):
        if ids[i:i + len(opener)] == opener:
            i += len(opener)
            while i < len(ids):
                labels[i] = ids[i]
                i += 1
                if ids[i - 1] == closer:
                    break
        else:
            i += 1
    return labels


def test_llava_masks_token_by_token_answers_and_their_end_of_turn_only(tmp_path, tiny_llava):
    """The row's ids are the processor's own (the chat rendered, each `<image>` expanded by LlavaProcessor); the
    loss falls on each answer and its `<|im_end|>`, never on the system prompt, the questions, the image tokens or
    the headers; with `train_on: all` every text token trains and still no image token does."""
    processor = AutoProcessor.from_pretrained(tiny_llava)
    paths = [str(_square(tmp_path / "r.png", "red")), str(_square(tmp_path / "b.png", "blue", (40, 24)))]
    messages = _two_turns("Red", "Blue, I think.")
    out = _tokenized(processor, [(messages, paths)], CHATML_IMAGES)
    tokenizer = processor.tokenizer
    text = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=CHATML_IMAGES)
    own = processor(text=text, images=[Image.open(p) for p in paths], add_special_tokens=False)["input_ids"][0]
    ids, labels = out["input_ids"][0].tolist(), out["labels"][0].tolist()
    assert ids == own and ids.count(processor.image_token_id) == 8  # two images, 4 tokens each
    opener = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert labels == _between(ids, opener, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert tokenizer.decode([t for t in labels if t != IGNORE_INDEX]) == "Red<|im_end|>Blue, I think.<|im_end|>"
    assert out["ft_turns"] == [2] and out["ft_turns_stopped"] == [2] and out["images"] == [paths]

    every = _tokenized(processor, [(messages, paths)], CHATML_IMAGES, train_on="all")
    expected = [IGNORE_INDEX if token == processor.image_token_id else token for token in ids]
    assert every["input_ids"][0].tolist() == ids and every["labels"][0].tolist() == expected


def test_smolvlm_masks_token_by_token_with_its_own_template_and_tiled_images(tmp_path, tiny_smolvlm):
    """Idefics3 writes an image as tiles with row/column tokens, as many as its size asks: the same mask method
    (the answer located in the rendered text, the end-of-turn after it) gives the answers and `<end_of_utterance>`,
    and every token of both images' expansions is untrained."""
    processor = AutoProcessor.from_pretrained(tiny_smolvlm)
    paths = [str(_square(tmp_path / "g.png", "green", (60, 40))), str(_square(tmp_path / "y.png", "yellow", (16, 48)))]
    messages = _two_turns(" Green", "Yellow")
    out = _tokenized(processor, [(messages, paths)], SMOLVLM)
    tokenizer = processor.tokenizer
    text = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=SMOLVLM)
    own = processor(text=text, images=[[Image.open(p) for p in paths]], add_special_tokens=False)["input_ids"][0]
    ids, labels = out["input_ids"][0].tolist(), out["labels"][0].tolist()
    assert ids == own
    sizes = [len(ImageTokens(processor, None).of(p)) for p in paths]
    assert sizes[0] > sizes[1] > 1  # the larger image is split into more tiles
    opener = tokenizer("\nAssistant: ", add_special_tokens=False)["input_ids"]
    # " Green": its own leading space trains, the template's before it does not (the header is "Assistant: ")
    assert labels == _between(ids, opener, tokenizer.convert_tokens_to_ids("<end_of_utterance>"))
    trained = tokenizer.decode([t for t in labels if t != IGNORE_INDEX])
    assert trained == " Green<end_of_utterance>Yellow<end_of_utterance>"
    image_like = {tokenizer.convert_tokens_to_ids(t) for t in ("<image>", "<fake_token_around_image>", "<global-img>")}
    assert not image_like & {t for t in labels if t != IGNORE_INDEX}


def test_gemma3_masks_token_by_token_with_its_own_template(tmp_path):
    """Gemma 3's own template (the shipped tiny Gemma 3 processor holds it: a system prompt folded into the first user
    turn, `model` as the assistant's role, contents trimmed) and its processor, which writes an image as
    `<start_of_image>`, its soft tokens and `<end_of_image>` between blank lines: the answers and their `<end_of_turn>`
    train, no image token and nothing of the prompt does."""
    processor = AutoProcessor.from_pretrained(Path(str(importlib.resources.files("ft.smoke") / "assets" /
                                                       "tiny-gemma3")))
    template = processor.chat_template
    paths = [str(_square(tmp_path / "r.png", "red")), str(_square(tmp_path / "b.png", "blue", (40, 24)))]
    messages = _two_turns("Red", "Blue, I think.")
    out = _tokenized(processor, [(messages, paths)], template)
    tokenizer = processor.tokenizer
    text = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template)
    own = processor(text=text, images=[[Image.open(p) for p in paths]], add_special_tokens=False)["input_ids"][0]
    ids, labels = out["input_ids"][0].tolist(), out["labels"][0].tolist()
    soft = tokenizer.convert_tokens_to_ids("<image_soft_token>")  # what the model puts an image's features on
    assert ids == own and ids.count(processor.image_token_id) == 2 and ids.count(soft) == 2 * processor.image_seq_length
    opener = tokenizer("<start_of_turn>model\n", add_special_tokens=False)["input_ids"]
    assert labels == _between(ids, opener, tokenizer.convert_tokens_to_ids("<end_of_turn>"))
    assert tokenizer.decode([t for t in labels if t != IGNORE_INDEX]) == "Red<end_of_turn>Blue, I think.<end_of_turn>"
    image_like = {tokenizer.convert_tokens_to_ids(t) for t in ("<start_of_image>", "<end_of_image>")} | {soft}
    assert not image_like & {t for t in labels if t != IGNORE_INDEX}


# --- 3. the checks before training ----------------------------------------------------------------------------------


def _vision_recipe(tmp_path, write_recipe, model: Path, train: list[dict], **data_changes) -> Path:
    recipe = {"method": "sft", "model": {"name": str(model), "init": "random"},
              "data": {"train": [{"path": str(_jsonl(tmp_path / "data" / "train.jsonl", train)), "format": "chat"}],
                       "max_length": 64, **data_changes},
              "optimizer": {"lr": 1e-2},
              "train": {"output_dir": str(tmp_path / "out"), "max_steps": 2, "per_device_train_batch_size": 4,
                        "save_strategy": "no", "report_to": "none"}}
    return write_recipe(recipe)


def _prepare(path: Path, said: list | None = None):
    recipe = load_recipe(path).recipe
    processor = loading.load_processing_class(recipe.model)
    say = said.append if said is not None else (lambda _: None)
    return data.prepare_data(recipe, processor, data.chat_template_for(recipe, processor), say)


def _squares(folder: Path, count: int) -> list[dict]:
    names = list(COLOURS)
    return [_asked(_square(folder / "images" / f"{i}.png", names[i % 4]).relative_to(folder).as_posix(), names[i % 4])
            for i in range(count)]


def test_a_row_whose_placeholders_and_images_disagree_is_named_or_skipped(tmp_path, write_recipe, tiny_llava):
    """A literal `<image>` in a row's text is one more image token than the row has images, once rendered: the row is
    listed by file and line, or dropped and counted under `on_bad_row: skip`."""
    rows = _squares(tmp_path / "data", 3)
    rows[1]["messages"][0]["content"][1]["text"] = "What colour is the square in <image>?"
    path = _vision_recipe(tmp_path, write_recipe, tiny_llava, rows)
    with pytest.raises(DataError) as caught:
        _prepare(path)
    message = str(caught.value)
    assert message.startswith("data.train: 1 row whose image placeholders and images disagree")
    assert (f"{tmp_path / 'data' / 'train.jsonl'}:2: the rendered chat holds 2 image placeholders ('<image>') for 1 "
            "image (image_count)") in message
    said = []
    prepared = _prepare(_vision_recipe(tmp_path, write_recipe, tiny_llava, rows, on_bad_row="skip"), said)
    assert len(prepared.train) == 2 and prepared.stats["skipped_rows"] == {"data.train.0": {"image_count": 1}}
    assert any("skipped 1 rows whose image placeholders and images disagree" in line for line in said)


def test_max_length_never_cuts_inside_an_image(tmp_path, write_recipe, tiny_llava):
    """`truncate` refuses a row cut inside an image's tokens (naming it); `drop` drops it, counted; a cut after an
    image keeps it, and an image wholly past the cut leaves the row with its tokens."""
    rows = _squares(tmp_path / "data", 2)
    # the second row's image sits after a long question, far past the first row's end
    rows[1]["messages"][0]["content"].reverse()
    rows[1]["messages"][0]["content"][0]["text"] = "Look closely, then tell me: what colour is the square? " * 2
    whole = _prepare(_vision_recipe(tmp_path, write_recipe, tiny_llava, rows, max_length=512))
    ids = whole.train[1]["input_ids"]
    assert len(whole.train[0]["input_ids"]) < 40
    start = ids.index(AutoProcessor.from_pretrained(tiny_llava).image_token_id)
    inside = start + 2  # a max_length that ends two tokens into the image
    with pytest.raises(DataError) as caught:
        _prepare(_vision_recipe(tmp_path, write_recipe, tiny_llava, rows, max_length=inside))
    message = str(caught.value)
    assert message.startswith("data.max_length: 1 train row would be cut inside an image's tokens")
    assert f"{tmp_path / 'data' / 'train.jsonl'}:2 ({len(ids)} tokens, data.max_length {inside})" in message
    dropped = _prepare(_vision_recipe(tmp_path, write_recipe, tiny_llava, rows, max_length=inside, truncation="drop"))
    assert len(dropped.train) == 1 and dropped.stats["train_rows_dropped_as_too_long"] == 1
    # a cut right before the image: the image and its tokens leave the row together (and the answer with them)
    before = _prepare(_vision_recipe(tmp_path, write_recipe, tiny_llava, rows, max_length=start))
    assert before.stats["train_rows_dropped_with_no_trained_tokens"] == 1 and len(before.train) == 1


def test_the_prepared_cache_holds_image_paths_and_goes_stale_with_the_image_settings(tmp_path, write_recipe,
                                                                                     tiny_llava):
    rows = _squares(tmp_path / "data", 4)
    prepared_path = tmp_path / "prepared"
    path = _vision_recipe(tmp_path, write_recipe, tiny_llava, rows, prepared_path=str(prepared_path))
    built, said = _prepare(path), []
    assert built.stats["prepared"] == f"built {prepared_path}"
    reused = _prepare(path, said)
    assert reused.stats["prepared"] == f"reused {prepared_path}"
    assert reused.train["images"] == built.train["images"] == [[str(tmp_path / "data" / "images" / f"{i}.png")]
                                                               for i in range(4)]
    assert reused.train["input_ids"] == built.train["input_ids"]
    resized = _vision_recipe(tmp_path, write_recipe, tiny_llava, rows, prepared_path=str(prepared_path),
                             image={"max_pixels": 100})
    _prepare(resized, said)
    assert any("stale (changed: data settings)" in line for line in said)


def test_a_template_that_cannot_write_image_parts_is_refused_by_its_key(tmp_path, write_recipe, tiny_llava):
    path = _vision_recipe(tmp_path, write_recipe, tiny_llava, _squares(tmp_path / "data", 2), chat_template="chatml")
    with pytest.raises(DataError, match=r"data.chat_template: the chat template fails on a message whose content is a "
                       r"list of parts .* Unset data.chat_template to use the model's own template"):
        _prepare(path)


def test_an_image_past_the_cut_leaves_with_its_tokens(tmp_path, tiny_llava):
    """Two images, the second wholly past max_length: the row keeps the first image alone, as its tokens do."""
    processor = AutoProcessor.from_pretrained(tiny_llava)
    paths = [str(_square(tmp_path / "r.png", "red")), str(_square(tmp_path / "b.png", "blue"))]
    messages = _two_turns("Red", "Blue")
    whole = _tokenized(processor, [(messages, paths)], CHATML_IMAGES)["input_ids"][0].tolist()
    second = len(whole) - 1 - whole[::-1].index(processor.image_token_id) - 3  # where the second image's tokens start
    out = _tokenized(processor, [(messages, paths)], CHATML_IMAGES, max_length=second)
    assert out["images"] == [paths[:1]] and out["ft_cut_image"] == [False] and out["ft_truncated"] == [True]
    assert out["input_ids"][0].tolist() == whole[:second]
    cut = _tokenized(processor, [(messages, paths)], CHATML_IMAGES, max_length=second + 1)
    assert cut["ft_cut_image"] == [True]


def test_packing_streaming_exact_match_and_other_methods_are_refused_for_a_vision_model(tmp_path, write_recipe,
                                                                                        tiny_llava):
    path = _vision_recipe(tmp_path, write_recipe, tiny_llava, _squares(tmp_path / "data", 2), packing=True)
    with pytest.raises(RecipeError) as caught:
        _prepare(path)
    assert [problem.path for problem in caught.value.problems] == ["data.packing"]
    assert "cannot be packed" in caught.value.problems[0].message
    recipe = load_recipe(path).recipe
    assert check_modality(recipe, "text") == []  # a text model packs as before

    def changed(**data_changes):
        return recipe.model_copy(update={"data": recipe.data.model_copy(update=data_changes)})

    assert check_modality(changed(packing=False), "vision") == []
    assert [p.path for p in check_modality(changed(packing=False, streaming=True), "vision")] == ["data.streaming"]
    assert [p.path for p in check_modality(recipe.model_copy(update={"method": "orpo"}), "vision")] == [
        "model.name", "data.packing"]


# --- 4. training --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ft_train_learns_the_colours_of_squares_and_final_holds_the_processor(tmp_path, write_recipe, tiny_llava):
    """The real CLI on a tiny random LLaVA: images read from disk a batch at a time, the loss falls, and final/ holds
    the model with its processor (image processor, tokenizer, template), loadable as one."""
    path = _vision_recipe(tmp_path, write_recipe, tiny_llava, _squares(tmp_path / "data", 32))
    text = path.read_text().replace("max_steps: 2", "max_steps: 24").replace("per_device_train_batch_size: 4",
                                                                           "per_device_train_batch_size: 8")
    path.write_text(text + "  logging_steps: 4\n")
    result = run_ft("train", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)  lr", result.stdout + result.stderr)]
    assert len(losses) == 6 and losses[-1] < losses[0] * 0.7, losses
    # each picture is 4 tokens of the image token (16x16 pixels in 8x8 patches), counted in the preflight and summary
    images = json.loads((tmp_path / "out" / "summary.json").read_text())["data"]["train_images"]
    rows = 32
    assert images["images"] == images["rows_with_images"] == rows and images["image_tokens"] == 4 * rows, images
    assert f"preflight: images: train: {rows} images in {rows} of {rows} rows, {4 * rows} image tokens" in result.stderr
    final = tmp_path / "out" / "final"
    processor = AutoProcessor.from_pretrained(final)
    assert isinstance(processor, transformers.LlavaProcessor) and processor.chat_template == CHATML_IMAGES
    model = transformers.AutoModelForImageTextToText.from_pretrained(final)
    assert type(model).__name__ == "LlavaForConditionalGeneration"


def test_ft_train_refuses_packing_at_the_recipe_line(tmp_path, write_recipe, tiny_llava):
    path = _vision_recipe(tmp_path, write_recipe, tiny_llava, _squares(tmp_path / "data", 2), packing=True)
    result = run_ft("train", str(path))
    assert result.returncode == 2
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("packing:"))
    assert f"{path}:{line}: data.packing: a vision-language model's rows cannot be packed" in result.stderr
    assert "cannot be packed" in result.stderr


def test_the_collator_reads_a_batch_of_images_and_stops_on_one_replaced_since(tmp_path, tiny_llava):
    processor = AutoProcessor.from_pretrained(tiny_llava)
    tokens = ImageTokens(processor, None)
    paths = [str(_square(tmp_path / "r.png", "red")), str(_square(tmp_path / "b.png", "blue"))]
    out = _tokenized(processor, [(_two_turns("Red", "Blue"), paths), (_two_turns("Blue", "Red")[:3], paths[1:])],
                     CHATML_IMAGES)
    rows = [{"input_ids": ids.tolist(), "labels": labels.tolist(), "images": images}
            for ids, labels, images in zip(out["input_ids"], out["labels"], out["images"], strict=True)]
    batch = ImageBatches(tokens, processor.tokenizer.pad_token_id)(rows)
    assert batch["pixel_values"].shape == (3, 3, 16, 16)
    assert batch["labels"][1, len(rows[1]["input_ids"]):].eq(IGNORE_INDEX).all()  # padding never trains
    assert batch["attention_mask"].sum().item() == sum(len(row["input_ids"]) for row in rows)
    model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.from_pretrained(tiny_llava))
    assert model(**batch).loss.isfinite()
    idefics = ImageTokens(transformers.Idefics3Processor(
        image_processor=transformers.Idefics3ImageProcessor(size={"longest_edge": 32},
                                                            max_image_size={"longest_edge": 16}),
        tokenizer=_tokenizer("<fake_token_around_image>", "<image>", "<global-img>"), image_seq_len=4), None)
    counted = [*rows[1]["input_ids"][:3], *idefics.of(paths[1]).tolist()]
    grown = {"input_ids": counted, "labels": [IGNORE_INDEX] * len(counted), "images": paths[1:]}
    _square(Path(paths[1]), "blue", (16, 48))  # replaced by a picture of another shape: fewer tiles than counted
    with pytest.raises(ImageChanged, match="image tokens now"):
        ImageBatches(idefics, 0)([grown])


def test_data_image_sizes_images_before_their_tokens_are_counted(tmp_path, tiny_smolvlm):
    """`max_pixels` scales a large image down with its aspect ratio kept, `size` resizes every image; the token count
    is the processor's for the image as resized (Idefics3 tiles by aspect ratio: 64x48 is 4 tiles, 16x48 two)."""
    processor = AutoProcessor.from_pretrained(tiny_smolvlm)
    big = str(_square(tmp_path / "big.png", "red", (64, 48)))
    assert image_size(big, None) == (64, 48) and image_size(big, ImageSettings(max_pixels=16 * 12)) == (16, 12)
    assert image_size(big, ImageSettings(max_pixels=64 * 48)) == (64, 48)
    tall = ImageSettings(size=[16, 48])
    assert image_size(big, tall) == (16, 48)
    assert len(ImageTokens(processor, tall).of(big)) < len(ImageTokens(processor, None).of(big))
    assert load_image(big, tall).size == (16, 48) and load_image(big, tall).mode == "RGB"


def test_the_method_table_and_the_model_class():
    assert METHODS["sft"].modalities == ("text", "vision")
    assert METHODS["sft"].model_class("vision") == "AutoModelForImageTextToText"
    assert [name for name, method in METHODS.items() if method.model_class("vision") is None] == ["orpo", "reward"]
