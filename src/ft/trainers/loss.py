"""A recipe's ``loss: module:function``, resolved and checked without importing TRL (so a typo fails fast)."""

from __future__ import annotations

from ..plugins import check_signature, resolve
from ..recipe import Recipe


def resolve_loss(recipe: Recipe, base_dir):
    """The recipe's ``loss: module:function``, checked against the documented signature
    ``compute_loss_func(outputs, labels, num_items_in_batch)``."""
    loss = resolve(recipe.loss, "loss", base_dir)
    check_signature(loss, "loss", ("outputs", "labels", "num_items_in_batch"), positional=True)
    return loss
