"""Axolotl's plugins (the Liger kernels carry, through transformers' own Liger integration; the rest do not), and the
reasons given for the Axolotl keys ft has no equivalent for."""

from __future__ import annotations

from .axolotl_keys import Ctx, handles

LIGER = "axolotl.integrations.liger.LigerPlugin"
# Axolotl's Liger keys -> the arguments of liger_kernel's apply function (transformers' `liger_kernel_config`; the
# function takes the ones its model type has: swiglu for Llama-like MLPs, geglu for Gemma's)
LIGER_KEYS = {"liger_rope": ("rope",), "liger_rms_norm": ("rms_norm",), "liger_glu_activation": ("swiglu", "geglu"),
              "liger_layer_norm": ("layer_norm",), "liger_fused_linear_cross_entropy": ("fused_linear_cross_entropy",),
              "liger_cross_entropy": ("cross_entropy",)}

# keys read by one Axolotl plugin (by prefix or name) -> the plugin
PLUGIN_KEYS = {"cut_cross_entropy": "cut_cross_entropy", "liger_": "liger", "swanlab_": "swanlab",
               "use_swanlab": "swanlab", "use_kernels": "kernels", "use_scattermoe": "kernels",
               "use_sonicmoe": "kernels", "expert_parallel_": "expert_parallel", "diffusion": "diffusion",
               "llmcompressor": "llm_compressor", "ebft": "ebft (rl: ebft)", "use_eaft": "eaft", "eaft_": "eaft"}


@handles("plugins", *LIGER_KEYS)
def plugins(ctx: Ctx) -> None:
    names = ctx.get("plugins") or []
    names = [names] if isinstance(names, str) else list(names)
    for i, name in enumerate(names):
        if name == LIGER and any(ctx.get(key) is True for key in LIGER_KEYS):
            ctx.put(f"plugins.{i}", "train.use_liger_kernel", True, "transformers' Liger integration, which patches "
                    "the model by its type as the plugin does (needs the liger-kernel package and CUDA)")
        else:
            ctx.skip(f"plugins.{i}", f"an Axolotl plugin; ft has no plugins, and nothing in ft does what "
                     f"`{str(name).rsplit('.', 1)[-1]}` does{_nearest(str(name))}")
    config: dict = {}
    for key, arguments in LIGER_KEYS.items():
        if not ctx.has(key):
            continue
        if LIGER not in names:
            ctx.off(key, "read by the Liger plugin, which this config does not load")
        elif ctx.get(key) is True:  # TRL's trainers of every method take the Liger kernels
            config.update(dict.fromkeys(arguments, True))
            ctx.put(key, "train.liger_kernel_config", config)
        else:
            ctx.off(key, "off")


def _nearest(plugin: str) -> str:
    if "cut_cross_entropy" in plugin:
        return " (the nearest: the Liger plugin's fused linear cross-entropy, train.use_liger_kernel)"
    return ""


# keys ft has no equivalent for, and why (keys not listed here and not mapped say "no ft equivalent")
REASONS = {
    "strict": "Axolotl's check of its own config keys; ft always checks a recipe strictly",
    "debug": "Axolotl's debug logging; set FT_DEBUG=1 for ft's tracebacks",
    "unfrozen_parameters": "ft trains every weight, or an adapter; it cannot freeze a subset of weights (but a "
                           "vision-language model's vision tower and projector: model.freeze)",
    "tokens": "ft does not add tokens to the tokenizer; save the tokenizer with them and train from that folder",
    "added_tokens_overrides": "ft does not change the tokenizer's vocabulary",
    "eot_tokens": "ft finds the end-of-turn token from the chat template",
    "resize_token_embeddings_to_32x": "ft does not resize the embeddings",
    "model_config": "ft loads the model's config.json as it is; save a model folder with the changed config",
    "cls_model_config": "ft trains causal language models only",
    "tokenizer_use_fast": "ft loads the tokenizer's fast version where it has one",
    "tokenizer_legacy": "ft loads the tokenizer as saved",
    "tokenizer_use_mistral_common": "ft loads tokenizers with transformers' AutoTokenizer",
    "tokenizer_config": "ft loads the tokenizer from model.name",
    "skip_prepare_dataset": "ft always reads and tokenizes (or, for RL methods, checks) the rows itself",
    "push_dataset_to_hub": "ft does not upload datasets",
    "hf_use_auth_token": "ft finds the Hub token in HF_TOKEN or `hf auth login` by itself",
    "loss_watchdog_threshold": "ft has no loss watchdog",
    "loss_watchdog_patience": "ft has no loss watchdog",
    "gptq": "ft loads quantized weights with bitsandbytes only (model.quantization)",
    "gptq_groupsize": "ft loads quantized weights with bitsandbytes only (model.quantization)",
    "gptq_model_v1": "ft loads quantized weights with bitsandbytes only (model.quantization)",
    "gptq_disable_exllama": "ft loads quantized weights with bitsandbytes only (model.quantization)",
    "qat": "ft has no quantization-aware training",
    "quantization": "ft has no post-training quantization",
    "fp8": "ft trains in bf16, fp16 or float32; no FP8",
    "fp8_enable_fsdp_float8_all_gather": "ft trains in bf16, fp16 or float32; no FP8",
    "model_quantization_config": "ft loads with bitsandbytes 4/8 bits only (model.quantization)",
    "model_quantization_config_kwargs": "ft loads with bitsandbytes 4/8 bits only (model.quantization)",
    "quantize_moe_experts": "ft loads with bitsandbytes 4/8 bits only (model.quantization)",
    "lora_mlp_kernel": "Axolotl's fused LoRA kernels; ft trains PEFT's LoRA layers",
    "lora_qkv_kernel": "Axolotl's fused LoRA kernels; ft trains PEFT's LoRA layers",
    "lora_o_kernel": "Axolotl's fused LoRA kernels; ft trains PEFT's LoRA layers",
    "lora_embedding_kernel": "Axolotl's fused LoRA kernels; ft trains PEFT's LoRA layers",
    "sequence_parallel_degree": "ft shares the model with DDP, FSDP or DeepSpeed ZeRO; no sequence parallelism",
    "context_parallel_size": "ft shares the model with DDP, FSDP or DeepSpeed ZeRO; no context parallelism",
    "tensor_parallel_size": "ft shares the model with DDP, FSDP or DeepSpeed ZeRO; no tensor parallelism",
    "expert_parallel_size": "ft shares the model with DDP, FSDP or DeepSpeed ZeRO; no expert parallelism",
    "dp_shard_size": "ft derives the sharding from the processes (distributed.fsdp.sharding: hybrid over machines)",
    "dp_replicate_size": "ft derives the sharding from the processes (distributed.fsdp.sharding: hybrid over machines)",
    "flash_attn_cross_entropy": "ft has no flash-attn cross-entropy patch",
    "flash_attn_rms_norm": "ft has no flash-attn RMSNorm patch",
    "flash_attn_fuse_mlp": "ft has no flash-attn MLP fusion",
    "flash_optimum": "ft has no BetterTransformer path",
    "torchdistx_path": "ft loads adamw_anyprecision's torchdistx from the environment (pip)",
    "device_map": "ft places the model itself (one device per process)",
    "max_memory": "ft places the model itself (one device per process)",
    "gpu_memory_limit": "ft places the model itself (one device per process)",
    "low_cpu_mem_usage": "ft loads models the way transformers does by default",
    "local_rank": "set by the launcher; ft's launch: and torchrun set it",
    "world_size": "set by the launcher; ft's launch: and torchrun set it",
    "ddp": "ft uses DDP whenever several processes train (distributed.kind: ddp)",
    "experimental_skip_move_to_device": "ft places the model itself",
    "use_ray": "ft launches with torchrun (launch:), not Ray",
    "ray_num_workers": "ft launches with torchrun (launch:), not Ray",
    "eval_table_size": "ft has no prediction table in the tracker",
    "eval_max_new_tokens": "ft's generation at evaluation is data.eval_exact_match",
    "do_causal_lm_eval": "ft's generation at evaluation is data.eval_exact_match",
    "eval_causal_lm_metrics": "ft's evaluation metrics are `metrics:` (token_accuracy, perplexity)",
    "dataset_exact_deduplication": "ft does not deduplicate rows",
    "sample_packing_sequentially": "ft packs with TRL's bin-fitting",
    "sample_packing_eff_est": "Axolotl's packing efficiency estimate; ft packs with TRL",
    "sample_packing_group_size": "ft packs with TRL's bin-fitting",
    "sample_packing_bin_size": "ft packs with TRL's bin-fitting",
    "total_num_tokens": "Axolotl's cached token count",
    "min_sample_len": "ft keeps rows of any length (data.truncation handles long ones)",
    "curriculum_sampling": "ft's sampler is train.train_sampling_strategy (sequential keeps the order)",
    "reinit_weights": "ft's model.init: random builds the model from its config; set it if that is what you want",
    "lisa_n_layers": "ft has no LISA layer sampling",
    "lisa_step_interval": "ft has no LISA layer sampling",
    "lisa_layers_attribute": "ft has no LISA layer sampling",
    "relora": "ft has no ReLoRA",
    "relora_prune_ratio": "ft has no ReLoRA",
    "relora_cpu_offload": "ft has no ReLoRA",
    "jagged_restart_steps": "ft has no jagged restarts of the schedule",
    "jagged_restart_warmup_steps": "ft has no jagged restarts of the schedule",
    "jagged_restart_anneal_steps": "ft has no jagged restarts of the schedule",
    "lr_quadratic_warmup": "ft's schedules warm up linearly",
    "embedding_lr": "set per-module learning rates with optimizer.groups ({match: embed_tokens, lr_scale: …})",
    "embedding_lr_scale": "set per-module learning rates with optimizer.groups ({match: embed_tokens, lr_scale: …})",
    "lr_groups": "set per-module learning rates with optimizer.groups ({match: regex, lr_scale: …})",
    "reward_model": ("ft trains reward models (`method: reward`), but does not import Axolotl's reward-model configs "
                     "yet; write the recipe by hand (recipes/smollm2-reward.yaml)"),
    "process_reward_model": "ft trains no process reward models",
    "num_labels": "ft trains no classification heads",
    "center_rewards_coefficient": "ft trains no reward models",
    "simpo_gamma": "ft has no SimPO",
    "cpo_alpha": "ft has no CPO",
    "max_prompt_len": "TRL's trainers truncate prompts to data.max_length with the rest",
    "vllm": "ft starts no vLLM server; for GRPO set train.use_vllm and train.vllm_* (TRL's names)",
    "streaming": "ft reads datasets whole (no streaming)",
    "streaming_multipack_buffer_size": "ft reads datasets whole (no streaming)",
    "pretrain_multipack_attn": "ft packs with TRL",
    "pretrain_multipack_buffer_size": "ft packs with TRL",
    "gemma4_hybrid_attn_impl": "ft uses one attention kernel (model.attn_implementation)",
    "flex_attn_compile_kwargs": "ft has no compile options for flex attention",
    "experts_implementation": "ft loads MoE experts as transformers does",
    "llama4_linearized_experts": "ft loads MoE experts as transformers does",
    "fused_attn_kernel": "ft has no fused attention patch",
    "tiled_mlp": "ft has no tiled MLP",
    "save_safetensors": "ft always saves safetensors",
    "save_first_step": "ft saves on its schedule (train.save_strategy) only",
    "include_tokens_per_second": "ft logs tokens/s in every run (summary.json, ft report)",
    "include_tkps": "ft logs tokens/s in every run (summary.json, ft report)",
    "profiler_steps": "ft has no profiler hook",
    "profiler_steps_start": "ft has no profiler hook",
    "gc_steps": "ft leaves garbage collection to Python",
}


def reason(key: str) -> str:
    """Why an Axolotl key no importer handles is not carried."""
    if key in REASONS:
        return REASONS[key]
    for prefix, plugin in PLUGIN_KEYS.items():
        if key == prefix or key.startswith(prefix):
            return f"read by Axolotl's `{plugin}` plugin or trainer, which ft does not have"
    return "no ft equivalent"
