"""Cross-field rules. Each is a small named function that returns the problems it finds, and cites
the sentence of the documentation (or the reason) it enforces. ``check_rules`` runs them all.

Rules here need no hardware knowledge and import nothing heavy; the rules that depend on the machine
(CUDA, bf16 support) live in ``ft.hardware`` and run at the start of ``ft train``.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import Problem

Rule = Callable[["object"], list[Problem]]
RULES: list[Rule] = []

# method -> data formats it can train on
METHOD_FORMATS = {
    "sft": {"chat", "instruction", "text"},
    "dpo": {"preference"},
    "kto": {"preference"},
    "orpo": {"preference"},
    "grpo": {"prompt"},
}


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def check_rules(recipe) -> list[Problem]:
    return [problem for fn in RULES for problem in fn(recipe)]


@rule
def quantization_needs_adapter(recipe) -> list[Problem]:
    """Quantized weights cannot be trained directly: "you can only train adapters on top of a
    quantized model" (PEFT/bitsandbytes docs). QLoRA = 4-bit base + LoRA adapter."""
    if recipe.model.quantization is not None and recipe.adapter is None:
        return [Problem("model.quantization", "a quantized model can only be trained through an adapter; "
                        "add `adapter: {kind: lora}` or remove `model.quantization`.")]
    return []


@rule
def data_formats_fit_method(recipe) -> list[Problem]:
    """Each method reads one family of formats (SFT: chat/instruction/text; DPO/KTO/ORPO: preference;
    GRPO: prompt)."""
    allowed = METHOD_FORMATS[recipe.method]
    problems = []
    for split in ("train", "eval"):
        for i, source in enumerate(getattr(recipe.data, split)):
            if source.format not in allowed:
                problems.append(Problem(
                    f"data.{split}.{i}.format",
                    f"`{source.format}` data cannot train method `{recipe.method}`; "
                    f"use one of: {', '.join(sorted(allowed))}.",
                ))
    return problems


@rule
def packing_is_sft_only(recipe) -> list[Problem]:
    """Packing concatenates independent rows; only supervised fine-tuning can train on that."""
    if recipe.data.packing and recipe.method != "sft":
        return [Problem("data.packing", f"packing is only for method `sft`, not `{recipe.method}`; "
                        "set `data.packing: false`.")]
    return []
