"""Adapters (PEFT LoRA, DoRA, rsLoRA) and what a quantized or re-sized base needs before one trains on it.

A new adapter is a ``LoraConfig`` handed to TRL, which wraps the model itself; an adapter continued from
``adapter.path`` is loaded here, trainable, and TRL gets no config. Before either:

- a 4/8-bit base is prepared for k-bit training (PEFT's ``prepare_model_for_kbit_training``: the layers left in
  16 bits go to float32 for stable training, the base is frozen); activation checkpointing stays the Trainer's;
- a tokenizer with more tokens than the model has embedding rows (added special tokens) resizes the embeddings,
  and with an adapter those new rows are trained and saved with it (PEFT's ``trainable_token_indices``), since the
  frozen base would otherwise keep them random.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..recipe import Recipe
from ..recipe.adapter import AdapterSection
from .loading import ModelLoadError


def prepare_base(model, recipe: Recipe, tokenizer, say: Callable[[str], None]) -> tuple[object, list[int]]:
    """The base as training needs it, and the ids of embedding rows added for the tokenizer."""
    if recipe.model.quantization is not None:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        bits = recipe.model.quantization.bits
        say(f"model: {bits}-bit base through bitsandbytes, prepared for k-bit training (non-quantized layers in "
            "float32, base frozen)")
    new_ids = fit_embeddings(model, tokenizer, say)
    if recipe.adapter is not None and recipe.adapter.path:
        model = _continue_adapter(model, recipe.adapter.path, say)
    return model, new_ids


def train_in_float32_without_autocast(model, args) -> int:
    """The trainable parameters of a quantized base's run, back in float32 when the run has no mixed precision
    (neither ``train.bf16`` nor ``train.fp16``: a CPU run, a smoke run); how many were cast.

    TRL casts every trainable parameter of a 4/8-bit model to bfloat16 (QLoRA's choice), and mixed precision's autocast
    then meets the float32 activations (``prepare_model_for_kbit_training`` keeps the layers left in 16 bits in
    float32). Without autocast, LoRA layers still work (PEFT casts their input), but a full copy trained beside the
    adapter (``adapter.modules_to_save``: ``lm_head``, ``embed_tokens``) multiplies float32 activations by bfloat16
    weights and fails at the first step. Such a run trains in float32, as it does everything else."""
    import torch

    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    if not quantized or args.bf16 or args.fp16:
        return 0
    cast = [p for p in model.parameters() if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)]
    for param in cast:
        param.data = param.data.float()
    return len(cast)


def fit_embeddings(model, tokenizer, say: Callable[[str], None] | None = None) -> list[int]:
    """Resize ``model``'s embeddings to the tokenizer's length when the tokenizer has more tokens (added special
    tokens); the ids of the added rows. Training trains those rows (with an adapter, as PEFT's trainable tokens, saved
    with it); a base rebuilt for an adapter (``ft merge``, ``ft generate``) is resized the same way, and the adapter
    then supplies their trained values."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) <= rows:
        return []
    model.resize_token_embeddings(len(tokenizer))
    if say is not None:
        say(f"model: the tokenizer has {len(tokenizer)} tokens and the embeddings {rows} rows; resized to "
            f"{len(tokenizer)} (the new rows start from the mean embedding and are trained)")
    return list(range(rows, len(tokenizer)))


def _continue_adapter(model, path: str, say):
    from peft import PeftModel

    if not (Path(path) / "adapter_config.json").is_file():
        raise ModelLoadError(f"adapter.path: {path} holds no adapter_config.json; name a directory an adapter was "
                             "saved to (a run's final/ or one of its checkpoint-N folders).")
    say(f"model: continuing the adapter saved in {path}")
    return PeftModel.from_pretrained(model, path, is_trainable=True)


def lora_config(section: AdapterSection | None, new_token_ids: list[int] = (), task_type: str = "CAUSAL_LM"):
    """The new adapter's ``LoraConfig`` for TRL (None without an adapter, or when one is continued from a path).
    ``task_type``: the method's (``Method.peft_task``); for a reward model PEFT then trains and saves the new score
    head with the adapter."""
    if section is None or section.path:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=section.r,
        lora_alpha=section.alpha,
        lora_dropout=section.dropout,
        target_modules=section.target_modules,
        modules_to_save=section.modules_to_save,
        use_dora=section.use_dora,
        use_rslora=section.use_rslora,
        trainable_token_indices=list(new_token_ids) or None,
        task_type=task_type,
    )
