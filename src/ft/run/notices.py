"""Library notices that do not concern the person running ``ft train``, and the filters that hide them.

Each entry of ``NOTICES`` names one notice precisely: where it is raised (a Python warning: its category and the
module the warning is attributed to; a log record: the logger), a regular expression its message starts with, and
why it concerns no user of ft. ``install`` hides them for the rest of the process (``ft train`` calls it first
thing, once the recipe is read); anything else a library says is shown as before.

Nothing is hidden when ``FT_DEBUG=1`` is set or when the recipe sets ``train.log_level`` itself (any value: asking
for transformers' log level is asking to see what the libraries say). docs/outputs.md lists the table.

Not filtered, on purpose: transformers' FutureWarnings about deprecated ``TrainingArguments`` names (the recipe wrote
them: they concern its author), and torch's DDP warning that ``find_unused_parameters=True`` found nothing unused
(ft passes False unless the model needs it, ``ft.trainers.distributed``; it shows only when the recipe's
``distributed.find_unused_parameters: true`` costs time for nothing, which its author wants to know).

This module imports nothing heavy: it runs before torch is imported.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Notice:
    message: str  # regular expression, matched at the start of the message (warnings: case-insensitively)
    source: str  # a warning: regular expression for the module it is attributed to; a log record: the logger name
    why: str  # why it does not concern a user of ft
    category: str = "warning"  # "warning" (the warnings module) or "log" (the logging module)
    warning: str = "Warning"  # a warning's category, by name: a builtin warning class


NOTICES: tuple[Notice, ...] = (
    Notice(r"Failed to load CPU gemm_4bit_forward from kernels-community",
           "bitsandbytes.backends.cpu.ops",
           "bitsandbytes 0.50 tries, on every import on a CPU with AVX512-BF16, to download an optional faster 4-bit "
           "CPU kernel through the `kernels` package (a dependency of transformers from 5.25, not of bitsandbytes or "
           "ft), and logs a warning when it or the kernel is missing; its own kernels are used instead, and a run "
           "that loads no 4-bit weights never uses either",
           category="log"),
    Notice(r"Skipping publisher trust check for 'kernels-community/",
           "kernels._internals.hf_hub",
           "the same attempt, offline (HF_HUB_OFFLINE=1): the `kernels` package that transformers 5.25 installs says "
           "it cannot check the kernel's publisher; the kernel is not in the cache, so bitsandbytes falls back to "
           "its own (the notice above)",
           category="log"),
    Notice(r"Could not find a config file in .* will assume that the vocabulary was not modified",
           r"peft\.utils\.save_and_load",
           "PEFT looks for config.json under the base model's path at every adapter save, to tell whether the "
           "embeddings were resized; a GGUF file's folder holds none. ft saves the rows of tokens it adds itself "
           "(trainable_token_indices, model.adapters), so the check has nothing to find",
           warning="UserWarning"),
    Notice(r"`is_gradient_checkpointing` is deprecated",
           r"transformers\.modeling_utils",
           "transformers 5 renamed the property; TRL's DPO, KTO, GRPO and RLOO still read the old name (GRPO and "
           "RLOO each time they generate), as PEFT did on every LoRA run before 0.22, which nothing in a recipe can "
           "change",
           warning="FutureWarning"),
    Notice(r"You are importing from 'trl\.experimental'",
           r"ft\..*",
           "ft's ORPO is TRL's experimental ORPOTrainer, chosen by ft (tests/test_preference.py trains it); the "
           "warning is about ft's import, not about the recipe",
           warning="UserWarning"),
    Notice(r"OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at",
           r"accelerate\.state",
           "accelerate sets the threads of each CPU process of a several-process run itself and says so on every "
           "rank; set OMP_NUM_THREADS to choose another number",
           warning="UserWarning"),
    Notice(r"Unknown ((leading|trailing) special token|(second )?separator token|(second )?middle sequence|sequence) "
           r"|TemplateProcessing<single> leading/trailing",
           "gguf.vocab",
           "`ft export` hands the saved tokenizer to gguf's SpecialVocab, which guesses the add-BOS/EOS flags from the "
           "tokenizer's post-processor and warns about the parts of it that are not its single-sequence template "
           "(the pair template, for two texts, e.g. Llama 3's); GGUF has no pair template and the flags it writes "
           "come from the single one",
           category="log"),
    Notice(r"There were missing keys in the checkpoint model loaded: \['lm_head\.weight'\]\.$",
           "transformers.trainer",
           "resuming a model whose output layer shares the input embeddings' weights (tie_word_embeddings): the "
           "checkpoint stores the shared tensor once, so lm_head.weight is 'missing' and the tie restores it; any "
           "other missing key is still shown",
           category="log"),
)

_DEBUG_ENV = "FT_DEBUG"


def wanted(train_args: dict | None = None) -> bool:
    """Whether to filter: not under ``FT_DEBUG=1``, nor when the recipe sets ``train.log_level``."""
    if os.environ.get(_DEBUG_ENV, "").strip() not in ("", "0"):
        return False
    return "log_level" not in (train_args or {})


def install(train_args: dict | None = None) -> bool:
    """Hide ``NOTICES`` for the rest of this process, unless ``wanted`` says no. Returns whether it did."""
    if not wanted(train_args):
        return False
    for notice in NOTICES:
        if notice.category == "log":
            _logger_filter(notice.source).add(re.compile(notice.message))
        else:
            warnings.filterwarnings("ignore", message=notice.message, category=_category(notice.warning),
                                    module=notice.source + r"\Z")  # the whole module name, as -W does
    return True


def _category(name: str) -> type[Warning]:
    import builtins

    category = getattr(builtins, name, None)
    return category if isinstance(category, type) and issubclass(category, Warning) else Warning


class _MessageFilter(logging.Filter):
    """Drops the records of one logger whose message starts with one of ``patterns``."""

    def __init__(self):
        super().__init__()
        self.patterns: list[re.Pattern] = []

    def add(self, pattern: re.Pattern) -> None:
        if pattern not in self.patterns:
            self.patterns.append(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        return not any(pattern.match(text) for pattern in self.patterns)


def _logger_filter(name: str) -> _MessageFilter:
    logger = logging.getLogger(name)
    for existing in logger.filters:
        if isinstance(existing, _MessageFilter):
            return existing
    added = _MessageFilter()
    logger.addFilter(added)
    return added
