"""GRPO: TRL's GRPOTrainer on canonical prompt rows (``prompt`` plus the row's other fields), scored by the
recipe's rewards (``ft.trainers.rewards``). TRL tokenizes, generates and batches; ft adds its token accounting and
stops at the end of generation rounds (``ft.trainers.generation``)."""

from __future__ import annotations

from collections.abc import Mapping

from trl import GRPOConfig, GRPOTrainer

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
    return FtGRPOTrainer(**reward_kwargs(inputs), reference_snapshot=snapshot_reference(recipe),
                         **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
