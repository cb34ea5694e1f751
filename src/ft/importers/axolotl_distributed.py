"""Axolotl's ``deepspeed`` and ``fsdp``/``fsdp_config`` → ft's ``distributed:``."""

from __future__ import annotations

from pathlib import Path

from .axolotl_keys import Ctx, handles

# Axolotl's bundled DeepSpeed configs (its deepspeed_configs/ folder), as ft's shorthand for the config ft generates
BUNDLED = {
    "zero1": {"stage": 1}, "zero1_torch_compile": {"stage": 1},
    "zero2": {"stage": 2, "offload_optimizer": "cpu"}, "zero2_torch_compile": {"stage": 2, "offload_optimizer": "cpu"},
    "zero3": {"stage": 3}, "zero3_bf16": {"stage": 3},
    "zero3_bf16_cpuoffload_params": {"stage": 3, "offload_params": "cpu"},
    "zero3_bf16_cpuoffload_all": {"stage": 3, "offload_params": "cpu", "offload_optimizer": "cpu"},
}


@handles("deepspeed")
def deepspeed(ctx: Ctx) -> None:
    value = ctx.get("deepspeed")
    if isinstance(value, dict):
        ctx.put_many("deepspeed", {"distributed.kind": "deepspeed", "distributed.deepspeed": {"config": value}})
        return
    name = Path(str(value)).stem
    if name in BUNDLED:
        ctx.put_many("deepspeed", {"distributed.kind": "deepspeed", "distributed.deepspeed": dict(BUNDLED[name])},
                     f"Axolotl's bundled {name}.json, as ft's shorthand (ft generates the same ZeRO stage and "
                     "offloads, with \"auto\" values the Trainer fills in)")
    elif Path(str(value)).is_file():
        ctx.put_many("deepspeed", {"distributed.kind": "deepspeed", "distributed.deepspeed": {"config": str(value)}})
    else:
        ctx.skip("deepspeed", f"{value} is not a file here, nor one of Axolotl's bundled configs; copy it next to "
                 "the recipe and set distributed: {kind: deepspeed, deepspeed: {config: FILE}}")


SHARDING = {"full_shard": "full", "shard_grad_op": "shard_grad_op", "hybrid_shard": "hybrid"}
STATE_DICT = {"FULL_STATE_DICT": "full", "SHARDED_STATE_DICT": "sharded"}
FSDP_REASONS = {
    "cpu_ram_efficient_loading": "ft leaves it to accelerate's default (loading on every process)",
    "sync_module_states": "FSDP2 has no such setting (ft trains FSDP2)",
    "use_orig_params": "FSDP2 keeps the original parameters always (ft trains FSDP2)",
    "limit_all_gathers": "an FSDP1 setting; ft trains FSDP2",
    "backward_prefetch": "an FSDP1 setting; ft trains FSDP2",
    "forward_prefetch": "an FSDP1 setting; ft trains FSDP2",
    "cpu_offload_pin_memory": "ft offloads with FSDP2's defaults (pinned memory)",
    "mixed_precision_policy": "ft's FSDP follows train.bf16/fp16",
    "min_num_params": "ft wraps decoder layers (TRANSFORMER_BASED_WRAP), not by size",
}


@handles("fsdp", "fsdp_config", "fsdp_version", "fsdp_final_state_dict_type")
def fsdp(ctx: Ctx) -> None:
    flags, config = ctx.get("fsdp") or [], ctx.get("fsdp_config") or {}
    flags = flags.split() if isinstance(flags, str) else flags
    if not isinstance(config, dict) or not isinstance(flags, list):
        for key in ("fsdp", "fsdp_config"):
            if ctx.has(key):
                ctx.skip(key, "expected a list of FSDP options (fsdp) and a mapping (fsdp_config)")
        return
    if not flags and not config:
        for key in ("fsdp", "fsdp_version", "fsdp_final_state_dict_type"):
            if ctx.has(key):
                ctx.off(key, "FSDP is off (no fsdp options, no fsdp_config)")
        return
    settings: dict = ctx.draft.get("distributed.fsdp") or {}  # gradient_checkpointing may have written here
    ctx.draft.set("distributed.kind", "fsdp")
    unknown = [str(flag) for flag in flags if flag not in SHARDING and flag not in ("offload", "auto_wrap")]
    for flag in flags:
        if flag in SHARDING:
            settings["sharding"] = SHARDING[flag]
    if "offload" in flags:
        settings["cpu_offload"] = True
    if ctx.has("fsdp"):
        ctx.carry("fsdp", ("distributed.kind", "distributed.fsdp"), f"no ft equivalent for {', '.join(unknown)}"
                  if unknown else "")
    version = config.get("fsdp_version", config.get("version", ctx.get("fsdp_version")))
    for name, value in config.items():
        _fsdp_option(ctx, f"fsdp_config.{name}", name.removeprefix("fsdp_"), value, settings)
    if ctx.has("fsdp_version"):
        ctx.carry("fsdp_version", ("distributed.kind",), "" if version == 2 else "ft trains FSDP2 (fully_shard); "
                  "FSDP1's options do not all exist there")
    if ctx.has("fsdp_final_state_dict_type"):
        _fsdp_option(ctx, "fsdp_final_state_dict_type", "final_state_dict_type",
                     ctx.get("fsdp_final_state_dict_type"), settings)
    ctx.draft.set("distributed.fsdp", settings)


def _fsdp_option(ctx: Ctx, key: str, name: str, value, settings: dict) -> None:
    if value is None:
        ctx.off(key, "empty")
    elif isinstance(value, (dict, list)):
        ctx.skip(key, "Axolotl reads one value here, not a mapping or a list")
    elif name == "version":
        ctx.carry(key, ("distributed.kind",), "" if value == 2 else "ft trains FSDP2 (fully_shard)")
    elif name == "offload_params":
        settings["cpu_offload"] = value is True
        ctx.carry(key, ("distributed.fsdp.cpu_offload",))
    elif name == "activation_checkpointing":
        settings["activation_checkpointing"] = value is True
        ctx.carry(key, ("distributed.fsdp.activation_checkpointing",))
    elif name == "state_dict_type" and value in STATE_DICT:
        settings["state_dict"] = STATE_DICT[value]
        ctx.carry(key, ("distributed.fsdp.state_dict",))
    elif name == "final_state_dict_type":
        ctx.carry(key, (), "" if value == "FULL_STATE_DICT" else "ft's final/ is always a full from_pretrained folder")
    elif name == "reshard_after_forward":
        settings["sharding"] = "full" if value else "shard_grad_op"
        ctx.carry(key, ("distributed.fsdp.sharding",))
    elif name == "auto_wrap_policy" and value == "TRANSFORMER_BASED_WRAP":
        ctx.carry(key, ("distributed.fsdp.wrap",))
    elif name == "transformer_layer_cls_to_wrap":
        settings["wrap"] = [part.strip() for part in str(value).split(",") if part.strip()]
        ctx.carry(key, ("distributed.fsdp.wrap",))
    elif name == "sharding_strategy" and str(value).lower() in SHARDING:
        settings["sharding"] = SHARDING[str(value).lower()]
        ctx.carry(key, ("distributed.fsdp.sharding",))
    else:
        ctx.skip(key, FSDP_REASONS.get(name, f"`{value}`: no ft equivalent"))
