"""The ``optimizer:`` and ``scheduler:`` sections: a transformers name, or a class of the user's, and per-module
parameter groups.

Either a transformers ``optim`` / ``lr_scheduler_type`` name (``name:`` / ``type:``, with ``args``/``kwargs``), or
any importable class (``class: torch.optim.SGD``, or ``module:Class`` for a module next to the recipe) with its
``kwargs``. The class is imported and its kwargs bound to its signature at the start of ``ft train``, before any
model loads (``ft.trainers.hooks``); which keys go with which choice is checked by ``recipe.rules``.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, StrictStr, field_validator

from .base import Section
from .optimizers import optimizer_names, scheduler_names

Number = Union[int, float]
_CLASS_REFERENCE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*")


def check_class_reference(value: Optional[str]) -> Optional[str]:
    if value is not None and not _CLASS_REFERENCE.fullmatch(value):
        raise ValueError("must name a class as `package.module.Class` (importable) or `module:Class` (a module next "
                         "to the recipe), e.g. torch.optim.SGD")
    return value


def check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"is not a valid regular expression: {exc}") from None
    return value


class ParamGroup(Section):
    """Parameters whose name matches ``match`` (``re.search``) train with their own learning rate and decay, as in
    the Trainer docs' ``create_optimizer`` example. The first group that matches a parameter takes it; the usual
    split stays inside each group (biases and norm weights get no decay unless ``weight_decay`` is set here)."""

    match: StrictStr = Field(description="Regular expression searched in parameter names, e.g. `embed_tokens`.")
    lr_scale: Number = Field(1.0, gt=0, description="This group's learning rate as a multiple of `optimizer.lr`.")
    weight_decay: Optional[Number] = Field(
        None, ge=0, description="This group's weight decay, for all its parameters (unset: the usual split).")

    checked_match = field_validator("match")(check_regex)


class OptimizerSection(Section):
    """Unset values keep the method's TRL default (e.g. lr 2e-5 for SFT, 1e-6 for DPO)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)  # YAML lists are fine for betas

    name: Literal[tuple(optimizer_names())] = Field(
        "adamw_torch", description="Optimizer (transformers `optim` names: GaLore, APOLLO, LOMO, schedule-free, …).")
    cls: Optional[StrictStr] = Field(
        None, alias="class", description="Your own optimizer class instead of `name`: `torch.optim.SGD`, or "
        "`module:Class` for a module next to the recipe (passed as the Trainer's optimizer_cls_and_kwargs).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of `class`.")
    lr: Optional[Number] = Field(None, gt=0, description="Peak learning rate (unset: the method's TRL default).")
    weight_decay: Optional[Number] = Field(None, ge=0, description="Decoupled weight decay (unset: 0).")
    betas: Optional[tuple[Number, Number]] = Field(None, description="Adam betas [beta1, beta2] (unset: 0.9, 0.999).")
    eps: Optional[Number] = Field(None, gt=0, description="Adam epsilon (unset: 1e-8).")
    target_modules: Optional[list[StrictStr]] = Field(
        None, description="Module name regexes the optimizer projects (GaLore, APOLLO).")
    args: dict[str, Any] = Field(default_factory=dict, description="Extra arguments of a named optimizer (optim_args).")
    groups: list[ParamGroup] = Field(
        default_factory=list,
        description="Per-module learning rates and decay: [{match: regex, lr_scale, weight_decay}].")

    checked_cls = field_validator("cls")(check_class_reference)


class SchedulerSection(Section):
    type: Literal[tuple(scheduler_names())] = Field(
        "linear", description="Learning-rate schedule (transformers names, including `greedy`).")
    cls: Optional[StrictStr] = Field(
        None, alias="class", description="Your own scheduler class instead of `type`, e.g. "
        "`torch.optim.lr_scheduler.OneCycleLR`; ft fills in its total steps (total_steps, T_max, total_iters).")
    warmup_steps: Number = Field(0, ge=0, description="Warm-up steps; a value below 1 is a fraction of all steps.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra scheduler arguments (or `class`'s).")

    checked_cls = field_validator("cls")(check_class_reference)
