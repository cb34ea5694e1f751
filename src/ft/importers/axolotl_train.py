"""Axolotl's training keys → ft's ``optimizer:``, ``scheduler:``, ``callbacks:`` and ``train:``: batch sizes, length of
training, optimizer and schedule, checkpointing of activations, logging, evaluation and checkpoint cadence, trackers
and the Hub."""

from __future__ import annotations

from ..recipe.methods import METHODS
from ..recipe.optimizers import optimizer_names, scheduler_names
from .axolotl_data import has_eval
from .axolotl_keys import Ctx, handles, number

# Axolotl keys that are TrainingArguments fields of the same name and meaning: passed to `train:` as they are
SAME_NAME = ("max_steps", "logging_steps", "save_total_limit", "seed", "max_grad_norm", "neftune_noise_alpha",
             "torch_compile", "torch_compile_backend", "torch_compile_mode", "ddp_find_unused_parameters",
             "ddp_timeout", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "dataloader_num_workers",
             "dataloader_pin_memory", "dataloader_prefetch_factor", "dataloader_drop_last", "save_only_model",
             "load_best_model_at_end", "metric_for_best_model", "greater_is_better", "torch_empty_cache_steps",
             "auto_find_batch_size", "include_num_input_tokens_seen")
RENAMED = {"micro_batch_size": "per_device_train_batch_size", "eval_batch_size": "per_device_eval_batch_size",
           "num_epochs": "num_train_epochs", "gradient_accumulation_steps": "gradient_accumulation_steps"}
OPTIMIZER_ALIASES = {"ao_adamw_4bit": "adamw_torch_4bit", "ao_adamw_8bit": "adamw_torch_8bit"}  # torchao's, by name


@handles(*SAME_NAME, *RENAMED)
def same_meaning(ctx: Ctx) -> None:
    for key in (*SAME_NAME, *RENAMED):
        if ctx.has(key):
            ctx.train(key, RENAMED.get(key, key), number(ctx.get(key)))


@handles("batch_size")
def batch_size(ctx: Ctx) -> None:
    """Axolotl's older total batch: gradient_accumulation_steps = batch_size // micro_batch_size when not given."""
    total, micro = number(ctx.get("batch_size")), number(ctx.get("micro_batch_size", 1))
    if ctx.has("gradient_accumulation_steps"):
        ctx.off("batch_size", "gradient_accumulation_steps decides")
    elif isinstance(total, int) and isinstance(micro, int) and total >= micro > 0:
        ctx.put("batch_size", "train.gradient_accumulation_steps", total // micro, "batch_size // micro_batch_size")
    else:
        ctx.skip("batch_size", "expected a whole number of rows, at least micro_batch_size")


@handles("optimizer", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim_args",
         "optim_target_modules")
def optimizer(ctx: Ctx) -> None:
    name = ctx.get("optimizer")
    if name is not None:
        name = OPTIMIZER_ALIASES.get(str(name), str(name))
        if name in optimizer_names():
            ctx.put("optimizer", "optimizer.name", name)
        else:
            ctx.skip("optimizer", f"`{name}` is an optimizer of Axolotl's own (not a transformers `optim` name); ft "
                     "offers the transformers ones (`ft schema`), or your own class as `optimizer.class`. The recipe "
                     "keeps ft's default, adamw_torch")
    for key, target in (("learning_rate", "lr"), ("weight_decay", "weight_decay"), ("adam_epsilon", "eps")):
        if ctx.has(key):
            ctx.put(key, f"optimizer.{target}", number(ctx.get(key)))
    if ctx.has("adam_beta1") or ctx.has("adam_beta2"):
        betas = [number(ctx.get("adam_beta1", 0.9)), number(ctx.get("adam_beta2", 0.999))]
        for key in ("adam_beta1", "adam_beta2"):
            if ctx.has(key):
                ctx.put(key, "optimizer.betas", betas)
    if ctx.has("optim_args"):
        args = ctx.get("optim_args")
        if isinstance(args, str):
            args = dict(item.split("=", 1) for item in args.replace(" ", "").split(",") if "=" in item)
        ctx.put("optim_args", "optimizer.args", {k: number(v) for k, v in args.items()})
    if ctx.has("optim_target_modules"):
        modules = ctx.get("optim_target_modules")
        ctx.put("optim_target_modules", "optimizer.target_modules", [".*"] if modules == "all_linear" else
                list(modules) if isinstance(modules, list) else [str(modules)])


@handles("lr_scheduler", "lr_scheduler_kwargs", "cosine_min_lr_ratio", "cosine_constant_lr_ratio", "warmup_steps",
         "warmup_ratio")
def scheduler(ctx: Ctx) -> None:
    kind, floor = ctx.get("lr_scheduler"), number(ctx.get("cosine_min_lr_ratio"))
    if kind is not None:
        if kind == "cosine" and floor is not None:  # Axolotl's own cosine with a floor: transformers has one
            ctx.put("lr_scheduler", "scheduler.type", "cosine_with_min_lr")
        elif kind in scheduler_names():
            ctx.put("lr_scheduler", "scheduler.type", kind)
        else:
            ctx.skip("lr_scheduler", f"`{kind}` is a schedule of Axolotl's own; ft offers the transformers schedules "
                     f"({', '.join(scheduler_names())}) or your own class (scheduler.class). The recipe keeps ft's "
                     "default, linear")
    kwargs = dict(ctx.get("lr_scheduler_kwargs") or {})
    if ctx.has("lr_scheduler_kwargs"):
        ctx.put("lr_scheduler_kwargs", "scheduler.kwargs", kwargs)
    if floor is not None:
        if kind == "cosine":
            ctx.put("cosine_min_lr_ratio", "scheduler.kwargs", {**kwargs, "min_lr_rate": floor})
        else:
            ctx.off("cosine_min_lr_ratio", "Axolotl reads it with lr_scheduler: cosine only")
    if ctx.has("cosine_constant_lr_ratio"):
        ctx.skip("cosine_constant_lr_ratio", "ft has no cosine-then-constant schedule (Axolotl's own); the recipe "
                 "decays to the floor with cosine_with_min_lr")
    if ctx.has("warmup_steps"):
        ctx.put("warmup_steps", "scheduler.warmup_steps", number(ctx.get("warmup_steps")))
    if ctx.has("warmup_ratio"):
        if ctx.has("warmup_steps"):
            ctx.off("warmup_ratio", "warmup_steps wins in Axolotl")
        else:
            ctx.put("warmup_ratio", "scheduler.warmup_steps", number(ctx.get("warmup_ratio")),
                    "ft reads a warmup_steps below 1 as a share of all steps")


@handles("gradient_checkpointing", "gradient_checkpointing_kwargs", "activation_offloading")
def checkpointing(ctx: Ctx) -> None:
    mode, fsdp_own = ctx.get("gradient_checkpointing"), _fsdp_checkpointing(ctx)
    if mode is True and fsdp_own is not None:
        if fsdp_own:
            ctx.same("gradient_checkpointing", "distributed.fsdp.activation_checkpointing (FSDP's own) does it")
        else:
            ctx.put("gradient_checkpointing", "distributed.fsdp.activation_checkpointing", True, "FSDP's own "
                    "activation checkpointing in place of the Trainer's, as transformers advises under FSDP")
    elif mode is True or mode is False:
        ctx.train("gradient_checkpointing", "activation_checkpointing", mode)
    elif mode == "offload":
        ctx.put_many("gradient_checkpointing", {"train.activation_checkpointing": True,
                                                "train.activation_checkpointing_kwargs": {"offload": True}})
    elif mode is not None:
        ctx.skip("gradient_checkpointing", f"`{mode}`: ft checkpoints activations in memory, or offloads them to "
                 "the CPU (activation_checkpointing_kwargs.offload), not to disk")
    if ctx.has("gradient_checkpointing_kwargs"):
        kwargs = dict(ctx.get("gradient_checkpointing_kwargs"))
        if ctx.draft.get("train.activation_checkpointing") is True:
            ctx.put("gradient_checkpointing_kwargs", "train.activation_checkpointing_kwargs",
                    {**(ctx.draft.get("train.activation_checkpointing_kwargs") or {}), **kwargs})
        else:
            ctx.off("gradient_checkpointing_kwargs", "read with the Trainer's activation checkpointing, which this "
                    "recipe does not use" if mode else "activation checkpointing is off")
    offload = ctx.get("activation_offloading")
    if offload is True:
        ctx.train("activation_offloading", "activation_offloading", True)
    elif offload is False:
        ctx.off("activation_offloading", "off")
    elif offload is not None:
        ctx.skip("activation_offloading", f"`{offload}`: ft offers TRL's activation offloading (true/false) only")


def _fsdp_checkpointing(ctx: Ctx) -> bool | None:
    """None without FSDP; else whether the FSDP config turns FSDP's own activation checkpointing on."""
    config = ctx.get("fsdp_config")
    if not ctx.get("fsdp") and not (isinstance(config, dict) and config):
        return None
    config = config if isinstance(config, dict) else {}
    return bool(config.get("activation_checkpointing", config.get("fsdp_activation_checkpointing")))


@handles("eval_steps", "evals_per_epoch", "eval_strategy", "save_steps", "saves_per_epoch", "save_strategy")
def cadence(ctx: Ctx) -> None:
    """Axolotl turns a count per epoch into a share of all steps, 1 / (count × num_epochs) (its config
    normalisation); transformers reads a save_steps/eval_steps below 1 as that share. A count that comes to one per
    epoch (or less often) becomes the `epoch` strategy."""
    _every(ctx, "eval", has_eval(ctx))
    _every(ctx, "save", True)


def _every(ctx: Ctx, what: str, possible: bool) -> None:
    steps, per_epoch, strategy = f"{what}_steps", f"{what}s_per_epoch", f"{what}_strategy"
    written = [key for key in (steps, per_epoch, strategy) if ctx.has(key)]
    if written and not possible:
        for key in written:
            ctx.off(key, "no evaluation data (val_set_size 0, no test_datasets), so Axolotl does not evaluate")
        return
    count, epochs = number(ctx.get(per_epoch)), number(ctx.get("num_epochs", 1))
    if ctx.has(steps):
        ctx.put_many(steps, {f"train.{strategy}": "steps", f"train.{steps}": number(ctx.get(steps))})
    elif count:
        share = 1 / (count * epochs) if isinstance(epochs, (int, float)) and epochs > 0 else 1
        if share < 1:
            ctx.put_many(per_epoch, {f"train.{strategy}": "steps", f"train.{steps}": round(share, 6)},
                         f"{what} every {round(share, 6)} of all steps: 1 / ({count} per epoch × {epochs} epochs)")
        else:
            ctx.put(per_epoch, f"train.{strategy}", "epoch", f"at the end of each epoch (Axolotl: "
                    f"{'saves at each epoch' if what == 'save' else 'skips evaluation when the share comes to 1'})")
    elif ctx.has(per_epoch):
        ctx.off(per_epoch, "0: never")
    if ctx.has(strategy):
        if ctx.has(steps) or count:
            ctx.off(strategy, f"{steps if ctx.has(steps) else per_epoch} decides")
        else:
            ctx.train(strategy, strategy, str(ctx.get(strategy)))


@handles("early_stopping_patience")
def early_stopping(ctx: Ctx) -> None:
    if not has_eval(ctx):
        ctx.off("early_stopping_patience", "no evaluation data, so nothing to stop on")
        return
    stop = {"callbacks": [{"name": "early_stopping", "patience": number(ctx.get("early_stopping_patience"))}]}
    if not ctx.has("metric_for_best_model"):
        stop["train.metric_for_best_model"] = "eval_loss"
    ctx.put_many("early_stopping_patience", stop)


@handles("output_dir")
def output_dir(ctx: Ctx) -> None:
    ctx.put("output_dir", "train.output_dir", str(ctx.get("output_dir")), fixed=True)


TRACKERS = {"use_wandb": "wandb", "use_tensorboard": "tensorboard", "use_mlflow": "mlflow", "use_comet": "comet_ml",
            "use_trackio": "trackio"}
PROJECTS = {"wandb_project": ("wandb", "WANDB_PROJECT"), "mlflow_experiment_name": ("mlflow", "MLFLOW_EXPERIMENT_NAME"),
            "trackio_project_name": ("trackio", "")}  # a project turns its tracker on, as in Axolotl
RUN_NAMES = ("wandb_name", "trackio_run_name", "mlflow_run_name")
ENVIRONMENT = {"wandb_entity": "WANDB_ENTITY", "wandb_watch": "WANDB_WATCH", "wandb_log_model": "WANDB_LOG_MODEL",
               "wandb_mode": "WANDB_MODE", "wandb_run_id": "WANDB_RUN_ID", "mlflow_tracking_uri": "MLFLOW_TRACKING_URI",
               "comet_workspace": "COMET_WORKSPACE", "comet_project_name": "COMET_PROJECT_NAME",
               "comet_mode": "COMET_MODE"}


@handles(*TRACKERS, *PROJECTS, *RUN_NAMES, *ENVIRONMENT, "trackio_space_id")
def trackers(ctx: Ctx) -> None:
    """Axolotl reports to a tracker when its ``use_*`` flag or its project is set; the run name follows."""
    names = [name for key, name in TRACKERS.items() if ctx.get(key) is True]
    names += [name for key, (name, _) in PROJECTS.items() if ctx.has(key) and name not in names]
    for key in TRACKERS:
        if ctx.get(key) is True:
            ctx.put(key, "train.report_to", names)
        elif ctx.has(key):
            ctx.off(key, "off")
    for key, (_, variable) in PROJECTS.items():
        if key == "trackio_project_name" and ctx.has(key):
            ctx.put_many(key, {"train.report_to": names, "train.project": str(ctx.get(key))})
        elif ctx.has(key):
            ctx.put(key, "train.report_to", names, f"the tracker is on; the project name has no recipe key: set "
                    f"{variable}={ctx.get(key)} where you run `ft train` (transformers' callback reads it)")
    if ctx.has("trackio_space_id"):
        ctx.train("trackio_space_id", "trackio_space_id", str(ctx.get("trackio_space_id")))
    run_name = next((key for key in RUN_NAMES if ctx.has(key)), None)
    for key in RUN_NAMES:
        if key == run_name and names:
            ctx.put(key, "train.run_name", str(ctx.get(key)))
        elif ctx.has(key):
            ctx.off(key, f"{run_name} names the run" if names else "no tracker reports in this config")
    for key, variable in ENVIRONMENT.items():
        tracker = {"wandb": "wandb", "mlflow": "mlflow", "comet": "comet_ml"}[key.split("_")[0]]
        if ctx.has(key) and tracker not in names:
            ctx.off(key, f"{tracker} does not report in this config")
        elif ctx.has(key):
            ctx.skip(key, f"a recipe has no key for it: set the environment variable {variable}={ctx.get(key)} where "
                     "you run `ft train` (transformers' callback reads it there)")


@handles("hub_model_id", "hub_strategy", "hub_revision")
def hub(ctx: Ctx) -> None:
    """Axolotl pushes whenever hub_model_id is set, to a private repository, every save (its trainer builder), and
    reads hub_strategy and hub_revision only then."""
    if ctx.has("hub_model_id"):
        ctx.put_many("hub_model_id", {"train.hub_model_id": str(ctx.get("hub_model_id")), "train.push_to_hub": True,
                                      "train.hub_private_repo": True, "train.hub_always_push": True},
                     "pushes to a private repository, as Axolotl does")
    for key in ("hub_strategy", "hub_revision"):
        if ctx.has(key) and ctx.has("hub_model_id"):
            ctx.train(key, key, str(ctx.get(key)))
        elif ctx.has(key):
            ctx.off(key, "read with hub_model_id only, and this config pushes nothing")


@handles("resume_from_checkpoint", "auto_resume_from_checkpoints")
def resume(ctx: Ctx) -> None:
    if ctx.has("resume_from_checkpoint"):
        ctx.skip("resume_from_checkpoint", f"a recipe does not say where to resume: run `ft train RECIPE --resume "
                 f"{ctx.get('resume_from_checkpoint')}`")
    if ctx.has("auto_resume_from_checkpoints"):
        if ctx.get("auto_resume_from_checkpoints") is True:
            ctx.same("auto_resume_from_checkpoints", "`ft train` resumes from the newest complete checkpoint")
        else:
            ctx.skip("auto_resume_from_checkpoints", "ft resumes by default; run `ft train --resume never` to start "
                     "afresh")


def _lora(ctx: Ctx) -> bool:
    return ctx.get("adapter") in ("lora", "qlora") and not ctx.has("lora_model_dir")


# Axolotl's defaults that differ from ft's, written out when the config leaves every one of the keys unset:
# (those Axolotl keys, the ft key, Axolotl's value (or a function of the config), when it applies, why)
DEFAULTS = (
    ((), "launch.num_processes", "auto", None, "`axolotl train` starts one process per visible GPU (accelerate "
     "launch's default); ft starts one unless launch: says"),
    (("num_epochs", "max_steps"), "train.num_train_epochs", 1, None, "Axolotl trains 1 epoch by default, ft 3"),
    (("sequence_len",), "data.max_length", 512, None, "Axolotl's default sequence_len; ft's is 1024"),
    (("excess_length_strategy",), "data.truncation", "drop", lambda ctx: METHODS[ctx.method].ft_tokenizes,
     "Axolotl drops rows longer than sequence_len by default; ft truncates them"),
    (("lora_dropout",), "adapter.dropout", 0.0, _lora, "Axolotl's default lora_dropout; ft's is 0.05"),
    (("gradient_checkpointing", "activation_offloading"), "train.activation_checkpointing", False, None,
     "Axolotl's default is off; ft turns it on on a GPU"),
    (("lr_scheduler",), "scheduler.type", "cosine", None, "Axolotl's default schedule; ft's is linear"),
    (("warmup_steps", "warmup_ratio"), "scheduler.warmup_steps", 0.03, None,
     "Axolotl warms up over 3% of the steps by default (at most 100 steps); ft does not warm up"),
    (("save_steps", "saves_per_epoch", "save_strategy"), "train.save_strategy", "epoch", None,
     "Axolotl saves at the end of each epoch by default; ft every 500 steps"),
    (("save_total_limit",), "train.save_total_limit", 4, None, "Axolotl keeps 4 checkpoints by default; ft all"),
    (("eval_batch_size",), "train.per_device_eval_batch_size", lambda ctx: number(ctx.get("micro_batch_size")),
     lambda ctx: isinstance(number(ctx.get("micro_batch_size")), int) and has_eval(ctx),
     "Axolotl evaluates with micro_batch_size rows per batch by default; ft with 8"),
)


def write_defaults(ctx: Ctx) -> None:
    """Axolotl's own default, for each setting the config leaves unset where ft's default differs."""
    for keys, target, value, when, why in DEFAULTS:
        if any(ctx.has(key) for key in keys) or (when is not None and not when(ctx)):
            continue
        if ctx.draft.get(target) is None:
            ctx.default(target, value(ctx) if callable(value) else value, why)
