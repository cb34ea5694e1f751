"""KTO: TRL's KTOTrainer on canonical preference rows, unpaired into mixed batches first. A vision-language model's
rows carry their prompt's images, read a row at a time (``ft.data.formats.with_images_read``) into TRL's vision
collator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trl import KTOConfig, KTOTrainer
from trl.data_utils import unpair_preference_dataset

from ..data.formats import with_images_read
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
    then finds the data already unpaired. TRL does not unpair rows with images itself at all (it refuses paired vision
    rows, to spare a pass over their images); here the pass reads the rows as stored, paths and not images.
    """

    def __init__(self, *args, train_dataset=None, eval_dataset=None, **kwargs):
        seed = kwargs["args"].seed
        super().__init__(*args, train_dataset=unpaired(train_dataset, seed),
                         eval_dataset=unpaired(eval_dataset, seed), **kwargs)


def unpaired(dataset, seed: int):
    """Paired preference rows as KTO's unpaired ones, shuffled once; other datasets (None, unpaired) as they are.
    A dataset read through a transform (``with_images_read``: its images decoded as rows are taken) is unpaired as
    stored, its images' paths copied to both halves of a pair, and keeps the transform: ``Dataset.map`` would
    otherwise decode every image and write it into the unpaired rows."""
    if dataset is None or not {"chosen", "rejected"} <= set(dataset.column_names):
        return dataset
    transform = dataset.format["format_kwargs"].get("transform") if dataset.format["type"] == "custom" else None
    rows = unpair_preference_dataset(dataset.with_format(None)).shuffle(seed=seed)
    return rows.with_transform(transform) if transform is not None else rows


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
    inputs = replace(inputs, train_dataset=with_images_read(inputs.train_dataset, recipe.data.image),
                     eval_dataset=with_images_read(inputs.eval_dataset, recipe.data.image))
    return FtKTOTrainer(ref_model=reference_model(recipe, inputs.model),
                        **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
