"""The tokenizer and config of a local GGUF file are converted once and read from ft's cache after
(``ft.model.gguf_cache``), and its de-quantized weights where ``FT_CACHE_GGUF_WEIGHTS`` asks: each cached one is
the file's own, the entry is keyed by what they are built from, and a broken entry or an unwritable cache costs only
the conversion. Checked on the real model's file
(SmolLM2-135M-Instruct)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_ft

from ft.model import gguf_cache
from ft.model.loading import load_tokenizer
from ft.recipe.schema import ModelSection

TOOLS = [{"type": "function", "function": {"name": "convert", "description": "Convert a quantity between units.",
                                           "parameters": {"type": "object", "properties": {
                                               "value": {"type": "number"}, "unit": {"type": "string"}},
                                               "required": ["value", "unit"]}}}]
CHAT = [{"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "Wie viel sind 3 Meilen in km? ünïcödé, 数字 123"},
        {"role": "assistant", "content": "Using the tool.",
         "tool_calls": [{"type": "function",
                         "function": {"name": "convert", "arguments": {"value": 3, "unit": "mi"}}}]},
        {"role": "tool", "content": "4.828 km"},
        {"role": "assistant", "content": "3 miles are 4.83 km."}]


@pytest.fixture(scope="module")
def converted(smollm2: Path):
    """The file's tokenizer as transformers converts it (no ft cache involved)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)


def _entries(cache: Path, part: str = "tokenizer") -> list[Path]:
    """The cache's entries of ``part`` (tokenizer, config), one per file converted."""
    return sorted(path for path in (cache / gguf_cache.SUBFOLDER).glob(f"*/{part}") if path.is_dir())


def _same_tokenizer(a, b) -> None:
    """What training, the prepared-data fingerprint and a trained model's template read from a tokenizer."""
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert a.chat_template == b.chat_template
    assert a.special_tokens_map == b.special_tokens_map
    assert (a.eos_token_id, a.bos_token_id, a.pad_token_id) == (b.eos_token_id, b.bos_token_id, b.pad_token_id)
    assert a.get_added_vocab() == b.get_added_vocab()
    assert (a.padding_side, a.model_max_length) == (b.padding_side, b.model_max_length)
    text = a.apply_chat_template(CHAT, tools=TOOLS, tokenize=False)
    assert text.count("<|im_start|>") == len(CHAT)  # SmolLM2's own template (ChatML; it renders no tool list)
    assert text == b.apply_chat_template(CHAT, tools=TOOLS, tokenize=False)
    assert a(text).input_ids == b(text).input_ids


def test_converted_once_then_read_from_the_cache(smollm2, converted, tmp_path, monkeypatch):
    """The first load converts the file and writes one entry; the second reads that entry (its conversion would fail)
    and is the tokenizer transformers converts from the file, down to the ids of a chat with tool calls."""
    monkeypatch.setenv("FT_CACHE_DIR", str(tmp_path / "cache"))
    section = ModelSection(name=str(smollm2.parent), gguf_file=smollm2.name)
    first = load_tokenizer(section)
    (entry,) = _entries(tmp_path / "cache")
    assert (entry / "tokenizer.json").is_file() and (entry / "chat_template.jinja").is_file()
    assert entry.parent.name == gguf_cache.entry_key(smollm2)

    def no_conversion():
        raise AssertionError("converted again although the cache holds the file's tokenizer")

    cached = gguf_cache.tokenizer(str(smollm2.parent), smollm2.name, no_conversion)
    assert cached.name_or_path == converted.name_or_path
    _same_tokenizer(cached, converted)
    _same_tokenizer(first, converted)  # load_tokenizer's pad choice included: SmolLM2 has a pad token of its own


def test_the_key_follows_the_metadata_not_the_weights(smollm2, tmp_path):
    """The entry's key digests the bytes the tokenizer is built from (the metadata section): a changed tensor byte
    keeps it, a changed metadata value gives a new one."""
    from transformers.integrations.gguf.reader import GgufHeader

    key = gguf_cache.entry_key(smollm2)
    data_start = GgufHeader.from_file(str(smollm2)).data_start
    blob = bytearray(smollm2.read_bytes())

    weights = tmp_path / "weights" / smollm2.name
    weights.parent.mkdir()
    changed = bytearray(blob)
    changed[data_start + 1000] ^= 0xFF
    weights.write_bytes(changed)
    assert gguf_cache.entry_key(weights) == key

    metadata = tmp_path / "metadata" / smollm2.name
    metadata.parent.mkdir()
    changed = bytearray(blob)
    at = changed.index(b"<|im_end|>")
    assert at < data_start
    changed[at + 2] = ord("M")  # <|iM_end|>: the same length, another token
    metadata.write_bytes(changed)
    assert gguf_cache.entry_key(metadata) != key


def test_a_broken_entry_is_converted_again_and_replaced(smollm2, converted, tmp_path, monkeypatch):
    monkeypatch.setenv("FT_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def convert():
        calls.append(1)
        return converted

    gguf_cache.tokenizer(str(smollm2.parent), smollm2.name, convert)
    (entry,) = _entries(tmp_path / "cache")
    whole = (entry / "tokenizer.json").read_bytes()
    (entry / "tokenizer.json").write_bytes(whole[: len(whole) // 2])  # a copy cut short

    again = gguf_cache.tokenizer(str(smollm2.parent), smollm2.name, convert)
    assert len(calls) == 2
    _same_tokenizer(again, converted)
    assert (entry / "tokenizer.json").read_bytes() == whole
    assert _entries(tmp_path / "cache") == [entry]
    assert [path.name for path in entry.parent.iterdir()] == ["tokenizer"]  # no staging folder left behind
    gguf_cache.tokenizer(str(smollm2.parent), smollm2.name, convert)
    assert len(calls) == 2


def test_an_unwritable_cache_costs_only_the_conversion(smollm2, converted, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache would be")
    monkeypatch.setenv("FT_CACHE_DIR", str(blocker))
    tokenizer = gguf_cache.tokenizer(str(smollm2.parent), smollm2.name, lambda: converted)
    assert tokenizer is converted
    assert blocker.read_text() == "a file where the cache would be"


def test_preprocess_show_fills_the_cache_and_shows_the_same_rows(smollm2, tmp_path):
    """``ft preprocess --show`` of the tool recipe, run twice against an empty cache: the first run writes the entry,
    the second (reading it) prints the same marked rows."""
    cache = tmp_path / "cache"
    runs = [run_ft("preprocess", "recipes/smollm2-tools.yaml", "--show", "2", cwd=ROOT,
                   env={"FT_CACHE_DIR": str(cache)}) for _ in range(2)]
    for result in runs:
        assert result.returncode == 0, result.stderr[-3000:]
    assert "[[" in runs[0].stdout and "<tool_call>" in runs[0].stdout
    assert runs[0].stdout == runs[1].stdout
    (entry,) = _entries(cache)
    assert json.loads((entry / "tokenizer_config.json").read_text())  # a whole entry, not a staging folder
    shutil.rmtree(cache)


def test_the_config_is_converted_once_and_read_from_the_cache(smollm2, tmp_path, monkeypatch):
    """The cached config is the file's own, value for value (ft's model load hands it to from_pretrained: that the
    weights are then transformers' own is tests/test_gguf.py's comparison, which runs with the cache)."""
    from transformers import AutoConfig

    from ft.model.loading import load_config

    monkeypatch.setenv("FT_CACHE_DIR", str(tmp_path / "cache"))
    section = ModelSection(name=str(smollm2.parent), gguf_file=smollm2.name)
    converted = AutoConfig.from_pretrained(smollm2.parent, gguf_file=smollm2.name)
    first = load_config(section)
    (entry,) = _entries(tmp_path / "cache", "config")
    assert (entry / "config.json").is_file()

    def no_conversion():
        raise AssertionError("converted again although the cache holds the file's config")

    cached = gguf_cache.config(str(smollm2.parent), smollm2.name, no_conversion)
    assert cached.to_dict() == converted.to_dict() == first.to_dict()
    assert cached.name_or_path == converted.name_or_path


def _recipe_of(smollm2: Path, tmp_path: Path):
    """A recipe training the real model from its GGUF file (what ``load_model`` reads of it: the model section)."""
    from ft.recipe import load_recipe

    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps({"method": "sft", "model": {"name": str(smollm2.parent), "gguf_file": smollm2.name},
                                "data": {"train": [{"path": str(ROOT / "data" / "arithmetic" / "train.jsonl"),
                                                    "format": "chat"}]},
                                "train": {"output_dir": str(tmp_path / "out")}}))
    return load_recipe(path).recipe


def test_weights_are_kept_only_when_asked_and_the_kept_entry_is_what_loads(smollm2, tmp_path, monkeypatch):
    """``FT_CACHE_GGUF_WEIGHTS=1``: the first load writes the de-quantized weights as one whole checkpoint, and later
    loads read that checkpoint (a value changed in it is the value loaded); an entry cut short is converted again; an
    unwritable cache or the switch off keep nothing. (That the kept weights compute what transformers' own GGUF load
    computes, tied embeddings included, is tests/test_gguf.py's comparison, run both ways.)"""
    import torch
    from safetensors.torch import load_file, save_file

    from ft.model.loading import load_model

    monkeypatch.setenv("FT_CACHE_DIR", str(tmp_path / "cache"))
    recipe = _recipe_of(smollm2, tmp_path)
    folder, name = str(smollm2.parent), smollm2.name

    def never():
        raise AssertionError("converted although no weights are to be kept")

    monkeypatch.setenv("FT_CACHE_GGUF_WEIGHTS", "0")
    assert gguf_cache.weights(folder, name, never) is None
    monkeypatch.setenv("FT_CACHE_GGUF_WEIGHTS", "1")
    first = load_model(recipe, seed=0)
    (entry,) = _entries(tmp_path / "cache", "weights")
    assert first.name_or_path == folder and first.config._name_or_path == folder  # as a GGUF load names it
    saved = entry / "model.safetensors"
    tensors = load_file(saved)
    norm = tensors["model.norm.weight"].clone()
    tensors["model.norm.weight"] += 1.0
    save_file(tensors, saved, metadata={"format": "pt"})
    assert torch.equal(load_model(recipe, seed=0).model.norm.weight, norm + 1.0)

    calls = []

    def convert():
        calls.append(1)
        return first

    saved.write_bytes(saved.read_bytes()[:1000])  # a copy cut short
    assert gguf_cache.weights(folder, name, convert) == entry
    assert calls == [1] and torch.equal(load_file(saved)["model.norm.weight"], norm)
    assert sorted(path.name for path in entry.parent.iterdir()) == ["config", "weights"]  # no staging left behind

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache would be")
    monkeypatch.setenv("FT_CACHE_DIR", str(blocker))
    assert gguf_cache.weights(folder, name, convert) is None  # the caller loads the GGUF file itself
    assert blocker.read_text() == "a file where the cache would be"
