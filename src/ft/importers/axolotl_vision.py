"""Axolotl's multimodal keys → ft's vision-language settings: ``processor_type`` (the model reads images through a
processor: ``model.modality: vision``; a config whose rows hold audio is refused), ``image_size`` and
``image_resize_algorithm`` (``data.image``), ``freeze_mm_modules`` (``model.freeze``), and the keys Axolotl's vision
configs set so that its collator gets whole rows with their images (``skip_prepare_dataset``,
``remove_unused_columns``), which ft's own preparation of vision rows makes unneeded.

Axolotl names no modality: a ``processor_type`` says the model reads more than text, and its processor, model and
datasets say what (``AUDIO_SIGNS``). That is decided first (``modality_of``, before any key is mapped, as the method
is), because the data, packing, chat template and LoRA handlers map some keys differently for a vision model
(``Ctx.modality``).
"""

from __future__ import annotations

from typing import Any

from .axolotl_keys import Ctx, handles, number

# where a config says its rows hold audio (ft trains text and images): Axolotl key -> words (lower case) of an audio
# processor, model or dataset in its value; ``datasets``/``test_datasets``: each entry's ``path``
AUDIO_SIGNS: dict[str, tuple[str, ...]] = {
    "processor_type": ("audio", "speech", "voxtral", "whisper"),
    "base_model": ("audio", "speech", "voxtral", "whisper"),
    "datasets": ("audio",),
    "test_datasets": ("audio",),
}

# what ft does for a vision-language model where Axolotl needs a key (read by the other handlers)
LM_ONLY = ("ft puts a vision-language model's adapter on its language model only: all-linear and module names leave "
           "the vision tower and the projector out unless a name holds the part's module name "
           "(vision_model.…, multi_modal_projector.…), where Axolotl adapts every module they match, vision tower "
           "included; write one regular expression to choose exactly (docs/vision.md)")
NOT_PACKED = ("a vision-language model's rows are never packed in ft (packing joins token ids and would separate the "
              "images from their tokens; Axolotl does not pack them either)")
IMAGE_ROWS = ("a chat's images are read by path, URL or data: URI (OpenAI's image parts, or an `images` column "
              "filling <image> placeholders; a relative path from the data file's folder), or from the dataset "
              "itself in TRL's layout (bare image parts and an `images` column of Image values, as in "
              "HuggingFaceH4/llava-instruct-mix-vsft), written once to files as the rows are prepared "
              "(docs/vision.md)")
TEXT_TEMPLATES = ("ft's built-in chatml and llama3 take text only (they write no image token for an image part); "
                  "the recipe renders with the model's own template, from its processor")

# the model classes Axolotl loads a vision-language model as, which ft's AutoModelForImageTextToText picks itself
IMAGE_TEXT_CLASSES = ("AutoModelForImageTextToText", "AutoModelForVision2Seq")
FT_RESAMPLING = "bicubic"  # the filter ft resizes images with (``ft.data.images``)

# keys Axolotl's vision configs set so that its collator gets whole rows ("needed for now to handle vision chat
# templates w images"): the value they set, and what ft does instead
ROW_KEYS: dict[str, tuple[Any, str]] = {
    "skip_prepare_dataset": (True, "ft prepares a vision-language model's rows itself before training: each chat "
                             "rendered with the template, each image's tokens counted by the model's processor and "
                             "checked against the row's images (a mismatch named by file:line), the images read a "
                             "batch at a time"),
    "remove_unused_columns": (False, "ft keeps a vision-language model's images column for its collator, which reads "
                              "a batch's images and runs the processor"),
}


def modality_of(cfg: dict) -> str:
    """What an Axolotl config's rows hold: ``text`` (no processor), ``audio`` (a processor, and a key that says audio:
    ``audio_sign``) or ``vision`` (a processor otherwise: Axolotl's multimodal configs are image-text ones)."""
    if cfg.get("processor_type") in (None, "", False):
        return "text"
    return "audio" if audio_sign(cfg) else "vision"


def audio_sign(cfg: dict) -> tuple[str, str] | None:
    """The first key of ``cfg`` (dotted) and its value that say its rows hold audio (``AUDIO_SIGNS``), or None."""
    for key, words in AUDIO_SIGNS.items():
        for name, value in _values(cfg, key):
            if isinstance(value, str) and any(word in value.lower() for word in words):
                return name, value
    return None


def _values(cfg: dict, key: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of ``key``; for a dataset list, each entry's ``path`` (a single mapping: its own)."""
    value = cfg.get(key)
    if key not in ("datasets", "test_datasets"):
        return [(key, value)]
    if isinstance(value, dict):
        return [(f"{key}.path", value.get("path"))]
    return [(f"{key}.{i}.path", entry.get("path")) for i, entry in enumerate(value or []) if isinstance(entry, dict)]


@handles("processor_type")
def processor(ctx: Ctx) -> None:
    """A processor means the model reads images (``model.modality: vision``, needed where the model's config cannot be
    read offline and for families transformers also loads as text-only models); rows with audio are refused."""
    name = str(ctx.get("processor_type"))
    if ctx.modality == "audio":
        key, value = audio_sign(ctx.cfg) or ("processor_type", name)
        said = "it is an audio model's processor" if key == "processor_type" else f"`{key}: {value}` holds audio"
        ctx.refuse("processor_type", "model.name", f"{said}, and ft trains language models on text and images, not "
                   "audio (it loads no audio processor and reads no audio in rows); train this config with Axolotl, "
                   "or import one of the model with image or text rows only")
        return
    picks = "" if name == "AutoProcessor" else f" (this config names `{name}`, which AutoProcessor loads where the " \
        "model's files name it)"
    ctx.put("processor_type", "model.modality", "vision", "ft loads the model with AutoModelForImageTextToText and "
            f"its processor with AutoProcessor, which picks the class the model's processor_config.json names{picks}; "
            "the processor is saved with every checkpoint and in final/", fixed=True)


@handles("image_size", "image_resize_algorithm")
def image_sizing(ctx: Ctx) -> None:
    """Axolotl resizes each image before its processor: ``image_size: [W, H]`` to exactly that (``data.image.size``),
    ``image_size: N`` into an N x N square, aspect ratio kept and padded black (ft does not pad: the nearest is
    ``data.image.max_pixels: N*N``, the same bound on an image's pixels, so on its tokens); with its bilinear filter
    unless ``image_resize_algorithm`` says another (ft resizes bicubic)."""
    size = ctx.get("image_size")
    if size is not None:
        if ctx.modality != "vision":
            ctx.off("image_size", "Axolotl resizes images for a multimodal model (processor_type) only")
        elif isinstance(size, list):
            ctx.put("image_size", "data.image.size", [number(side) for side in size])
        else:
            side = number(size)
            whole = float(side).is_integer()  # a side in pixels; another value is left for ft to refuse
            side = int(side) if whole else side
            ctx.put("image_size", "data.image.max_pixels", side * side if whole else side,
                    f"Axolotl fits each image into a {side}x{side} square, aspect ratio kept, and pads it black (small "
                    f"images scaled up); ft scales an image with more pixels than that down to {side}x{side} pixels in "
                    "all, aspect ratio kept, without padding or scaling up: the same bound on an image's tokens. "
                    f"`data.image.size: [{side}, {side}]` resizes every image to exactly that instead (stretched)")
    algorithm = ctx.get("image_resize_algorithm")
    if algorithm is None:
        return
    if size is None or ctx.modality != "vision":
        ctx.off("image_resize_algorithm", "Axolotl reads it only with image_size, for a multimodal model")
    elif str(algorithm).lower() == FT_RESAMPLING:
        ctx.same("image_resize_algorithm", "images are resized with PIL's bicubic filter")
    else:
        ctx.skip("image_resize_algorithm", f"ft resizes images with PIL's {FT_RESAMPLING} filter; no key chooses "
                 "another")


@handles("freeze_mm_modules")
def freeze_mm_modules(ctx: Ctx) -> None:
    """Axolotl freezes the multimodal parts (vision and audio towers, projectors): ``model.freeze: [vision,
    projector]`` in a full fine-tune of a vision model; with an adapter they are frozen already (PEFT trains the
    adapter alone, which ft puts on the language model only)."""
    if ctx.get("freeze_mm_modules") is not True:
        ctx.off("freeze_mm_modules", "off")
    elif ctx.get("adapter") in ("lora", "qlora"):
        ctx.same("freeze_mm_modules", "with a LoRA adapter the whole base is frozen, vision tower and projector "
                 "included, and the adapter goes on the language model only unless adapter.target_modules names "
                 "them (model.freeze would change nothing)")
    elif ctx.modality == "vision":
        ctx.put("freeze_mm_modules", "model.freeze", ["vision", "projector"], "ft finds the parts by the names "
                "transformers gives them (vision_tower, vision_model, visual; multi_modal_projector, connector, "
                "merger) and names the model's modules when one is missing")
    else:
        ctx.skip("freeze_mm_modules", "ft freezes a vision-language model's parts (model.freeze: [vision, "
                 "projector]) only when it trains one (processor_type, model.modality: vision); this config trains "
                 "text: an adapter keeps the base frozen")


@handles(*ROW_KEYS)
def vision_rows(ctx: Ctx) -> None:
    """``skip_prepare_dataset: true``, ``remove_unused_columns: false``: what ft does for a vision model's rows anyway.
    In a text config they are left to the driver's reasons, as before (``axolotl_other.REASONS``)."""
    if ctx.modality != "vision":
        return
    for key, (value, what) in ROW_KEYS.items():
        if ctx.has(key):
            if ctx.get(key) == value:
                ctx.same(key, what)
            else:
                ctx.skip(key, f"{what}, whatever this key says")
