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
trains with, so the same ones apply); a text prompt is continued as it is.

A held-out chat whose last assistant turn calls tools is scored on its calls: the model's answer is read back into a
message by the tokenizer's response template (transformers' ``tokenizer.parse_response``; the built-in
``chatml-tools`` template brings its own, ``ft.data.templates.BUILTINS``, and ``ft train`` sets it beside the chat
template), and it is right when its calls equal the row's as parsed JSON (each call's name and arguments: key order,
JSON whitespace and ``2`` against ``2.0`` do not matter; a string ``"2"`` is not the number ``2``) and its text beside
them equals the turn's. exact_match.jsonl and the examples show both sides as compact JSON text (``call_text``). A
tokenizer with no response template cannot read calls back: such rows are then left out, and the run says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..data.rows import ROW, SOURCE, BadRows, DataError, locate
from ..data.templates import render
from ..model.loading import text_tokenizer

EXAMPLES = 3  # (prompt, expected, got) triples kept for the report


@dataclass(frozen=True)
class HeldOut:
    prompt: str | list  # text, or a list of {role, content} messages (with their tool calls, as canonical rows hold)
    answer: str | dict  # the expected text, or the expected assistant message when its tool calls are the answer
    images: tuple[str, ...] = ()  # a vision-language model's row: its images' paths (or URLs), in the prompt's order
    tools: list | None = None  # the tool definitions the template renders with a chat prompt (the row's, or data.tools)
    group: str | None = None  # the row's value of ``data.eval_exact_match.group_by``, as text


def exact_match(model, tokenizer, rows: Sequence[HeldOut | dict], *, max_new_tokens: int = 8, batch_size: int = 64,
                examples: int = EXAMPLES, sizing=None) -> dict:
    """The share of ``rows`` (``HeldOut`` or ``{"prompt", "answer"}``) whose greedy answer equals the expected one (a
    text stripped; tool calls as parsed JSON, read back by ``tokenizer``'s response template: the module's docstring):
    ``{"exact_match": fraction, "n": count, "ended_turn": fraction, "examples": [{"prompt", "expected", "got"}, …]}``
    (the examples are the first rows, right or wrong). ``ended_turn`` is the share of answers that stopped on an
    end-of-sequence (or pad) token within ``max_new_tokens``: a model that learned to stop ends its answer itself;
    one that rambles is cut off by the budget, and its answer is compared only up to there. ``tokenizer`` may be a
    vision-language model's processor: rows with images are handed to it with their images, read and sized as
    training reads them (``sizing``: ``data.image``)."""
    from .generate import Sampling, generation_config
    from .prefix import generate_batch

    rows = [row if isinstance(row, HeldOut) else HeldOut(row["prompt"], str(row["answer"])) for row in rows]
    text_side = text_tokenizer(tokenizer)
    config = generation_config(model, text_side, Sampling(max_new_tokens=max_new_tokens))
    stops = set(config.eos_token_id) | ({text_side.pad_token_id} - {None})
    pad = text_side.pad_token_id if text_side.pad_token_id is not None else config.eos_token_id[0]
    side, text_side.padding_side = text_side.padding_side, "left"  # generation continues every row at its end
    was_training = model.training
    model.eval()
    answers: list[str] = []
    prompts: list[str] = []
    ended = 0
    try:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            texts = [_rendered(tokenizer, row.prompt, row.tools) for row in batch]
            prompts += texts
            templated = isinstance(batch[0].prompt, list)  # a rendered template holds its special tokens
            if any(row.images for row in batch):
                output, width = _with_pictures(model, tokenizer, texts, templated, _pictures(batch, sizing), config)
            else:  # their shared beginning (system prompt, tools) read once: ft.inference.prefix
                ids = [text_side(text, add_special_tokens=not templated).input_ids for text in texts]
                output, width = generate_batch(model, ids, pad, config)
            for ids in output[:, width:].tolist():
                end = next((i for i, token in enumerate(ids) if token in stops), None)
                ended += end is not None
                kept = ids[:end]
                answers.append(text_side.decode(kept, skip_special_tokens=True))
    finally:
        text_side.padding_side = side
        model.train(was_training)
    scored = [_score(text_side, row, got, prompt) for row, got, prompt in zip(rows, answers, prompts, strict=True)]
    result = {"exact_match": round(sum(right for right, _, _ in scored) / len(rows), 4) if rows else None,
              "n": len(rows), "ended_turn": round(ended / len(rows), 4) if rows else None,
              "examples": [{"prompt": _shown(row.prompt), "expected": expected, "got": got}
                           for row, (_, expected, got) in zip(rows[:examples], scored, strict=False)]}
    if any(row.group is not None for row in rows):
        result["groups"] = _by_group(rows, [right for right, _, _ in scored])
    return result


def _with_pictures(model, processor, texts: list[str], templated: bool, pictures: dict, config):
    """``model.generate`` of a batch of rows with images, the processor given their texts and pictures (padded on the
    left): (the output, the width of the inputs)."""
    import torch

    encoded = processor(text=texts, return_tensors="pt", padding=True, add_special_tokens=not templated,
                        **pictures).to(model.device)
    if "pixel_values" in encoded:  # the processor's float32 pixels, in the model's dtype
        encoded["pixel_values"] = encoded["pixel_values"].to(model.dtype)
    with torch.no_grad():
        return model.generate(**encoded, generation_config=config), encoded["input_ids"].shape[1]


def _by_group(rows: Sequence[HeldOut], right: list[bool]) -> dict:
    """``{value: {"exact_match", "n"}}`` for each ``group_by`` value, most rows first."""
    counts: dict[str, list[int]] = {}
    for row, ok in zip(rows, right, strict=True):
        tally = counts.setdefault(str(row.group), [0, 0])
        tally[0] += ok
        tally[1] += 1
    ordered = sorted(counts.items(), key=lambda item: (-item[1][1], item[0]))
    return {group: {"exact_match": round(hits / n, 4), "n": n} for group, (hits, n) in ordered}


def reads_calls(tokenizer) -> bool:
    """Whether ``tokenizer`` can read a model's tool calls back from its text: it has a response template
    (``tokenizer.parse_response``)."""
    return getattr(text_tokenizer(tokenizer), "response_template", None) is not None


def read_answer(tokenizer, text: str, prompt: str = "") -> dict | None:
    """``text`` (what the model wrote after ``prompt``) read back into an assistant message by the tokenizer's response
    template (``{"role": "assistant", "content"?, "tool_calls"?: [{"type": "function", "function": …}]}``); None when
    the tokenizer has none, or the text does not parse (a call that is not JSON)."""
    if not reads_calls(tokenizer):
        return None
    try:
        return text_tokenizer(tokenizer).parse_response(text, prefix=prompt)
    except Exception:  # noqa: BLE001 (any failure to parse what a model wrote makes that answer unreadable, not the run)
        return None


def call_text(message: dict) -> str:
    """An assistant message with tool calls as exact match compares and shows it: its text (stripped; omitted when
    empty), then its calls as compact JSON, ``[{"arguments":{…},"name":"…"}]``, keys sorted and whole-number floats
    written as integers, so that two messages whose calls are equal as parsed JSON give the same text."""
    calls = [_call(call) for call in message.get("tool_calls") or ()]
    content = message.get("content")
    content = content.strip() if isinstance(content, str) else ""
    dumped = json.dumps(_canonical(calls), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"{content}\n{dumped}" if content else dumped


def _call(call) -> object:
    """A call's name and arguments (OpenAI's layout, ``{"type": "function", "function": {"name", "arguments"}}``, or
    the function alone); anything else a model wrote inside the call's tags, as it is."""
    function = call.get("function", call) if isinstance(call, dict) else call
    if isinstance(function, dict) and set(function) <= {"name", "arguments"}:
        return {"name": function.get("name"), "arguments": function.get("arguments")}
    return function


def _canonical(value):
    """``value`` (parsed JSON) with every whole-number float an int (JSON has one number type: ``2.0`` is ``2``)."""
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _score(tokenizer, row: HeldOut, got: str, prompt: str) -> tuple[bool, str, str]:
    """(right, the expected answer, the answer), the two as exact_match.jsonl shows them: texts, stripped; for a row
    whose answer is tool calls, ``call_text`` of both (of the answer when it reads back as calls and nothing else, else
    the text the model wrote)."""
    if isinstance(row.answer, str):
        return got.strip() == row.answer.strip(), row.answer, got.strip()
    expected = call_text(row.answer)
    message = read_answer(tokenizer, got, prompt)
    if message is None or not message.get("tool_calls"):
        return False, expected, got.strip()
    said = call_text(message)
    shown = said if not (message.get("content") or "").strip() else got.strip()
    return said == expected, expected, shown


def held_out_rows(recipe, n: int | None = None, images: bool = False, calls: bool = True,
                  say: Callable[[str], None] | None = None) -> list[HeldOut]:
    """The first ``n`` held-out rows of ``recipe`` for ``data.eval_exact_match``: its ``source`` when set, else the
    recipe's evaluation data (its ``data.eval`` sources, or the rows ``split_ratio`` holds out). Raises DataError
    when there are none. Each row is read by its own source's format (rows keep their source's index). ``images``:
    read for a vision-language model, each row with its images (checked as training checks them). ``calls``: whether
    rows whose answer is tool calls are kept (``reads_calls`` of the run's tokenizer); left out, ``say`` is told how
    many, and why."""
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
    grouping = settings.group_by if settings is not None else None
    groups = _group_values(recipe, sources, key, grouping) if grouping else None
    rows, unread = [], 0
    for row in dataset:
        held = formats[row[SOURCE]].prompt_and_answer(row, field)
        if held is not None and not calls and isinstance(held[1], dict):
            unread += 1
        elif held is not None:
            group = _group_of(groups, row, sources, key, grouping) if groups is not None else None
            rows.append(HeldOut(*held, images=tuple(row.get("images") or ()), tools=row.get("tools") or tools,
                                group=group))
            if n is not None and len(rows) == n:
                break
    why = (f"; {unread} {'ends' if unread == 1 else 'end'} on a tool call, which the chat template has no response "
           "template to read back from the model's text (data.chat_template: chatml-tools has one)") if unread else ""
    if not rows:
        raise DataError(f"data.eval_exact_match: no row of {key} has both a prompt and an expected answer "
                        f"(columns: {', '.join(c for c in dataset.column_names if not c.startswith('__ft'))}){why}.")
    if unread and say is not None:
        say(f"ft: exact match: {unread} held-out {'row is' if unread == 1 else 'rows are'} not scored{why}")
    return rows


def _group_values(recipe, sources, key: str, field: str) -> list[dict]:
    """For each source, its rows' ``field`` by row number (``ROW``), read from the source as written: a canonical row
    keeps only its format's columns, and the field that groups the rows (``group_by``) is usually another."""
    from ..data.sources import read_source

    values = []
    for i, source in enumerate(sources):
        raw = read_source(source, seed=recipe.data.seed, on_bad_row=recipe.data.on_bad_row, report=BadRows(),
                          key=f"{key}.{i}" if key == "data.eval" else key)
        column = raw[field][:] if field in raw.column_names else [None] * len(raw)
        values.append(dict(zip(raw[ROW][:], column, strict=True)))
    return values


def _group_of(groups: list[dict], row, sources, key: str, field: str) -> str:
    """The ``group_by`` value of a canonical row, as text; a row without one is a DataError naming the row."""
    value = groups[row[SOURCE]].get(row[ROW])
    if value is None:
        source = sources[row[SOURCE]]
        where = locate(source, [row[ROW]])[row[ROW]]
        raise DataError(f"data.eval_exact_match.group_by: {where} has no {field!r} field ({key}), so its answer "
                        f"cannot be counted in a group; give every held-out row a {field!r}, or remove group_by.")
    return value if isinstance(value, str) else json.dumps(value)


def answer_tokens(model, tokenizer, rows: Sequence[HeldOut]) -> tuple[int, int]:
    """(tokens, index of its row): the most tokens any of ``rows``' expected answers takes the model to write, its end
    of turn included, as ``exact_match`` generates it: the tokens of the prompt with the expected answer after it (a
    chat rendered with the answer as its last turn, a text prompt followed by the answer) beyond those of the prompt
    alone, up to and including the first token generation stops at. ``max_new_tokens`` below it cuts that answer
    short, and scores it wrong however well the model answers."""
    from .generate import Sampling, generation_config

    text_side = text_tokenizer(tokenizer)
    stops = set(generation_config(model, text_side, Sampling(max_new_tokens=1)).eos_token_id)
    stops |= {text_side.pad_token_id} - {None}
    most, longest = 0, 0
    for index, row in enumerate(rows):
        prompt = _rendered(tokenizer, row.prompt, row.tools)
        if isinstance(row.prompt, str):
            whole, extra = prompt + str(row.answer), 1  # the end-of-sequence token a text answer ends with
        else:
            turn = row.answer if isinstance(row.answer, dict) else {"role": "assistant", "content": row.answer}
            whole, extra = render(tokenizer, None, [*row.prompt, turn], row.tools), 0
        start = len(text_side(prompt, add_special_tokens=False).input_ids)
        written = text_side(whole, add_special_tokens=False).input_ids[start:]
        end = next((i + 1 for i, token in enumerate(written) if token in stops), len(written) + extra)
        if end > most:
            most, longest = end, index
    return most, longest


def report_line(result: dict, when: str = "") -> str:
    """``ft: exact match on 200 held-out prompts: 0.985 (197 right) (e.g. 'What is 3 + 4?' → '7')``; ``when``
    follows "prompts" (`` before training``). The share is written as summary.json holds it and ``ft report`` shows
    it (four significant digits): one figure everywhere."""
    example = next(iter(result["examples"]), None)
    shown = f" (e.g. {example['prompt']!r} → {example['got']!r})" if example else ""
    share, n = result["exact_match"], result["n"]
    return f"ft: exact match on {n} held-out prompts{when}: {share:.4g} ({round(share * n)} right){shown}"


def after_training(recipe, trainer, rows: list[HeldOut] | None, max_new_tokens: int,
                   say: Callable[[str], None] = print) -> dict | None:
    """``data.eval_exact_match`` of the model ``trainer`` just trained, on ``rows`` (``held_out_rows``, read before
    training so that a bad source fails first), on this (the main) process alone: printed, and returned for
    summary.json, every row's answer under ``answers`` (``write_answers`` takes them out for exact_match.jsonl). None
    when the recipe does not ask, or when the model is sharded over several processes (FSDP,
    DeepSpeed: one process cannot run it alone; ``ft generate`` on final/ can)."""
    return _scored(recipe, trainer, rows, max_new_tokens, say, "")


def before_training(recipe, trainer, rows: list[HeldOut] | None, max_new_tokens: int,
                    say: Callable[[str], None] = print) -> dict | None:
    """The same score of the model as loaded (``data.eval_exact_match.before``), with the same code, rows and
    settings as ``after_training``: the baseline summary.json keeps beside the trained figure. It generates greedily
    in eval mode and restores train mode, drawing no random numbers, so the training that follows is the one a run
    without it would do."""
    settings = recipe.data.eval_exact_match
    if settings is None or not settings.before:
        return None
    return _scored(recipe, trainer, rows, max_new_tokens, say, " before training")


def _scored(recipe, trainer, rows, max_new_tokens: int, say, when: str) -> dict | None:
    settings = recipe.data.eval_exact_match
    if settings is None or rows is None:
        return None
    if trainer.args.world_size > 1 and recipe.distributed.kind != "ddp":
        say(f"ft: exact match{when} skipped: the model is sharded over {trainer.args.world_size} processes "
            f"({recipe.distributed.kind}); score final/ with `ft generate` instead")
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = exact_match(model, trainer.processing_class, rows, max_new_tokens=max_new_tokens,
                         batch_size=settings.batch_size, examples=len(rows), sizing=recipe.data.image)
    result["answers"], result["examples"] = result["examples"], result["examples"][:EXAMPLES]
    say(report_line(result, when))
    return result


ANSWERS = "exact_match.jsonl"  # in the output directory: every held-out row's answers (``write_answers``)


def write_answers(path, after: dict | None, before: list[dict] | None) -> None:
    """``exact_match.jsonl``: each held-out row's prompt, expected answer and greedy answer after training (and
    before, from the ``answers`` of the score before training), so what training changed can be read row by row.
    Takes the ``answers`` out of ``after`` (summary.json keeps the first few as ``examples``). ``after`` None: the
    baseline alone, written as soon as it is scored, so that a run stopped and resumed keeps it. Written whole or not
    at all (``outputs.disk.write_whole``): a full disk leaves no file cut short."""
    import json
    from pathlib import Path

    from ..outputs.disk import write_whole

    answers = after.pop("answers") if after is not None else before
    lines = []
    for i, row in enumerate(answers):
        line = {"prompt": row["prompt"], "expected": row["expected"]}
        if after is not None:
            line["after"] = row["got"]
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
