"""Supervised fine-tuning: TRL's SFTTrainer on rows ft has already tokenized and masked."""

from __future__ import annotations

from trl import SFTTrainer

from ..plugins import check_signature, resolve
from ..recipe import Recipe
from .metrics import metric_kwargs
from .mixin import FtTrainerMixin


class FtSFTTrainer(FtTrainerMixin, SFTTrainer):
    """SFTTrainer with ft's token accounting (see FtTrainerMixin) and a one-pass custom loss.

    A recipe's ``loss:`` is Trainer's ``compute_loss_func(outputs, labels, num_items_in_batch)``. It is called
    here after a single forward pass: TRL 1.16's own path for it runs a second, no-grad forward for its metrics
    (and is deprecated). Setting ``self.compute_loss_func`` keeps Trainer's documented behaviour: it counts
    ``num_items_in_batch`` over the whole accumulated batch and does not rescale the loss for gradient
    accumulation, because the function normalises by that count itself. At evaluation Trainer passes
    ``num_items_in_batch=None``; ft passes the batch's own count of prediction targets instead, so the same
    normalisation rule holds there.
    """

    def __init__(self, *args, compute_loss_func=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.compute_loss_func = compute_loss_func

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.compute_loss_func is None:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        labels = inputs["labels"]
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
        if num_items_in_batch is None:
            num_items_in_batch = (labels[..., 1:] != -100).sum()  # targets after the causal shift
        loss = self.compute_loss_func(outputs, labels, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss


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
