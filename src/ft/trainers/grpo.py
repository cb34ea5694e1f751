"""GRPO: TRL's GRPOTrainer on canonical prompt rows (``prompt`` plus the row's other fields), scored by the
recipe's rewards (``ft.trainers.rewards``). TRL tokenizes, generates and batches; ft adds its token accounting and
stops at the end of generation rounds (``ft.trainers.generation``). A vision-language model's prompts carry their
images (``images``), read a row at a time (``ft.data.formats.with_images_read``): TRL puts them into the prompts it
generates from and computes the loss on, and hands them to the reward functions (their ``images`` argument)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trl import GRPOConfig, GRPOTrainer

from ..data.formats import check_every_prompt_sees, with_images_read
from ..recipe import Recipe
from .build import TrainerInputs, trainer_kwargs, trl_config
from .generation import GenerationRounds, generation_kwargs, reward_kwargs, snapshot_reference
from .mixin import FtTrainerMixin


class FtGRPOTrainer(GenerationRounds, FtTrainerMixin, GRPOTrainer):
    """GRPOTrainer with ft's token accounting (FtTrainerMixin) and generation rounds (GenerationRounds)."""


def config(recipe: Recipe, defaults: Mapping[str, object]) -> GRPOConfig:
    """The ``grpo:`` section, its ``loss_type`` among its settings (``generation_kwargs``)."""
    return trl_config(GRPOConfig, recipe, defaults, **generation_kwargs(recipe))


def build(recipe: Recipe, inputs: TrainerInputs) -> FtGRPOTrainer:
    check_every_prompt_sees(inputs.train_dataset, "train", GRPOTrainer.__name__)
    check_every_prompt_sees(inputs.eval_dataset, "eval", GRPOTrainer.__name__)
    inputs = replace(inputs, train_dataset=with_images_read(inputs.train_dataset, recipe.data.image),
                     eval_dataset=with_images_read(inputs.eval_dataset, recipe.data.image))
    return FtGRPOTrainer(**reward_kwargs(inputs), reference_snapshot=snapshot_reference(recipe),
                         **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
