"""Reward model: TRL's RewardTrainer on canonical ``prompt``/``chosen``/``rejected`` rows (the prompt is put before
each answer), training a sequence classifier with one score to rank chosen above rejected. TRL tokenizes; it logs
the share of pairs ranked right (``accuracy``) and the mean score gap (``margin``), on held-out pairs too when the
recipe has ``data.eval``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from trl import RewardConfig, RewardTrainer

from ..data import DataError
from ..model.loading import text_tokenizer
from ..recipe import Recipe
from .build import TrainerInputs, trainer_kwargs, trl_config
from .mixin import FtTrainerMixin


class FtRewardTrainer(FtTrainerMixin, RewardTrainer):
    """RewardTrainer with ft's token accounting (see FtTrainerMixin): its batches put chosen and rejected answers
    through the model together as ``input_ids``."""


def config(recipe: Recipe, defaults: Mapping[str, object]) -> RewardConfig:
    """ft's length limit and process count go to TRL, which tokenizes (and drops pairs longer than the limit: ``build``
    says how many)."""
    return trl_config(RewardConfig, recipe, defaults, max_length=recipe.data.max_length,
                      dataset_num_proc=recipe.data.num_proc)


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(recipe: Recipe, inputs: TrainerInputs, say: Callable[[str], None] = _warn) -> FtRewardTrainer:
    model, tokenizer = inputs.model, text_tokenizer(inputs.processing_class)
    if model.config.pad_token_id is None:  # the score is read at the last token before padding
        model.config.pad_token_id = tokenizer.pad_token_id
    trainer = FtRewardTrainer(**trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
    for name, given, kept in (("data.train", inputs.train_dataset, trainer.train_dataset),
                              ("data.eval", inputs.eval_dataset, trainer.eval_dataset)):
        if given is not None and kept is not None and len(given) and not len(kept):
            raise DataError(f"{name}: every one of its {len(given)} pairs has a chosen or rejected text longer than "
                            f"data.max_length ({recipe.data.max_length} tokens), and TRL's RewardTrainer leaves such "
                            "pairs out; raise data.max_length.")
        if given is not None and kept is not None and len(kept) < len(given):
            say(f"warning: {name}: {len(given) - len(kept)} of {len(given)} pairs have a chosen or rejected text "
                f"longer than data.max_length ({recipe.data.max_length} tokens) and were left out (TRL's "
                "RewardTrainer drops them); raise data.max_length to keep them.")
    return trainer
