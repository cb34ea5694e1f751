"""KTO: TRL's KTOTrainer on canonical preference rows, unpaired into mixed batches first."""

from __future__ import annotations

from collections.abc import Mapping

from trl import KTOConfig, KTOTrainer
from trl.data_utils import unpair_preference_dataset

from ..recipe import Recipe
from ..recipe.methods import KtoSection
from .build import TrainerInputs, section_kwargs, trainer_kwargs, trl_config
from .mixin import FtTrainerMixin
from .reference import reference_model


class FtKTOTrainer(FtTrainerMixin, KTOTrainer):
    """KTOTrainer with ft's token accounting, fed paired preference data in a mixed order.

    KTO learns from unpaired examples (``prompt``, ``completion``, ``label``). TRL unpairs paired rows itself, with
    ``trl.data_utils.unpair_preference_dataset``, but in blocks of 1,000 rows: every chosen completion of a block
    comes before every rejected one. KTO's default ``train_sampling_strategy`` is ``sequential`` (its KL estimate
    pairs each prompt with a neighbour's completion in a fixed-order batch), so training would see a long run of
    desirable-only batches and then undesirable-only ones. Here the same TRL helper unpairs the rows before
    ``KTOTrainer.__init__`` and the result is shuffled once (``train.seed``), so each batch mixes both labels; TRL
    then finds the data already unpaired.
    """

    def __init__(self, *args, train_dataset=None, eval_dataset=None, **kwargs):
        seed = kwargs["args"].seed
        super().__init__(*args, train_dataset=unpaired(train_dataset, seed),
                         eval_dataset=unpaired(eval_dataset, seed), **kwargs)


def unpaired(dataset, seed: int):
    """Paired preference rows as KTO's unpaired ones, shuffled once; other datasets (None, unpaired) as they are."""
    if dataset is None or not {"chosen", "rejected"} <= set(dataset.column_names):
        return dataset
    return unpair_preference_dataset(dataset).shuffle(seed=seed)


def config(recipe: Recipe, defaults: Mapping[str, object]) -> KTOConfig:
    """As DPO's: TRL tokenizes the rows, with ft's length limit and process count, and the ``kto:`` section's
    settings (``section_kwargs``)."""
    return trl_config(
        KTOConfig, recipe, defaults,
        max_length=recipe.data.max_length,
        dataset_num_proc=recipe.data.num_proc,
        **section_kwargs(recipe.kto or KtoSection()),
    )


def build(recipe: Recipe, inputs: TrainerInputs) -> FtKTOTrainer:
    return FtKTOTrainer(ref_model=reference_model(recipe, inputs.model),
                        **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
