"""ORPO: TRL's (experimental) ORPOTrainer on canonical preference rows. ORPO has no reference model."""

from __future__ import annotations

from collections.abc import Mapping

from trl.experimental.orpo import ORPOConfig, ORPOTrainer

from ..recipe import Recipe
from ..recipe.methods import OrpoSection
from .build import TrainerInputs, section_kwargs, trainer_kwargs, trl_config
from .mixin import FtTrainerMixin


class FtORPOTrainer(FtTrainerMixin, ORPOTrainer):
    """ORPOTrainer with ft's hooks. Its batches carry ``chosen_input_ids``/``rejected_input_ids`` rather than
    ``input_ids``, so the mixin's token counts stay empty."""


def config(recipe: Recipe, defaults: Mapping[str, object]) -> ORPOConfig:
    """As DPO's, and the paired columns are kept (ORPOTrainer would force ``remove_unused_columns=False`` itself,
    with a warning asking for it)."""
    return trl_config(
        ORPOConfig, recipe, defaults,
        max_length=recipe.data.max_length,
        dataset_num_proc=recipe.data.num_proc,
        **section_kwargs(recipe.orpo or OrpoSection()),
        remove_unused_columns=False,
    )


def build(recipe: Recipe, inputs: TrainerInputs) -> FtORPOTrainer:
    return FtORPOTrainer(**trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
