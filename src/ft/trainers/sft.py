"""Supervised fine-tuning: TRL's SFTTrainer on rows ft has already tokenized and masked."""

from __future__ import annotations

from trl import SFTTrainer

from ..plugins import check_signature, resolve
from ..recipe import Recipe
from .metrics import metric_kwargs
from .mixin import FtTrainerMixin


class FtSFTTrainer(FtTrainerMixin, SFTTrainer):
    """SFTTrainer with ft's token accounting (see FtTrainerMixin)."""


def data_args(recipe: Recipe) -> dict:
    """ft hands SFTTrainer tokenized rows (input_ids, labels with the loss mask, length): TRL skips its own
    preparation, except packing, and the length column survives for the length-aware samplers."""
    data = recipe.data
    return {
        "max_length": data.max_length,
        "packing": data.packing,
        "dataset_kwargs": {"skip_prepare_dataset": not data.packing},
        "remove_unused_columns": False,
    }


def resolve_loss(recipe: Recipe, base_dir):
    """The recipe's ``loss: module:function``, checked against the documented signature
    ``compute_loss_func(outputs, labels, num_items_in_batch)``."""
    loss = resolve(recipe.loss, "loss", base_dir)
    check_signature(loss, "loss", ("outputs", "labels", "num_items_in_batch"), positional=True)
    return loss


def trainer_kwargs(ctx) -> dict:
    kwargs = metric_kwargs(ctx.recipe.metrics)
    if ctx.recipe.loss:
        kwargs["compute_loss_func"] = resolve_loss(ctx.recipe, ctx.base_dir)
    return kwargs
