"""DPO: TRL's DPOTrainer on canonical ``prompt``/``chosen``/``rejected`` rows, which TRL tokenizes. A
vision-language model's rows carry their prompt's images (``images``), read a row at a time
(``ft.data.formats.with_images_read``) into TRL's vision collator, which processes each batch's images with the
model's processor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trl import DPOConfig, DPOTrainer

from ..data.formats import with_images_read
from ..recipe import Recipe
from ..recipe.methods import DpoSection
from .build import TrainerInputs, section_kwargs, trainer_kwargs, trl_config
from .mixin import FtTrainerMixin
from .reference import reference_model


class FtDPOTrainer(FtTrainerMixin, DPOTrainer):
    """DPOTrainer with ft's token accounting (see FtTrainerMixin)."""


def config(recipe: Recipe, defaults: Mapping[str, object]) -> DPOConfig:
    """TRL tokenizes preference rows, so ft's length limit and process count go to it (``data.truncation`` and
    ``data.train_on`` do not apply: TRL truncates by its ``truncation_mode`` and puts the loss on completions). The
    ``dpo:`` section's settings (``section_kwargs``) are its own or, left out, TRL's defaults."""
    return trl_config(
        DPOConfig, recipe, defaults,
        max_length=recipe.data.max_length,
        dataset_num_proc=recipe.data.num_proc,
        **section_kwargs(recipe.dpo or DpoSection()),
    )


def build(recipe: Recipe, inputs: TrainerInputs) -> FtDPOTrainer:
    inputs = replace(inputs, train_dataset=with_images_read(inputs.train_dataset, recipe.data.image),
                     eval_dataset=with_images_read(inputs.eval_dataset, recipe.data.image))
    return FtDPOTrainer(ref_model=reference_model(recipe, inputs.model),
                        **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
