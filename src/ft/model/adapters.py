"""Adapters (PEFT LoRA, DoRA, rsLoRA) and what a quantized or re-sized base needs before one trains on it.

A new adapter is a ``LoraConfig`` handed to TRL, which wraps the model itself; an adapter continued from
``adapter.path`` is loaded here, trainable, and TRL gets no config. Before either:

- a 4/8-bit base is prepared for k-bit training (PEFT's ``prepare_model_for_kbit_training``: the layers left in
  16 bits go to float32 for stable training, the base is frozen); activation checkpointing stays the Trainer's;
- a tokenizer with more tokens than the model has embedding rows (added special tokens) resizes the embeddings,
  and with an adapter those new rows are trained and saved with it (PEFT's ``trainable_token_indices``), since the
  frozen base would otherwise keep them random;
- a vision-language model's parts named by ``model.freeze`` (its vision tower, its projector) stop training
  (``freeze``).

A vision-language model's parts are found by the attribute names transformers' image-text-to-text families give them
(``VISION_PARTS``: LLaVA's ``vision_tower`` and ``multi_modal_projector``, Idefics3's ``vision_model`` and
``connector``, Qwen2-VL's ``visual`` and the ``merger`` inside it), never inside the language model
(``get_decoder()``). A new LoRA adapter on such a model targets its language model only: the vision tower and
projector go to PEFT's ``exclude_modules`` (``fit_lora_targets``), unless ``adapter.target_modules`` names them (a
regular expression, or a name with the part's module name in its path: ``multi_modal_projector.linear_1``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..recipe import Recipe
from ..recipe.adapter import AdapterSection
from .loading import ModelLoadError, modality_of, text_tokenizer


def prepare_base(model, recipe: Recipe, tokenizer, say: Callable[[str], None]) -> tuple[object, list[int]]:
    """The base as training needs it, and the ids of embedding rows added for the tokenizer."""
    if recipe.model.quantization is not None:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        bits = recipe.model.quantization.bits
        say(f"model: {bits}-bit base through bitsandbytes, prepared for k-bit training (non-quantized layers in "
            "float32, base frozen)")
    new_ids = fit_embeddings(model, tokenizer, say)
    if recipe.model.freeze:
        freeze(model, recipe.model.freeze, say)
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
    then supplies their trained values. ``tokenizer`` may be a processor: its text tokenizer is measured."""
    tokenizer = text_tokenizer(tokenizer)
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


# --- a vision-language model's parts ----------------------------------------------------------------------------

# the attribute names transformers' image-text-to-text families give their vision encoder and the projector that maps
# its features into the language model's embeddings (a projector may sit inside the vision module: Qwen2-VL's merger)
VISION_PARTS = {
    "vision": ("vision_tower", "vision_model", "visual", "vision_encoder", "image_encoder"),
    "projector": ("multi_modal_projector", "multimodal_projector", "mm_projector", "connector", "merger"),
}


def vision_parts(model) -> dict[str, list[str]]:
    """The module paths of each part of ``VISION_PARTS`` in ``model`` (the outermost match of each; none inside the
    language model, ``get_decoder()``, whose own modules may share a name): ``{"vision": [...], "projector": [...]}``,
    a list empty when the model has no such module."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    language = next((name for name, module in model.named_modules() if module is decoder), None) if decoder else None
    found = {part: [] for part in VISION_PARTS}
    for name, _ in model.named_modules():
        leaf = name.rpartition(".")[2]
        if language is not None and (name == language or name.startswith(language + ".")):
            continue
        for part, leaves in VISION_PARTS.items():
            if leaf in leaves and not any(name.startswith(outer + ".") for outer in found[part]):
                found[part].append(name)
    return found


def _inside(name: str, paths: list[str]) -> bool:
    return any(name == path or name.startswith(path + ".") for path in paths)


def part_parameters(model, part: str, parts: dict[str, list[str]] | None = None) -> dict[str, object]:
    """The parameters of one part (``vision`` or ``projector``) by name; the vision part leaves out a projector
    nested in it (Qwen2-VL's ``visual.merger``), which is the projector's."""
    parts = parts if parts is not None else vision_parts(model)
    others = [path for other, paths in parts.items() if other != part for path in paths
              if any(path.startswith(own + ".") for own in parts[part])]
    return {name: param for name, param in model.named_parameters()
            if _inside(name, parts[part]) and not _inside(name, others)}


def freeze(model, names: list[str], say: Callable[[str], None]) -> None:
    """``model.freeze``: the parameters of the parts named stop training (``requires_grad`` off) before the trainer
    is built, so the optimizer never holds them and they keep their loaded values. A part the model does not have is
    an error naming the key and the model's own top modules (a text model is refused earlier, by the recipe rule
    ``freeze_needs_a_vision_model``)."""
    parts = vision_parts(model)
    for name in names:
        params = part_parameters(model, name, parts)
        if not params:
            has = ", ".join(n for n, m in model.named_modules() if n and n.count(".") <= 1)
            raise ModelLoadError(
                f"model.freeze: `{name}` matches no module of this {type(model).__name__} (ft looks for a module "
                f"named {' or '.join(VISION_PARTS[name])} outside its language model); its top modules are {has}. "
                "Remove it from model.freeze.")
        for param in params.values():
            param.requires_grad_(False)
        count = sum(p.numel() for p in params.values())
        say(f"model: froze the {name} ({', '.join(parts[name])}: {count:,} parameters, model.freeze)")


def fit_lora_targets(config, model, say: Callable[[str], None] | None = None):
    """A new LoRA adapter's ``config`` fitted to a vision-language ``model``: its vision tower and projector go to
    PEFT's ``exclude_modules`` (one regular expression of their module paths), so ``all-linear`` or names such as
    ``q_proj`` (which the vision tower's attention has too) put adapters on the language model only. A part stays a
    target when ``adapter.target_modules`` names it: a regular expression (matched against whole module names, it says
    exactly where adapters go), or a name with the part's module name in its dotted path. ``config`` unchanged for a
    text model, or without an adapter."""
    if config is None or getattr(config, "target_modules", None) is None or modality_of(model.config) != "vision":
        return config
    parts = vision_parts(model)
    if not any(parts.values()):
        return config
    targets = config.target_modules
    if isinstance(targets, str) and targets.lower() != "all-linear":
        return config  # a regular expression: the user's exact choice
    named = set() if isinstance(targets, str) else {piece for target in targets for piece in target.split(".")}
    opted = [part for part, paths in parts.items() if paths and any(p.rpartition(".")[2] in named for p in paths)]
    excluded = [path for part, paths in parts.items() if part not in opted for path in paths]
    if not excluded:
        return config
    kept = [path for part in opted for path in parts[part] if any(path.startswith(e + ".") for e in excluded)]
    keep = f"(?!(?:{'|'.join(map(re.escape, kept))})(?:\\.|$))" if kept else ""
    config.exclude_modules = f"{keep}(?:{'|'.join(map(re.escape, excluded))})(?:\\..*)?"
    if say is not None:
        say(f"adapter: LoRA on the language model only; not on {', '.join(excluded)} (name them in "
            "adapter.target_modules to adapt them too)")
    return config
