"""The memory model of ``ft plan``: a recipe's peak training memory per device, every part a formula over the model's
shape, the recipe and ft's defaults for the device. docs/plan.md derives the formulas and gives their measured
accuracy (``benchmarks/plan_accuracy.py``).

The peak is the largest of three moments of a training step and, when the run evaluates, of its evaluation pass:

- forward: weights, optimizer state, the activations saved for backward, and the logits with the loss's copies;
- backward: the same activations, the loss's gradient buffers and the first (LM head) gradients;
- optimizer step: weights, state, every gradient and the update's temporaries;
- evaluation: weights, optimizer state, and the evaluation batch's logits and loss (``per_device_eval_batch_size``
  rows at once, often four times the training batch: on a small model with a large vocabulary it is the peak).

Gradients are held through the forward and backward only with gradient accumulation; otherwise the Trainer frees them
after each step. Beside the policy, the frozen models the method holds: a reference (a copy of the start model, or the
one its section declares, at the policy's shape), and each other causal LM its section declares
(``MethodSection.models``: a teacher), at its own shape read from its own config, in its own dtype. A reward model's
memory is not counted, as the generation it scores is not.

A vision-language model adds its vision tower and projector (``ft.plan.vision``): their weights; gradients and
optimizer state for what of them trains (not the parts ``model.freeze`` names; with LoRA, only adapters on the parts
its targets reach, the language model alone by default); and, when gradients reach them, the activations they save
for the batch's images (``vision_activations``). The language model's sequence is ``data.max_length`` tokens as for
text, image tokens included (ft counts them in it). What no formula here knows (allocator fragmentation, the CUDA
context, library workspaces, FSDP/DeepSpeed sharding) is left out and said so. The constants the model counts with live
here, and the code whose memory they describe reads them from here (``ENTROPY_CHUNK``: ``ft.trainers.token_metrics``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..machine.hardware import Hardware, device_defaults
from ..recipe import Recipe
from ..recipe.methods import METHODS, ExtraModel, models_of
from ..recipe.optimizers import traits
from .shape import DTYPE_BYTES, Linear, PlanError, Shape, read_shape
from .vision import ImageLoad, config_load, lora_parts, part_path

ENTROPY_CHUNK = 2**25  # float32 values per chunk of the token metrics' entropy: three such chunks are counted here
TILE_TOKENS, TILE_VOCAB = 4096, 32768  # one tile of TRL's fused LM head (trl.kernels.chunked_logprob)
BNB_MIN_8BIT = 4096  # bitsandbytes and torchao keep tensors smaller than this in 32-bit state
FOREACH = {"adamw_torch", "sgd", "adagrad", "rmsprop", "schedule_free_adamw", "schedule_free_sgd"}
FITS_BELOW = 0.9  # of the GPU's memory: the rest is for the CUDA context, fragmentation and library workspaces
# a CPU run's process beside its training memory: Python, torch, transformers, TRL, PEFT, datasets imported (RSS;
# measured in docs/plan.md), which summary.json's peak_memory_gb (the process's peak RSS) includes
CPU_RUNTIME = 526 * 2**20


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
    reference: bool  # a frozen copy of the weights (DPO/KTO full fine-tuning, or the reference the section declares)
    frozen: tuple[Frozen, ...] = ()  # the other frozen models the method's section declares (a teacher)
    freeze: tuple[str, ...] = ()  # model.freeze: a vision-language model's parts that do not train
    images: ImageLoad | None = None  # a vision-language model's images per row (ft.plan.vision.image_load)
    eval_batch: int = 0  # per_device_eval_batch_size when the run evaluates (data.eval, split_ratio), else 0
    vllm_share: float = 0.0  # of each GPU's memory vLLM takes beside training (train.use_vllm, vllm_mode colocate)

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


@dataclass(frozen=True)
class Frozen:
    """A model the method holds beside the policy with no gradients, as its section declares it: its recipe ``key``,
    its ``role``, its ``shape`` (from its own config) and the ``dtype`` its weights load in."""

    key: str
    role: str
    shape: Shape
    dtype: str


def frozen_models(recipe: Recipe) -> tuple[Frozen, ...]:
    """The causal LMs the method's section declares (``MethodSection.models``) other than its reference (counted as
    a copy of the policy, ``Setup.reference``), each with its shape read from its own config, in the dtype it loads in:
    its declared one, else its checkpoint's (transformers' ``dtype="auto"``), else float32. A reward model is not
    counted (see the module's docstring). Raises PlanError naming the model's recipe key when its config cannot be
    read."""
    declared = models_of(recipe)
    return tuple(_frozen(recipe, extra) for extra in declared if not extra.scores and extra.role != "reference")


def _frozen(recipe: Recipe, extra: ExtraModel) -> Frozen:
    section = recipe.model.model_copy(update={"name": extra.name, "revision": None, "gguf_file": None,
                                              "init": "pretrained", "quantization": None})
    try:
        shape = read_shape(recipe.model_copy(update={"model": section}))
    except PlanError as exc:  # its message names the recipe's model.name: this model has a key of its own
        raise PlanError(str(exc).replace("model.name", extra.key, 1)) from None
    return Frozen(extra.key, extra.role, shape, extra.dtype or shape.dtype or "float32")


def setup_for(recipe: Recipe, shape: Shape, device: str = "cuda", gpus: int = 1,
              images: ImageLoad | None = None) -> Setup:
    """ft's view of the recipe on ``gpus`` devices of kind ``device``: the recipe's keys, then ft's defaults for
    the device (``ft.machine.hardware.device_defaults``: bf16 and activation checkpointing on CUDA, neither on a
    CPU), then TRL's. The reference is held when the section declares one (``ft.trainers.reference`` loads it
    whatever the adapter), else as the method's copy of the start model (full fine-tuning, not precomputed).
    A vision-language model's ``images`` (``ft.plan.vision.image_load``, which reads the data) are, when not given,
    the config's count for one image a row (``config_load``: no files read, for ``ft train``'s checks)."""
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
    if shape.vision is not None and images is None:
        images = config_load(recipe, shape.vision)
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
        reference=any(extra.role == "reference" for extra in models_of(recipe)) or (
            method.reference_copy and adapter is None and not train.get("precompute_ref_log_probs")),
        frozen=frozen_models(recipe), freeze=tuple(model.freeze or ()), images=images,
        eval_batch=train.get("per_device_eval_batch_size", 8) if recipe.data.has_eval else 0,
        vllm_share=vllm_share(train) if device == "cuda" else 0.0)


def vllm_share(train: dict) -> float:
    """The share of each GPU's memory vLLM reserves in the training processes (GRPO/RLOO with ``use_vllm`` in TRL's
    ``colocate`` mode, its default): ``vllm_gpu_memory_utilization`` of the whole GPU (TRL's default 0.3), for its
    weights and KV cache, whatever training needs. In ``server`` mode vLLM runs on other GPUs: 0 here."""
    if not train.get("use_vllm") or train.get("vllm_mode", "colocate") != "colocate":
        return 0.0
    return float(train.get("vllm_gpu_memory_utilization", 0.3))


# --- parameters ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    module: str
    rows: int
    cols: int  # 1 for vectors
    bytes: float  # per value, as stored
    trainable: bool
    kind: str  # embedding | linear | head | vector | adapter; a vision tower's conv | matrix (ft.plan.vision.Weight)
    part: str = "language"  # a vision-language model's: language, vision (its tower) or projector

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


def adapted(shape: Shape, adapter: Adapter) -> list[Linear]:
    """The linears a new LoRA adapter goes on: the language model's its targets match, and a vision-language model's
    tower and projector linears only in the parts its targets reach (``ft.plan.vision.lora_parts``, as
    ``ft.model.adapters.fit_lora_targets`` excludes the others)."""
    candidates = shape.linears()
    if shape.vision is not None:
        reaches = lora_parts(adapter.targets)
        candidates += [lin for lin in shape.vision.linears()
                       if reaches(lin.part, part_path(shape.vision, lin.part))]
    return [lin for lin in candidates if lora_targets(adapter, lin.name)]


def parameters(shape: Shape, s: Setup) -> list[Param]:
    """Every parameter of the policy as loaded for training: the language model's from its shape, a vision-language
    model's tower and projector tensors (trained in full fine-tuning unless ``model.freeze`` names their part), and a
    LoRA adapter's (float32) with what ``modules_to_save`` copies."""
    full, base = s.adapter is None, s.param_bytes
    h, v, lm = shape.hidden, shape.vocab, shape.decoder
    params = [Param(f"{lm}.embed_tokens", v, h, base, full, "embedding")]
    for i in range(shape.layers):
        for lin in shape.layer_linears(i):
            params.append(Param(lin.name, lin.fan_out, lin.fan_in, _quantized_bytes(s, lin.fan_in) if s.bits else base,
                                full, "linear"))
        params.append(Param(f"{lm}.layers.{i}", 2 * h + shape.biases, 1, base, full, "vector"))
    params.append(Param(f"{lm}.norm", h, 1, base, full, "vector"))
    if shape.vision is not None:  # bitsandbytes quantizes the tower's and projector's linears as the decoder's
        params += [Param(w.module, w.rows, w.cols, _quantized_bytes(s, w.cols) if s.bits and w.kind == "linear"
                         else base, full and w.part not in s.freeze, w.kind, w.part) for w in shape.vision.weights()]
    if s.scores:  # a new score head in place of the LM head; trained under LoRA too (PEFT's SEQ_CLS task)
        params.append(Param("score", 1, h, base, True, "head"))
    elif not shape.tied:
        params.append(Param("lm_head", v, h, base, full, "head"))  # bitsandbytes leaves the output head alone
    if s.adapter:  # adapters train in float32 (PEFT upcasts them on a half-precision base)
        a = s.adapter
        for lin in adapted(shape, a):
            params += [Param(lin.name + ".lora_A", a.r, lin.fan_in, 4, True, "adapter", lin.part),
                       Param(lin.name + ".lora_B", lin.fan_out, a.r, 4, True, "adapter", lin.part)]
            if a.dora:
                params.append(Param(lin.name + ".magnitude", lin.fan_out, 1, 4, True, "adapter", lin.part))
        for p in list(params):  # modules_to_save: a trained copy beside the frozen original
            if p.kind in ("embedding", "head") and p.part == "language" and any(p.module.endswith(m) for m in
                                                                                  a.modules_to_save):
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
    return total + _linear_inputs(s, shape.layer_linears(i), h, q, inter)


def _linear_inputs(s: Setup, linears: list[Linear], h: int, q: int, inter: int) -> float:
    """What a layer's linears save of their inputs, per token, by the tensor each reads (``_saved_inputs``)."""
    norm, c = s.param_bytes, s.compute
    return sum(_saved_inputs(s, [lin for lin in linears if lin.reads == reads], width, in_bytes, presaved)
               for reads, width, in_bytes, presaved in (
                   ("attn_in", h, norm, False), ("attn_out", q, c, s.attention != "eager"), ("mlp_in", h, norm, False),
                   ("mlp_mid", inter, s.mlp_bytes, False)))


ACT_SAVES = {"quick_gelu": 2}  # fc1-sized tensors a tower MLP's activation keeps: x and sigmoid(1.702x); GELU its input


def vision_layer_bytes(shape: Shape, s: Setup, i: int, sequence: int) -> float:
    """Bytes tower layer ``i`` of a vision-language model saves for backward per tower token, when gradients reach
    the tower: the decoder layer's terms (``layer_bytes``) with the tower's own norms and MLP. A LayerNorm keeps its
    input and a float32 mean and 1/std per token (an RMSNorm as the decoder's); attention as the decoder's, with
    ``sequence`` tokens per image or tile for eager attention's probabilities; an fc1/fc2 MLP keeps its activation's
    input (CLIP's quick_gelu also its sigmoid), a gated one gate, act(gate) and up; each linear's input as
    ``_saved_inputs`` says. Exact for a CLIP or SigLIP layer in float32 (``tests/test_plan_vision.py`` counts what torch
    saves)."""
    v = shape.vision
    d, q, inter, c, norm = v.hidden, v.q, v.intermediate, s.compute, s.param_bytes
    if v.norm == "rms":
        total = 2 * (4 * d + 4) + (2 * norm * d if s.adapter is None else 0)
    else:
        total = 2 * (norm * d + 8)
    if s.attention == "eager":
        total += 3 * c * q + v.heads * sequence * (4 if c == 4 else 4 + c)
    else:
        total += 4 * c * q + 4 * v.heads
    total += (3 if v.gated else ACT_SAVES.get(v.act, 1)) * s.mlp_bytes * inter
    return total + _linear_inputs(s, v.layer_linears(i), d, q, inter)


def grad_parts(params: list[Param]) -> set[str]:
    """The parts of a vision-language model that gradients reach in backward: a part with a trainable parameter, and
    the projector when the tower behind it trains. A part they do not reach runs forward without saving anything."""
    parts = {p.part for p in params if p.trainable}
    return parts | ({"projector"} if "vision" in parts else set())


def vision_activations(shape: Shape, s: Setup, params: list[Param]) -> tuple[float, float]:
    """(held from forward to backward, one tower layer's for the batch) for a vision-language model's images: each
    sequence of the batch (two a row for DPO's chosen and rejected) brings ``ImageLoad.row_patches`` tower tokens (the
    worst row's, as every sequence is taken full). When gradients reach the tower, each layer saves
    ``vision_layer_bytes`` a token (checkpointed: its input only, and one layer is recomputed in backward); when they
    reach the projector, each of its matrices keeps its input and each activation between two of them its input, per
    language-model image token. The tower's patch embedding and outer norms, and a frozen tower's passing forward
    working set (freed before the language model runs), are left out."""
    v, load = shape.vision, s.images
    if v is None or load is None:
        return 0.0, 0.0
    reached, seqs = grad_parts(params), s.batch * s.sequences
    saved = layer = 0.0
    if "vision" in reached:
        tokens = seqs * load.row_patches
        sequence = v.encoder_tokens(v.grid) if v.grid else load.patches_per_image
        layers = [vision_layer_bytes(shape, s, i, sequence) * tokens for i in range(v.layers)]
        saved, layer = (v.layers * s.param_bytes * v.hidden * tokens if s.checkpointing else sum(layers)), max(layers)
    if "projector" in reached:
        matrices = [w for w in v.projector if w.kind in ("linear", "matrix")]
        per_token = s.compute * (sum(w.cols for w in matrices) + sum(w.rows for w in matrices[:-1]))
        saved += per_token * seqs * min(load.row_tokens, s.max_length)
    return saved, layer


@dataclass(frozen=True)
class Activations:
    saved: float  # held from the forward to the backward
    layer: float  # one layer's saved activations (a checkpointed layer's recomputation; a layer's gradient buffers)
    autocast_copies: float  # half-precision copies of float32 weights that autocast saves for backward
    vision: float = 0.0  # a vision-language model's tower and projector, held from the forward to the backward


def activations(shape: Shape, s: Setup, params: list[Param]) -> Activations:
    seqs = s.batch * s.sequences
    tokens = seqs * s.max_length
    layers = [layer_bytes(shape, s, i) * tokens for i in range(shape.layers)]
    h, norm, c = shape.hidden, s.param_bytes, s.compute
    final = 4 * h + 4 + (norm * h if s.adapter is None else 0)  # the final norm, like a layer's
    head_trained = any(p.trainable and p.kind in ("head", "embedding") and p.part == "language" for p in params)
    if not s.full_logits:
        final += norm * h  # TRL's fused head keeps its own copy of the hidden states
    elif head_trained:
        final += 2 * h if s.mixed and norm > 2 else norm * h  # the LM head's input
    mask = 0 if s.packing or s.attention.startswith("flash") else seqs * s.max_length**2 * (c if s.attention == "eager"
                                                                                             else 1)
    saved = (shape.layers * norm * h * tokens if s.checkpointing else sum(layers)) + final * tokens + mask
    copies = 0.0
    reached = grad_parts(params) | {"language"}
    if s.mixed and norm == 4:  # autocast keeps a half-precision copy of every float32 matmul weight until backward
        copies = 2 * sum(p.numel for p in params if p.cols > 1 and p.bytes == 4 and p.kind != "embedding"
                         and (p.kind != "head" or s.full_logits) and p.part in reached)
    vision, vision_layer = vision_activations(shape, s, params)
    return Activations(saved, max(layers + [vision_layer]), copies, vision)


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


def frozen_bytes(model: Frozen, s: Setup) -> float:
    """The weights of a frozen model beside the policy: every parameter of its shape (as ``parameters`` counts a full
    model's, neither adapted nor quantized) in its own dtype."""
    return sum(p.size for p in parameters(model.shape, replace(s, adapter=None, bits=None, dtype=model.dtype)))


def estimate(shape: Shape, s: Setup) -> Estimate:
    params = parameters(shape, s)
    trainable = [p for p in params if p.trainable]
    weights = sum(p.size for p in params)
    grads = 0.0 if s.fused_update else sum(p.size for p in trainable)
    state = optimizer_state(s, trainable)
    act = activations(shape, s, params)
    head_trained = any(p.kind in ("head", "embedding") and p.part == "language" for p in trainable)
    head_fwd, head_bwd = head_memory(shape, s, head_trained)
    largest = max((p.size for p in trainable), default=0.0)
    # the first gradient backward makes (the head's; one at a time for a fused update); accumulation reuses its buffer
    head_grad = 0.0 if s.accumulation > 1 else largest if s.fused_update else max(
        (p.size for p in trainable if p.kind in ("head", "embedding") and p.part == "language"), default=0.0)
    if s.device == "cuda" and s.optimizer in FOREACH:  # torch's foreach step: one temporary per state tensor
        step_tmp = sum(p.size for p in trainable)
    else:  # a loop over parameters: about two temporaries of the largest
        step_tmp = 0.0 if s.fused_update else 2 * largest
    in_pass = grads if s.accumulation > 1 else 0.0  # gradients accumulate across micro-batches
    buffers = (2 if s.checkpointing else 1) * act.layer  # a layer's recomputation and its gradient buffers
    held = act.saved + act.vision + act.autocast_copies
    # an evaluation pass (data.eval): no gradients or saved activations, the eval batch's logits and one layer's
    evaluation = head_memory(shape, replace(s, batch=s.eval_batch), False)[0] + act.layer if s.eval_batch else 0.0
    phases = {"forward": held + head_fwd + in_pass,
              "backward": held + in_pass + max(head_bwd + head_grad, buffers),
              "optimizer step": 0.0 if s.fused_update else grads + step_tmp,
              "evaluation": evaluation}
    phase = max(phases, key=phases.get)
    fwd, bwd, step = phase == "forward", phase == "backward", phase == "optimizer step"
    evaluating = phase == "evaluation"
    head_wins = head_bwd + head_grad >= buffers
    grads_held = grads if step else 0.0 if evaluating else in_pass + (head_grad if bwd and head_wins else 0.0)
    ddp = grads if s.gpus > 1 else 0.0  # DDP's gradient buckets, a second copy of the gradients
    ref = sum(p.size for p in params if p.kind != "adapter") if s.reference else 0.0
    frozen = [(f"{model.role} model {model.key} (frozen)", frozen_bytes(model, s)) for model in s.frozen]
    dtype = f"{s.bits}-bit base" if s.bits else s.dtype
    parts = [
        Part(f"weights ({dtype})", weights, weights),
        Part("reference model (frozen copy)", ref, ref),
        *(Part(name, size, size) for name, size in frozen),
        Part("gradients" + (" (none kept: updated in backward)" if s.fused_update else ""), grads or largest,
             grads_held),
        Part(f"optimizer state ({s.optimizer})", state, state),
        Part("activations saved for backward" + (" (checkpointed)" if s.checkpointing else ""), act.saved,
             0.0 if step or evaluating else act.saved),
        Part("vision tower and projector activations" + (" (checkpointed)" if s.checkpointing and "vision" in
                                                          grad_parts(params) else ""), act.vision,
             0.0 if step or evaluating else act.vision),
        Part("autocast copies of float32 weights", act.autocast_copies,
             0.0 if step or evaluating else act.autocast_copies),
        Part("scores and loss" if s.scores else "logits and loss" + ("" if s.full_logits else " (fused LM head)"),
             max(head_fwd, head_bwd),
             head_fwd if fwd else head_bwd if bwd and head_wins else 0.0),
        Part("backward buffers of one layer" + (" (+ its recomputation)" if s.checkpointing else ""), buffers,
             buffers if bwd and not head_wins else 0.0),
        Part("optimizer step temporaries", step_tmp, step_tmp if step else 0.0),
        Part(f"evaluation pass (batch {s.eval_batch}: logits, loss, one layer)", evaluation,
             evaluation if evaluating else 0.0),
        Part("DDP gradient buckets", ddp, ddp),
    ]
    parts = tuple(p for p in parts if p.size > 0)
    return Estimate(s, parts, phase, sum(p.numel for p in params if p.kind != "adapter" and not
                                         p.module.endswith(".copy")), sum(p.numel for p in trainable))
