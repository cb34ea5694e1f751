"""Single recipe changes that lower a step's peak memory (``ft plan``'s suggestions), as ``--set`` arguments, and the
figures ``ft train``'s preflight and disk checks read of the estimate (``step_figures``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..recipe import Recipe
from .memory import (
    ADAMW,
    ADAMW_32,
    FITS_BELOW,
    OPTIMIZER_STATE,
    Adapter,
    Estimate,
    Setup,
    estimate,
    parameters,
    setup_for,
)
from .shape import Shape, read_shape

PROJECTED = [r".*self_attn.*", r".*mlp.*"]  # the modules a suggested GaLore projects


@dataclass(frozen=True)
class Suggestion:
    changes: dict  # recipe key -> new value
    estimate: Estimate


def _candidates(s: Setup, fits: Callable[[Setup], bool]) -> list[tuple[dict, Setup]]:
    """Single recipe changes that lower the peak, least disruptive first (a vision-language model's full fine-tune:
    freezing its vision tower, after the changes that leave training as it is)."""
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
    if s.images is not None and s.adapter is None and "vision" not in s.freeze:  # keep the vision tower as loaded
        freeze = ("vision", *s.freeze)
        out.append(({"model.freeze": list(freeze)}, replace(s, freeze=freeze)))
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


def yaml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
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
    return [f"{k}={yaml_value(v)}" for k, v in flat.items()]


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
