"""Recipe → TRL config keyword arguments. One mapping table per concern, no if/elif chains."""

from __future__ import annotations

from ..recipe import Recipe


def optimizer_args(recipe: Recipe) -> dict:
    opt = recipe.optimizer
    args = {
        "optim": opt.name,
        "learning_rate": opt.lr,
        "weight_decay": opt.weight_decay,
        "adam_beta1": opt.betas[0],
        "adam_beta2": opt.betas[1],
        "adam_epsilon": opt.eps,
    }
    if opt.args:
        args["optim_args"] = ",".join(f"{k}={v}" for k, v in opt.args.items())
    if opt.target_modules:
        args["optim_target_modules"] = list(opt.target_modules)
    return args


def scheduler_args(recipe: Recipe) -> dict:
    sched = recipe.scheduler
    args = {"lr_scheduler_type": sched.type, "warmup_steps": sched.warmup_steps}
    if sched.kwargs:
        args["lr_scheduler_kwargs"] = dict(sched.kwargs)
    return args


def sft_data_args(recipe: Recipe) -> dict:
    data = recipe.data
    conversational = all(s.format in ("chat", "instruction") for s in data.train)
    args = {
        "max_length": data.max_length,
        "packing": data.packing,
        "assistant_only_loss": conversational and data.train_on == "assistant",
    }
    if data.num_proc:
        args["dataset_num_proc"] = data.num_proc
    return args
