"""A model is more than a tokenizer: its modality comes from its config through transformers' own auto tables, the
(method x modality) entry of the method table picks its auto class, and its processing class is a tokenizer for a text
model and a processor for a vision-language one. Real transformers classes, a tiny random LLaVA built offline."""

from __future__ import annotations

from dataclasses import replace

import pytest
import transformers
from conftest import ASSETS, tiny_sft
from test_vision import build_tiny_llava
from transformers import AutoConfig

from ft.model import loading, locate
from ft.recipe import load_recipe
from ft.recipe.methods import METHODS
from ft.recipe.schema import ModelSection


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    """A tiny random LLaVA's config and processor, with no chat template of its own (test_vision builds it)."""
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"), chat_template=None)


def test_the_modality_is_read_from_transformers_own_tables(tiny_llava):
    assert loading.modality_of(AutoConfig.from_pretrained(ASSETS)) == "text"
    assert loading.modality_of(AutoConfig.from_pretrained(tiny_llava)) == "vision"
    # multimodal families with a text-only class train as text models, as they did before modalities existed
    assert loading.modality_of(transformers.Llama4Config()) == "text"
    assert loading.modality_of(transformers.Gemma3Config()) == "text"
    assert loading.model_modality(ModelSection(name=str(tiny_llava))) == "vision"
    assert loading.model_modality(ModelSection(name=str(ASSETS))) == "text"


def test_the_processing_class_is_a_processor_for_a_vision_model(tiny_llava):
    processor = loading.load_processing_class(ModelSection(name=str(tiny_llava)))
    assert isinstance(processor, transformers.ProcessorMixin)
    assert loading.text_tokenizer(processor) is processor.tokenizer
    assert processor.tokenizer.pad_token is not None  # padding as a text model's tokenizer pads
    tokenizer = loading.load_processing_class(ModelSection(name=str(ASSETS)))
    assert isinstance(tokenizer, transformers.PreTrainedTokenizerBase)
    assert loading.text_tokenizer(tokenizer) is tokenizer


def test_a_saved_processor_is_found_again_with_the_run(tiny_llava):
    """``ft generate``, ``merge`` and ``export`` load what a run saved: a processor where one was saved."""
    found = locate.Found("full", tiny_llava, None)
    assert isinstance(locate.load_processing_class(found, "MODEL_OR_RUN_DIR", print), transformers.ProcessorMixin)
    assert isinstance(locate.load_processing_class(locate.Found("full", ASSETS, None), "X", print),
                      transformers.PreTrainedTokenizerBase)


def test_the_model_class_comes_from_the_method_and_the_modality():
    assert METHODS["sft"].model_class("text") == "AutoModelForCausalLM"
    assert METHODS["reward"].model_class("text") == "AutoModelForSequenceClassification"
    assert METHODS["sft"].peft_task == "CAUSAL_LM" and METHODS["reward"].peft_task == "SEQ_CLS"
    assert METHODS["sft"].model_class("vision") == "AutoModelForImageTextToText"  # SFT trains images (test_vision)
    assert [name for name, method in METHODS.items() if method.model_class("vision") is None] == ["orpo", "reward"]
    assert replace(METHODS["sft"], modalities=("text",)).model_class("vision") is None
    assert replace(METHODS["reward"], modalities=("text", "vision")).model_class("vision") is None  # no such class


def _recipe(tmp_path, write_recipe, folder):
    recipe = tiny_sft(tmp_path / "out")
    recipe["model"]["name"] = str(folder)
    return load_recipe(write_recipe(recipe)).recipe


def test_a_vision_model_is_refused_by_a_method_that_trains_text(tmp_path, write_recipe, tiny_llava, monkeypatch):
    monkeypatch.setitem(METHODS, "sft", replace(METHODS["sft"], modalities=("text",)))
    with pytest.raises(loading.ModelLoadError, match=r"model.name: .* is a vision model .* method sft"):
        loading.load_model(_recipe(tmp_path, write_recipe, tiny_llava), seed=0)


def test_a_method_entry_that_trains_images_loads_the_image_text_to_text_class(tmp_path, write_recipe, tiny_llava,
                                                                            monkeypatch):
    """What the method table declares is what loads: no branch elsewhere chooses the class."""
    monkeypatch.setitem(METHODS, "sft", replace(METHODS["sft"], modalities=("text", "vision")))
    model = loading.load_model(_recipe(tmp_path, write_recipe, tiny_llava), seed=0)
    assert type(model).__name__ == "LlavaForConditionalGeneration"


def test_model_modality_says_what_a_model_reads_and_is_checked_against_its_config(tmp_path, tiny_llava):
    """``model.modality`` decides for a config that cannot be read (a hub model offline) and for a family that has
    both classes (Gemma 3 trains on images only when asked); one its config contradicts is refused by its key."""
    assert loading.model_modality(ModelSection(name="org/not-here", modality="vision")) == "vision"
    assert loading.model_modality(ModelSection(name="org/not-here")) == "text"
    gemma3 = tmp_path / "gemma3"
    transformers.Gemma3Config().save_pretrained(gemma3)
    assert loading.model_modality(ModelSection(name=str(gemma3))) == "text"
    assert loading.model_modality(ModelSection(name=str(gemma3), modality="vision")) == "vision"
    with pytest.raises(loading.ModelLoadError, match=r"model.modality: is vision, and the model's family \(llama\)"):
        loading.model_modality(ModelSection(name=str(ASSETS), modality="vision"))
    with pytest.raises(loading.ModelLoadError, match=r"model.modality: is text, .*\(llava\)"):
        loading.model_modality(ModelSection(name=str(tiny_llava), modality="text"))


def test_a_gguf_file_is_a_text_model_whatever_modality_says(tmp_path, write_recipe):
    from ft.recipe.errors import RecipeError

    recipe = tiny_sft(tmp_path / "out")
    recipe["model"] = {"name": str(tmp_path), "gguf_file": "m.gguf", "modality": "vision"}
    path = write_recipe(recipe)
    with pytest.raises(RecipeError, match=r"recipe.yaml:5: model.modality: is vision, and model.gguf_file holds a"):
        load_recipe(path)
