"""RLOO: TRL's RLOOTrainer on canonical prompt rows, scored by the recipe's rewards as GRPO is. Each completion's
advantage is its reward minus the mean reward of the other completions of the same prompt (the leave-one-out
baseline). TRL tokenizes, generates and batches; ft adds what it adds to GRPO (``ft.trainers.generation``), and a
vision-language model's prompt images reach it as they reach GRPO."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trl import RLOOConfig, RLOOTrainer

from ..data.formats import check_every_prompt_sees, with_images_read
from ..recipe import Recipe
from .build import TrainerInputs, trainer_kwargs, trl_config
from .generation import GenerationRounds, generation_kwargs, reward_kwargs, snapshot_reference
from .mixin import FtTrainerMixin


class FtRLOOTrainer(GenerationRounds, FtTrainerMixin, RLOOTrainer):
    """RLOOTrainer with ft's token accounting (FtTrainerMixin) and generation rounds (GenerationRounds)."""


def config(recipe: Recipe, defaults: Mapping[str, object]) -> RLOOConfig:
    """The ``rloo:`` section (``generation_kwargs``)."""
    return trl_config(RLOOConfig, recipe, defaults, **generation_kwargs(recipe))


def build(recipe: Recipe, inputs: TrainerInputs) -> FtRLOOTrainer:
    check_every_prompt_sees(inputs.train_dataset, "train", RLOOTrainer.__name__)
    check_every_prompt_sees(inputs.eval_dataset, "eval", RLOOTrainer.__name__)
    inputs = replace(inputs, train_dataset=with_images_read(inputs.train_dataset, recipe.data.image),
                     eval_dataset=with_images_read(inputs.eval_dataset, recipe.data.image))
    return FtRLOOTrainer(**reward_kwargs(inputs), reference_snapshot=snapshot_reference(recipe),
                         **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
