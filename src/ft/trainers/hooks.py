"""The code a recipe plugs into its trainer (``loss:``, ``callbacks:``, the rewards of a method that generates:
``grpo.rewards``, ``optimizer.class``, ``scheduler.class``), resolved once.

``resolve_hooks`` runs at the start of ``ft train``, before any model loads: a missing module, a typo in a name, a
wrong signature or bad arguments is a ``PluginError`` naming the recipe key (exit code 2). What it returns is what
the trainer gets: nothing is imported or constructed a second time. It imports neither TRL nor transformers'
Trainer (callbacks import ``transformers.TrainerCallback`` only when the recipe names some; a reward model is loaded
here, with transformers' auto classes, so that one that is not a reward model stops the run before the policy loads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..recipe import Recipe
from ..recipe.methods import generation_of
from .callbacks import build_callbacks
from .optimization import OPTIMIZER_PROVIDES, SCHEDULER_PROVIDES
from .plugins import check_signature, resolve, resolve_class, search_folders
from .rewards import reward_functions


@dataclass(frozen=True)
class Hooks:
    loss: Callable | None = None  # SFT's compute_loss_func
    callbacks: tuple = ()  # TrainerCallback objects, in recipe order
    rewards: tuple = ()  # GRPO/RLOO reward functions and LearnedRewards, in recipe order (weights: the recipe)
    optimizer_class: type | None = None  # optimizer.class (its kwargs stay in the recipe)
    scheduler_class: type | None = None  # scheduler.class (likewise)


def resolve_hooks(recipe: Recipe, folders: Path | Sequence[Path]) -> Hooks:
    """Import, check and build everything the recipe names. ``folders``: where its modules are looked up, the recipe's
    own folder first, then those of the recipes it ``extends:`` (``LoadedRecipe.folders``; one folder may be given
    alone). They are importable only while each name is imported, after the installed packages, and ``sys.path`` is
    left as it was (``ft.trainers.plugins``)."""
    folders = search_folders(folders)
    generation, opt, sched = generation_of(recipe), recipe.optimizer, recipe.scheduler
    rewards = generation.rewards if generation is not None else ()
    return Hooks(
        loss=resolve_loss(recipe.loss, folders) if recipe.loss else None,
        callbacks=tuple(build_callbacks(recipe, folders)),
        rewards=tuple(reward_functions(rewards, folders, recipe.method, recipe.model.trust_remote_code)),
        optimizer_class=_class(opt.cls, "optimizer.class", folders, "Optimizer", opt.kwargs, OPTIMIZER_PROVIDES),
        scheduler_class=_class(sched.cls, "scheduler.class", folders, "LRScheduler", sched.kwargs,
                               SCHEDULER_PROVIDES),
    )


def _class(reference: str | None, key: str, folders: tuple[Path, ...], base: str, kwargs: dict,
           provides: tuple[str, ...]):
    """A class the recipe names (None when it names none); ``base`` is a torch.optim class it must extend."""
    if reference is None:
        return None
    import torch.optim.lr_scheduler

    base_class = {"Optimizer": torch.optim.Optimizer, "LRScheduler": torch.optim.lr_scheduler.LRScheduler}[base]
    return resolve_class(reference, key, folders, base_class, kwargs, provides)


def resolve_loss(reference: str, folders: Path | Sequence[Path]) -> Callable:
    """``loss: module:function``, checked against the documented signature
    ``compute_loss_func(outputs, labels, num_items_in_batch)``."""
    loss = resolve(reference, "loss", folders, "a loss function")
    check_signature(loss, "loss", ("outputs", "labels", "num_items_in_batch"), positional=True)
    return loss
