"""The model card a run writes (README.md, ``ft.trainers.card``) names the base as the recipe names it: TRL's card
named a local, GGUF or random-init base "[None](https://huggingface.co/None)" (issue 47, item 7). The card's metadata
carries a ``base_model`` only for a hub repository (the Hub refuses a local path there)."""

from __future__ import annotations

from conftest import ROOT

from ft.recipe import load_recipe
from ft.trainers.card import card_facts, write_card


def _card(tmp_path, recipe_path, *sets):
    from huggingface_hub import ModelCard

    facts = card_facts(load_recipe(recipe_path, list(sets)).recipe)
    path = write_card(facts, tmp_path, "my-run", "FtSFTTrainer")
    return path.read_text(), ModelCard.load(path)


def test_a_gguf_base_is_named_by_its_file_and_kept_out_of_the_metadata(tmp_path):
    text, card = _card(tmp_path, ROOT / "recipes" / "smollm2-sft.yaml")
    assert "None" not in text and "huggingface.co/None" not in text
    assert "Fine-tuned from the GGUF file `SmolLM2-135M-Instruct.Q4_1.gguf` in `" in text and "de-quantized" in text
    assert "method `sft` (FtSFTTrainer, from TRL), LoRA (r=16) adapter, on `train.jsonl`" in text
    assert card.data.base_model is None and card.data.library_name == "peft"
    assert {"ft", "sft", "lora"} <= set(card.data.tags) and card.data.model_name == "my-run"
    assert str(ROOT / "data") not in text  # a local data file is named, not where it was


def test_a_hub_base_is_linked_and_is_the_cards_base_model(tmp_path):
    text, card = _card(tmp_path, ROOT / "recipes" / "llama-sft.yaml")
    name = load_recipe(ROOT / "recipes" / "llama-sft.yaml").recipe.model.name
    assert card.data.base_model == name
    assert f"Fine-tuned from [{name}](https://huggingface.co/{name})" in text
