"""The tiny model ``--smoke`` trains: a random model of the recipe's family, 2 layers of width 64 (``TINY``).

The real config (a local directory, the HF cache, the hub when online) is shrunk to ``TINY`` and keeps the family's
own fields (rope scaling, sliding windows, soft-capping, …), with the real tokenizer and its chat template. Where
they cannot be read, the shipped ``assets/tiny-<family>/`` of this package (config and tokenizer with the family's
special tokens and chat template, written by ``scripts/make_tiny_model.py``) stands in: the family the real config's
model_type names, else the model name (``FAMILY_WORDS``). The assets are package data, read through
``importlib.resources``, so an installed ft finds them wherever it is installed.

A vision-language model (``model.modality: vision``, a config transformers loads as image-text-to-text only, or an
unreadable config whose name names such a family: ``VISION_ONLY_WORDS``) stands in as a tiny random
image-text-to-text model with a processor whose images are a few tokens (``VISION_FAMILIES``: 16–32 pixels, at most
16 tokens an image), so that a smoke run of it takes seconds: the real config shrunk (its language model as a text
model's, its vision tower and the tokens an image becomes to the family's smoke sizes) and the real processor
re-sized to match, or the family's shipped asset (config, processor and tokenizer with the family's image tokens and
chat template). A family ft ships no asset of is stood in for by the generic tiny LLaVA, and the stand-in says so.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..model import gguf_cache
from ..model.loading import ModelLoadError, modality_of, modality_problem, names_a_path, text_tokenizer
from ..recipe import Problem
from ..recipe.adapter import AdapterSection
from ..recipe.errors import first_line

# family -> its folder under this package's assets/
FAMILIES = {"llama": "tiny-llama3", "qwen2": "tiny-qwen2", "mistral": "tiny-mistral", "gemma": "tiny-gemma"}
# a real config's model_type -> the family whose shipped tokenizer stands in when the real one cannot be read
FAMILY_OF_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen2_moe": "qwen2", "qwen3": "qwen2", "qwen3_moe": "qwen2",
                  "mistral": "mistral", "mixtral": "mistral", "ministral": "mistral", "gemma": "gemma",
                  "gemma2": "gemma", "gemma3_text": "gemma"}
# a word in model.name -> its family, when not even the config can be read (the earliest word in the name wins)
FAMILY_WORDS = {"llama": "llama", "qwen": "qwen2", "mistral": "mistral", "mixtral": "mistral", "gemma": "gemma"}
DEFAULT_FAMILY = "llama"  # a model another run has not written yet, with no recipe here that writes it

# the sizes a real config is shrunk to (never larger than it was); the shipped family assets have them too
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128}
TINY_MOE = {"num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128}
# a vision tower at the smoke sizes (CLIP, SigLIP, Idefics3's: their config keys); each family adds its image size
TINY_VISION = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2}


@dataclass(frozen=True)
class VisionFamily:
    """A vision-language family ft ships a tiny asset of, at the smoke sizes: what its real config and processor are
    set to (``shrink``, ``resized``) and what its asset holds (``scripts/make_tiny_model.py`` builds it from the same
    table). The vision tower's image and patch size, the config's tokens an image becomes and the processor's agree:
    an image is at most 16 tokens."""

    folder: str  # under this package's assets/
    vision: dict  # vision_config keys
    config: dict  # top-level config keys (how image features become tokens)
    tokens: dict  # config key -> the token whose id it holds (taken from the processor's tokenizer)
    image_processor: dict  # the image processor's settings (the size images are resized to)
    processor: dict = field(default_factory=dict)  # the processor's own settings (the tokens it writes an image as)


VISION_FAMILIES = {
    # SmolVLM: a 32-pixel image is one tile (no splitting) of 4x4 patches, pixel-shuffled by 2 into 4 tokens
    "idefics3": VisionFamily(
        "tiny-smolvlm", vision={**TINY_VISION, "image_size": 32, "patch_size": 8}, config={"scale_factor": 2},
        tokens={"image_token_id": "<image>"},
        image_processor={"size": {"longest_edge": 32}, "max_image_size": {"longest_edge": 32},
                         "do_image_splitting": False},
        processor={"image_seq_len": 4}),
    # LLaVA (and the generic stand-in): 16 pixels in 8-pixel patches, 4 tokens (the CLS feature dropped)
    "llava": VisionFamily(
        "tiny-llava", vision={**TINY_VISION, "image_size": 16, "patch_size": 8}, config={"image_seq_length": 4},
        tokens={"image_token_index": "<image>"},
        image_processor={"size": {"shortest_edge": 16}, "crop_size": {"height": 16, "width": 16}},
        processor={"patch_size": 8}),
    # Gemma 3: SigLIP at 32 pixels in 8-pixel patches, pooled into 4 soft tokens between its image markers
    "gemma3": VisionFamily(
        "tiny-gemma3", vision={**TINY_VISION, "image_size": 32, "patch_size": 8}, config={"mm_tokens_per_image": 4},
        tokens={"image_token_index": "<image_soft_token>", "boi_token_index": "<start_of_image>",
                "eoi_token_index": "<end_of_image>"},
        image_processor={"size": {"height": 32, "width": 32}, "do_pan_and_scan": False},
        processor={"image_seq_length": 4}),
}
# a real config's model_type -> its vision family (the families whose processors build without torchvision)
VISION_FAMILY_OF_TYPE = {"idefics3": "idefics3", "llava": "llava", "gemma3": "gemma3"}
# a word in model.name -> its vision family, when the config cannot be read (the earliest word in the name wins)
VISION_FAMILY_WORDS = {"smolvlm": "idefics3", "idefics": "idefics3", "llava": "llava", "gemma": "gemma3"}
# words that name a vision-language model whatever the recipe says: an unreadable config with one is taken as one
VISION_ONLY_WORDS = ("smolvlm", "idefics", "llava", "-vl", "pixtral", "paligemma")
DEFAULT_VISION_FAMILY = "llava"  # the generic stand-in of a vision-language family ft ships no asset of
ASSET_FOLDERS = {**FAMILIES, **{name: family.folder for name, family in VISION_FAMILIES.items()}}


class UnknownFamily(Exception):
    """No tiny model can stand in: the real config or tokenizer cannot be read and no family is known (a problem
    of ``model.name``)."""


@dataclass
class StandIn:
    """The tiny model, its processing class (a tokenizer; a vision-language model's processor) and generation config,
    and where each came from (summary.json's ``smoke``)."""

    model: object
    processing: object
    generation: object | None
    described: dict

    @property
    def model_type(self) -> str:
        return self.described["model_type"]

    @property
    def tokenizer(self):
        """The text tokenizer (a processor's own)."""
        return text_tokenizer(self.processing)

    def save(self, folder: Path) -> None:
        """Weights, config, tokenizer (or processor) and generation config, as a model directory ``init:
        pretrained`` loads."""
        folder.mkdir(parents=True)
        self.model.save_pretrained(folder)
        self.processing.save_pretrained(folder)
        if self.generation is not None:
            self.generation.save_pretrained(folder)

    def save_as_scorer(self, folder: Path, seed: int) -> None:
        """A random sequence classifier with one score of the same tiny config, with the tokenizer: the stand-in for a
        reward model (``rewards: [{model: ...}]``), which TRL runs with its own tokenizer and chat template."""
        import torch
        from transformers import AutoModelForSequenceClassification

        config = copy.deepcopy(self.model.config)
        config.num_labels = 1
        config.pad_token_id = self.tokenizer.pad_token_id
        torch.manual_seed(seed)
        scorer = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
        folder.mkdir(parents=True)
        scorer.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)


def asset(family: str) -> Path:
    """The shipped asset folder of ``family`` (``assets/<ASSET_FOLDERS[family]>`` of this package), on disk."""
    folder = ASSET_FOLDERS[family]
    resource = importlib.resources.files(__package__) / "assets" / folder
    if not resource.joinpath("config.json").is_file():
        raise ModelLoadError(f"model.name: the smoke test needs ft's shipped tiny {family} model "
                             f"(assets/{folder} of the ft.smoke package), which is missing from this "
                             "installation of ft; reinstall ft, or make the real config and tokenizer of the "
                             "recipe's model readable here instead.")
    return Path(str(resource))


def stand_in(name: str, revision: str | None, trust_remote_code: bool, seed: int, notes: list[str],
             named: str | None = None, gguf_file: str | None = None, tokens: dict[str, str] | None = None,
             modality: str | None = None) -> StandIn:
    """A tiny random model for the model ``name`` (``gguf_file``: its config and tokenizer are a GGUF file's;
    ``named``: as the recipe names it, for messages; ``notes``: what was found out about it so far; ``tokens``: the
    tokens the recipe names, ``train.pad_token`` and the like, which a shipped tokenizer standing in for the real one
    is given where it lacks them; ``modality``: ``model.modality`` where the recipe sets it). A vision-language model
    (``stand_in_modality``) stands in as one (``_vision_stand_in``). Raises UnknownFamily or ModelLoadError."""
    from transformers import AutoConfig, AutoTokenizer

    named = named or name
    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code,
              **({"gguf_file": gguf_file} if gguf_file else {})}
    def config_of():  # a local GGUF file's, as its tokenizer, converted once, then read from ft's cache
        def convert():
            return AutoConfig.from_pretrained(name, **kwargs)

        return gguf_cache.config(name, gguf_file, convert) if gguf_file else convert()

    config, config_error = _attempt(config_of)
    if stand_in_modality(name, config, modality, notes) == "vision":
        return _vision_stand_in(name, kwargs, config, config_error, seed, notes, named, tokens)
    def tokenizer_of():  # a local GGUF file's is converted once, then read from ft's cache
        def convert():
            return AutoTokenizer.from_pretrained(name, **kwargs)

        return gguf_cache.tokenizer(name, gguf_file, convert) if gguf_file else convert()

    tokenizer, tokenizer_error = _attempt(tokenizer_of)
    family = FAMILY_OF_TYPE.get(config.model_type) if config is not None else family_from_name(name)
    if family is None and config is None and names_a_path(name):
        family = DEFAULT_FAMILY
        notes.append(f"{name} does not exist and no recipe next to this one writes it, so its family is unknown: "
                     f"the {DEFAULT_FAMILY} asset stands in")
    if family is None and (config is None or tokenizer is None):
        missing = (f"its config cannot be read ({config_error})" if config is None
                   else f"its tokenizer cannot be read ({tokenizer_error}) and ft ships no tiny tokenizer for "
                        f"model_type {config.model_type!r}")
        raise UnknownFamily(f"the smoke test cannot tell what tiny model stands in for {named!r}: {missing}, and its "
                            f"name names none of the families ft ships tiny assets for ({', '.join(FAMILIES)}). Make "
                            "the real config and tokenizer readable here (a local directory, or the HF cache).")
    described = {"family": family, "modality": "text", "config": None, "tokenizer": None, "notes": notes}
    shipped = f"shipped assets/{FAMILIES[family]}" if family is not None else ""

    generation = None
    if tokenizer is None:
        tokenizer, generation = _shipped(AutoTokenizer, family)
        described["tokenizer"] = f"{shipped} (the real one cannot be read: {tokenizer_error})"
        _give_tokens(tokenizer, tokens, notes)
    else:
        described["tokenizer"] = f"the real one ({name})"
        generation = _generation(name, kwargs)
    tiny = None
    if config is not None:
        try:
            tiny, changed = shrink(config)
            described["config"] = f"the real one ({name}), shrunk: " + (", ".join(changed) or "already tiny")
        except Exception as exc:  # a config class that refuses the tiny sizes: the family asset, when there is one
            if family is None:
                raise ModelLoadError(f"model.name: the smoke test could not shrink the config of {name!r} "
                                     f"({first_line(exc)}).") from None
            config_error = f"shrinking it failed: {first_line(exc)}"
    if tiny is None:
        tiny = AutoConfig.from_pretrained(asset(family))
        described["config"] = f"{shipped} (the real one cannot be read: {config_error})"
    _fit_vocabulary(tiny, tokenizer, described["config"], described["tokenizer"])
    return _built("AutoModelForCausalLM", tiny, tokenizer, generation, described, name, seed, trust_remote_code)


def stand_in_modality(name: str, config, declared: str | None, notes: list[str]) -> str:
    """What the stand-in reads, as the real run would take the model: ``model.modality`` where set (checked against a
    readable config as ``model.loading.model_modality`` checks it), else the config's modality; a config that cannot
    be read is a text model unless its name names a vision-language family (``VISION_ONLY_WORDS``: what the real run
    would read in its config where the model can be reached)."""
    if config is not None:
        problem = modality_problem(declared, config)
        if problem:
            raise ModelLoadError(f"model.modality: {problem}")
        return declared or modality_of(config)
    if declared is not None:
        return declared
    word = _earliest(name, dict.fromkeys(VISION_ONLY_WORDS, True))
    if word is None:
        return "text"
    notes.append(f"its config cannot be read here, and {word[0]!r} in its name names a vision-language model: a "
                 "vision-language model stands in (set model.modality: text if it is a text model)")
    return "vision"


def _vision_stand_in(name: str, kwargs: dict, config, config_error: str | None, seed: int, notes: list[str],
                     named: str, tokens: dict[str, str] | None) -> StandIn:
    """``stand_in`` of a vision-language model: its family from the config's model_type (``VISION_FAMILY_OF_TYPE``)
    or the name (``VISION_FAMILY_WORDS``); the real config shrunk (``shrink`` with the family's sizes) and the real
    processor re-sized to match (``resized``) where each can be read, else the family's shipped asset. A family ft
    ships no asset of is stood in for by the generic tiny LLaVA, config and processor, and a note says so."""
    from transformers import AutoConfig, AutoProcessor

    if config is not None:
        family = VISION_FAMILY_OF_TYPE.get(config.model_type)
    else:
        found = _earliest(name, VISION_FAMILY_WORDS)
        family = found[1] if found else None
    fallback = family is None
    if fallback:
        family = DEFAULT_VISION_FAMILY
        what = f"model_type {config.model_type!r}" if config is not None else f"{named!r} (its config cannot be read)"
        notes.append(f"ft ships no tiny model of the vision-language family of {what}: its generic tiny {family} "
                     f"(assets/{ASSET_FOLDERS[family]}: config, processor and chat template) stands in, whose module "
                     "names and image tokens may differ from the real model's")
    sizes, shipped = VISION_FAMILIES[family], f"shipped assets/{ASSET_FOLDERS[family]}"
    described = {"family": family, "modality": "vision", "fallback": fallback, "config": None, "processor": None,
                 "notes": notes}
    processor, processor_error = (None, "its family has no tiny asset") if fallback else _attempt(
        lambda: resized(AutoProcessor.from_pretrained(name, **kwargs), sizes))
    if processor is None:
        processor, generation = _shipped(AutoProcessor, family)
        described["processor"] = f"{shipped} (the real one cannot be used: {processor_error})"
        _give_tokens(text_tokenizer(processor), tokens, notes)
    else:
        described["processor"] = (f"the real one ({name}), its images re-sized: "
                                  + ", ".join(f"{k} {v}" for k, v in {**sizes.image_processor, **sizes.processor}
                                              .items()))
        generation = _generation(name, kwargs)
    tiny = None
    if config is not None and not fallback:
        try:
            tiny, changed = shrink(config, sizes)
            described["config"] = f"the real one ({name}), shrunk: " + ", ".join(changed)
        except Exception as exc:  # a config class that refuses the tiny sizes: the family asset
            config_error = f"shrinking it failed: {first_line(exc)}"
    if tiny is None:
        tiny = AutoConfig.from_pretrained(asset(family))
        described["config"] = f"{shipped} (the real one cannot be used: {config_error or 'see the notes'})"
    tokenizer = text_tokenizer(processor)
    if _fit_vocabulary(tiny, tokenizer, described["config"], described["processor"]):
        for key, token in sizes.tokens.items():  # the image tokens' ids, as the processor's tokenizer has them
            setattr(tiny, key, tokenizer.convert_tokens_to_ids(token))
    return _built("AutoModelForImageTextToText", tiny, processor, generation, described, name, seed,
                  kwargs["trust_remote_code"])


def resized(processor, sizes: VisionFamily):
    """``processor`` (the real one) with its images at the smoke sizes: saved, the settings ``sizes`` names replaced
    (the image processor's in its nested ``image_processor`` entry, or in ``preprocessor_config.json`` as older
    processors save it), and loaded again, so that what a processor derives from them when it is made (Gemma 3's
    image token sequence) follows. Its tokenizer and chat template are the real ones."""
    from transformers import AutoProcessor

    with tempfile.TemporaryDirectory() as folder:
        processor.save_pretrained(folder)
        saved = Path(folder) / "processor_config.json"
        settings = json.loads(saved.read_text()) if saved.is_file() else {}
        settings.update(sizes.processor)
        if isinstance(settings.get("image_processor"), dict):
            settings["image_processor"].update(sizes.image_processor)
        else:
            older = Path(folder) / "preprocessor_config.json"
            older.write_text(json.dumps({**json.loads(older.read_text()), **sizes.image_processor}, indent=2))
        saved.write_text(json.dumps(settings, indent=2))
        return AutoProcessor.from_pretrained(folder)


def _shipped(auto, family: str):
    """The shipped asset's tokenizer (or processor, by ``auto``) and generation config."""
    from transformers import GenerationConfig

    folder = asset(family)
    return auto.from_pretrained(folder), GenerationConfig.from_pretrained(folder)


def _generation(name: str, kwargs: dict):
    from transformers import GenerationConfig

    return _attempt(lambda: GenerationConfig.from_pretrained(name, **kwargs))[0]


def _give_tokens(tokenizer, tokens: dict[str, str] | None, notes: list[str]) -> None:
    """A shipped tokenizer is given the tokens the recipe names that it lacks (the real one is expected to have them:
    a real run checks, ``model.loading.token_problems``)."""
    vocabulary = tokenizer.get_vocab()
    lacking = {key: token for key, token in (tokens or {}).items() if token not in vocabulary}
    if lacking:
        tokenizer.add_tokens(sorted(set(lacking.values())), special_tokens=True)
        notes.append("the shipped tokenizer is given the recipe's " + ", ".join(
            f"train.{key} {token!r}" for key, token in lacking.items()) + ", which it lacks (a real run checks "
            "that the real tokenizer has it)")


def _fit_vocabulary(tiny, tokenizer, config_from: str, tokenizer_from: str) -> bool:
    """The tiny config's language model reads every id of ``tokenizer``; when config and tokenizer came from two
    places (one shipped, one real), its vocabulary and special token ids are the tokenizer's. Returns whether they
    did."""
    text = tiny.get_text_config()
    mixed = config_from.startswith("shipped") != tokenizer_from.startswith("shipped")
    if mixed:
        text.vocab_size = (len(tokenizer) + 7) // 8 * 8
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            setattr(text, key, getattr(tokenizer, key, None))
    text.vocab_size = max(text.vocab_size or 0, (len(tokenizer) + 7) // 8 * 8)
    return mixed


def _built(auto: str, tiny, processing, generation, described: dict, name: str, seed: int,
           trust_remote_code: bool) -> StandIn:
    """The random model of config ``tiny`` (transformers' ``auto`` class), seeded."""
    import torch
    import transformers

    torch.manual_seed(seed)
    try:
        model = getattr(transformers, auto).from_config(tiny, dtype=torch.float32,
                                                        trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(f"model.name: the smoke test could not build a tiny model from the config of "
                             f"{name!r} ({first_line(exc)}).") from None
    described["model_type"] = tiny.model_type
    described["parameters"] = sum(p.numel() for p in model.parameters())
    return StandIn(model, processing, generation, described)


def _attempt(load: Callable):
    try:
        return load(), None
    except Exception as exc:  # unreachable, gated, missing, malformed: the caller falls back and says why
        return None, first_line(exc)


def _earliest(name: str, words: dict):
    """(word, value) of the ``words`` entry found earliest in ``name`` (case-insensitive), or None."""
    lowered = name.lower()
    found = [(lowered.find(word), word) for word in words if word in lowered]
    return (min(found)[1], words[min(found)[1]]) if found else None


def family_from_name(name: str) -> str | None:
    found = _earliest(name, FAMILY_WORDS)
    return found[1] if found else None


def shrink(config, sizes: VisionFamily | None = None) -> tuple[object, list[str]]:
    """A copy of ``config`` at the smoke sizes (never larger than it was), with what changed. The family's own
    fields (rope scaling, sliding windows, soft-capping, …) stay; per-layer lists are cut to the new depth. A
    vision-language config's language model (``text_config``) is shrunk as a text model's, and ``sizes`` (its
    family's) sets its vision tower and the tokens an image becomes, to match the processor ``resized`` makes."""
    values = config.to_dict()
    changed: list[str] = []
    _shrink_dict(values, changed, "")
    if sizes is not None:
        _put_all(values, sizes.config, changed, "")
        if isinstance(values.get("vision_config"), dict):
            vision = values["vision_config"]
            _put_all(vision, _tiny_vision(vision, sizes.vision), changed, "vision_config.")
    return type(config).from_dict(values), changed


def _tiny_vision(vision: dict, sizes: dict) -> dict:
    """The family's vision ``sizes`` for the real tower ``vision``: its depth and width never larger than they were
    (``TINY_VISION``'s keys), its heads dividing its width; its image and patch size exactly the family's, which the
    re-sized processor's images have."""
    tiny = dict(sizes)
    for key in TINY_VISION:
        if key in tiny and isinstance(vision.get(key), int):
            tiny[key] = min(vision[key], tiny[key])
    while "num_attention_heads" in tiny and tiny["hidden_size"] % tiny["num_attention_heads"]:
        tiny["num_attention_heads"] -= 1
    return tiny


def _put_all(values: dict, settings: dict, changed: list[str], prefix: str) -> None:
    for key, value in settings.items():
        if values.get(key) != value:
            changed.append(f"{prefix}{key} {values.get(key)} -> {value}")
            values[key] = value


def _shrink_dict(values: dict, changed: list[str], prefix: str) -> None:
    def put(key: str, value) -> None:
        if key in values and values[key] is not None and values[key] != value:
            changed.append(f"{prefix}{key} {values[key]} -> {value}")
            values[key] = value

    if "num_hidden_layers" in values and "hidden_size" in values:
        layers = min(values["num_hidden_layers"], TINY["num_hidden_layers"])
        heads = min(values.get("num_attention_heads") or TINY["num_attention_heads"], TINY["num_attention_heads"])
        kv = values.get("num_key_value_heads")
        if kv is not None:
            kv = heads if kv >= values.get("num_attention_heads", kv) else min(kv, TINY["num_key_value_heads"], heads)
            while heads % kv:
                kv -= 1
        hidden = min(values["hidden_size"], TINY["hidden_size"])
        put("num_hidden_layers", layers)
        put("hidden_size", hidden)
        put("num_attention_heads", heads)
        put("num_key_value_heads", kv)
        put("head_dim", hidden // heads)
        put("intermediate_size", min(values.get("intermediate_size") or 0, TINY["intermediate_size"]))
        for key, tiny in TINY_MOE.items():
            if isinstance(values.get(key), int):
                put(key, min(values[key], tiny))
        if isinstance(values.get("layer_types"), list):
            put("layer_types", values["layer_types"][:layers])
        if isinstance(values.get("max_window_layers"), int):
            put("max_window_layers", min(values["max_window_layers"], layers))
    for key in ("text_config",):  # a multimodal config's language model
        if isinstance(values.get(key), dict):
            _shrink_dict(values[key], changed, f"{prefix}{key}.")


def adapter_problems(adapter: AdapterSection | None, stand: StandIn, name: str) -> list[Problem]:
    """``adapter.target_modules`` and ``modules_to_save`` must name modules the model has (matched as PEFT does);
    a real run fails when PEFT finds none, or quietly trains fewer layers when it finds only some. When the stand-in
    is not built from the real config of ``name`` (unreadable here, or of a vision-language family ft ships no tiny
    model of), a missing module may be the stand-in's fault rather than the recipe's: the message says so."""
    if adapter is None or adapter.path:
        return []
    problems = _missing_modules(adapter, stand.model, stand.model_type)
    guess = _may_differ(stand.described, name)
    return [Problem(p.path, p.message + guess) for p in problems] if guess else problems


def fitted_to_generic(adapter: AdapterSection | None, stand: StandIn) -> dict[str, object]:
    """For a generic stand-in (``described["fallback"]``: a vision-language family ft ships no tiny model of), the
    adapter settings the smoke run can use instead of names the stand-in lacks, ``{key: value}`` under ``adapter.``:
    the target names it has (``all-linear`` when it has none of them, or for a regular expression that matches none
    of its modules), the modules to save it has (unset when none). The real names cannot be checked against another
    family's modules; PEFT checks them against the real model when the real run starts."""
    if adapter is None or adapter.path or not stand.described.get("fallback"):
        return {}
    names = [name for name, _ in stand.model.named_modules() if name]

    def has(target: str) -> bool:
        return any(n == target or n.endswith("." + target) for n in names)

    fitted: dict[str, object] = {}
    targets = adapter.target_modules
    if isinstance(targets, str) and targets != "all-linear" and not any(re.fullmatch(targets, n) for n in names):
        fitted["target_modules"] = "all-linear"
    elif isinstance(targets, list) and not all(has(t) for t in targets):
        fitted["target_modules"] = [t for t in targets if has(t)] or "all-linear"
    if adapter.modules_to_save and not all(has(m) for m in adapter.modules_to_save):
        fitted["modules_to_save"] = [m for m in adapter.modules_to_save if has(m)] or None
    return fitted


def _may_differ(described: dict, name: str) -> str:
    """Why the stand-in's module names may not be the real model's ("" when it is built from the real config)."""
    family = described["family"]
    if described.get("fallback"):
        return (f" This stand-in is ft's generic tiny {family} model ({ASSET_FOLDERS[family]}): ft ships no tiny "
                f"model of the vision-language family of {name!r}, whose module names may differ (Qwen2-VL's vision "
                "tower is `visual`, Idefics3's language model `text_model`), so these names may be right; a real run "
                "fails when PEFT finds none of them in the real model.")
    if described["config"].startswith("shipped"):
        return (f" This stand-in is ft's shipped tiny {family} model ({ASSET_FOLDERS[family]}), chosen from the name "
                f"{name!r} because the real config cannot be read here: the real model may be another architecture "
                "(a mixture of experts with shared_expert layers, a vision-language model), so these names may be "
                f"right. Make its config readable here (`hf download {name} config.json` where the Hub is "
                "reachable, then copy the HF cache; or a local model directory) and the stand-in is built from it.")
    return ""


def _missing_modules(adapter: AdapterSection, model, model_type: str) -> list[Problem]:
    import torch

    names = [name for name, _ in model.named_modules() if name]
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear)})
    problems = []
    targets = adapter.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        if not any(re.fullmatch(targets, name) for name in names):
            problems.append(Problem("adapter.target_modules", f"the regular expression {targets!r} matches no module "
                                    f"name of a {model_type} model (e.g. {names[len(names) // 2]}); its linear "
                                    f"layers are {', '.join(linear)}."))
    elif isinstance(targets, list):
        missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
        if missing:
            problems.append(Problem("adapter.target_modules", f"{', '.join(missing)}: no such module in a "
                                    f"{model_type} model, whose linear layers are {', '.join(linear)}. (A real run "
                                    "fails when PEFT finds none of the names, and trains fewer layers than meant "
                                    "when it finds only some.)"))
    missing = [t for t in adapter.modules_to_save or [] if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        top = sorted({n.rsplit(".", 1)[-1] for n in names if n.count(".") <= 1})
        problems.append(Problem("adapter.modules_to_save", f"{', '.join(missing)}: no such module in a {model_type} "
                                f"model (its top-level modules: {', '.join(top)})."))
    return problems


