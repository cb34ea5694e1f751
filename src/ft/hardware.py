"""What this machine can do, the defaults that follow from it, and the rules that depend on it.

TRL's configs default to ``bf16=True`` and ``gradient_checkpointing=True`` everywhere; on a CPU both
make training several times slower (or fail), so ft turns them off there. A value the recipe sets
always wins. These checks run at the start of ``ft train``, before any model or data loads.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from .recipe import Problem, Recipe
from .recipe.optimizers import traits

# pip package -> importable module, for the optimizer packages ft can tell users to install
_MODULES = {"galore-torch": "galore_torch", "apollo-torch": "apollo_torch", "lomo-optim": "lomo_optim",
            "grokadamw": "grokadamw", "schedulefree": "schedulefree", "torch-optimi": "optimi",
            "bitsandbytes": "bitsandbytes", "torch_xla": "torch_xla", "torch_npu": "torch_npu",
            "torchdistx": "torchdistx"}


@dataclass(frozen=True)
class Hardware:
    cuda: bool
    bf16: bool
    devices: int
    name: str

    @property
    def summary(self) -> str:
        return f"{self.devices}× {self.name}" if self.cuda else "CPU (no CUDA device)"


def probe() -> Hardware:
    import torch

    if torch.cuda.is_available():
        return Hardware(True, torch.cuda.is_bf16_supported(), torch.cuda.device_count(),
                        torch.cuda.get_device_name(0))
    return Hardware(False, False, 0, "cpu")


def device_defaults(recipe: Recipe, hw: Hardware) -> dict:
    """Trainer arguments ft chooses for this machine. They fill only the keys the recipe leaves unset (the rule is
    applied where the config is built, ``ft.trainers.build``); here a default is also dropped when the recipe set
    its alias or its rival (``gradient_checkpointing`` for ``activation_checkpointing``, ``fp16`` for ``bf16``)."""
    explicit = recipe.train_args
    if hw.cuda:
        # TRL's own default, restated under transformers' new name so it warns of no deprecation
        defaults = {"bf16": hw.bf16, "activation_checkpointing": True}
    else:
        # use_cpu: several processes (torchrun) then train data-parallel over gloo instead of each on its own
        defaults = {"bf16": False, "activation_checkpointing": False, "dataloader_pin_memory": False, "use_cpu": True}
    if "fp16" in explicit:
        defaults.pop("bf16")
    if "gradient_checkpointing" in explicit:  # the deprecated alias counts as setting it
        defaults.pop("activation_checkpointing")
    return defaults


def check_hardware(recipe: Recipe, hw: Hardware) -> list[Problem]:
    """What this machine cannot run of the recipe (checked before any model or data loads)."""
    problems = []
    train = recipe.train_args
    if not hw.cuda and recipe.model.quantization is not None:
        problems.append(Problem("model.quantization", "4/8-bit loading through bitsandbytes needs a CUDA GPU and "
                                "none is visible; remove `model.quantization` to train in full precision here."))
    if not hw.cuda and train.get("fp16"):
        problems.append(Problem("train.fp16", "fp16 mixed precision needs a CUDA GPU and none is visible; "
                                "remove it (CPU trains in float32) or use `train.bf16: true`."))
    if hw.cuda and train.get("bf16") and not hw.bf16:
        problems.append(Problem("train.bf16", f"this GPU ({hw.name}) does not support bfloat16; "
                                "use `train.fp16: true` instead."))
    if not hw.cuda and train.get("use_liger_kernel"):
        problems.append(Problem("train.use_liger_kernel", "Liger kernels are Triton GPU kernels and no CUDA "
                                "device is visible; remove `train.use_liger_kernel` here."))
    problems += _optimizer_problems(recipe, hw)
    return problems


def _optimizer_problems(recipe: Recipe, hw: Hardware) -> list[Problem]:
    name = recipe.optimizer.name
    info = traits(name)
    if info.cuda_only and not hw.cuda:
        return [Problem("optimizer.name", f"`{name}` runs on CUDA GPUs only and none is visible; on this machine "
                        "use e.g. `adamw_torch` (or `lomo` instead of `adalomo`, `galore_adamw` instead of its "
                        "8-bit form).")]
    if info.layerwise and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return [Problem("optimizer.name", f"`{name}` works on a single process only, and this run has "
                        f"WORLD_SIZE={os.environ['WORLD_SIZE']}; launch one process or choose a non-layerwise "
                        "optimizer.")]
    module = _MODULES.get(info.package or "")
    if module and importlib.util.find_spec(module) is None:
        return [Problem("optimizer.name", f"`{name}` needs the `{info.package}` package, which is not "
                        f"installed; run `pip install {info.package}` (or `pip install 'ft[optim]'`).")]
    return []
