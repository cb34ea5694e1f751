"""What a recipe asks of the processes of its run: how many there are, and how they share the model.

Read by the rules (``recipe.rules``), the machine checks (``ft.machine.hardware``) and the builders. How many processes
a run has is known to the command, not to the recipe: ``ft train --num-processes N`` is about to start N, and a rank of
a started run knows the run's size (torchrun's WORLD_SIZE, read by ``ft.run.ranks``). The command passes it as a
``Processes``; without one the recipe's ``launch:`` section says, else one process.
"""

from __future__ import annotations

from dataclasses import dataclass

from .distributed import deepspeed_config_file
from .schema import Recipe


@dataclass(frozen=True)
class Processes:
    """The process count the command knows, and how it knows it (for messages: ``--num-processes 2``,
    ``WORLD_SIZE=2``)."""

    count: int
    source: str


def written(recipe: Recipe) -> bool:
    """True when the recipe has a ``distributed:`` section of its own (not the default)."""
    return "distributed" in recipe.model_fields_set


def uses_fsdp(recipe: Recipe) -> bool:
    """FSDP, through ``distributed.kind`` or a ``train.fsdp`` of the recipe's own."""
    return recipe.distributed.kind == "fsdp" or bool(recipe.train_args.get("fsdp"))


def uses_deepspeed(recipe: Recipe) -> bool:
    return recipe.distributed.kind == "deepspeed" or bool(recipe.train_args.get("deepspeed"))


def zero_stage(recipe: Recipe) -> int | None:
    """The ZeRO stage a DeepSpeed recipe trains with (None: no DeepSpeed, or a config whose stage is unknown)."""
    if recipe.distributed.kind == "deepspeed":
        settings = recipe.distributed.deepspeed_settings
        if settings.config is None:
            return settings.stage or 2
        config = deepspeed_config_file(settings.config)
    elif recipe.train_args.get("deepspeed"):
        config = deepspeed_config_file(recipe.train_args["deepspeed"])
    else:
        return None
    stage = ((config or {}).get("zero_optimization") or {}).get("stage", 0)
    return stage if isinstance(stage, int) else None


def declared_processes(recipe: Recipe, processes: Processes | None = None) -> int | None:
    """How many processes this run has, as far as validation can tell: the command's ``processes``; else the recipe's
    ``launch:`` (num_processes × nnodes); else 1. None when ``launch.num_processes: auto`` is all there is (the
    visible GPUs, unknown until ``ft train`` looks)."""
    if processes is not None:
        return processes.count
    launch = recipe.launch
    if launch is None:
        return 1
    if launch.num_processes == "auto":
        return None
    return launch.num_processes * launch.nnodes


def process_count(recipe: Recipe, processes: Processes | None = None) -> int:
    """The number of processes the rules that involve processes see (``declared_processes``; 1 when unknown)."""
    return declared_processes(recipe, processes) or 1


def process_source(recipe: Recipe, processes: Processes | None = None) -> str:
    """Where ``process_count`` comes from, for messages: ``WORLD_SIZE=2``, ``--num-processes 2``, ``launch:``."""
    if processes is not None:
        return processes.source
    launch = recipe.launch
    if launch is not None and launch.nnodes > 1:
        return f"launch.num_processes {launch.num_processes} × launch.nnodes {launch.nnodes}"
    return f"launch.num_processes {launch.num_processes}" if launch is not None else "no `launch:`, no WORLD_SIZE"
