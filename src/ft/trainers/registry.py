"""Registry: method name → ft's trainer subclass, its TRL config and what else its constructor needs.

Entries name their classes and functions as ``"module:attribute"`` strings, imported only when that
method trains (TRL's trainers are heavy imports). Adding a method is one entry here plus its module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from ..models import lora_config
from ..recipe import Recipe
from .callbacks import build_callbacks
from .config import method_section_args, optimizer_args, scheduler_args
from .loss import resolve_loss


def load(reference: str):
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class BuildContext:
    """What a method's constructor-kwargs function may use besides the recipe."""

    recipe: Recipe
    model: object
    tokenizer: object
    base_dir: Path


@dataclass(frozen=True)
class TrainerSpec:
    config: str  # the TRL config class
    trainer: str  # ft's subclass of the TRL trainer
    data_args: str  # (recipe) -> config kwargs for the data settings
    trainer_kwargs: str  # (BuildContext) -> extra constructor kwargs (reference model, rewards, loss, metrics)


TRAINERS: dict[str, TrainerSpec] = {
    "sft": TrainerSpec("trl:SFTConfig", "ft.trainers.sft:FtSFTTrainer", "ft.trainers.sft:data_args",
                       "ft.trainers.sft:trainer_kwargs"),
    "dpo": TrainerSpec("trl:DPOConfig", "ft.trainers.preference:FtDPOTrainer",
                       "ft.trainers.preference:data_args", "ft.trainers.preference:dpo_kwargs"),
    "kto": TrainerSpec("trl:KTOConfig", "ft.trainers.preference:FtKTOTrainer",
                       "ft.trainers.preference:data_args", "ft.trainers.preference:kto_kwargs"),
    "orpo": TrainerSpec("trl.experimental.orpo:ORPOConfig", "ft.trainers.preference:FtORPOTrainer",
                        "ft.trainers.preference:data_args", "ft.trainers.preference:orpo_kwargs"),
    "grpo": TrainerSpec("trl:GRPOConfig", "ft.trainers.grpo:FtGRPOTrainer", "ft.trainers.grpo:data_args",
                        "ft.trainers.grpo:trainer_kwargs"),
}


def check_plugins(recipe: Recipe, base_dir: Path) -> None:
    """Import and check all user code the recipe names (loss, callbacks, rewards) before any model loads.

    Raises ``ft.plugins.PluginError``.
    """
    if recipe.loss:
        resolve_loss(recipe, base_dir)
    build_callbacks(recipe, base_dir)
    if recipe.method == "grpo":
        load("ft.rewards:reward_functions")(recipe, base_dir)


def build_trainer(recipe: Recipe, *, model, tokenizer, train_dataset, eval_dataset, defaults: dict,
                  base_dir: Path = Path("."), callbacks=()):
    """The method's trainer with its config built from the recipe; ``defaults`` fill unset keys only.

    Raises ``ft.plugins.PluginError`` (a recipe problem) when user code named in the recipe is unusable.
    """
    spec = TRAINERS[recipe.method]
    kwargs = {**defaults, **optimizer_args(recipe), **scheduler_args(recipe), **load(spec.data_args)(recipe),
              **method_section_args(recipe), **recipe.train_args}
    config = load(spec.config)(**kwargs)
    extra = load(spec.trainer_kwargs)(BuildContext(recipe, model, tokenizer, base_dir))
    return load(spec.trainer)(
        model=model,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=lora_config(recipe.adapter),
        callbacks=[*build_callbacks(recipe, base_dir), *callbacks],
        **extra,
    )
