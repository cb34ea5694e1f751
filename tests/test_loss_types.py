"""Every DPO and GRPO ``loss_type`` the installed TRL documents is the loss ft's trainer computes, or is refused when
the recipe is read, before any model loads, with the reason. The values come from TRL's own help text
(``documented_values``, recorded in the generated field table), so a TRL that adds one adds it here.

For each type, the trainer ``ft train`` builds for a recipe naming it computes, on one fixed batch, the loss that a
TRL trainer built directly (TRL's own config, naming the type, with the same model and batch) computes, and it has a
gradient; and the types' losses all differ from one another, so a trainer that computed one loss whatever the type
named would match TRL's for that type alone. Both start from the quickstart model trained half way (conftest's
``sft_model``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import ASSETS, DATA, built_trainer, tiny_sft

from ft.recipe import RecipeError, load_recipe
from ft.recipe.methods import documented_values

DPO_LOSSES = documented_values("dpo", "loss_type")
GRPO_LOSSES = documented_values("grpo", "loss_type")
SEQUENCE_LEVEL = {"luspo"}  # needs train.importance_sampling_level: sequence (ft.recipe.rules)


def _recipe(model: str, tmp_path, method: str, section: dict, data: Path | None = None, **train) -> dict:
    recipe = tiny_sft(tmp_path / "out", max_steps=2, logging_steps=1, **train)
    recipe.update(method=method, model={"name": model, "init": "pretrained"}, optimizer={"lr": 1.0e-3},
                  **{method: section})
    file, form = ("preference.jsonl", "preference") if method == "dpo" else ("prompts.jsonl", "prompt")
    recipe["data"] = {"train": [{"path": str(data or DATA / file), "format": form}], "max_length": 48}
    return recipe


def _first_rows(tmp_path, name: str, count: int) -> list[dict]:
    """The first ``count`` rows of the arithmetic data file ``name``, also written to tmp_path/name (a few rows:
    TRL tokenizes the whole file when the trainer is built, and one batch is all these tests use)."""
    lines = (DATA / name).read_text().splitlines()[:count]
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    return [json.loads(line) for line in lines]


def _has_gradient(loss: torch.Tensor, model) -> None:
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)


def _all_differ(losses: dict[str, float]) -> None:
    """No two loss types give the same loss (to 1e-3; the closest two measured about 5e-3 apart)."""
    ranked = sorted(losses.items(), key=lambda item: item[1])
    close = [(a, b) for a, b in zip(ranked, ranked[1:], strict=False) if b[1] - a[1] < 1.0e-3]
    assert not close, close


def test_trl_documents_the_loss_types():
    assert {"sigmoid", "ipo", "hinge", "robust", "bco_pair", "apo_zero", "discopop"} <= set(DPO_LOSSES)
    assert {"grpo", "dr_grpo", "dapo", "bnpo"} <= set(GRPO_LOSSES)


# label smoothing: EXO's paper value (without it the recipe is refused), and one for robust DPO, which without it is
# the sigmoid loss exactly
NEEDS = {"exo_pair": {"label_smoothing": 1.0e-3}, "robust": {"label_smoothing": 0.1}}


def test_each_dpo_loss_type_is_trls_loss_of_that_type(sft_model, write_recipe, tmp_path):
    """The policy is moved away from the reference (noise on its weights, as training would move it) before the loss:
    at the start the two are one model, every log-ratio is 0, and most types then give one number whatever the batch
    (sigmoid, robust and AOT all log 2)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    rows = _first_rows(tmp_path, "preference.jsonl", 8)
    losses = {}
    for loss in DPO_LOSSES:
        section, train = {"beta": 0.1, "loss_type": [loss]}, NEEDS.get(loss, {})
        recipe = _recipe(str(sft_model), tmp_path, "dpo", section, tmp_path / "preference.jsonl",
                         per_device_train_batch_size=4, **train)
        trainer, _ = built_trainer(write_recipe(recipe))
        noise = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in trainer.model.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=noise))
        batch = next(iter(trainer.get_train_dataloader()))
        ours = trainer.compute_loss(trainer.model, batch)
        trl = DPOTrainer(model=trainer.model, ref_model=trainer.ref_model, train_dataset=Dataset.from_list(rows[:2]),
                         processing_class=trainer.processing_class,
                         args=DPOConfig(str(tmp_path / "trl"), bf16=False, report_to="none", **section, **train))
        with torch.no_grad():
            theirs = trl.compute_loss(trl.model, batch)
        assert math.isfinite(ours.item()) and ours.item() == pytest.approx(theirs.item(), rel=1.0e-6), loss
        _has_gradient(ours, trainer.model)
        losses[loss] = ours.item()
    _all_differ(losses)


def _grpo_round(tokenizer) -> list[dict]:
    """One generation round as TRL's GRPOTrainer hands it to the loss, in its two micro-batches: four completions of
    each of the first two prompts, of 1 to 5 tokens (10 in the first micro-batch, 17 in the second: DAPO divides by
    the round's tokens, BNPO by each micro-batch's, Dr. GRPO by a fixed number), with advantages of both signs that
    do not cancel out (GRPO's mean over completions is not SAPO's, nor a sum over tokens)."""
    rows = [json.loads(line) for line in (DATA / "prompts.jsonl").read_text().splitlines()[:2]]
    lengths, advantages = [[1, 2, 3, 4], [5, 5, 3, 4]], [[1.5, -0.5, 0.5, -1.0], [-1.5, 1.0, 0.25, 0.75]]
    total = sum(map(sum, lengths))
    batches = []
    for row, counts, values in zip(rows, lengths, advantages, strict=True):
        prompt = tokenizer(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False).input_ids
        answer = [*tokenizer(f"{row['answer']} is the answer", add_special_tokens=False).input_ids,
                  tokenizer.eos_token_id]
        completion = torch.tensor([answer[:count] + [tokenizer.pad_token_id] * (5 - count) for count in counts])
        mask = (torch.arange(5) < torch.tensor(counts)[:, None]).long()
        batches.append({"prompt_ids": torch.tensor([prompt] * 4), "prompt_mask": torch.ones(4, len(prompt)).long(),
                        "completion_ids": completion, "completion_mask": mask, "advantages": torch.tensor(values),
                        "num_items_in_batch": torch.tensor(total)})
    return batches


def test_each_grpo_loss_type_is_trls_loss_of_that_type(sft_model, write_recipe, tmp_path):
    """The loss of a whole optimizer step: the two accumulated micro-batches of one generation round (each divided by
    the accumulation steps, as the Trainer's loop has it), on policy (no older log-probs in the batch: every ratio is
    1, and the types differ in how they weigh and normalise the advantages)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = _first_rows(tmp_path, "prompts.jsonl", 8)
    settings = {"num_generations": 4, "max_completion_length": 8, "steps_per_generation": 2, "beta": 0.0}
    losses, round_ = {}, None
    for loss in GRPO_LOSSES:
        train = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
                 **({"importance_sampling_level": "sequence"} if loss in SEQUENCE_LEVEL else {})}
        section = {**settings, "loss_type": loss, "rewards": [{"name": "numeric_match"}]}
        trainer, _ = built_trainer(write_recipe(_recipe(str(sft_model), tmp_path, "grpo", section,
                                                        tmp_path / "prompts.jsonl", **train)))
        trl = GRPOTrainer(model=trainer.model, reward_funcs=trainer.reward_funcs, train_dataset=Dataset.from_list(rows),
                          processing_class=trainer.processing_class,
                          args=GRPOConfig(str(tmp_path / "trl"), bf16=False, report_to="none", loss_type=loss,
                                          **settings, **train))
        round_ = round_ or _grpo_round(trainer.processing_class)
        trainer.model.train()
        total = 0.0
        for one in (trainer, trl):  # the training loop's setting, read by the loss
            one.current_gradient_accumulation_steps = one.args.gradient_accumulation_steps
        for batch in round_:
            ours = trainer.compute_loss(trainer.model, batch)
            with torch.no_grad():
                theirs = trl.compute_loss(trl.model, batch)
            assert math.isfinite(ours.item()) and ours.item() == pytest.approx(theirs.item(), rel=1.0e-6), loss
            _has_gradient(ours, trainer.model)
            total += ours.item()
        losses[loss] = total
    _all_differ(losses)


def _refusal(write_recipe, recipe: dict) -> str:
    with pytest.raises(RecipeError) as raised:
        load_recipe(write_recipe(recipe))
    return str(raised.value)


def test_an_unknown_or_mismatched_loss_type_is_refused_before_loading(write_recipe, tmp_path):
    dpo = _recipe(str(ASSETS), tmp_path, "dpo", {"loss_type": ["sigmoid", "ipp"]})
    message = _refusal(write_recipe, dpo)
    assert "dpo.loss_type" in message and "'ipp' is not a dpo loss_type" in message and "Did you mean 'ipo'" in message
    dpo["dpo"]["loss_type"] = ["exo_pair"]
    assert "label_smoothing` above 0" in _refusal(write_recipe, dpo)
    dpo["dpo"]["loss_type"] = ["aot"]
    dpo["train"]["f_divergence_type"] = "js_divergence"
    assert "train.f_divergence_type" in _refusal(write_recipe, dpo)
    grpo = _recipe(str(ASSETS), tmp_path, "grpo", {"loss_type": "luspo", "rewards": [{"name": "numeric_match"}]})
    assert "importance_sampling_level: sequence" in _refusal(write_recipe, grpo)
    grpo["grpo"]["loss_type"] = "dapo"
    grpo["train"]["importance_sampling_level"] = "sequence"
    assert "importance_sampling_level: token" in _refusal(write_recipe, grpo)
    grpo["train"].pop("importance_sampling_level")
    grpo["train"]["loss_type"] = "bnpo"  # one home: the grpo section
    assert "grpo.loss_type" in _refusal(write_recipe, grpo)
