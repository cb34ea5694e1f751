"""Tokenization and loss masks for SFT rows, in ft's canonical row layout.

Chat rows have ``messages`` (a list of ``{"role", "content"}``); text rows have ``prompt`` ("" for plain text)
and ``completion``. ``tokenize_batch`` is written for ``datasets.Dataset.map(batched=True)``.

Chat masks are found in character space: each conversation is rendered once with its chat template and
tokenized once with offsets; the assistant contents (plus the template's end-of-turn text, so the model learns
to stop) are located in the rendered text, and a token carries loss iff its characters lie inside such a span.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .labels import IGNORE_INDEX
from .templates import end_of_turn

_SPACE = re.compile(r"\s*")

Span = tuple[int, int]  # [start, end) character positions in the rendered text


@dataclass(frozen=True)
class TokenizeSettings:
    template: str | None  # resolved Jinja chat template (None for text data)
    max_length: int
    truncation: str  # "truncate" (keep the first max_length tokens) | "drop" (flag the row as ft_too_long)
    train_on: str  # "assistant" (loss on assistant spans / completions only) | "all"


def tokenize_batch(batch: dict[str, list], tokenizer, settings: TokenizeSettings) -> dict[str, list]:
    """For ``datasets.Dataset.map(batched=True)``: returns input_ids, labels (-100 = no loss),
    length (= len(input_ids)), and the flags ft_truncated (cut to max_length), ft_too_long (longer than
    max_length and truncation == 'drop': the caller filters these rows out and counts them; their tokens are
    returned uncut) and ft_no_loss (no label != -100 left). Everything is plain Python lists; where every token
    of a row is trained on, its labels list IS its input_ids list (one object: callers may convert it once).

    Counted before max_length cuts anything (the ``STATS`` columns): ft_full_length (tokens), ft_trained_full
    (tokens with loss), ft_turns (runs of trained tokens: an assistant turn, a completion) and ft_turns_stopped
    (those whose last trained token, whitespace after it aside, is ``stop_token_id``: the model learns to stop).

    Chat rows are rendered by ``settings.template`` (which writes its own BOS, if any); text rows are tokenized
    with the tokenizer's special tokens (e.g. its BOS) and end with ``eos_token_id`` (trained on).
    """
    if settings.truncation not in ("truncate", "drop") or settings.train_on not in ("assistant", "all"):
        raise ValueError(f"bad TokenizeSettings: truncation={settings.truncation!r}, train_on={settings.train_on!r}")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer; loss masks need its offset mapping")
    if "messages" in batch:
        if settings.template is None:
            raise ValueError("chat rows need a chat template (TokenizeSettings.template is None)")
        ids, labels, turns = _chat_rows(batch["messages"], tokenizer, settings)
    else:
        ids, labels, turns = _text_rows(batch["prompt"], batch["completion"], tokenizer, settings)
    return _limit(ids, labels, turns, settings)


STATS = ("ft_full_length", "ft_trained_full", "ft_turns", "ft_turns_stopped")


def stop_token_id(settings: TokenizeSettings, tokenizer) -> int | None:
    """The token a trained turn must end with for the model to learn to stop: the last token of the chat template's
    end-of-turn text (``<|im_end|>``, ``<|eot_id|>``), or the tokenizer's EOS for text rows and for templates that
    write nothing after an answer."""
    return _stop_id(end_of_turn(settings.template, tokenizer).strip() if settings.template else "", tokenizer)


def _stop_id(eot: str, tokenizer) -> int | None:
    ids = tokenizer(eot, add_special_tokens=False)["input_ids"] if eot else []
    return ids[-1] if ids else tokenizer.eos_token_id


def _turns(ids: list[int], labels: list[int], stop: int | None, blank=None) -> tuple[int, int, int]:
    """(trained tokens, trained turns, turns ending with ``stop``) of one row; ``blank(i)`` says token i is only
    whitespace (skipped back over at a turn's end, as a template's newline after its end-of-turn token)."""
    if labels is ids:
        bounds = [(0, len(ids) - 1)] if ids else []
        trained = len(ids)
    else:
        bounds, start, trained = [], None, 0
        for i, label in enumerate(labels):
            if label != IGNORE_INDEX:
                trained += 1
                if start is None:
                    start = i
            elif start is not None:
                bounds.append((start, i - 1))
                start = None
        if start is not None:
            bounds.append((start, len(labels) - 1))
    stopped = 0
    for start, end in bounds:
        while blank is not None and end > start and blank(end):
            end -= 1
        stopped += stop is not None and ids[end] == stop
    return trained, len(bounds), stopped


def _chat_rows(conversations: list, tokenizer, settings: TokenizeSettings) -> tuple[list, list]:
    render = tokenizer.apply_chat_template
    texts = [render(messages, tokenize=False, chat_template=settings.template) for messages in conversations]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    eot = end_of_turn(settings.template, tokenizer).strip()
    stop = _stop_id(eot, tokenizer)
    labels, turns = [], []
    rows = zip(conversations, texts, enc["input_ids"], enc["offset_mapping"], strict=True)
    for messages, text, ids, offsets in rows:
        if settings.train_on == "all":
            row_labels = ids
        else:
            spans = _assistant_spans(messages, text, eot)
            if spans is None:
                spans = _assistant_spans_by_prefix(messages, text, tokenizer, settings.template)
            row_labels = _mask(ids, offsets, spans, text)
        labels.append(row_labels)
        turns.append(_turns(ids, row_labels, stop, lambda i, o=offsets, t=text: t[o[i][0]:o[i][1]].isspace()))
    return enc["input_ids"], labels, turns


def _assistant_spans(messages: list[dict], text: str, eot: str) -> list[Span] | None:
    """Each assistant content plus the end-of-turn text after it, located by walking all messages in order.

    Every message is searched from where the previous one ended, so an answer "4" is not found inside an
    earlier "What is 4 * 1?". Contents are searched stripped (templates may trim them); whitespace the template
    kept around an answer is part of its span. An answer must be followed (after optional whitespace) by
    ``eot``, which skips look-alikes elsewhere. None when a content cannot be located (the template rewrites
    it): the caller then falls back to prefix rendering.
    """
    cursor, spans = 0, []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            return None
        needle = content.strip()
        if message.get("role") != "assistant":
            if needle:
                at = text.find(needle, cursor)
                if at < 0:
                    return None
                cursor = at + len(needle)
            continue
        if not needle:
            return None  # an empty answer leaves nothing to search for; the prefix renders know where it is
        at = text.find(needle, cursor)
        while at >= 0:
            end = at + len(needle)
            after = _SPACE.match(text, end).end()
            if not eot or text.startswith(eot, after):
                break
            at = text.find(needle, at + 1)
        if at < 0:
            return None
        lead = content[: len(content) - len(content.lstrip())]  # leading whitespace the template kept
        if lead and at - len(lead) >= cursor and text.startswith(lead, at - len(lead)):
            at -= len(lead)
        end = after + len(eot) if eot else end
        spans.append((at, end))
        cursor = end
    return spans


def _assistant_spans_by_prefix(messages: list[dict], text: str, tokenizer, template: str) -> list[Span]:
    """Fallback for a row whose contents the template rewrites: each assistant span runs from the end of
    ``messages[:i]`` rendered with the generation prompt to the end of ``messages[:i + 1]`` (trailing
    whitespace excluded). Correct but QUADRATIC in the number of turns (one prefix render per answer), hence
    only used for rows the linear search cannot place. A turn whose prefix render is not a prefix of the full
    render (or fails) gets no loss.
    """
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        try:
            before = tokenizer.apply_chat_template(
                messages[:i], tokenize=False, chat_template=template, add_generation_prompt=True)
            through = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False, chat_template=template)
        except Exception:  # a template may refuse some prefixes (e.g. one not ending on a user turn)
            continue
        start, end = len(before), len(through.rstrip())
        if text.startswith(before) and text.startswith(through) and start < end:
            spans.append((start, end))
    return spans


def _mask(ids: list[int], offsets: list[Span], spans: list[Span], text: str) -> list[int]:
    """Labels: a token keeps its id iff its characters lie inside a span (sorted, disjoint), else -100.

    A token whose offsets are empty (e.g. a special token) is matched by its position. A token that starts
    with whitespace before a span (" answer" after "[/INST]") counts as inside when the rest of it is.
    """
    labels, j = [], 0
    for token, (start, end) in zip(ids, offsets, strict=True):
        while j < len(spans) and spans[j][1] <= start:
            j += 1
        inside = False
        if j < len(spans):
            a, b = spans[j]
            if start == end:
                inside = a <= start < b
            else:
                inside = end <= b and (a <= start or (start < a < end and text[start:a].isspace()))
        labels.append(token if inside else IGNORE_INDEX)
    return labels


def _text_rows(prompts: list[str], completions: list[str], tokenizer, settings: TokenizeSettings):
    masked = settings.train_on == "assistant" and any(prompts)  # plain text trains on every token
    texts = completions
    if any(prompts):
        texts = [prompt + completion for prompt, completion in zip(prompts, completions, strict=True)]
    enc = tokenizer(texts, return_offsets_mapping=masked)
    offsets = enc["offset_mapping"] if masked else [None] * len(texts)
    eos = tokenizer.eos_token_id
    all_ids, all_labels, turns = [], [], []
    for prompt, text, ids, spans in zip(prompts, texts, enc["input_ids"], offsets, strict=True):
        labels = _mask(ids, spans, [(len(prompt), len(text))], text) if masked and prompt else ids
        if eos is not None:
            if ids and ids[-1] == eos:
                labels[-1] = eos  # an EOS the tokenizer appended (its offsets are often empty)
            else:
                ids.append(eos)
                if labels is not ids:
                    labels.append(eos)
        all_ids.append(ids)
        all_labels.append(labels)
        turns.append(_turns(ids, labels, eos))
    return all_ids, all_labels, turns


def _limit(all_ids: list, all_labels: list, turns: list, settings: TokenizeSettings) -> dict[str, list]:
    """Apply max_length / truncation and compute the length, flag and ``STATS`` columns."""
    out: dict[str, list] = {k: [] for k in ("input_ids", "labels", "length", "ft_truncated", "ft_too_long",
                                             "ft_no_loss", *STATS)}
    for ids, labels, (trained, count, stopped) in zip(all_ids, all_labels, turns, strict=True):
        out["ft_full_length"].append(len(ids))
        out["ft_trained_full"].append(trained)
        out["ft_turns"].append(count)
        out["ft_turns_stopped"].append(stopped)
        too_long = len(ids) > settings.max_length
        truncated = too_long and settings.truncation == "truncate"
        if truncated:
            cut = ids[: settings.max_length]
            labels = cut if labels is ids else labels[: settings.max_length]
            ids = cut
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["length"].append(len(ids))
        out["ft_truncated"].append(truncated)
        out["ft_too_long"].append(too_long and settings.truncation == "drop")
        out["ft_no_loss"].append(all(label == IGNORE_INDEX for label in labels))
    return out
