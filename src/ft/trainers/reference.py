"""The reference model of DPO and KTO (TRL's behaviour, read from its source: docs/architecture.md names the release).

- a reference model declared by the method's section (``dpo.ref_model``: ``MethodSection.models``, role
  ``reference``): that model is loaded (``ft.model.loading.load_reference_model``) and passed in.
- a LoRA adapter (``adapter:``): no reference model is passed. TRL wraps the model with the adapter itself and,
  finding ``ref_model is None`` on a PEFT model, keeps ``trainer.ref_model = None`` and computes the reference
  log-probs under ``use_adapter(model, None)``, i.e. ``model.disable_adapter()``: the base model, which is the
  starting model since a fresh LoRA adapter starts as a no-op.
- ``train.precompute_ref_log_probs: true``: none either; TRL computes the reference log-probs with the model
  itself before the first step and keeps no reference model in memory.
- otherwise: a frozen copy of the starting model, made here. Left to itself TRL would reload the reference from
  ``model.config._name_or_path``, which for ``model.init: random`` names a directory with a config and no weights
  (it fails, or would load different weights), and costs a second load otherwise.
"""

from __future__ import annotations

import copy

from ..model.loading import load_reference_model
from ..recipe import Recipe
from ..recipe.methods import models_of
from ..recipe.processes import uses_fsdp


def reference_model(recipe: Recipe, model):
    """The reference model for ``model`` (None: TRL's own handling, as above)."""
    declared = next((extra for extra in models_of(recipe) if extra.role == "reference"), None)
    if declared is not None:
        return load_reference_model(declared.name, recipe.model, fsdp=uses_fsdp(recipe), key=declared.key)
    if recipe.adapter is not None or recipe.train_args.get("precompute_ref_log_probs"):
        return None
    # what trl.experimental.utils.create_reference_model does with no shared layers, without the experimental import
    return copy.deepcopy(model).requires_grad_(False).eval()
