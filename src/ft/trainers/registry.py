"""Registry: method name → how to build its trainer. Adding a method is one entry here."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ..recipe import Recipe
from .config import method_section_args, optimizer_args, scheduler_args, sft_data_args


@dataclass(frozen=True)
class TrainerSpec:
    config: str  # "module:Class" of the TRL config
    trainer: str  # "module:Class" of the trainer
    data_args: Callable[[Recipe], dict] = field(default=lambda recipe: {})

    def load(self, ref: str):
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module), name)


TRAINERS: dict[str, TrainerSpec] = {
    "sft": TrainerSpec("trl:SFTConfig", "trl:SFTTrainer", sft_data_args),
}


def build_trainer(recipe: Recipe, *, model, tokenizer, train_dataset, eval_dataset, defaults: dict,
                  callbacks=()):
    """The method's trainer with its config built from the recipe; ``defaults`` fill unset keys only."""
    from ..models import lora_config

    spec = TRAINERS.get(recipe.method)
    if spec is None:
        raise NotImplementedError(f"method `{recipe.method}` has no trainer yet; available: {', '.join(TRAINERS)}")
    kwargs = {**defaults, **optimizer_args(recipe), **scheduler_args(recipe), **spec.data_args(recipe),
              **method_section_args(recipe), **recipe.train_args}
    config = spec.load(spec.config)(**kwargs)
    return spec.load(spec.trainer)(
        model=model,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=lora_config(recipe.adapter),
        callbacks=list(callbacks),
    )
