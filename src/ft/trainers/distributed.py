"""``distributed:`` in TrainingArguments' terms, and the full state dict ``final/`` needs.

``training_args`` is merged into the defaults of every method's TRL config (``ft.run.train.prepare_trainer``, after
``hardware.device_defaults``), so the one precedence rule holds: a key the recipe's ``train:`` sets wins, and a
``train:`` key that contradicts ``distributed:`` is refused at validation (``recipe.rules``), naming both.

The mapping (read from transformers' ``TrainingArguments._process_fsdp_args`` and ``integrations/deepspeed.py``, and
accelerate's ``FullyShardedDataParallelPlugin``, of the releases docs/architecture.md names):

- ``ddp``: ``ddp_find_unused_parameters``. Left unset, transformers passes ``find_unused_parameters=True`` to DDP
  for every model trained without activation checkpointing (always on the CPU, and for any PEFT model, which is no
  ``PreTrainedModel``): an extra traversal of the autograd graph each step, and a PyTorch warning when nothing is
  unused. Nothing in ft's methods leaves a trainable parameter without a gradient: DPO's and KTO's reference
  passes (the adapter turned off, or the KL pass) run under ``torch.no_grad``, which DDP does not prepare a
  reduction for; GRPO generates with the unwrapped model and its reference model is a separate, frozen module;
  LoRA's frozen base has ``requires_grad=False``, which DDP skips. So ft passes False, except for multimodal models
  (a ``vision_config`` or ``audio_config``: Gemma 3, 3n and 4 load as ``…ForConditionalGeneration`` through
  ``AutoModelForCausalLM``), whose towers get no gradient from text rows (DDP then fails at the second step with
  "Expected to have finished reduction in the prior iteration").
- ``fsdp``: ``fsdp=True`` and ``fsdp_config`` with ``version: 2`` (FSDP2, ``fully_shard``): ``reshard_after_forward``
  (full and hybrid: True; shard_grad_op: False), ``cpu_offload``, ``activation_checkpointing`` (FSDP's own, in
  place of the Trainer's, which transformers refuses alongside it), ``state_dict_type``
  (``SHARDED_STATE_DICT``/``FULL_STATE_DICT``), ``auto_wrap_policy: TRANSFORMER_BASED_WRAP`` (accelerate wraps the
  classes in the model's ``_no_split_modules``, or ``transformer_layer_cls_to_wrap``). ``hybrid`` over several
  machines adds ``parallelism_config`` (accelerate's ``ParallelismConfig``: ``dp_replicate_size`` machines ×
  ``dp_shard_size`` processes each), the FSDP2 form of hybrid sharding: FSDP2 has no ``sharding_strategy``. With
  one process nothing (the Trainer refuses fsdp outside a distributed launch, and there is nothing to shard).
- ``deepspeed``: ``deepspeed`` = a config dict (or the recipe's own file / mapping), with ``"auto"`` wherever
  transformers' ``HfTrainerDeepSpeedConfig`` fills a value from TrainingArguments (batch sizes, accumulation,
  clipping, precision, bucket sizes, the optimizer's lr/betas/eps/weight decay).
"""

from __future__ import annotations

import copy
import os

from ..recipe import Recipe
from ..recipe.distributed import DeepSpeedSettings, LaunchSection

FSDP_STATE_DICT = {"sharded": "SHARDED_STATE_DICT", "full": "FULL_STATE_DICT"}
RESHARD_AFTER_FORWARD = {"full": True, "hybrid": True, "shard_grad_op": False}  # FSDP2 (no_shard: refused)
ADAMW = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}


def training_args(recipe: Recipe, world_size: int, *, cuda: bool = False, model=None,
                  local_world_size: int | None = None) -> dict:
    """TrainingArguments values for ``recipe.distributed`` with ``world_size`` processes (``local_world_size`` of
    them on each machine: LOCAL_WORLD_SIZE by default) on a machine with or without CUDA, for ``model``."""
    kind = recipe.distributed.kind
    if kind == "fsdp":
        return _fsdp(recipe, world_size, cuda, local_world_size)
    if kind == "deepspeed":
        return {"deepspeed": deepspeed_config(recipe.distributed.deepspeed_settings)}
    unused = recipe.distributed.find_unused_parameters
    return {"ddp_find_unused_parameters": needs_unused_parameter_search(model) if unused is None else unused}


def collective_timeout(recipe: Recipe) -> dict:
    """TrainingArguments' ``ddp_timeout`` (the process group's timeout, whatever ``distributed:`` says): the seconds a
    rank waits in one collective before it fails, ``launch.collective_timeout`` (its default when the recipe has no
    ``launch:``); ``ft.run.peers`` then names the ranks that stopped answering."""
    launch = recipe.launch or LaunchSection()
    return {"ddp_timeout": launch.collective_timeout}


def needs_unused_parameter_search(model) -> bool:
    """True for a model with parameters a text-only forward never uses: a multimodal model's vision/audio tower."""
    config = getattr(model, "config", None)
    return any(getattr(config, name, None) is not None for name in ("vision_config", "audio_config"))


def trainer_checkpointing(recipe: Recipe) -> bool | None:
    """The Trainer's activation checkpointing as the recipe's ``train:`` sets it (either name), else None."""
    args = recipe.train_args
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        if args.get(key) is not None:
            return bool(args[key])
    return None


def _fsdp(recipe: Recipe, world_size: int, cuda: bool, local_world_size: int | None) -> dict:
    settings = recipe.distributed.fsdp_settings
    if world_size <= 1:
        # one process has nothing to shard over, and transformers' Trainer refuses fsdp outside a distributed launch
        # ("Using fsdp only works in distributed training"): train plainly, with the asked-for checkpointing
        asked = settings.activation_checkpointing and trainer_checkpointing(recipe) is None
        return {"activation_checkpointing": True} if asked else {}
    own_checkpointing = settings.activation_checkpointing
    if own_checkpointing is None:  # ft's CUDA default, as FSDP's own unless train: chose the Trainer's
        own_checkpointing = cuda and trainer_checkpointing(recipe) is None
    config = {
        "version": 2,
        "reshard_after_forward": RESHARD_AFTER_FORWARD.get(settings.sharding, True),
        "cpu_offload": settings.cpu_offload,
        "activation_checkpointing": own_checkpointing,
        "state_dict_type": FSDP_STATE_DICT[settings.state_dict],
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }
    if settings.wrap != "auto":
        config["transformer_layer_cls_to_wrap"] = list(settings.wrap)
    args: dict = {"fsdp": True, "fsdp_config": config}
    if own_checkpointing and trainer_checkpointing(recipe) is None:
        args["activation_checkpointing"] = False  # transformers refuses both (and ft's CUDA default turns it on)
    if settings.sharding == "hybrid":
        parallelism = hybrid_parallelism(world_size, local_world_size)
        if parallelism is not None:
            args["parallelism_config"] = parallelism
    return args


def hybrid_parallelism(world_size: int, local_world_size: int | None = None):
    """accelerate's ParallelismConfig for hybrid sharding: shard within each machine, replicate across machines.
    None on one machine, where hybrid sharding is full sharding."""
    local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if local < 1 or world_size <= local or world_size % local:
        return None
    from accelerate import ParallelismConfig

    return ParallelismConfig(dp_replicate_size=world_size // local, dp_shard_size=local)


def deepspeed_config(settings: DeepSpeedSettings) -> dict | str:
    """The DeepSpeed config for ``settings``: the recipe's own (a file path, or a copy of the mapping, which
    transformers fills in place), or one generated from the stage and offloads."""
    if settings.config is not None:
        return copy.deepcopy(settings.config) if isinstance(settings.config, dict) else settings.config
    stage = settings.stage or 2
    zero: dict = {"stage": stage}
    if stage >= 2:
        zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size="auto")
    if stage == 3:
        # the last one makes Trainer.save_model write whole 16-bit weights (final/ a from_pretrained directory)
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto",
                    stage3_gather_16bit_weights_on_model_save=True)
    if settings.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(settings.offload_optimizer, settings.nvme_path)
    if settings.offload_params != "none":
        zero["offload_param"] = _offload(settings.offload_params, settings.nvme_path)
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }
    if settings.offload_optimizer != "none":
        # ZeRO-Offload steps on the CPU with DeepSpeed's CPU Adam; a client (torch) optimizer is refused by DeepSpeed
        # ("zero_force_ds_cpu_optimizer"). The Trainer fills its lr/betas/eps/weight decay from optimizer:, and
        # keeps its own schedule (no "scheduler" here).
        config["optimizer"] = copy.deepcopy(ADAMW)
    return config


def _offload(device: str, nvme_path: str | None) -> dict:
    target = {"device": device, "pin_memory": True}
    if device == "nvme":
        target["nvme_path"] = nvme_path
    return target


def full_state_dict_for_final(trainer) -> bool:
    """Make ``trainer.save_model`` write a whole model: under FSDP with sharded checkpoints, transformers'
    ``Trainer.save_model`` writes nothing at all unless the plugin's state dict type is ``FULL_STATE_DICT`` (then
    ``accelerator.get_state_dict`` gathers the full state dict, FSDP2's ``get_model_state_dict(full_state_dict=
    True)``, and process 0 saves it with ``save_pretrained``). Called once training is over, before ``final/`` is
    written; checkpoints written before stay sharded. True when it switched."""
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "fsdp_plugin", None)
    if not getattr(trainer, "is_fsdp_enabled", False) or plugin is None:
        return False
    if "FULL_STATE_DICT" in str(plugin.state_dict_type):
        return False
    plugin.set_state_dict_type("FULL_STATE_DICT")
    return True
