"""lm-eval run on a model already in memory: lm-eval's ``HFLM`` wraps the model and tokenizer as they are (no reload,
no copy), ``simple_evaluate`` scores the tasks, and lm-eval's own ``EvaluationTracker`` writes the results file (its
JSON: scores, task configs and hashes, versions) where one is asked for.

The chat template: lm-eval renders a task's prompts as plain text unless told to apply the tokenizer's chat template
(its ``--apply_chat_template``); ft applies it where the tokenizer has one (a model trained on chats is asked as it
was trained, and ft's own exact match renders prompts so), unless ``Settings.chat_template`` says otherwise. A task's
``description`` becomes the system message then, as lm-eval places it.

lm-eval seeds Python's, NumPy's and torch's generators before it scores (``simple_evaluate``'s seeds), and says what it
does at INFO; its notices are kept to errors unless FT_DEBUG is set.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .tasks import Tasks


@dataclass(frozen=True)
class Settings:
    """How the tasks are run: ``limit`` rows per task (a count, or a fraction below 1), ``num_fewshot`` examples in
    each prompt (the task's own number when None), ``batch_size`` prompts at once, ``chat_template`` (None: where the
    tokenizer has one), ``system`` (lm-eval's system instruction, before a task's description)."""

    limit: float | None = None
    num_fewshot: int | None = None
    batch_size: int = 8
    chat_template: bool | None = None
    system: str | None = None


def score(model, tokenizer, tasks: Tasks, manager, settings: Settings,
          out: Path | None = None) -> tuple[dict, Path | None]:
    """(lm-eval's results without its per-row samples, the results file written or None). ``out``: where lm-eval
    writes it, ``<folder>/<name>.json`` becoming ``<folder>/<name>_<time>.json``."""
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.models.huggingface import HFLM

    if not os.environ.get("FT_DEBUG"):
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
    chat = bool(getattr(tokenizer, "chat_template", None)) if settings.chat_template is None else settings.chat_template
    limit = settings.limit if settings.limit is None or settings.limit < 1 else int(settings.limit)
    was_training = model.training
    lm = HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=settings.batch_size)
    tracker = EvaluationTracker(output_path=str(out)) if out is not None else None
    try:
        results = simple_evaluate(model=lm, tasks=list(tasks.specs), task_manager=manager, limit=limit,
                                  num_fewshot=settings.num_fewshot, apply_chat_template=chat,
                                  system_instruction=settings.system, log_samples=True, evaluation_tracker=tracker)
    finally:
        model.train(was_training)
    samples = results.pop("samples")
    if tracker is None:
        return results, None
    tracker.save_results_aggregated(results=results, samples=samples)  # adds the task hashes and versions
    return results, out.with_name(f"{out.stem}_{tracker.date_id}.json")


def metrics(results: dict) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` from lm-eval's results: each metric named as lm-eval names it with its filter
    (``exact_match`` for the filter ``none``, else ``exact_match (strict-match)``), standard errors left out."""
    table = {}
    for task, values in results.get("results", {}).items():
        row = {}
        for key, value in values.items():
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, filter_name = key.split(",", 1)
            row[metric if filter_name == "none" else f"{metric} ({filter_name})"] = float(value)
        table[task] = row
    return table
