"""From a validated recipe to a trainer: what every method's builder shares.

Each method has one module named after it (``ft.trainers.<method>``; or the one its ``Method.trainer`` names)
with two plain functions: ``config(recipe, defaults)`` builds the method's TRL config keyword by keyword (the method
section's own fields through ``section_kwargs``), and ``build(recipe, inputs)`` returns the trainer.
``build_trainer`` imports only the chosen method's module, so TRL is imported only when ``ft train`` builds a
trainer.

Every TRL config follows one precedence rule (``trl_config``):

1. The recipe's own values win. They are its ``train:`` keys, verbatim, and what the method's builder derives from
   the other sections (optimizer, scheduler, data, the method's own section). The schema gives each TRL field one
   home (a field a section owns is refused under ``train:``), so the two rarely name the same field; where they do
   (``train.remove_unused_columns``, ``train.max_grad_norm: 0`` with a layerwise optimizer), ``train:`` wins.
2. ``defaults``, ft's choices for this machine (``ft.machine.hardware.device_defaults``), what ``distributed:`` maps to
   (``ft.trainers.distributed.training_args``: fsdp, fsdp_config, deepspeed, ddp_find_unused_parameters; a
   ``train:`` key that contradicts ``distributed:`` is refused at validation) and JIT checkpointing, fill only the
   fields the recipe left unset.
"""

from __future__ import annotations

import importlib
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..machine import trackers
from ..model import adapters
from ..recipe import Recipe
from ..recipe.methods import METHODS, MethodSection
from ..recipe.optimizers import traits
from .card import card_facts
from .hooks import Hooks
from .optimization import optimization_for


@dataclass(frozen=True)
class TrainerInputs:
    """What ``ft.run.train`` has made ready for the trainer; the recipe says how to use it."""

    model: object
    processing_class: object  # a tokenizer, or a vision-language model's processor (model.loading)
    train_dataset: object
    eval_dataset: object | None
    hooks: Hooks  # the recipe's user and built-in code, resolved once before the model loaded
    defaults: Mapping[str, object] = field(default_factory=dict)  # ft's machine defaults (rule 2 above)
    callbacks: tuple = ()  # more TrainerCallbacks, from programs that drive ft (benchmarks, tests)
    optimizer_defaults: Mapping[str, object] = field(default_factory=dict)  # ft.machine.hardware.optimizer_defaults
    peft_config: object | None = None  # a new adapter's LoraConfig (ft.model.adapters.lora_config), for TRL to apply
    preflight: object | None = None  # trainers.preflight.PreflightSettings, or None: no probe of the largest batch


def build_trainer(recipe: Recipe, inputs: TrainerInputs):
    """The trainer of ``recipe.method``, built by its module's ``build`` (``trainer_module``), with trackers writing
    under the output directory (``trackers.writing_under``), a quantized base's trainable weights in float32 where no
    mixed precision runs (``model.adapters.train_in_float32_without_autocast``), ft's console lines for the method
    instead of transformers' (``console.install``), and without transformers' own stop on SIGTERM (ft stops at a step
    end: ``preemption``)."""
    from . import console  # imports transformers
    from .preemption import without_transformers_stop

    sigterm = signal.getsignal(signal.SIGTERM)
    with trackers.writing_under(recipe.train_args["output_dir"]):
        trainer = importlib.import_module(trainer_module(recipe.method)).build(recipe, inputs)
    adapters.train_in_float32_without_autocast(trainer.model, trainer.args)  # before the optimizer exists
    console.install(trainer, recipe.method)
    without_transformers_stop(trainer, sigterm)  # ft stops at a step end itself (trainers.preemption)
    return trainer


def trainer_module(method: str) -> str:
    """The module that builds ``method``'s trainer: the one its entry names (``Method.trainer``: a method registered
    from outside ft), else ``ft.trainers.<method>``."""
    return METHODS[method].trainer or f"{__package__}.{method}"


def section_kwargs(section: MethodSection | None) -> dict:
    """The method section's own settings in its TRL config's names (``CONFIG_FIELDS``: section field -> TRL field),
    each as the recipe has it (a list copied: TRL's config may normalise it in place); {} without a section."""
    if section is None:
        return {}
    values = {trl: getattr(section, name) for name, trl in section.CONFIG_FIELDS.items()}
    return {trl: list(value) if isinstance(value, list) else value for trl, value in values.items()}


def trl_config(config_class, recipe: Recipe, defaults: Mapping[str, object], **from_sections):
    """``config_class`` (a TRL config) by the precedence rule above. ``from_sections`` are the method's own
    mappings of the recipe's sections; the optimizer and scheduler sections are mapped here, alike for all."""
    own = {**optimizer_kwargs(recipe), **scheduler_kwargs(recipe), **from_sections, **recipe.train_args}
    return config_class(**{key: value for key, value in defaults.items() if key not in own}, **own)


def trainer_kwargs(recipe: Recipe, inputs: TrainerInputs, config) -> dict:
    """The constructor arguments every ft trainer takes (TRL's, and ``FtTrainerMixin``'s ``ft_optimization``,
    ``ft_preflight`` and ``ft_card``)."""
    return {
        "model": inputs.model,
        "args": config,
        "train_dataset": inputs.train_dataset,
        "eval_dataset": inputs.eval_dataset,
        "processing_class": inputs.processing_class,
        "peft_config": inputs.peft_config,
        "callbacks": [*inputs.hooks.callbacks, *inputs.callbacks],
        "ft_optimization": optimization_for(recipe, inputs.hooks, config.learning_rate, inputs.optimizer_defaults),
        "ft_preflight": inputs.preflight,
        "ft_card": card_facts(recipe),
    }


def optimizer_kwargs(recipe: Recipe) -> dict:
    """``optimizer:`` in TrainingArguments' names. Only what the recipe set: unset values keep the method's TRL
    default (DPO's learning rate differs from SFT's)."""
    opt = recipe.optimizer
    kwargs = {"optim": opt.name}
    optional = {"learning_rate": opt.lr, "weight_decay": opt.weight_decay, "adam_epsilon": opt.eps}
    if opt.betas is not None:
        optional.update(adam_beta1=opt.betas[0], adam_beta2=opt.betas[1])
    kwargs.update({key: value for key, value in optional.items() if value is not None})
    if opt.args:
        kwargs["optim_args"] = ",".join(f"{k}={v}" for k, v in opt.args.items())
    if opt.target_modules:
        kwargs["optim_target_modules"] = list(opt.target_modules)
    if traits(opt.name).layerwise:
        kwargs["max_grad_norm"] = 0.0  # layerwise updates happen inside backward: nothing is left to clip
    return kwargs


def scheduler_kwargs(recipe: Recipe) -> dict:
    """``scheduler:`` in TrainingArguments' names."""
    sched = recipe.scheduler
    kwargs = {"lr_scheduler_type": sched.type, "warmup_steps": sched.warmup_steps}
    if sched.kwargs:
        kwargs["lr_scheduler_kwargs"] = dict(sched.kwargs)
    return kwargs
