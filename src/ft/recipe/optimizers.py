"""What each transformers optimizer needs, as data (no torch): read by the rules (``recipe.rules``), the machine
checks (``ft.machine.hardware``) and the trainer builder.

Names are transformers' ``optim`` values (read from the generated field table, so a new transformers release
brings its new names; a name missing from ``TRAITS`` is taken to need nothing, and ``tests/test_optimizers.py``
trains every name, so such a name is caught if that is wrong).

Verified by training the tiny model a few steps with every name (``tests/test_optimizers.py``) on a CPU-only machine,
with the optimizer packages docs/optimizers.md lists by version:

- CUDA-only (fail on a CPU-only torch): ``adalomo`` (``AdaLomo.__init__`` puts its state on ``.cuda()``),
  ``galore_adamw_8bit`` and ``galore_adamw_8bit_layerwise`` (``GaLoreAdamW8bit.step`` calls
  ``torch.cuda.synchronize()``).
- Train on the CPU: everything else that installs, including all bitsandbytes 8-bit, 32-bit and paged optimizers
  (paged memory falls back to ordinary memory), ``ademamix``, ``lion_*``, ``rmsprop_bnb*``, ``lomo``, GaLore
  (adamw, adafactor, adamw layerwise), APOLLO and APOLLO-Mini (layerwise too), GrokAdamW, the schedule-free three,
  ``stable_adamw`` (with ``triton=False`` where a CPU machine has Triton installed: ``hardware.optimizer_defaults``)
  and torchao's ``adamw_torch_4bit``/``8bit`` (compiled with ``torch.compile``: a C++ compiler on the machine;
  torchao is installed by hand, see ``PACKAGES``).
- Cannot be built by the tested transformers on any machine: ``galore_adafactor_layerwise`` (``unbuildable``).
- Platform packages ft does not install: ``torch-xla`` (TPUs), ``torch-npu`` (Ascend NPUs), ``torchdistx`` (not on
  PyPI); those names are refused with the reason when the package is absent.

``args`` lists the ``optim_args`` keys transformers' handler for the name reads (``optimizer.args`` becomes
``optim_args``); any other key would be dropped without a word, so the rules refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .train_section import field_table


@dataclass(frozen=True)
class Traits:
    package: str | None = None  # pip package that provides it (``PACKAGES``)
    cuda_only: bool = False  # fails on a CPU-only torch
    layerwise: bool = False  # updates during backward: one process, no clipping, no accumulation, no DeepSpeed
    needs_target_modules: bool = False  # GaLore/APOLLO project only the named modules
    schedule_free: bool = False  # pairs with a constant schedule
    args: tuple[str, ...] = ()  # the optim_args keys transformers reads for it
    unbuildable: str = ""  # why the installed transformers cannot build it (refused by a rule), else ""


@dataclass(frozen=True)
class Package:
    module: str  # the name it is imported by
    install: str  # "ft": one of ft's dependencies; "ft[optim]": ft's optional extra; "pip": on PyPI, not installed
    # by ft (heavy, or slows every model load); "": not installed by ft, nor from PyPI on a common machine
    purpose: str = ""  # for packages ft does not install: what they are, said in the refusal


PACKAGES: dict[str, Package] = {
    "bitsandbytes": Package("bitsandbytes", "ft"),
    "galore-torch": Package("galore_torch", "ft"),
    "schedulefree": Package("schedulefree", "ft"),
    "apollo-torch": Package("apollo_torch", "ft[optim]"),
    "grokadamw": Package("grokadamw", "ft[optim]"),
    "torch-optimi": Package("optimi", "ft[optim]"),
    # an extra, not a dependency: while it is importable, accelerate's AcceleratedOptimizer.step looks it up twice
    # per step, whatever the optimizer (two importlib.metadata reads; measured in benchmarks/README.md)
    "lomo-optim": Package("lomo_optim", "ft[optim]"),
    # installed, transformers imports torchao on every model load (seconds, and log noise, on a CPU): not in ft[optim]
    "torchao": Package("torchao", "pip", "PyTorch's low-bit optimizers, compiled with torch.compile"),
    "torch-xla": Package("torch_xla", "", "the PyTorch/XLA runtime for Google TPUs"),
    "torch-npu": Package("torch_npu", "", "the PyTorch adapter for Huawei Ascend NPUs"),
    "torchdistx": Package("torchdistx", "", "not on PyPI: built from source against a matching torch"),
}

_BNB_ADEMAMIX = ("beta1", "beta2", "beta3", "alpha", "eps", "t_alpha", "t_beta3")
_GALORE = ("rank", "update_proj_gap", "scale", "proj_type")
_APOLLO = ("rank", "proj", "scale_type", "update_proj_gap", "scale", "proj_type")
_SCHEDULE_FREE = Traits("schedulefree", schedule_free=True, args=("weight_lr_power", "r"))
_TORCHAO = Traits("torchao", args=("block_size", "bf16_stochastic_round"))

TRAITS: dict[str, Traits] = {
    # torch.optim and transformers' own
    "adamw_torch": Traits(),
    "adamw_torch_fused": Traits(),
    "adafactor": Traits(),
    "sgd": Traits(args=("momentum", "dampening", "weight_decay", "nesterov")),
    "adagrad": Traits(args=("lr_decay", "weight_decay", "eps")),
    "rmsprop": Traits(args=("momentum", "alpha", "eps", "weight_decay", "centered")),
    # other accelerators and packages ft does not install
    "adamw_torch_xla": Traits("torch-xla"),
    "adamw_torch_npu_fused": Traits("torch-npu"),
    "adamw_anyprecision": Traits("torchdistx", args=("use_kahan_summation", "momentum_dtype", "variance_dtype",
                                                     "compensation_buffer_dtype")),
    # torchao's low-bit AdamW
    "adamw_torch_4bit": _TORCHAO,
    "adamw_torch_8bit": _TORCHAO,
    # bitsandbytes: every one trains on the CPU. rmsprop_bnb* reads no key: transformers hands optim_args on
    # unparsed, as text, which bitsandbytes' RMSprop cannot compute with.
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "lion_8bit",
                     "lion_32bit", "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit",
                     "rmsprop_bnb_32bit"), Traits("bitsandbytes")),
    **dict.fromkeys(("ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit"),
                    Traits("bitsandbytes", args=_BNB_ADEMAMIX)),
    # GaLore
    "galore_adamw": Traits("galore-torch", needs_target_modules=True, args=_GALORE),
    "galore_adafactor": Traits("galore-torch", needs_target_modules=True, args=_GALORE),
    "galore_adamw_8bit": Traits("galore-torch", cuda_only=True, needs_target_modules=True, args=_GALORE),
    "galore_adamw_layerwise": Traits("galore-torch", layerwise=True, needs_target_modules=True, args=_GALORE),
    "galore_adamw_8bit_layerwise": Traits("galore-torch", cuda_only=True, layerwise=True, needs_target_modules=True,
                                          args=_GALORE),
    "galore_adafactor_layerwise": Traits(
        "galore-torch", layerwise=True, needs_target_modules=True, args=_GALORE,
        unbuildable="it gives each layer's GaLoreAdafactor the learning rate but not `relative_step=False` (only "
        "`galore_adafactor` gets that), and GaLoreAdafactor refuses the pair (\"Cannot combine manual `lr` and "
        "`relative_step=True`\"); use `galore_adafactor` or `galore_adamw_layerwise`."),
    # APOLLO (APOLLO-Mini is apollo_adamw with args {proj: random, rank: 1, scale: 128, scale_type: tensor})
    "apollo_adamw": Traits("apollo-torch", needs_target_modules=True, args=_APOLLO),
    "apollo_adamw_layerwise": Traits("apollo-torch", layerwise=True, needs_target_modules=True, args=_APOLLO),
    # LOMO fuses the update into backward; AdaLomo keeps its state on the GPU
    "lomo": Traits("lomo-optim"),
    "adalomo": Traits("lomo-optim", cuda_only=True),
    "grokadamw": Traits("grokadamw", args=("alpha_init", "lamb", "gamma", "grokking_signal_decay_rate",
                                           "gradient_clipping")),
    "schedule_free_adamw": _SCHEDULE_FREE,
    "schedule_free_radam": _SCHEDULE_FREE,
    "schedule_free_sgd": _SCHEDULE_FREE,
    "stable_adamw": Traits("torch-optimi", args=("max_lr", "kahan_sum", "decouple_lr")),
}

# optim_args keys transformers reads but mishandles; ``recipe.rules.optimizer_args_reach_the_optimizer`` refuses them
PASSED_ON_AS_TEXT = {"adamw_torch_4bit": ("block_size",), "adamw_torch_8bit": ("block_size",)}  # '128' % … fails
FALSE_READ_AS_TRUE = {"stable_adamw": ("kahan_sum", "decouple_lr")}  # read with bool(text): bool("False") is True


def optimizer_names() -> list[str]:
    return list(field_table()["base"]["optim"]["choices"])


def traits(name: str) -> Traits:
    return TRAITS.get(name, Traits())


def scheduler_names() -> list[str]:
    return list(field_table()["base"]["lr_scheduler_type"]["choices"])
