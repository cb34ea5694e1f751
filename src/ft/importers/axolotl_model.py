"""Axolotl's model keys → ft's ``model:`` and ``adapter:``: the base model, dtype and mixed precision, 4/8-bit
loading, attention kernel, LoRA/QLoRA and special tokens."""

from __future__ import annotations

from .axolotl_keys import Ctx, handles, number
from .axolotl_vision import IMAGE_TEXT_CLASSES, LM_ONLY

ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")  # ft's choices
LEGACY_ATTENTION = {  # Axolotl's older boolean flags -> the attn_implementation they stand for
    "flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "flex_attention": "flex_attention",
    "eager_attention": "eager", "xformers_attention": "xformers", "sage_attention": "sage",
}
CAUSAL_LM = ("AutoModelForCausalLM",)


@handles("base_model", "base_model_config", "revision_of_model", "trust_remote_code", "model_type", "tokenizer_type")
def base_model(ctx: Ctx) -> None:
    if ctx.has("base_model"):
        ctx.put("base_model", "model.name", str(ctx.get("base_model")), fixed=True)
    if ctx.has("base_model_config"):
        if ctx.get("base_model_config") == ctx.get("base_model"):
            ctx.off("base_model_config", "the same as base_model")
        else:
            ctx.skip("base_model_config", "ft reads the model's config and tokenizer from `model.name`; a separate "
                     "config source has no ft key (save the model with the config you want, and name that folder)")
    if ctx.has("revision_of_model"):
        ctx.put("revision_of_model", "model.revision", str(ctx.get("revision_of_model")))
    if ctx.has("trust_remote_code"):
        ctx.put("trust_remote_code", "model.trust_remote_code", ctx.get("trust_remote_code") is True)
    model_type = ctx.get("model_type")
    if model_type is not None:
        if model_type in CAUSAL_LM or str(model_type).endswith("ForCausalLM"):
            ctx.same("model_type", "AutoModelForCausalLM, which picks the class from the model's config.json")
        elif ctx.modality == "vision" and (model_type in IMAGE_TEXT_CLASSES or str(model_type).endswith(
                "ForConditionalGeneration")):
            ctx.same("model_type", "AutoModelForImageTextToText for a vision-language model (model.modality: "
                     "vision), which picks the class from the model's config.json")
        else:
            ctx.skip("model_type", f"ft trains causal language models on text (AutoModelForCausalLM); a "
                     f"`{model_type}` model (classification, vision or audio heads) has no ft equivalent")
    tokenizer = ctx.get("tokenizer_type")
    if tokenizer is not None:
        if tokenizer == "AutoTokenizer":
            ctx.same("tokenizer_type", "AutoTokenizer")
        else:
            ctx.skip("tokenizer_type", "ft loads the tokenizer with AutoTokenizer, which picks the class the model's "
                     "tokenizer_config.json names (usually this one, or its fast version); there is no key to force "
                     "another")


def model_dtype(ctx: Ctx) -> str | None:
    """The dtype Axolotl loads the weights in (its ``resolve_dtype``); None for ``bf16: auto`` without fp16, which
    Axolotl resolves by the GPU (ft: the checkpoint's dtype)."""
    bf16 = ctx.get("bf16", "auto")
    if bf16 == "auto" and ctx.get("fp16") is True:
        bf16 = False  # Axolotl: fp16 with bf16 auto turns bf16 off
    if bf16 is True or bf16 == "full" or ctx.get("bfloat16") is True:
        return "bfloat16"
    if bf16 == "auto":
        return None
    if ctx.get("load_in_8bit") is True or ctx.get("fp16") is True or ctx.get("float16") is True:
        return "float16"
    return "float32"


@handles("bf16", "fp16", "bfloat16", "float16", "float32", "torch_dtype", "tf32")
def precision(ctx: Ctx) -> None:
    bf16, fp16, dtype = ctx.get("bf16", "auto"), ctx.get("fp16"), model_dtype(ctx)
    if dtype is not None:
        ctx.draft.set("model.dtype", dtype)
    if ctx.has("bf16"):
        if bf16 is True or bf16 == "full":
            extra = {"train.bf16_full_eval": True} if bf16 == "full" else {}
            ctx.put_many("bf16", {"train.bf16": True, "model.dtype": "bfloat16", **extra})
        elif bf16 == "auto" and fp16 is not True:
            ctx.put("bf16", None, why="ft's default: bf16 mixed precision where the GPU supports it, float32 where "
                    "not (Axolotl falls back to fp16); weights load in the checkpoint's dtype")
        elif bf16 is False:
            ctx.put_many("bf16", {"train.bf16": False, **({"model.dtype": dtype} if dtype else {})})
        elif bf16 == "auto":
            ctx.off("bf16", "fp16: true decides")
        else:
            ctx.skip("bf16", "Axolotl takes true, false, auto or full")
    if ctx.has("fp16"):
        if fp16 is True and bf16 not in (True, "full"):
            ctx.put_many("fp16", {"train.fp16": True, "model.dtype": "float16"})
        elif fp16 is True:
            ctx.off("fp16", "bf16 wins over fp16 in Axolotl")
        else:
            ctx.off("fp16", "off")
    for key, name in (("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32")):
        if ctx.has(key):
            if ctx.get(key) is True and dtype == name:
                ctx.put(key, "model.dtype", name)
            else:
                ctx.off(key, "off" if ctx.get(key) is not True else f"another dtype key decides ({dtype})")
    if ctx.has("torch_dtype"):
        ctx.off("torch_dtype", "Axolotl overwrites it with the dtype bf16/fp16 decide")
    if ctx.has("tf32"):
        if ctx.get("tf32") is True:
            ctx.put("tf32", "train.tf32", True)
        else:
            ctx.same("tf32", "TF32 off, as Axolotl passes tf32=False to the Trainer for false and auto")


@handles("load_in_4bit", "load_in_8bit", "bnb_config_kwargs")
def quantization(ctx: Ctx) -> None:
    """Axolotl loads in 4 bits only with ``adapter: qlora``, in 8 bits only with ``adapter: lora`` (its loader)."""
    adapter = ctx.get("adapter")
    for key, bits, needs in (("load_in_4bit", 4, "qlora"), ("load_in_8bit", 8, "lora")):
        if not ctx.has(key):
            continue
        if ctx.get(key) is not True:
            ctx.off(key, "off")
        elif adapter != needs:
            ctx.off(key, f"Axolotl quantizes {bits}-bit only with `adapter: {needs}` (this config: {adapter})")
        else:
            section = {"bits": bits}
            if bits == 4:
                section["compute_dtype"] = {"float16": "float16", "float32": "float32"}.get(model_dtype(ctx),
                                                                                         "bfloat16")
            ctx.put(key, "model.quantization", section)
    kwargs = ctx.get("bnb_config_kwargs")
    if not isinstance(kwargs, dict):
        if ctx.has("bnb_config_kwargs"):
            ctx.skip("bnb_config_kwargs", "expected a mapping of BitsAndBytesConfig arguments")
        return
    names = {"bnb_4bit_quant_type": "quant_type", "bnb_4bit_use_double_quant": "double_quant",
             "bnb_4bit_compute_dtype": "compute_dtype"}
    for name, value in kwargs.items():
        key = f"bnb_config_kwargs.{name}"
        if name in names and ctx.draft.get("model.quantization.bits") == 4:
            ctx.put(key, f"model.quantization.{names[name]}", value)
        elif name in names:
            ctx.off(key, "read with 4-bit loading only, which this config does not do")
        else:
            ctx.skip(key, "ft's quantization section sets bits, quant_type, double_quant and compute_dtype only")


@handles("attn_implementation", *LEGACY_ATTENTION)
def attention(ctx: Ctx) -> None:
    chosen = ctx.get("attn_implementation")
    if chosen is not None:
        _attention(ctx, "attn_implementation", str(chosen))
    for flag, name in LEGACY_ATTENTION.items():
        if not ctx.has(flag):
            continue
        if ctx.get(flag) is not True:
            ctx.off(flag, "off")
        elif chosen is not None:
            ctx.off(flag, "attn_implementation decides")
        else:
            chosen = name
            _attention(ctx, flag, name)


def _attention(ctx: Ctx, key: str, name: str) -> None:
    if name in ATTENTION:
        ctx.put(key, "model.attn_implementation", name)
    else:
        ctx.skip(key, f"ft's attention kernels are {', '.join(ATTENTION)}; `{name}` is not one of them (the nearest: "
                 f"{'flash_attention_3' if 'flash' in name and '3' in name else 'flash_attention_2 or sdpa'})")


LORA_SHAPE = {"lora_r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "lora_modules_to_save":
              "modules_to_save", "peft_use_dora": "use_dora", "peft_use_rslora": "use_rslora"}
LORA_TARGETS = ("lora_target_modules", "lora_target_linear")
LORA_OTHER = ("lora_fan_in_fan_out", "lora_target_parameters")


@handles("adapter", "lora_model_dir", *LORA_SHAPE, *LORA_TARGETS, *LORA_OTHER)
def adapter(ctx: Ctx) -> None:
    kind = ctx.get("adapter")
    owned = ("lora_model_dir", *LORA_SHAPE, *LORA_TARGETS, *LORA_OTHER)
    if kind not in ("lora", "qlora"):
        if kind is not None:
            ctx.skip("adapter", f"ft's adapters are LoRA (with DoRA, rsLoRA) and QLoRA; `{kind}` has no equivalent, "
                     "so the recipe fine-tunes every weight")
        for key in owned:
            if ctx.has(key):
                ctx.off(key, "no LoRA adapter in this config (full fine-tuning), so Axolotl does not read it")
        return
    notes = []
    if kind == "qlora" and ctx.get("load_in_4bit") is not True:
        notes.append("qlora without load_in_4bit loads the model unquantized in Axolotl, and here")
    ctx.draft.set("adapter.kind", "lora")
    if ctx.has("lora_model_dir"):
        ctx.put("lora_model_dir", "adapter.path", str(ctx.get("lora_model_dir")))
        for key in (*LORA_SHAPE, *LORA_TARGETS):
            if ctx.has(key):
                ctx.off(key, "the saved adapter's adapter_config.json decides (lora_model_dir), in Axolotl as in ft")
    else:
        _lora_shape(ctx, notes)
    for key, why in (("lora_fan_in_fan_out", "PEFT's fan_in_fan_out (Conv1D models such as GPT-2) has no ft key"),
                     ("lora_target_parameters", "ft's adapter targets modules, not parameters (PEFT "
                      "target_parameters, e.g. MoE expert weights)")):
        if ctx.has(key):
            (ctx.skip if ctx.get(key) else ctx.off)(key, why if ctx.get(key) else "off")
    ctx.put("adapter", "adapter.kind", "lora", "; ".join(notes))


def _lora_shape(ctx: Ctx, notes: list[str]) -> None:
    for key, name in LORA_SHAPE.items():
        if ctx.has(key):
            value = number(ctx.get(key))
            if name == "modules_to_save":
                value = [value] if isinstance(value, str) else list(value)
            ctx.put(key, f"adapter.{name}", value)
    modules, linear = ctx.get("lora_target_modules"), ctx.get("lora_target_linear")
    vision = LM_ONLY if ctx.modality == "vision" else ""  # names and all-linear: the language model only
    if linear is True:
        ctx.put("lora_target_linear", "adapter.target_modules", "all-linear", vision)
        if modules is not None:
            ctx.put("lora_target_modules", "adapter.target_modules", "all-linear", "Axolotl adds every linear layer to "
                    "these; all-linear covers them unless one of them is not a linear layer (add it by hand then)"
                    + (f"; {vision}" if vision else ""))
    else:
        if ctx.has("lora_target_linear"):
            ctx.off("lora_target_linear", "off")
        if modules is not None:  # one text is a regular expression, in PEFT as in ft: taken as written
            ctx.put("lora_target_modules", "adapter.target_modules", modules, vision if isinstance(modules, list)
                    else "")
        else:
            notes.append("no target modules given: Axolotl leaves PEFT's per-model default (e.g. q_proj, v_proj), "
                         "ft's default is all-linear" + (" (on the language model only)" if vision else ""))


@handles("special_tokens")
def special_tokens(ctx: Ctx) -> None:
    tokens = ctx.get("special_tokens")
    if not isinstance(tokens, dict):
        ctx.skip("special_tokens", "expected a mapping such as {pad_token: <|end_of_text|>}")
        return
    for name, value in tokens.items():
        key = f"special_tokens.{name}"
        if value in (None, "", []):
            ctx.off(key, "empty")
        elif name == "pad_token":
            ctx.train(key, "pad_token", value, "must already be a token of the tokenizer's vocabulary (Axolotl adds "
                      "it when missing; ft pads with it as TRL does)")
        else:
            ctx.skip(key, "ft keeps the tokenizer's own special tokens (its BOS/EOS end every sequence ft "
                     "tokenizes); to change them, save the tokenizer with the tokens you want and train from that "
                     "folder")
