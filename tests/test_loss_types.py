"""Every DPO and GRPO ``loss_type`` the installed TRL documents trains two steps on the CPU with that loss in the
config TRL's trainer runs (finite losses, weights moved), or is refused when the recipe is read, before any model
loads, with the reason. The values come from TRL's own help text (``documented_values``, recorded in the generated
field table), so a TRL that adds one adds it here.

Both start from the quickstart model trained half way (conftest's ``sft_model``): its answers are right about half
the time, so GRPO's groups of answers earn different rewards and every loss has a gradient."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DATA, built_trainer, tiny_sft

from ft.recipe import RecipeError, load_recipe
from ft.recipe.methods import documented_values

DPO_LOSSES = documented_values("dpo", "loss_type")
GRPO_LOSSES = documented_values("grpo", "loss_type")
SEQUENCE_LEVEL = {"luspo"}  # needs train.importance_sampling_level: sequence (ft.recipe.rules)


def _recipe(sft_model, tmp_path, method: str, section: dict, **train) -> dict:
    recipe = tiny_sft(tmp_path / "out", max_steps=2, logging_steps=1, **train)
    recipe.update(method=method, model={"name": str(sft_model), "init": "pretrained"}, optimizer={"lr": 1.0e-3},
                  **{method: section})
    data = ("preference.jsonl", "preference") if method == "dpo" else ("prompts.jsonl", "prompt")
    recipe["data"] = {"train": [{"path": str(DATA / data[0]), "format": data[1]}], "max_length": 48}
    return recipe


def _trains(write_recipe, recipe: dict, expected_loss) -> list[float]:
    trainer, _ = built_trainer(write_recipe(recipe))
    assert trainer.args.loss_type == expected_loss  # what the trainer computes with, not only what the recipe says
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), losses
    assert any(not torch.equal(p, before[name]) for name, p in trainer.model.named_parameters() if name in before)
    return losses


def test_trl_documents_the_loss_types():
    assert {"sigmoid", "ipo", "hinge", "robust", "bco_pair", "apo_zero", "discopop"} <= set(DPO_LOSSES)
    assert {"grpo", "dr_grpo", "dapo", "bnpo"} <= set(GRPO_LOSSES)


NEEDS = {"exo_pair": {"label_smoothing": 1.0e-3}}  # the EXO paper's value; without it the recipe is refused


@pytest.mark.parametrize("loss", DPO_LOSSES)
def test_every_dpo_loss_type_trains(sft_model, write_recipe, tmp_path, loss):
    recipe = _recipe(sft_model, tmp_path, "dpo", {"beta": 0.1, "loss_type": [loss]}, per_device_train_batch_size=4,
                     **NEEDS.get(loss, {}))
    _trains(write_recipe, recipe, [loss])


@pytest.mark.parametrize("loss", GRPO_LOSSES)
def test_every_grpo_loss_type_trains(sft_model, write_recipe, tmp_path, loss):
    level = {"importance_sampling_level": "sequence"} if loss in SEQUENCE_LEVEL else {}
    section = {"num_generations": 4, "max_completion_length": 8, "steps_per_generation": 1, "beta": 0.0,
               "loss_type": loss, "rewards": [{"name": "numeric_match"}]}
    recipe = _recipe(sft_model, tmp_path, "grpo", section, per_device_train_batch_size=16, **level)
    _trains(write_recipe, recipe, loss)


def _refusal(write_recipe, recipe: dict) -> str:
    with pytest.raises(RecipeError) as raised:
        load_recipe(write_recipe(recipe))
    return str(raised.value)


def test_an_unknown_or_mismatched_loss_type_is_refused_before_loading(sft_model, write_recipe, tmp_path):
    dpo = _recipe(sft_model, tmp_path, "dpo", {"loss_type": ["sigmoid", "ipp"]})
    message = _refusal(write_recipe, dpo)
    assert "dpo.loss_type" in message and "'ipp' is not a dpo loss_type" in message and "Did you mean 'ipo'" in message
    dpo["dpo"]["loss_type"] = ["exo_pair"]
    assert "label_smoothing` above 0" in _refusal(write_recipe, dpo)
    dpo["dpo"]["loss_type"] = ["aot"]
    dpo["train"]["f_divergence_type"] = "js_divergence"
    assert "train.f_divergence_type" in _refusal(write_recipe, dpo)
    grpo = _recipe(sft_model, tmp_path, "grpo", {"loss_type": "luspo", "rewards": [{"name": "numeric_match"}]})
    assert "importance_sampling_level: sequence" in _refusal(write_recipe, grpo)
    grpo["grpo"]["loss_type"] = "dapo"
    grpo["train"]["importance_sampling_level"] = "sequence"
    assert "importance_sampling_level: token" in _refusal(write_recipe, grpo)
    grpo["train"].pop("importance_sampling_level")
    grpo["train"]["loss_type"] = "bnpo"  # one home: the grpo section
    assert "grpo.loss_type" in _refusal(write_recipe, grpo)
