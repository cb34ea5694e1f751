"""Preference methods: TRL's DPOTrainer, KTOTrainer and (experimental) ORPOTrainer on canonical
``prompt``/``chosen``/``rejected`` rows, which each trainer tokenizes its own way.

The reference model of DPO and KTO (TRL 1.16 behaviour, read from its source):

- ``dpo.ref_model`` set: that model is loaded (``ft.models.load_reference_model``) and passed in.
- a LoRA adapter (``adapter:``): no reference model is passed. TRL wraps the model with the adapter
  itself and, finding ``ref_model is None`` on a PEFT model, keeps ``trainer.ref_model = None`` and
  computes the reference log-probs under ``use_adapter(model, None)``, i.e. ``model.disable_adapter()``:
  the base model, which is the starting model since a fresh LoRA adapter starts as a no-op.
- otherwise: a frozen copy of the starting model, made here. Left to itself TRL would reload the
  reference from ``model.config._name_or_path``, which for ``model.init: random`` names a directory with
  a config and no weights (it fails, or would load different weights), and costs a second load otherwise.
- ``train.precompute_ref_log_probs: true``: no copy either; TRL computes the reference log-probs with
  the model itself before the first step and keeps no reference model in memory.

ORPO has no reference model.
"""

from __future__ import annotations

import copy

from trl import DPOTrainer, KTOTrainer
from trl.data_utils import unpair_preference_dataset
from trl.experimental.orpo import ORPOTrainer

from ..models import load_reference_model
from ..recipe import Recipe
from .mixin import FtTrainerMixin


class FtDPOTrainer(FtTrainerMixin, DPOTrainer):
    """DPOTrainer with ft's token accounting (see FtTrainerMixin)."""


class FtKTOTrainer(FtTrainerMixin, KTOTrainer):
    """KTOTrainer with ft's token accounting, fed paired preference data in a mixed order.

    KTO learns from unpaired examples (``prompt``, ``completion``, ``label``). TRL unpairs paired rows
    itself, with ``trl.data_utils.unpair_preference_dataset``, but in blocks of 1,000 rows: every chosen
    completion of a block comes before every rejected one. KTO's default ``train_sampling_strategy`` is
    ``sequential`` (its KL estimate pairs each prompt with a neighbour's completion in a fixed-order batch),
    so training would see a long run of desirable-only batches and then undesirable-only ones. Here the
    same TRL helper unpairs the rows before ``KTOTrainer.__init__`` and the result is shuffled once
    (``train.seed``), so each batch mixes both labels; TRL then finds the data already unpaired.
    """

    def __init__(self, *args, train_dataset=None, eval_dataset=None, **kwargs):
        seed = kwargs["args"].seed
        super().__init__(*args, train_dataset=_unpaired(train_dataset, seed),
                         eval_dataset=_unpaired(eval_dataset, seed), **kwargs)


class FtORPOTrainer(FtTrainerMixin, ORPOTrainer):
    """ORPOTrainer (trl.experimental) with ft's hooks. Its batches carry ``chosen_input_ids``/
    ``rejected_input_ids`` rather than ``input_ids``, so the mixin's token counts stay empty."""


def _unpaired(dataset, seed: int):
    if dataset is None or not {"chosen", "rejected"} <= set(dataset.column_names):
        return dataset
    return unpair_preference_dataset(dataset).shuffle(seed=seed)


def data_args(recipe: Recipe) -> dict:
    """The data settings of the preference configs: TRL tokenizes these rows, so ft's length limit and
    process count go to it. (``data.truncation``/``train_on`` do not apply: TRL truncates as its
    ``truncation_mode`` says and puts the loss on completions.)"""
    data = recipe.data
    args = {"max_length": data.max_length, "dataset_num_proc": data.num_proc}
    if recipe.method == "orpo":
        # ORPOTrainer needs its paired columns kept; it forces this itself, with a warning asking for it
        args["remove_unused_columns"] = False
    return args


def reference_model(ctx):
    """DPO/KTO's reference model as explained in the module docstring (None: TRL's own handling)."""
    recipe = ctx.recipe
    explicit = recipe.dpo.ref_model if recipe.method == "dpo" and recipe.dpo is not None else None
    if explicit:
        return load_reference_model(explicit, recipe.model)
    if recipe.adapter is not None or recipe.train_args.get("precompute_ref_log_probs"):
        return None
    # what trl.experimental.utils.create_reference_model does with no shared layers, without the experimental import
    return copy.deepcopy(ctx.model).requires_grad_(False).eval()


def dpo_kwargs(ctx) -> dict:
    return {"ref_model": reference_model(ctx)}


def kto_kwargs(ctx) -> dict:
    return {"ref_model": reference_model(ctx)}


def orpo_kwargs(ctx) -> dict:
    return {}
