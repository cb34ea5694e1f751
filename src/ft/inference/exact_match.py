"""Exact match on held-out prompts: greedy answers of a trained model compared with the expected ones.

The end of ``ft train`` computes it when the recipe sets ``data.eval_exact_match`` (the quickstart recipes do): the
first ``n`` rows of the held-out data (``data.eval``, or the setting's own ``source``, e.g. GRPO's held-out prompts),
each a prompt and its expected answer, are answered greedily in batches, and an answer counts when its text, stripped
of whitespace, equals the expected one. Where a held-out row's prompt and expected answer are is its source's format's
to say (``Format.prompt_and_answer`` in ``ft.data.formats``: a chat's conversation up to its last assistant turn and
that turn, a preference pair's prompt and ``chosen`` answer, a prompt row's prompt and ``answer`` field, a text row's
``prompt`` and ``completion``).

A prompt given as messages is rendered with the chat template (as the trainers render it: ``ft.data.templates.render``,
with the row's own ``tools``, else ``data.tools``; ``data.chat_template_kwargs`` are written into the template the run
trains with, so the same ones apply); a text prompt is continued as it is. A held-out chat whose last assistant turn is
a tool call has no text answer to compare, and is not scored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..data.rows import SOURCE, BadRows, DataError
from ..data.templates import render
from ..model.loading import text_tokenizer

EXAMPLES = 3  # (prompt, expected, got) triples kept for the report


@dataclass(frozen=True)
class HeldOut:
    prompt: str | list  # text, or a list of {role, content} messages (with their tool calls, as canonical rows hold)
    answer: str
    images: tuple[str, ...] = ()  # a vision-language model's row: its images' paths (or URLs), in the prompt's order
    tools: list | None = None  # the tool definitions the template renders with a chat prompt (the row's, or data.tools)


def exact_match(model, tokenizer, rows: Sequence[HeldOut | dict], *, max_new_tokens: int = 8, batch_size: int = 64,
                examples: int = EXAMPLES, sizing=None) -> dict:
    """The share of ``rows`` (``HeldOut`` or ``{"prompt", "answer"}``) whose greedy answer equals the expected one:
    ``{"exact_match": fraction, "n": count, "ended_turn": fraction, "examples": [{"prompt", "expected", "got"}, …]}``
    (the examples are the first rows, right or wrong). ``ended_turn`` is the share of answers that stopped on an
    end-of-sequence (or pad) token within ``max_new_tokens``: a model that learned to stop ends its answer itself;
    one that rambles is cut off by the budget, and its answer is compared only up to there. ``tokenizer`` may be a
    vision-language model's processor: rows with images are handed to it with their images, read and sized as
    training reads them (``sizing``: ``data.image``)."""
    import torch

    from .generate import Sampling, generation_config

    rows = [row if isinstance(row, HeldOut) else HeldOut(row["prompt"], str(row["answer"])) for row in rows]
    text_side = text_tokenizer(tokenizer)
    config = generation_config(model, text_side, Sampling(max_new_tokens=max_new_tokens))
    stops = set(config.eos_token_id) | ({text_side.pad_token_id} - {None})
    side, text_side.padding_side = text_side.padding_side, "left"  # generation continues every row at its end
    was_training = model.training
    model.eval()
    answers: list[str] = []
    ended = 0
    try:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            texts = [_rendered(tokenizer, row.prompt, row.tools) for row in batch]
            templated = isinstance(batch[0].prompt, list)  # a rendered template holds its special tokens
            encoded = tokenizer(text=texts, return_tensors="pt", padding=True, add_special_tokens=not templated,
                                **_pictures(batch, sizing)).to(model.device)
            if "pixel_values" in encoded:  # the processor's float32 pixels, in the model's dtype
                encoded["pixel_values"] = encoded["pixel_values"].to(model.dtype)
            with torch.no_grad():
                output = model.generate(**encoded, generation_config=config)
            for ids in output[:, encoded["input_ids"].shape[1]:].tolist():
                end = next((i for i, token in enumerate(ids) if token in stops), None)
                ended += end is not None
                kept = ids[:end]
                answers.append(text_side.decode(kept, skip_special_tokens=True))
    finally:
        text_side.padding_side = side
        model.train(was_training)
    right = [got.strip() == row.answer.strip() for row, got in zip(rows, answers, strict=True)]
    return {"exact_match": round(sum(right) / len(rows), 4) if rows else None, "n": len(rows),
            "ended_turn": round(ended / len(rows), 4) if rows else None,
            "examples": [{"prompt": _shown(row.prompt), "expected": row.answer, "got": got.strip()}
                         for row, got in zip(rows[:examples], answers, strict=False)]}


def held_out_rows(recipe, n: int | None = None, images: bool = False) -> list[HeldOut]:
    """The first ``n`` held-out rows of ``recipe`` for ``data.eval_exact_match``: its ``source`` when set, else the
    recipe's evaluation data (its ``data.eval`` sources, or the rows ``split_ratio`` holds out). Raises DataError
    when there are none. Each row is read by its own source's format (rows keep their source's index). ``images``:
    read for a vision-language model, each row with its images (checked as training checks them)."""
    from ..data.build import read_splits
    from ..data.formats import FORMATS

    settings = recipe.data.eval_exact_match
    field = settings.field if settings is not None else "answer"
    if settings is not None and settings.source is not None:
        key, sources = "data.eval_exact_match.source", [settings.source]
        dataset = _rows(recipe, sources, [key], images)
    elif recipe.data.eval_sources:
        key, sources = "data.eval", recipe.data.eval_sources
        dataset = _rows(recipe, sources, [f"data.eval.{i}" for i in range(len(sources))], images)
    elif recipe.data.has_eval:  # split_ratio: the training rows it holds out
        key, sources, dataset = "data.eval", recipe.data.train, read_splits(recipe, _quiet, images)[1]
    else:
        raise DataError("data.eval_exact_match: the recipe has no held-out data to score; give `data.eval` or "
                        "`data.eval_exact_match.source` (e.g. {path: held-out.jsonl, format: prompt}).")
    formats = [FORMATS[source.format] for source in sources]
    tools = recipe.data.tool_list
    rows = []
    for row in dataset:
        held = formats[row[SOURCE]].prompt_and_answer(row, field)
        if held is not None:
            rows.append(HeldOut(*held, images=tuple(row.get("images") or ()), tools=row.get("tools") or tools))
            if n is not None and len(rows) == n:
                break
    if not rows:
        raise DataError(f"data.eval_exact_match: no row of {key} has both a prompt and an expected answer "
                        f"(columns: {', '.join(c for c in dataset.column_names if not c.startswith('__ft'))}).")
    return rows


def report_line(result: dict, when: str = "") -> str:
    """``ft: exact match on 200 held-out prompts: 0.985 (197 right) (e.g. 'What is 3 + 4?' → '7')``; ``when``
    follows "prompts" (`` before training``). The share is written as summary.json holds it and ``ft report`` shows
    it (four significant digits): one figure everywhere."""
    example = next(iter(result["examples"]), None)
    shown = f" (e.g. {example['prompt']!r} → {example['got']!r})" if example else ""
    share, n = result["exact_match"], result["n"]
    return f"ft: exact match on {n} held-out prompts{when}: {share:.4g} ({round(share * n)} right){shown}"


def after_training(recipe, trainer, rows: list[HeldOut] | None, say: Callable[[str], None] = print) -> dict | None:
    """``data.eval_exact_match`` of the model ``trainer`` just trained, on ``rows`` (``held_out_rows``, read before
    training so that a bad source fails first), on this (the main) process alone: printed, and returned for
    summary.json, every row's answer under ``answers`` (``write_answers`` takes them out for exact_match.jsonl). None
    when the recipe does not ask, or when the model is sharded over several processes (FSDP,
    DeepSpeed: one process cannot run it alone; ``ft generate`` on final/ can)."""
    return _scored(recipe, trainer, rows, say, "")


def before_training(recipe, trainer, rows: list[HeldOut] | None, say: Callable[[str], None] = print) -> dict | None:
    """The same score of the model as loaded (``data.eval_exact_match.before``), with the same code, rows and
    settings as ``after_training``: the baseline summary.json keeps beside the trained figure. It generates greedily
    in eval mode and restores train mode, drawing no random numbers, so the training that follows is the one a run
    without it would do."""
    settings = recipe.data.eval_exact_match
    if settings is None or not settings.before:
        return None
    return _scored(recipe, trainer, rows, say, " before training")


def _scored(recipe, trainer, rows, say, when: str) -> dict | None:
    settings = recipe.data.eval_exact_match
    if settings is None or rows is None:
        return None
    if trainer.args.world_size > 1 and recipe.distributed.kind != "ddp":
        say(f"ft: exact match{when} skipped: the model is sharded over {trainer.args.world_size} processes "
            f"({recipe.distributed.kind}); score final/ with `ft generate` instead")
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = exact_match(model, trainer.processing_class, rows, max_new_tokens=settings.max_new_tokens,
                         batch_size=settings.batch_size, examples=len(rows), sizing=recipe.data.image)
    result["answers"], result["examples"] = result["examples"], result["examples"][:EXAMPLES]
    say(report_line(result, when))
    return result


def write_answers(path, after: dict, before: list[dict] | None) -> None:
    """``exact_match.jsonl``: each held-out row's prompt, expected answer and greedy answer after training (and
    before, from the ``answers`` of the score before training), so what training changed can be read row by row.
    Takes the ``answers`` out of ``after`` (summary.json keeps the first few as ``examples``). Written whole or not at
    all (``outputs.disk.write_whole``): a full disk leaves no file cut short."""
    import json
    from pathlib import Path

    from ..outputs.disk import write_whole

    answers = after.pop("answers")
    lines = []
    for i, row in enumerate(answers):
        line = {"prompt": row["prompt"], "expected": row["expected"], "after": row["got"]}
        if before is not None:
            line["before"] = before[i]["got"]
        lines.append(json.dumps(line, ensure_ascii=False) + "\n")
    write_whole(Path(path), "".join(lines))


def _rows(recipe, sources, keys: list[str], images: bool = False):
    """The canonical rows of ``sources`` (``data.eval`` or the setting's own, named by ``keys`` in errors), read as
    ``ft train`` reads them."""
    import datasets

    from ..data.build import read_sources

    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # a re-read of a few hundred rows: its bars would only interrupt the report
    try:
        return read_sources(recipe, sources, keys, BadRows(), images)
    finally:
        if shown:
            datasets.enable_progress_bars()


def _pictures(batch: Sequence[HeldOut], sizing) -> dict:
    """The processor's ``images`` argument for a batch of rows with images (each row's list, decoded and sized as
    training reads them: ``ft.data.images.load_image``); nothing for rows without."""
    if not any(row.images for row in batch):
        return {}
    from ..data.images import load_image

    return {"images": [[load_image(ref, sizing) for ref in row.images] for row in batch]}


def _rendered(tokenizer, prompt, tools: list | None = None) -> str:
    if isinstance(prompt, str):
        return prompt
    return render(tokenizer, None, prompt, tools, generation=True)


def _shown(prompt) -> str:
    """The last user message of a conversational prompt, or the text prompt."""
    if isinstance(prompt, str):
        return prompt
    content = next((m["content"] for m in reversed(prompt) if m["role"] == "user"), "")
    return content if isinstance(content, str) else "".join(part.get("text") or "" for part in content)


def _quiet(_message: str) -> None:
    """``say`` for re-reading the eval data (its notes were printed when the run read it)."""
