"""The ``launch:`` and ``distributed:`` sections: how many processes a run has, and how they share the model.

``launch:`` says how many processes to start and where they meet (``ft train`` starts them, ``ft.run.launch``; the CLI's
``--num-processes``, ``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port`` and ``--rdzv-endpoint``
override the keys of the same names). ``distributed:`` says what the processes do with the model: ``ddp`` (a full
copy per process, gradients all-reduced: the Trainer's default), ``fsdp`` (FSDP2: parameters, gradients and
optimizer state sharded) or ``deepspeed`` (ZeRO stage 1/2/3). ``ft.trainers.distributed.training_args`` maps it to
TrainingArguments (``docs/distributed.md`` has the table). Validation imports nothing heavy; the cross-field rules
(with their key paths) are in ``recipe.rules``, and what a recipe asks of the processes in ``recipe.processes``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field, NonNegativeInt, PositiveInt, StrictBool, StrictStr, field_validator

from .base import Section, resolve_input_path

_ENDPOINT = re.compile(r"[^\s:/]+:\d{1,5}|\[[0-9A-Fa-f:.]+\]:\d{1,5}")  # host:port, or [IPv6]:port


def _endpoint(value: Optional[str]) -> Optional[str]:
    if value is not None and not _ENDPOINT.fullmatch(value):
        raise ValueError("must be host:port (e.g. node0.cluster:29400)")
    return value


class LaunchSection(Section):
    """The processes ``ft train`` starts (the same command runs on each machine of a multi-machine run)."""

    num_processes: Union[PositiveInt, Literal["auto"]] = Field(
        1, description="Processes on this machine (data-parallel ranks): a number, or `auto` (the visible GPUs).")
    nnodes: PositiveInt = Field(1, description="Machines taking part; run the same `ft train` on each.")
    node_rank: NonNegativeInt = Field(0, description="This machine's number, 0..nnodes-1 (machine 0 is the master).")
    master_addr: Optional[StrictStr] = Field(None, description="Address of machine 0 (several machines).")
    master_port: Optional[int] = Field(None, ge=1, le=65535, description="Port on machine 0 (unset: 29500).")
    rdzv_endpoint: Optional[StrictStr] = Field(
        None, description="host:port of a c10d rendezvous (ranks assigned by it), instead of master_addr/master_port.")
    accelerate_config: Optional[StrictStr] = Field(
        None, description="An accelerate config YAML (`accelerate config` writes one) to launch with instead; the "
        "other launch keys stay unset then. Relative to the recipe's folder.")
    join_timeout: PositiveInt = Field(
        300, description="Seconds the machines of a several-machine run wait for each other to join; past it each "
        "exits 2 naming how many joined and where they met.")
    collective_timeout: PositiveInt = Field(
        1800, description="Seconds a rank waits in one collective (a gradient all-reduce, a barrier while rank 0 "
        "saves) before it takes the others for lost: then each surviving rank exits 1 naming the ranks and node "
        "that stopped answering, the step and the newest complete checkpoint. Sets TrainingArguments' ddp_timeout; "
        "keep it above your longest checkpoint save. A process that dies is noticed at once, without it.")

    checked_endpoint = field_validator("rdzv_endpoint")(_endpoint)

    @field_validator("num_processes", mode="before")
    @classmethod
    def _count_or_auto(cls, value):
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError("must be a number of processes, 1 or more, or `auto` (the visible GPUs)")
    resolve_config = field_validator("accelerate_config")(resolve_input_path)


class FsdpSettings(Section):
    """FSDP2 (``fsdp_version: 2``), through transformers' ``fsdp_config`` and accelerate's FSDP plugin."""

    sharding: Literal["full", "hybrid", "shard_grad_op", "no_shard"] = Field(
        "full", description="full: parameters resharded after each forward (least memory); shard_grad_op: kept "
        "gathered between forward and backward (faster, more memory); hybrid: sharded within each machine, "
        "replicated across machines. (no_shard is DDP: use `kind: ddp`.)")
    state_dict: Literal["sharded", "full"] = Field(
        "sharded", description="Checkpoint format: sharded (each process writes its shard; fast) or full (one file, "
        "gathered on process 0). final/ is always a full from_pretrained directory.")
    cpu_offload: StrictBool = Field(False, description="Keep parameters, gradients and optimizer state on the CPU.")
    activation_checkpointing: Optional[StrictBool] = Field(
        None, description="FSDP's own activation checkpointing (recompute activations in backward). Unset: on with "
        "CUDA, off on the CPU (ft's device default, moved from the Trainer's activation checkpointing to FSDP's).")
    wrap: Union[Literal["auto"], list[StrictStr]] = Field(
        "auto", description="Modules sharded as units: `auto` (the model's decoder layer class, from its "
        "_no_split_modules) or a list of class names, e.g. [LlamaDecoderLayer].")


class DeepSpeedSettings(Section):
    """DeepSpeed ZeRO through transformers' ``deepspeed`` argument: a stage with offloads, or a full config."""

    stage: Optional[Literal[1, 2, 3]] = Field(
        None, description="ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters (unset: 2, or "
        "the stage `config` says).")
    offload_optimizer: Literal["none", "cpu", "nvme"] = Field(
        "none", description="Where optimizer state lives (nvme: stage 3 only). Offloading trains with DeepSpeed's "
        "CPU AdamW, so `optimizer.name` must be an AdamW.")
    offload_params: Literal["none", "cpu", "nvme"] = Field(
        "none", description="Where parameters live between uses (stage 3 only).")
    nvme_path: Optional[StrictStr] = Field(None, description="A fast local disk for nvme offloading.")
    config: Union[dict[str, Any], StrictStr, None] = Field(
        None, description="A full DeepSpeed config instead of the keys above: a JSON file (relative to the "
        "recipe's folder) or an inline mapping; use \"auto\" for batch sizes, learning rate and precision so the "
        "Trainer fills them in.")

    @field_validator("config", mode="after")
    @classmethod
    def _resolve_config(cls, value, info):
        return resolve_input_path(value, info) if isinstance(value, str) else value


class DistributedSection(Section):
    """What several processes do with the model (one process trains alone whatever this says)."""

    kind: Literal["ddp", "fsdp", "deepspeed"] = Field(
        "ddp", description="ddp: a full copy per process; fsdp: FSDP2 sharding; deepspeed: ZeRO.")
    find_unused_parameters: Optional[StrictBool] = Field(
        None, description="DDP: look for parameters that got no gradient every step (an extra pass over the "
        "autograd graph). Unset: ft decides (true only for multimodal models trained on text, whose vision or "
        "audio towers get no gradient).")
    fsdp: Optional[FsdpSettings] = Field(None, description="FSDP settings (kind: fsdp).")
    deepspeed: Optional[DeepSpeedSettings] = Field(None, description="DeepSpeed settings (kind: deepspeed).")

    @property
    def fsdp_settings(self) -> FsdpSettings:
        return self.fsdp or FsdpSettings()

    @property
    def deepspeed_settings(self) -> DeepSpeedSettings:
        return self.deepspeed or DeepSpeedSettings()


def deepspeed_config_file(value) -> dict | None:
    """A DeepSpeed config given as a mapping, or read from its JSON file; None when the file cannot be read."""
    if isinstance(value, dict):
        return value
    try:
        loaded = json.loads(Path(value).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return loaded if isinstance(loaded, dict) else None
