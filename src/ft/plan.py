"""``ft plan``: a recipe's peak training memory per device, from the model's config alone.

Only the config is read (``config.json`` or a GGUF file's metadata, through ``transformers.AutoConfig``; no weights,
no torch): the parameters of a Llama-style decoder (Llama, Mistral, Qwen2, Gemma, …) are counted from it, and every
part of the peak is a formula over the recipe and ft's defaults for the device. docs/plan.md derives the formulas and
gives their measured accuracy (``benchmarks/plan_accuracy.py``).

The peak is the largest of three moments of a training step:

- forward: weights, optimizer state, the activations saved for backward, and the logits with the loss's copies;
- backward: the same activations, the loss's gradient buffers and the first (LM head) gradients;
- optimizer step: weights, state, every gradient and the update's temporaries.

Gradients are held through the forward and backward only with gradient accumulation; otherwise the Trainer frees
them after each step. What no formula here knows (allocator fragmentation, the CUDA context, library workspaces,
FSDP/DeepSpeed sharding) is left out and said so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from .inference.locate import start_config
from .model.loading import ModelLoadError, gguf_problems, names_a_path
from .recipe import Recipe
from .recipe.methods import METHODS
from .recipe.optimizers import traits
from .run.hardware import Hardware, device_defaults
from .trainers.token_metrics import ENTROPY_CHUNK

KiB, MiB, GiB = 2**10, 2**20, 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TILE_TOKENS, TILE_VOCAB = 4096, 32768  # one tile of TRL's fused LM head (trl.kernels.chunked_logprob)
BNB_MIN_8BIT = 4096  # bitsandbytes and torchao keep tensors smaller than this in 32-bit state
FOREACH = {"adamw_torch", "sgd", "adagrad", "rmsprop", "schedule_free_adamw", "schedule_free_sgd"}
FITS_BELOW = 0.9  # of the GPU's memory: the rest is for the CUDA context, fragmentation and library workspaces
PROJECTED = [r".*self_attn.*", r".*mlp.*"]  # the modules a suggested GaLore projects


class PlanError(Exception):
    """No estimate can be made (unreadable config, an architecture not modelled, a bad --gpu-memory): exit 2."""


# --- the model, from its config -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Linear:
    name: str  # the module name PEFT and transformers match targets against: model.layers.0.self_attn.q_proj
    fan_in: int
    fan_out: int
    reads: str  # the tensor it reads: attn_in / mlp_in (a norm's output), attn_out, mlp_mid, head


@dataclass(frozen=True)
class Shape:
    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    biases: int  # bias values per layer
    dtype: str | None  # the checkpoint's, which model.dtype: auto keeps

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_linears(self, i: int) -> list[Linear]:
        h, q, kv, inter, p = self.hidden, self.q, self.kv, self.intermediate, f"model.layers.{i}."
        return [Linear(p + "self_attn.q_proj", h, q, "attn_in"), Linear(p + "self_attn.k_proj", h, kv, "attn_in"),
                Linear(p + "self_attn.v_proj", h, kv, "attn_in"), Linear(p + "self_attn.o_proj", q, h, "attn_out"),
                Linear(p + "mlp.gate_proj", h, inter, "mlp_in"), Linear(p + "mlp.up_proj", h, inter, "mlp_in"),
                Linear(p + "mlp.down_proj", inter, h, "mlp_mid")]

    def linears(self) -> list[Linear]:
        return [lin for i in range(self.layers) for lin in self.layer_linears(i)] + [
            Linear("lm_head", self.hidden, self.vocab, "head")]


_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def read_shape(recipe: Recipe) -> Shape:
    """The model's dimensions, from its config (local directory, the hub cache, or the hub when online; a GGUF
    file's metadata)."""
    model = recipe.model
    problems = gguf_problems(model)
    if problems:
        raise PlanError(problems[0].render())
    try:
        config = start_config(model)  # a run's: its base's config
    except ModelLoadError as exc:  # a run that cannot be read: said as ft merge says it
        raise PlanError(str(exc)) from None
    except (OSError, ValueError) as exc:
        if names_a_path(model.name):
            raise PlanError(f"model.name: {model.name!r} is not a directory (a relative path is read from the "
                            "recipe's folder); `ft plan` needs only the model's config.json: point model.name at "
                            "a directory that holds one (for a run's final/, train that run first).") from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise PlanError(
            f"model.name: could not read the model's config from {model.name!r}: {first}. `ft plan` needs only its "
            "config.json: set model.name to a local directory that holds one, or to a hub id that is in the local "
            "cache or reachable from this machine (unset HF_HUB_OFFLINE to download it; `hf auth login` for gated "
            "models).") from None
    config = config.get_text_config()
    missing = [key for key in _REQUIRED if getattr(config, key, None) is None]
    experts = [key for key in _EXPERTS if getattr(config, key, None)]
    kind = getattr(config, "model_type", "?")
    if missing or experts:
        why = (f"lacks {', '.join(missing)}" if missing
               else f"is a mixture of experts ({experts[0]}: {getattr(config, experts[0])})")
        raise PlanError(f"model.name: the config of {model.name!r} ({kind}) {why}; `ft plan` models dense "
                        "Llama-style decoders (Llama, Mistral, Qwen2, Gemma, …) and cannot estimate this model.")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    attention_bias = bool(getattr(config, "attention_bias", False)) or kind.startswith("qwen2")
    biases = (heads + 2 * kv_heads) * head_dim if attention_bias else 0
    if getattr(config, "mlp_bias", False):
        biases += 2 * config.intermediate_size + config.hidden_size
    dtype = getattr(config, "dtype", None)
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    return Shape(model.name, kind, config.hidden_size, config.intermediate_size, config.num_hidden_layers, heads,
                 kv_heads, head_dim, config.vocab_size, bool(getattr(config, "tie_word_embeddings", False)), biases,
                 dtype if dtype in DTYPE_BYTES else None)


# --- what the estimate depends on ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    r: int
    targets: str | tuple[str, ...]
    dropout: float
    dora: bool
    modules_to_save: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setup:
    """The recipe as the estimate sees it, after ft's defaults for the device (suggestions change a copy)."""

    device: str  # cuda | cpu
    gpus: int
    method: str
    batch: int  # per device
    accumulation: int
    max_length: int
    packing: bool
    checkpointing: bool
    mixed: str | None  # bf16 / fp16 autocast, or None
    dtype: str  # of the weights that are not quantized
    bits: int | None  # model.quantization
    double_quant: bool
    optimizer: str  # a transformers optim name, or "class" for optimizer.class
    optim_args: tuple[tuple[str, object], ...]
    optim_targets: tuple[str, ...] | None
    adapter: Adapter | None
    attention: str
    full_logits: bool  # the loss builds batch × length × vocab logits (else TRL's fused LM head)
    metrics_on_logits: bool  # ft's CPU SFT path also measures entropy and accuracy on those logits
    reference: bool  # a frozen copy of the weights (DPO/KTO full fine-tuning)

    @property
    def sequences(self) -> int:
        """Sequences one row puts through the model together (DPO, ORPO: chosen and rejected)."""
        return METHODS[self.method].sequences_per_row

    @property
    def scores(self) -> bool:
        """The model is a sequence classifier with one score (a reward model): a score head, not an LM head."""
        return METHODS[self.method].scores

    @property
    def compute(self) -> int:
        """Bytes of an activation: half precision under autocast, else the weights' (float32 beside a k-bit base)."""
        return 2 if self.mixed else self.param_bytes

    @property
    def param_bytes(self) -> int:
        """Bytes of each parameter that is not quantized (PEFT's k-bit preparation puts them in float32)."""
        return 4 if self.bits else DTYPE_BYTES[self.dtype]

    @property
    def mlp_bytes(self) -> int:
        """Bytes of the MLP's activations: bitsandbytes layers answer in their input's dtype (the float32 norms')."""
        return 4 if self.bits else self.compute

    @property
    def fused_update(self) -> bool:
        """The optimizer updates each parameter during backward and keeps no gradients (LOMO, layerwise)."""
        return self.optimizer in ("lomo", "adalomo") or traits(self.optimizer).layerwise


def setup_for(recipe: Recipe, shape: Shape, device: str = "cuda", gpus: int = 1) -> Setup:
    """ft's view of the recipe on ``gpus`` devices of kind ``device``: the recipe's keys, then ft's defaults for
    the device (``ft.run.hardware.device_defaults``: bf16 and activation checkpointing on CUDA, neither on a CPU), then
    TRL's."""
    hw = Hardware(cuda=device == "cuda", bf16=True, devices=gpus, name=device)
    train = {**device_defaults(recipe, hw), **recipe.train_args}
    checkpointing = train.get("activation_checkpointing")
    if checkpointing is None:
        checkpointing = train.get("gradient_checkpointing", True)  # TRL's default
    mixed = "fp16" if train.get("fp16") else "bf16" if train.get("bf16", True) else None
    model, adapter, opt = recipe.model, recipe.adapter, recipe.optimizer
    dtype = model.dtype
    if dtype == "auto":  # the checkpoint's; float32 for a model built from its config
        dtype = "float32" if model.init == "random" else shape.dtype or "float32"
    quant = model.quantization
    lora = None
    if adapter is not None:
        targets = adapter.target_modules if isinstance(adapter.target_modules, str) else tuple(adapter.target_modules)
        lora = Adapter(adapter.r, targets, adapter.dropout, adapter.use_dora, tuple(adapter.modules_to_save or ()))
    method = METHODS[recipe.method]
    fused_loss = (method.fused_lm_head and recipe.loss is None and not train.get("label_smoothing_factor")
                  and train.get("loss_type", "nll") == "nll")
    return Setup(
        device=device, gpus=gpus, method=recipe.method, batch=train.get("per_device_train_batch_size", 8),
        accumulation=train.get("gradient_accumulation_steps", 1), max_length=recipe.data.max_length,
        packing=recipe.data.packing, checkpointing=bool(checkpointing), mixed=mixed, dtype=dtype,
        bits=quant.bits if quant else None, double_quant=bool(quant and quant.double_quant),
        optimizer="class" if opt.cls else opt.name, optim_args=tuple(sorted(opt.args.items())),
        optim_targets=tuple(opt.target_modules) if opt.target_modules else None, adapter=lora,
        attention=model.attn_implementation or "sdpa", full_logits=device == "cpu" or not fused_loss,
        metrics_on_logits=device == "cpu" and fused_loss,
        reference=method.reference_copy and adapter is None and not train.get("precompute_ref_log_probs"))


# --- parameters ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    module: str
    rows: int
    cols: int  # 1 for vectors
    bytes: float  # per value, as stored
    trainable: bool
    kind: str  # embedding | linear | head | vector | adapter

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def size(self) -> float:
        return self.numel * self.bytes


def lora_targets(adapter: Adapter, module: str) -> bool:
    """PEFT's matching: `all-linear` (not the output head), a regex matched against the whole name, or names
    matched against the end of it."""
    if adapter.targets == "all-linear":
        return module != "lm_head"
    if isinstance(adapter.targets, str):
        return re.fullmatch(adapter.targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in adapter.targets)


def optim_targets(targets: tuple[str, ...] | None, module: str) -> bool:
    """transformers' ``check_target_module_exists`` for a list: a name, a substring, or a regex (fullmatch)."""
    return bool(targets) and (module in targets or any(t in module for t in targets)
                              or any(re.fullmatch(t, module) for t in targets))


def _quantized_bytes(s: Setup, fan_in: int) -> float:
    """bitsandbytes: int8 plus a float32 scale per row; or 4-bit with a float32 absmax per 64 values (8-bit, with a
    float32 second level per 256 blocks, under double quantization)."""
    if s.bits == 8:
        return 1 + 4 / fan_in
    return 0.5 + (1 / 64 + 4 / (64 * 256) if s.double_quant else 4 / 64)


def parameters(shape: Shape, s: Setup) -> list[Param]:
    full, base = s.adapter is None, s.param_bytes
    h, v = shape.hidden, shape.vocab
    params = [Param("model.embed_tokens", v, h, base, full, "embedding")]
    for i in range(shape.layers):
        for lin in shape.layer_linears(i):
            params.append(Param(lin.name, lin.fan_out, lin.fan_in, _quantized_bytes(s, lin.fan_in) if s.bits else base,
                                full, "linear"))
        params.append(Param(f"model.layers.{i}", 2 * h + shape.biases, 1, base, full, "vector"))
    params.append(Param("model.norm", h, 1, base, full, "vector"))
    if s.scores:  # a new score head in place of the LM head; trained under LoRA too (PEFT's SEQ_CLS task)
        params.append(Param("score", 1, h, base, True, "head"))
    elif not shape.tied:
        params.append(Param("lm_head", v, h, base, full, "head"))  # bitsandbytes leaves the output head alone
    if s.adapter:  # adapters train in float32 (PEFT upcasts them on a half-precision base)
        a = s.adapter
        for lin in shape.linears():
            if lora_targets(a, lin.name):
                params += [Param(lin.name + ".lora_A", a.r, lin.fan_in, 4, True, "adapter"),
                           Param(lin.name + ".lora_B", lin.fan_out, a.r, 4, True, "adapter")]
                if a.dora:
                    params.append(Param(lin.name + ".magnitude", lin.fan_out, 1, 4, True, "adapter"))
        for p in list(params):  # modules_to_save: a trained copy beside the frozen original
            if p.kind in ("embedding", "head") and any(p.module.endswith(m) for m in a.modules_to_save):
                params.append(replace(p, module=p.module + ".copy", trainable=True))
    return params


# --- optimizer state: transformers' optim name -> bytes kept between steps -----------------------------------------


@dataclass(frozen=True)
class OptimizerInput:
    params: list[Param]  # the trainable ones
    args: dict
    targets: tuple[str, ...] | None


StateBytes = Callable[[OptimizerInput], float]


def per_param(states: float, dtype_bytes: float | None = None) -> StateBytes:
    """``states`` tensors the size of each parameter: in its own dtype (torch's ``zeros_like``) or ``dtype_bytes``."""
    return lambda o: sum(p.numel * states * (dtype_bytes or p.bytes) for p in o.params)


def blockwise(states: int, bits: int, block: int = 256) -> StateBytes:
    """bitsandbytes / torchao low-bit states: ``bits`` per value plus a float32 scale per ``block`` values, for
    tensors of 4096+ values; smaller ones and embeddings (transformers registers them for 32 bits) stay float32."""
    def state(o: OptimizerInput) -> float:
        return sum(states * p.numel * ((bits / 8 + 4 / block) if p.numel >= BNB_MIN_8BIT and p.kind != "embedding"
                                       else 4) for p in o.params)
    return state


def factored(o: OptimizerInput) -> float:
    """Adafactor (no first moment): a float32 row and column of second moments per matrix, full ones for vectors."""
    return sum(4 * (p.rows + p.cols) if p.cols > 1 else 4 * p.numel for p in o.params)


def momentum_states(base: int, *flags: str) -> StateBytes:
    """``base`` states plus one per optimizer.args flag that is set (SGD's momentum; RMSprop's momentum, centered)."""
    def state(o: OptimizerInput) -> float:
        extra = sum(1 for flag in flags if str(o.args.get(flag, 0)).lower() not in ("0", "0.0", "false", "none"))
        return per_param(base + extra)(o)
    return state


def low_rank(inner: Callable[[int, int], float], projector: Callable[[int, int, dict], float]) -> StateBytes:
    """GaLore / APOLLO: each targeted matrix keeps ``inner`` state for its projected gradient (rank × its larger
    side) and a projector; every other trainable parameter keeps AdamW's two states."""
    def state(o: OptimizerInput) -> float:
        rank, total = int(o.args.get("rank", 128)), 0.0
        for p in o.params:
            if p.cols > 1 and p.kind in ("linear", "head") and optim_targets(o.targets, p.module):
                r, big, small = min(rank, p.rows, p.cols), max(p.rows, p.cols), min(p.rows, p.cols)
                total += inner(r, big) + projector(r, small, o.args)
            else:
                total += 2 * p.size
        return total
    return state


def _galore_projector(r: int, small: int, args: dict) -> float:
    return 4 * small * small  # a slice of the float32 SVD factor, which keeps the whole factor alive


def _apollo_projector(r: int, small: int, args: dict) -> float:
    return 4 * r * small if args.get("proj", "random") == "random" else 4 * small * small


ADAMW, ADAMW_32 = per_param(2), per_param(2, 4)
OPTIMIZER_STATE: dict[str, StateBytes] = {
    **dict.fromkeys(("adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused",
                     "adamw_anyprecision", "stable_adamw"), ADAMW),
    **dict.fromkeys(("paged_adamw_32bit",), ADAMW_32),
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit"), blockwise(2, 8)),
    "adamw_torch_8bit": blockwise(2, 8),
    "adamw_torch_4bit": blockwise(2, 4, 128),
    **dict.fromkeys(("lion_32bit", "paged_lion_32bit", "rmsprop_bnb", "rmsprop_bnb_32bit"), per_param(1, 4)),
    **dict.fromkeys(("lion_8bit", "paged_lion_8bit", "rmsprop_bnb_8bit"), blockwise(1, 8)),
    **dict.fromkeys(("ademamix", "paged_ademamix_32bit"), per_param(3, 4)),
    **dict.fromkeys(("ademamix_8bit", "paged_ademamix_8bit"), blockwise(3, 8)),
    "adafactor": factored,
    "adalomo": factored,
    "lomo": per_param(0),
    "sgd": momentum_states(0, "momentum"),
    "adagrad": per_param(1),
    "rmsprop": momentum_states(1, "momentum", "centered"),
    "grokadamw": per_param(3),
    **dict.fromkeys(("schedule_free_adamw", "schedule_free_radam"), per_param(2)),  # z and the second moment
    "schedule_free_sgd": per_param(1),  # z
    **dict.fromkeys(("galore_adamw", "galore_adamw_layerwise"),
                    low_rank(lambda r, big: 2 * 4 * r * big, _galore_projector)),
    **dict.fromkeys(("galore_adamw_8bit", "galore_adamw_8bit_layerwise"),
                    low_rank(lambda r, big: 2 * r * big * (1 + 4 / 256), _galore_projector)),
    **dict.fromkeys(("galore_adafactor", "galore_adafactor_layerwise"),
                    low_rank(lambda r, big: 4 * (r + big), _galore_projector)),
    **dict.fromkeys(("apollo_adamw", "apollo_adamw_layerwise"),
                    low_rank(lambda r, big: 2 * 4 * r * big, _apollo_projector)),
}


def optimizer_state(s: Setup, trainable: list[Param]) -> float:
    """State kept between steps (an unknown name or optimizer.class: counted as AdamW's two states)."""
    return OPTIMIZER_STATE.get(s.optimizer, ADAMW)(OptimizerInput(trainable, dict(s.optim_args), s.optim_targets))


# --- activations ---------------------------------------------------------------------------------------------------


def _saved_inputs(s: Setup, consumers: list[Linear], width: int, in_bytes: int, presaved: bool) -> float:
    """What the linears reading one tensor (``width`` values per token, ``in_bytes`` each) save for backward:
    a trained weight needs its input (one copy shared by all readers, or one half-precision cast per reader under
    autocast); a LoRA adapter keeps its dropout's output and mask (bool on CUDA, a scaled float copy on the CPU)
    and its rank-r hidden value; a frozen weight keeps nothing."""
    cast = s.mixed is not None and in_bytes > 2
    mask = 1 if s.device == "cuda" else in_bytes
    shared, total = False, 0.0
    for lin in consumers:
        lora = s.adapter is not None and lora_targets(s.adapter, lin.name)
        if s.adapter is not None and not lora:
            continue
        if lora:
            total += s.compute * s.adapter.r + (2 * s.compute * lin.fan_out if s.adapter.dora else 0)
        if lora and s.adapter.dropout > 0:
            total += (in_bytes + mask) * width + (2 * width if cast else 0)
        elif cast:
            total += 2 * width
        else:
            shared = True
    return total + (in_bytes * width if shared and not presaved else 0)


def layer_bytes(shape: Shape, s: Setup, i: int) -> float:
    """Bytes decoder layer ``i`` saves for backward, per token (derived term by term in docs/plan.md)."""
    h, q, inter, c, norm = shape.hidden, shape.q, shape.intermediate, s.compute, s.param_bytes
    total = 2 * (4 * h + 4)  # each RMSNorm: its input in float32, and 1/rms
    if s.adapter is None:
        total += 2 * norm * h  # ... and the normalised input, for the norm weight's gradient
    if s.attention == "eager":  # q, k and v repeated to every head, the softmax probabilities
        total += 3 * c * q + shape.heads * s.max_length * (4 if c == 4 else 4 + c)
    else:  # q, k, v, the output and the log-sum-exp; transformers repeats k/v for sdpa with a padding mask
        kv = q if s.attention == "sdpa" and not s.packing else shape.kv
        total += c * (2 * q + 2 * kv) + 4 * shape.heads
    total += 3 * s.mlp_bytes * inter  # gate, act(gate), up
    linears = shape.layer_linears(i)
    for reads, width, in_bytes, presaved in (("attn_in", h, norm, False), ("attn_out", q, c, s.attention != "eager"),
                                             ("mlp_in", h, norm, False), ("mlp_mid", inter, s.mlp_bytes, False)):
        total += _saved_inputs(s, [lin for lin in linears if lin.reads == reads], width, in_bytes, presaved)
    return total


@dataclass(frozen=True)
class Activations:
    saved: float  # held from the forward to the backward
    layer: float  # one layer's saved activations (a checkpointed layer's recomputation; a layer's gradient buffers)
    autocast_copies: float  # half-precision copies of float32 weights that autocast saves for backward


def activations(shape: Shape, s: Setup, params: list[Param]) -> Activations:
    seqs = s.batch * s.sequences
    tokens = seqs * s.max_length
    layers = [layer_bytes(shape, s, i) * tokens for i in range(shape.layers)]
    h, norm, c = shape.hidden, s.param_bytes, s.compute
    final = 4 * h + 4 + (norm * h if s.adapter is None else 0)  # the final norm, like a layer's
    head_trained = any(p.trainable and p.kind in ("head", "embedding") for p in params)
    if not s.full_logits:
        final += norm * h  # TRL's fused head keeps its own copy of the hidden states
    elif head_trained:
        final += 2 * h if s.mixed and norm > 2 else norm * h  # the LM head's input
    mask = 0 if s.packing or s.attention.startswith("flash") else seqs * s.max_length**2 * (c if s.attention == "eager"
                                                                                             else 1)
    saved = (shape.layers * norm * h * tokens if s.checkpointing else sum(layers)) + final * tokens + mask
    copies = 0.0
    if s.mixed and norm == 4:  # autocast keeps a half-precision copy of every float32 matmul weight until backward
        copies = 2 * sum(p.numel for p in params if p.cols > 1 and p.bytes == 4 and p.kind != "embedding"
                         and (p.kind != "head" or s.full_logits))
    return Activations(saved, max(layers), copies)


def head_memory(shape: Shape, s: Setup, head_trained: bool) -> tuple[float, float]:
    """(forward, backward) bytes of the LM head and loss beyond the saved activations.

    A reward model's score head: one value per position, a few bytes a token.

    Full logits (ft's CPU path, a custom loss, the other methods): the logits, the loss's float32 log-softmax
    (and float32 copy of half-precision logits); ft's CPU SFT metrics add a copy of the shifted logits and three
    float32 chunks of at most 2**25 values (four from half-precision logits); backward holds the log-softmax and
    two float32 gradients of it.
    TRL's fused LM head (SFT on CUDA): one 4096 × 32768 tile, a float32 gradient of the hidden states and, when
    the head trains, a float32 gradient of its weight."""
    tokens = s.batch * s.sequences * s.max_length
    c, v, h = s.compute, shape.vocab, shape.hidden
    if s.scores:  # one score per position (the last real one is read), and the pairwise loss on a few numbers
        return c * tokens + 4 * tokens, 3 * 4 * tokens
    if s.full_logits:
        n = tokens * v
        upcast = 4 * n if c != 4 else 0
        forward = c * n + 4 * n + upcast
        if s.metrics_on_logits:  # the loss's float copy is gone by then; the metric makes its own per chunk
            forward += c * n + (3 + (c != 4)) * 4 * min(n, ENTROPY_CHUNK) - upcast
        return forward, 3 * 4 * n + (c * n if c != 4 else 0)
    tile = min(tokens, TILE_TOKENS) * min(v, TILE_VOCAB) * c + min(v, TILE_VOCAB) * h * c
    return tile + 8 * 4 * tokens, tile + 4 * tokens * h + (4 * v * h if head_trained else 0)


# --- the estimate ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    name: str
    size: float  # its own largest size
    at_peak: float  # what of it is held at the peak


@dataclass(frozen=True)
class Estimate:
    setup: Setup
    parts: tuple[Part, ...]
    phase: str  # forward | backward | optimizer step
    params: int
    trainable: int

    @property
    def total(self) -> float:
        return sum(p.at_peak for p in self.parts)


def estimate(shape: Shape, s: Setup) -> Estimate:
    params = parameters(shape, s)
    trainable = [p for p in params if p.trainable]
    weights = sum(p.size for p in params)
    grads = 0.0 if s.fused_update else sum(p.size for p in trainable)
    state = optimizer_state(s, trainable)
    act = activations(shape, s, params)
    head_trained = any(p.kind in ("head", "embedding") for p in trainable)
    head_fwd, head_bwd = head_memory(shape, s, head_trained)
    largest = max((p.size for p in trainable), default=0.0)
    # the first gradient backward makes (the head's; one at a time for a fused update); accumulation reuses its buffer
    head_grad = 0.0 if s.accumulation > 1 else largest if s.fused_update else max(
        (p.size for p in trainable if p.kind in ("head", "embedding")), default=0.0)
    if s.device == "cuda" and s.optimizer in FOREACH:  # torch's foreach step: one temporary per state tensor
        step_tmp = sum(p.size for p in trainable)
    else:  # a loop over parameters: about two temporaries of the largest
        step_tmp = 0.0 if s.fused_update else 2 * largest
    in_pass = grads if s.accumulation > 1 else 0.0  # gradients accumulate across micro-batches
    buffers = (2 if s.checkpointing else 1) * act.layer  # a layer's recomputation and its gradient buffers
    held = act.saved + act.autocast_copies
    phases = {"forward": held + head_fwd + in_pass,
              "backward": held + in_pass + max(head_bwd + head_grad, buffers),
              "optimizer step": 0.0 if s.fused_update else grads + step_tmp}
    phase = max(phases, key=phases.get)
    fwd, bwd, step = phase == "forward", phase == "backward", phase == "optimizer step"
    head_wins = head_bwd + head_grad >= buffers
    grads_held = grads if step else in_pass + (head_grad if bwd and head_wins else 0.0)
    ddp = grads if s.gpus > 1 else 0.0  # DDP's gradient buckets, a second copy of the gradients
    ref = sum(p.size for p in params if p.kind != "adapter") if s.reference else 0.0
    dtype = f"{s.bits}-bit base" if s.bits else s.dtype
    parts = [
        Part(f"weights ({dtype})", weights, weights),
        Part("reference model (frozen copy)", ref, ref),
        Part("gradients" + (" (none kept: updated in backward)" if s.fused_update else ""), grads or largest,
             grads_held),
        Part(f"optimizer state ({s.optimizer})", state, state),
        Part("activations saved for backward" + (" (checkpointed)" if s.checkpointing else ""), act.saved,
             0.0 if step else act.saved),
        Part("autocast copies of float32 weights", act.autocast_copies, 0.0 if step else act.autocast_copies),
        Part("scores and loss" if s.scores else "logits and loss" + ("" if s.full_logits else " (fused LM head)"),
             max(head_fwd, head_bwd),
             head_fwd if fwd else head_bwd if bwd and head_wins else 0.0),
        Part("backward buffers of one layer" + (" (+ its recomputation)" if s.checkpointing else ""), buffers,
             buffers if bwd and not head_wins else 0.0),
        Part("optimizer step temporaries", step_tmp, step_tmp if step else 0.0),
        Part("DDP gradient buckets", ddp, ddp),
    ]
    parts = tuple(p for p in parts if p.size > 0)
    return Estimate(s, parts, phase, sum(p.numel for p in params if p.kind != "adapter" and not
                                         p.module.endswith(".copy")), sum(p.numel for p in trainable))


# --- suggestions ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Suggestion:
    changes: dict  # recipe key -> new value
    estimate: Estimate


def _candidates(s: Setup, fits: Callable[[Setup], bool]) -> list[tuple[dict, Setup]]:
    """Single recipe changes that lower the peak, least disruptive first."""
    out = []
    if not s.checkpointing:
        out.append(({"train.gradient_checkpointing": True}, replace(s, checkpointing=True)))
    if s.batch > 1:  # the largest smaller batch that fits (else 1), accumulating to the same batch per update
        for batch in sorted({max(1, s.batch // 2**k) for k in range(1, 16)}, reverse=True):
            new = replace(s, batch=batch, accumulation=math.ceil(s.batch * s.accumulation / batch))
            if batch == 1 or fits(new):
                out.append(({"train.per_device_train_batch_size": batch,
                             "train.gradient_accumulation_steps": new.accumulation}, new))
                break
    if s.device == "cuda" and s.dtype == "float32" and not s.bits:
        out.append(({"model.dtype": "bfloat16"}, replace(s, dtype="bfloat16")))
    if OPTIMIZER_STATE.get(s.optimizer, ADAMW) in (ADAMW, ADAMW_32):
        out.append(({"optimizer.name": "adamw_8bit"}, replace(s, optimizer="adamw_8bit", optim_args=())))
    lora = Adapter(16, "all-linear", 0.05, False)
    if s.adapter is None:
        out.append(({"adapter": {"kind": "lora"}}, replace(s, adapter=lora, reference=False)))
    if s.bits is None and s.device == "cuda":
        change = {"model.quantization": {"bits": 4}}
        out.append(({**({} if s.adapter else {"adapter": {"kind": "lora"}}), **change},
                    replace(s, adapter=s.adapter or lora, reference=False, bits=4, double_quant=True)))
    if s.adapter is None and s.optimizer in ("adamw_torch", "adamw_torch_fused"):
        out.append(({"optimizer.name": "galore_adamw", "optimizer.target_modules": PROJECTED},
                    replace(s, optimizer="galore_adamw", optim_args=(), optim_targets=tuple(PROJECTED))))
    return out


def suggestions(shape: Shape, s: Setup, budget: float) -> list[Suggestion]:
    """Changes that each make the recipe fit in ``budget``; if none does alone, changes that fit together (taken
    in the order of ``_candidates``, each on top of the ones before, skipping those that save nothing)."""
    def total(setup: Setup) -> float:
        return estimate(shape, setup).total

    def fits(setup: Setup) -> bool:
        return total(setup) <= FITS_BELOW * budget

    found = [Suggestion(changes, estimate(shape, new)) for changes, new in _candidates(s, fits) if fits(new)]
    if found:
        return found
    changes, current = {}, s
    while not fits(current):
        options = [(c, new) for c, new in _candidates(current, fits)
                   if not c.keys() <= changes.keys() and total(new) < 0.99 * total(current)]
        if not options:
            return []
        change, current = options[0]
        changes.update(change)
    return [Suggestion(changes, estimate(shape, current))]


# --- the report ------------------------------------------------------------------------------------------------------


def parse_memory(text: str) -> float:
    """'80GiB', '24GB', '16G' (GiB), '81920MiB', '80' (GiB) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*", text, re.I)
    if not match or float(match.group(1)) <= 0:
        raise PlanError(f"--gpu-memory: {text!r} is not an amount of memory; write it like 80GiB, 24GB or 16G.")
    value, prefix, suffix = float(match.group(1)), match.group(2).upper() or "G", match.group(3)
    power = "KMGT".index(prefix) + 1
    return value * (1000**power if suffix.upper() == "B" else 1024**power)


def local_gpu_memory() -> float | None:
    """Memory of this machine's first GPU, or None without CUDA."""
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None


@dataclass(frozen=True)
class Plan:
    source: str
    shape: Shape
    estimate: Estimate
    budget: float | None
    suggestions: list[Suggestion]

    @property
    def fits(self) -> bool | None:
        return None if self.budget is None else self.estimate.total <= FITS_BELOW * self.budget

    def as_dict(self) -> dict:
        e = self.estimate
        return {
            "recipe": self.source, "model": asdict(self.shape), "setup": asdict(e.setup),
            "parameters": e.params, "trainable_parameters": e.trainable,
            "components": [{"name": p.name, "bytes": round(p.size), "at_peak_bytes": round(p.at_peak)}
                           for p in e.parts],
            "peak_bytes": round(e.total), "peak_phase": e.phase,
            "gpu_memory_bytes": None if self.budget is None else round(self.budget), "fits": self.fits,
            "suggestions": [{"changes": x.changes, "set": set_args(x.changes), "peak_bytes": round(x.estimate.total)}
                            for x in self.suggestions],
        }

    def render(self) -> str:
        e, s, shape = self.estimate, self.estimate.setup, self.shape
        where = ("the CPU" if s.device == "cpu" else f"{s.gpus} GPUs (DDP)" if s.gpus > 1 else "1 GPU")
        precision = f"{s.mixed} autocast" if s.mixed else "no autocast"
        trained = ("full fine-tuning" if s.adapter is None
                   else f"LoRA r={s.adapter.r}{' (DoRA)' if s.adapter.dora else ''}")
        lines = [
            f"ft plan: {self.source}, per device on {where}",
            f"model: {shape.name} ({shape.model_type}, {shape.layers} layers, hidden {shape.hidden}, vocab "
            f"{shape.vocab}): {e.params / 1e6:,.1f}M parameters, {e.trainable / 1e6:,.2f}M trained ({trained})",
            f"step: {s.batch} × {s.max_length} tokens{' packed' if s.packing else ''}, gradient accumulation "
            f"{s.accumulation}; {precision}; activation checkpointing {'on' if s.checkpointing else 'off'}; "
            f"{s.attention} attention; optimizer {s.optimizer}",
            "",
            f"{'component':<52}{'size':>12}{'at peak':>12}",
        ]
        lines += [f"{p.name:<52}{human(p.size):>12}{human(p.at_peak):>12}" for p in e.parts]
        lines.append(f"{'peak (in the ' + e.phase + ')':<52}{'':>12}{human(e.total):>12}")
        if self.budget is None:
            lines.append("\nNo GPU here to compare with: pass --gpu-memory (e.g. 80GiB) to check that it fits.")
            return "\n".join(lines)
        share = e.total / self.budget
        verdict = ("fits" if self.fits else "too tight (over 90%: leave room for the CUDA context and fragmentation)"
                   if share <= 1 else "does not fit")
        lines.append(f"\n{human(self.budget)} {'per GPU' if s.device == 'cuda' else 'of memory'}: {verdict}, "
                     f"{share:.1%} of it.")
        if not self.fits:
            lines += self._render_suggestions()
        return "\n".join(lines)

    def _render_suggestions(self) -> list[str]:
        if not self.suggestions:
            return ["No change ft plan knows makes it fit: use GPUs with more memory or a smaller model "
                    "(FSDP/DeepSpeed sharding is not modelled yet)."]
        alone = len(self.suggestions) > 1 or len(self.suggestions[0].changes) <= 2
        lines = ["Changes that make it fit" + (", each on its own:" if alone else " (together):")]
        for x in self.suggestions:
            lines.append(f"  {'; '.join(f'{k}: {_yaml(v)}' for k, v in x.changes.items()):<62}"
                         f"{human(x.estimate.total):>12}")
        first = " ".join(f"--set {arg}" for arg in set_args(self.suggestions[0].changes))
        lines.append(f"Check one with: ft plan {self.source} {first}")
        return lines


def _yaml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(f"'{v}'" for v in value) + "]"
    return str(value)


def set_args(changes: dict) -> list[str]:
    """The changes as ``--set`` arguments (dotted keys, YAML values)."""
    flat = {}
    for key, value in changes.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return [f"{k}={_yaml(v)}" for k, v in flat.items()]


def human(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class StepFigures:
    """What ``ft train``'s preflight check reads of the estimate: the step's peak, the optimizer state in it (not
    allocated before the first optimizer step), and the single changes that lower the peak, as ``key: value``."""

    peak: float
    optimizer_state: float
    lowering: tuple[str, ...]
    checkpoint: float = 0.0  # a checkpoint's main files: the trained weights (all of them, or the adapter's) and the
    # optimizer state


def step_figures(recipe: Recipe, device: str, budget: float | None = None) -> StepFigures:
    """The estimate of ``recipe`` on ``device`` (one process), for the preflight and disk checks; raises PlanError. The
    smaller batch suggested is the largest that fits in ``budget`` by the estimate, or half the batch without one."""
    shape = read_shape(recipe)
    setup = setup_for(recipe, shape, device)
    result = estimate(shape, setup)
    state = sum(p.size for p in result.parts if p.name.startswith("optimizer state"))

    def fits(new: Setup) -> bool:
        return budget is None or estimate(shape, new).total <= FITS_BELOW * budget

    lowering = tuple(", ".join(arg.replace("=", ": ", 1) for arg in set_args(changes))
                     for changes, _ in _candidates(setup, fits))
    saved = sum(p.size for p in parameters(shape, setup) if p.trainable or setup.adapter is None)
    return StepFigures(result.total, state, lowering, saved + state)


def plan(recipe: Recipe, source: str, gpu_memory: str | None = None, gpus: int = 1, device: str = "cuda") -> Plan:
    """The whole of ``ft plan``: the estimate for the recipe, and changes that make it fit when it does not."""
    budget = parse_memory(gpu_memory) if gpu_memory is not None else (
        local_gpu_memory() if device == "cuda" else None)
    shape = read_shape(recipe)
    setup = setup_for(recipe, shape, device, gpus)
    result = estimate(shape, setup)
    fits = budget is None or result.total <= FITS_BELOW * budget
    return Plan(source, shape, result, budget, [] if fits else suggestions(shape, setup, budget))
