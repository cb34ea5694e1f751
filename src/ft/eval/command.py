"""``ft eval``: models scored on lm-eval tasks, side by side.

Each ``MODEL_OR_RUN`` is found as ``ft generate`` finds it (``ft.model.locate``: a run directory scores its final/, a
checkpoint-N/ itself, an adapter is loaded on the base its run recorded, through PEFT; a full model folder as saved),
or is a hub id. Every argument and task is checked before the first model loads; then each model is loaded, scored
(``score``) and let go before the next. A model inside a run has its results written there, in
``<run>/eval/results_<time>.json`` (lm-eval's results file); the scores are shown as one table with a column per
model (the base and the tuned, side by side), or as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..model.loading import names_a_path, text_tokenizer
from ..model.locate import Found, LocateError, load_for_generation, locate, scoring_model
from ..recipe.errors import first_line
from .score import Settings, metrics, score
from .tasks import TaskError, check, resolve

ARG = "MODEL_OR_RUN"


@dataclass(frozen=True)
class Scored:
    """One model's scores: ``name`` as given, lm-eval's ``results``, the results file ``written`` (None outside a
    run)."""

    name: str
    results: dict
    written: Path | None


def evaluate(sources: Sequence[str], task_names: Sequence[str], settings: Settings, dtype: str | None = None,
             say: Callable[[str], None] = print) -> list[Scored]:
    """Every model of ``sources`` scored on ``task_names`` (task names and task files, files relative to the working
    directory), in order."""
    if not task_names:
        raise TaskError("--tasks: no task given; name lm-eval tasks or task YAML files, e.g. "
                        "`--tasks tasks/arithmetic/sums.yaml,arc_easy`.")
    tasks = resolve(task_names, Path.cwd(), "--tasks")
    found = [_find(source) for source in sources]  # every argument checked before anything loads
    manager = check(tasks, "--tasks")
    scored = []
    for source, where in zip(sources, found, strict=True):
        model, tokenizer = _load(source, where, dtype, say)
        out = where.run_dir / "eval" / "results.json" if where is not None and where.run_dir is not None else None
        results, written = score(model, tokenizer, tasks, manager, settings, out)
        if written is not None:
            say(f"ft eval: wrote {written}")
        scored.append(Scored(source, results, written))
        del model
    return scored


def _find(source: str) -> Found | None:
    """What a local argument holds (None for a hub id); LocateError for a path that does not exist or a model that
    writes no text."""
    path = Path(source).expanduser()
    if not path.exists():
        if names_a_path(source):
            raise LocateError(f"{ARG}: {source} does not exist; name a run directory, a model or adapter folder, or "
                              "a hub id (org/name).")
        return None
    found = locate(path, ARG)
    if scoring_model(found):
        raise LocateError(f"{ARG}: {found.path} is a reward model (it scores a text with one number) and lm-eval's "
                          "tasks ask a model that writes text; score the policy model it was trained to judge.")
    return found


def _load(source: str, found: Found | None, dtype: str | None, say: Callable[[str], None]):
    """(model, tokenizer) of one argument, on the GPU where there is one."""
    if found is not None:
        model, processing_class = load_for_generation(found.path, dtype, say, "scoring", found)
    else:
        model, processing_class = _from_hub(source, dtype, say)
    tokenizer = text_tokenizer(processing_class)
    if tokenizer is not processing_class:
        raise LocateError(f"{ARG}: {source} is a vision-language model; ft eval scores text models (lm-eval's `hf` "
                          "model reads text alone). Score the text tasks of its language model after merging, or "
                          "evaluate it with lm-eval's `hf-multimodal` model.")
    return model, tokenizer


def _from_hub(name: str, dtype: str | None, say: Callable[[str], None]):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype="auto" if dtype in (None, "auto") else
                                                     getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise LocateError(f"{ARG}: could not load {name!r} from the Hub: {first_line(exc)}. Name a local run or "
                          "model folder, or a hub id reachable from this machine (unset HF_HUB_OFFLINE; `hf auth "
                          "login` for gated models).") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = "cuda" if torch.cuda.is_available() else "cpu"
    say(f"ft: scoring with {name} on {device}")
    return model.to(device).eval(), tokenizer


def table(scored: Sequence[Scored]) -> str:
    """One row per task and metric, one column per model (its value, ± its standard error where lm-eval gives one),
    and the rows scored per task."""
    header = ["task", "metric", "n", *(item.name for item in scored)]
    rows = []
    first = scored[0].results
    for task, values in metrics(first).items():
        n = first.get("n-samples", {}).get(task, {}).get("effective", "")
        for metric in values:
            cells = [_cell(item.results, task, metric) for item in scored]
            rows.append([task, metric, str(n), *cells])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


def _cell(results: dict, task: str, metric: str) -> str:
    name, _, filter_name = metric.partition(" (")
    filter_name = filter_name.rstrip(")") or "none"
    values = results.get("results", {}).get(task, {})
    value = values.get(f"{name},{filter_name}")
    if not isinstance(value, (int, float)):
        return "-"
    error = values.get(f"{name}_stderr,{filter_name}")
    return f"{value:.4f}" + (f" ± {error:.4f}" if isinstance(error, (int, float)) else "")


def as_json(scored: Sequence[Scored]) -> str:
    """Each model's name, results file and lm-eval's results (values lm-eval keeps that JSON cannot hold, such as a
    task's functions, as their text)."""
    return json.dumps([{"model": item.name, "written": str(item.written) if item.written else None,
                        "results": item.results} for item in scored], indent=1, default=str, ensure_ascii=False)
