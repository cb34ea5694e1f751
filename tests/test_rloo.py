"""``method: rloo``: TRL's RLOOTrainer through the same ``rewards`` and generation settings as GRPO (its section is the
same, with RLOO's own TRL defaults), generation-batched and stopped only at round ends like GRPO."""

from __future__ import annotations

import json

import pytest
from conftest import DATA, built_trainer, logged_rewards, run_ft


def _recipe(output_dir, model, **train) -> dict:
    return {
        "method": "rloo",
        "model": {"name": str(model), "init": "pretrained"},
        "data": {"train": [{"path": str(DATA / "prompts.jsonl"), "format": "prompt"}]},
        "optimizer": {"lr": 1.0e-3},
        "rloo": {"num_generations": 8, "max_completion_length": 8, "steps_per_generation": 1, "temperature": 1.0,
                 "beta": 0.0, "rewards": [{"name": "format", "args": {"pattern": r"\d*[02468]"}}]},
        "train": {"output_dir": str(output_dir), "max_steps": 4, "per_device_train_batch_size": 32,
                  "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0, **train},
    }


@pytest.mark.slow
def test_rloo_raises_the_reward_of_the_sft_model(write_recipe, tmp_path, sft_model):
    """As GRPO's test: the SFT model's sampled answers are even about half the time; rewarded for even answers
    alone, RLOO's leave-one-out advantages push the policy to them. Measured on 2 cores (seed 0): see the asserts."""
    recipe = _recipe(tmp_path / "out", sft_model, max_steps=30, save_strategy="steps", save_steps=30)
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = logged_rewards(tmp_path / "out" / "checkpoint-30")
    assert len(rewards) == 30
    assert sum(rewards[:5]) / 5 < 0.7 and sum(rewards[-10:]) / 10 > 0.85, rewards
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["headline"]["reward"]["last"] > summary["headline"]["reward"]["first"]


def test_rloo_trainer_takes_the_sections_settings_and_rounds(write_recipe, tmp_path, sft_model):
    from trl import RLOOTrainer

    recipe = _recipe(tmp_path / "out", sft_model, gradient_accumulation_steps=2)
    recipe["rloo"].update(steps_per_generation=4, beta=0.2)
    trainer, _ = built_trainer(write_recipe(recipe))
    assert isinstance(trainer, RLOOTrainer) and trainer.args.num_generations == 8 and trainer.args.beta == 0.2
    assert trainer.args.reward_weights == [1.0] and trainer.ref_model is not None
    assert [trainer.ft_stop_point(step) for step in (1, 2, 3, 4)] == [False, True, False, True]
