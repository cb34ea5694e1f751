"""What each optimizer needs, as data (no torch): the Trainer docs' integration table, as rules read it.

CUDA-only here means "fails on a CPU-only torch" (checked with torch 2.13 CPU: adalomo and
galore_adamw_8bit assert CUDA; lomo and the bitsandbytes 8-bit/paged optimizers train).

Names are transformers' ``optim`` values (read from the generated field table, so a new transformers
release brings its new names). Only optimizers with a requirement appear in ``TRAITS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .train_section import field_table


@dataclass(frozen=True)
class Traits:
    package: str | None = None  # pip package that provides it
    cuda_only: bool = False
    layerwise: bool = False  # updates during backward: one process, no clipping, no DeepSpeed
    needs_target_modules: bool = False  # GaLore/APOLLO project only the named modules
    schedule_free: bool = False  # pairs with a constant schedule


_BNB = Traits(package="bitsandbytes")  # 8-bit and paged optimizers run on CPU too (paged falls back)
TRAITS: dict[str, Traits] = {
    **{name: _BNB for name in ("adamw_bnb_8bit", "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit",
                               "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit",
                               "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb",
                               "rmsprop_bnb_8bit", "rmsprop_bnb_32bit")},
    "adamw_torch_fused": Traits(),
    "galore_adamw": Traits("galore-torch", needs_target_modules=True),
    "galore_adafactor": Traits("galore-torch", needs_target_modules=True),
    "galore_adamw_8bit": Traits("galore-torch", cuda_only=True, needs_target_modules=True),
    "galore_adamw_layerwise": Traits("galore-torch", layerwise=True, needs_target_modules=True),
    "galore_adafactor_layerwise": Traits("galore-torch", layerwise=True, needs_target_modules=True),
    "galore_adamw_8bit_layerwise": Traits("galore-torch", cuda_only=True, layerwise=True, needs_target_modules=True),
    "apollo_adamw": Traits("apollo-torch", needs_target_modules=True),
    "apollo_adamw_layerwise": Traits("apollo-torch", layerwise=True, needs_target_modules=True),
    "lomo": Traits("lomo-optim"),
    "adalomo": Traits("lomo-optim", cuda_only=True),
    "grokadamw": Traits("grokadamw"),
    "schedule_free_adamw": Traits("schedulefree", schedule_free=True),
    "schedule_free_radam": Traits("schedulefree", schedule_free=True),
    "schedule_free_sgd": Traits("schedulefree", schedule_free=True),
    "stable_adamw": Traits("torch-optimi"),
    "adamw_torch_xla": Traits(package="torch_xla"),
    "adamw_torch_npu_fused": Traits(package="torch_npu"),
    "adamw_anyprecision": Traits(package="torchdistx"),
}


def optimizer_names() -> list[str]:
    return list(field_table()["base"]["optim"]["choices"])


def traits(name: str) -> Traits:
    return TRAITS.get(name, Traits())


def scheduler_names() -> list[str]:
    return list(field_table()["base"]["lr_scheduler_type"]["choices"])
