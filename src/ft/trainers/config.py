"""Recipe → TRL config keyword arguments. One mapping table per concern, no if/elif chains."""

from __future__ import annotations

from ..recipe import Recipe
from ..recipe.optimizers import traits


def optimizer_args(recipe: Recipe) -> dict:
    """Only what the recipe set: unset values keep the method's TRL default (DPO's lr differs from SFT's)."""
    opt = recipe.optimizer
    args = {"optim": opt.name}
    optional = {"learning_rate": opt.lr, "weight_decay": opt.weight_decay, "adam_epsilon": opt.eps}
    if opt.betas is not None:
        optional.update(adam_beta1=opt.betas[0], adam_beta2=opt.betas[1])
    args.update({key: value for key, value in optional.items() if value is not None})
    if opt.args:
        args["optim_args"] = ",".join(f"{k}={v}" for k, v in opt.args.items())
    if opt.target_modules:
        args["optim_target_modules"] = list(opt.target_modules)
    if traits(opt.name).layerwise:
        args["max_grad_norm"] = 0.0  # layerwise updates happen inside backward: nothing left to clip
    return args


def scheduler_args(recipe: Recipe) -> dict:
    sched = recipe.scheduler
    args = {"lr_scheduler_type": sched.type, "warmup_steps": sched.warmup_steps}
    if sched.kwargs:
        args["lr_scheduler_kwargs"] = dict(sched.kwargs)
    return args


def method_section_args(recipe: Recipe) -> dict:
    """The method section (``dpo:``, ``grpo:``, …) mapped onto its TRL config fields."""
    section = recipe.method_section
    return section.config_args() if section is not None else {}
