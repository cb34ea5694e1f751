"""Tokenization and loss masks for SFT rows, in ft's canonical row layout.

Chat rows have ``messages`` (a list of ``{"role", "content"}``); text rows have ``prompt`` ("" for plain text)
and ``completion``. ``tokenize_batch`` is written for ``datasets.Dataset.map(batched=True)``.

Chat masks are found in character space: each conversation is rendered once with its chat template and
tokenized once; the assistant contents (plus the template's end-of-turn text, so the model learns to stop) are
located in the rendered text, and a token carries loss iff its characters lie inside such a span (the run of such
tokens found from the span's two ends through the tokenizer's character index).

A vision-language model's chat rows (contents as lists of text and image parts, and ``images``: their paths) are
masked the same way, from the same rendered text, with no per-family boundaries: the text parts are located in order,
an assistant turn's span runs from its first text to the end-of-turn after its last. Then each image's placeholder
token (which the template writes once per image part) becomes the tokens the model's processor writes for that image
(``ft.data.images.ImageTokens``), none of them trained, whatever ``train_on`` says. Such a row is flagged when its
placeholders and images differ in number (``ft_image_mismatch``), or when ``max_length`` would cut inside an image's
tokens (``ft_cut_image``): ``ft.data.build`` refuses or drops those rows, by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

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
    parts: bool = False  # chat contents are lists of parts (a vision-language model's rows, rendered by its template)


def tokenize_batch(batch: dict[str, list], tokenizer, settings: TokenizeSettings) -> dict[str, list]:
    """For ``datasets.Dataset.map(batched=True)``: returns input_ids, labels (-100 = no loss),
    length (= len(input_ids)), and the flags ft_truncated (cut to max_length), ft_too_long (longer than
    max_length and truncation == 'drop': the caller filters these rows out and counts them; their tokens are
    returned uncut) and ft_no_loss (no label != -100 left). Everything is plain Python lists; where every token
    of a row is trained on, its labels list IS its input_ids list (one object: callers may convert it once).

    Counted before max_length cuts anything (the ``STATS`` columns but ft_trained): ft_full_length (tokens),
    ft_trained_full (tokens with loss), ft_turns (runs of trained tokens: an assistant turn, a completion) and
    ft_turns_stopped (those whose last trained token, whitespace after it aside, is ``stop_token_id``: the model
    learns to stop); after the cut, ft_trained (tokens with loss kept: callers sum it instead of every label).

    Chat rows are rendered by ``settings.template`` (which writes its own BOS, if any); text rows are tokenized
    with the tokenizer's special tokens (e.g. its BOS) and end with ``eos_token_id`` (trained on).
    """
    out = tokenize_arrays(batch, tokenizer, settings)
    ids = [row.tolist() for row in out["input_ids"]]
    out["labels"] = [ids[i] if labels is row else labels.tolist()
                     for i, (row, labels) in enumerate(zip(out["input_ids"], out["labels"], strict=True))]
    out["input_ids"] = ids
    return out


def tokenize_arrays(batch: dict[str, list], tokenizer, settings: TokenizeSettings, images=None) -> dict[str, list]:
    """``tokenize_batch`` with each row's input_ids and labels as an int32 numpy array (labels that are every token
    IS the input_ids array), for callers that hand the rows to Arrow whole: masks are computed on arrays, since a
    Python loop per token cost more than the tokenizer itself.

    Rows with ``images`` (a vision-language model's chats) need ``images``, the model's ``ImageTokens``; they also
    return ``images`` (the paths of the images left in each row), ``ft_image_tokens`` (the tokens they take: the
    whole expansion of each, its marks around the image included) and the flags ``ft_image_mismatch`` and
    ``ft_cut_image`` (see the module's docstring)."""
    if settings.truncation not in ("truncate", "drop") or settings.train_on not in ("assistant", "all"):
        raise ValueError(f"bad TokenizeSettings: truncation={settings.truncation!r}, train_on={settings.train_on!r}")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer; loss masks need its offset mapping")
    if "images" in batch:
        if images is None or settings.template is None:
            raise ValueError("rows with images need the model's ImageTokens and a chat template")
        return _seeing_rows(batch["messages"], batch["images"], tokenizer, settings, images)
    if "messages" in batch:
        if settings.template is None:
            raise ValueError("chat rows need a chat template (TokenizeSettings.template is None)")
        ids, labels, turns = _chat_rows(batch["messages"], tokenizer, settings)
    else:
        ids, labels, turns = _text_rows(batch["prompt"], batch["completion"], tokenizer, settings)
    return _limit(ids, labels, turns, settings)


STATS = ("ft_full_length", "ft_trained_full", "ft_turns", "ft_turns_stopped", "ft_trained")


def stop_token_id(settings: TokenizeSettings, tokenizer) -> int | None:
    """The token a trained turn must end with for the model to learn to stop: the last token of the chat template's
    end-of-turn text (``<|im_end|>``, ``<|eot_id|>``), or the tokenizer's EOS for text rows and for templates that
    write nothing after an answer."""
    eot = end_of_turn(settings.template, tokenizer, settings.parts).strip() if settings.template else ""
    return _stop_id(eot, tokenizer)


def _stop_id(eot: str, tokenizer) -> int | None:
    ids = tokenizer(eot, add_special_tokens=False)["input_ids"] if eot else []
    return ids[-1] if ids else tokenizer.eos_token_id


def _turns(ids: np.ndarray, labels: np.ndarray, stop: int | None, blank=None) -> tuple[int, int, int]:
    """(trained tokens, trained turns, turns ending with ``stop``) of one row; ``blank(i)`` says token i is only
    whitespace (skipped back over at a turn's end, as a template's newline after its end-of-turn token)."""
    if labels is ids:
        bounds = [(0, len(ids) - 1)] if len(ids) else []
        trained = len(ids)
    else:
        on = labels != IGNORE_INDEX
        trained = int(on.sum())
        edges = np.diff(on.astype(np.int8), prepend=0, append=0)  # +1 where a run of trained tokens starts, -1 after
        bounds = zip(np.flatnonzero(edges == 1).tolist(), (np.flatnonzero(edges == -1) - 1).tolist(), strict=True)
    stopped, count = 0, 0
    for start, end in bounds:
        count += 1
        while blank is not None and end > start and blank(end):
            end -= 1
        stopped += stop is not None and int(ids[end]) == stop
    return trained, count, stopped


def _chat_rows(conversations: list, tokenizer, settings: TokenizeSettings) -> tuple[list, list, list]:
    render = tokenizer.apply_chat_template
    texts = [render(messages, tokenize=False, chat_template=settings.template) for messages in conversations]
    enc = tokenizer(texts, add_special_tokens=False)
    eot = end_of_turn(settings.template, tokenizer).strip()
    stop = _stop_id(eot, tokenizer)
    all_ids, labels, turns = [], [], []
    rows = zip(conversations, texts, enc["input_ids"], enc.encodings, strict=True)
    for messages, text, row_ids, encoding in rows:
        ids = np.fromiter(row_ids, dtype=np.int32, count=len(row_ids))
        if settings.train_on == "all":
            row_labels = ids
        else:
            spans = _assistant_spans(messages, text, eot)
            if spans is None:
                spans = _assistant_spans_by_prefix(messages, text, tokenizer, settings.template)
            row_labels = _mask(ids, encoding, spans, text)
        all_ids.append(ids)
        labels.append(row_labels)
        turns.append(_turns(ids, row_labels, stop, lambda i, e=encoding, t=text: _blank(e, t, i)))
    return all_ids, labels, turns


def _blank(encoding, text: str, token: int) -> bool:
    """Token ``token`` is only whitespace (a token with no characters is not)."""
    chars = encoding.token_to_chars(token)
    return chars is not None and chars[0] < chars[1] and text[chars[0]:chars[1]].isspace()


def _assistant_spans(messages: list[dict], text: str, eot: str) -> list[Span] | None:
    """Each assistant content plus the end-of-turn text after it, located by walking all messages in order.

    Every message is searched from where the previous one ended, so an answer "4" is not found inside an
    earlier "What is 4 * 1?". Contents are searched stripped (templates may trim them); whitespace the template
    kept around an answer is part of its span. An answer must be followed (after optional whitespace) by
    ``eot``, which skips look-alikes elsewhere. None when a content cannot be located (the template rewrites
    it): the caller then falls back to prefix rendering.
    """
    if not all(isinstance(message.get("content"), str) for message in messages):
        return None
    return _spans_of([(message.get("role"), [message["content"]]) for message in messages], text, eot)


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


def _mask(ids: np.ndarray, encoding, spans: list[Span], text: str) -> np.ndarray:
    """Labels: a token keeps its id iff its characters lie inside a span (sorted, disjoint), else -100.

    A token that starts with whitespace before a span (" answer" after "[/INST]") counts as inside when the rest of
    it is. The tokens inside a span are a run, found from its two ends through the tokenizer's own character index
    (``encoding``: the row's ``tokenizers.Encoding``), never a Python step per token: the offsets of every token
    cost more to bring into Python than the tokenization itself.
    """
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
    for a, b in spans:
        first, last = _first_inside(encoding, text, a, b), _last_inside(encoding, a, b)
        if first is not None and last is not None and first <= last:
            labels[first:last + 1] = ids[first:last + 1]
    return labels


def _first_inside(encoding, text: str, a: int, b: int) -> int | None:
    """The first token inside [a, b): the one holding the span's first character that a token holds, or the next
    one when it starts before ``a`` with more than whitespace there, or ends after ``b``."""
    token = next((t for c in range(a, b) if (t := encoding.char_to_token(c)) is not None), None)
    if token is None:
        return None
    start, end = encoding.token_to_chars(token)
    if start < a and not (text[start:a].isspace() and end <= b):
        return token + 1
    return token


def _last_inside(encoding, a: int, b: int) -> int | None:
    """The last token inside [a, b): the last one holding the span's last character that a token holds (a
    character split into several tokens, the bytes of an "é", is held by all of them), or the one before when
    it ends after ``b``."""
    token = next((t for c in range(b - 1, a - 1, -1) if (t := encoding.char_to_token(c)) is not None), None)
    if token is None:
        return None
    if encoding.token_to_chars(token)[1] > b:
        return token - 1
    while token + 1 < len(encoding) and (chars := encoding.token_to_chars(token + 1)) is not None \
            and chars[0] < chars[1] <= b:
        token += 1
    return token


def _seeing_rows(conversations: list, refs: list, tokenizer, settings: TokenizeSettings, images) -> dict[str, list]:
    """A vision-language model's chat rows: rendered, tokenized and masked as text chats are (the text parts located
    in the rendered text, ``_part_spans``), then each image placeholder replaced by its image's tokens, untrained;
    ``max_length`` applied as ``_limit`` applies it, never inside an image's tokens."""
    render = tokenizer.apply_chat_template
    texts = [render(messages, tokenize=False, chat_template=settings.template) for messages in conversations]
    enc = tokenizer(texts, add_special_tokens=False)
    eot = end_of_turn(settings.template, tokenizer, parts=True).strip()
    stop = _stop_id(eot, tokenizer)
    all_ids, all_labels, turns, kept, mismatch, cut_image, image_tokens = [], [], [], [], [], [], []
    rows = zip(conversations, refs, texts, enc["input_ids"], enc.encodings, strict=True)
    for messages, paths, text, row_ids, encoding in rows:
        ids = np.fromiter(row_ids, dtype=np.int32, count=len(row_ids))
        if settings.train_on == "all":
            labels = ids.copy()
        else:
            spans = _part_spans(messages, text, eot)
            if spans is None:
                spans = _assistant_spans_by_prefix(messages, text, tokenizer, settings.template)
            labels = _mask(ids, encoding, spans, text)
        places = np.flatnonzero(ids == images.id)
        labels[places] = IGNORE_INDEX  # a placeholder is an image's, never text to learn
        turns.append(_turns(ids, labels, stop, lambda i, e=encoding, t=text: _blank(e, t, i)))
        mismatch.append(len(places) != len(paths))
        spans_of_images: list[Span] = []
        if not mismatch[-1] and len(places):
            ids, labels, spans_of_images = _expanded(ids, labels, places, [images.of(path) for path in paths])
        cut = len(ids) > settings.max_length and settings.truncation == "truncate"
        cut_image.append(cut and any(a < settings.max_length < b for a, b in spans_of_images))
        kept.append([path for path, (_, end) in zip(paths, spans_of_images, strict=False)
                     if not cut or end <= settings.max_length] if spans_of_images else list(paths))
        image_tokens.append(sum(end - start for start, end in spans_of_images if not cut or end <= settings.max_length))
        all_ids.append(ids)
        all_labels.append(labels)
    out = _limit(all_ids, all_labels, turns, settings)
    out.update(images=kept, ft_image_mismatch=mismatch, ft_cut_image=cut_image, ft_image_tokens=image_tokens)
    return out


def _expanded(ids: np.ndarray, labels: np.ndarray, places: np.ndarray, expansions: list[np.ndarray]):
    """(ids, labels, the [start, end) of each image's tokens) with the placeholder at each of ``places`` replaced by
    its image's expansion; the expansions' labels are -100."""
    id_pieces, label_pieces, spans, start, at = [], [], [], 0, 0
    for place, expansion in zip(places.tolist(), expansions, strict=True):
        id_pieces += [ids[start:place], expansion]
        label_pieces += [labels[start:place], np.full(len(expansion), IGNORE_INDEX, dtype=np.int32)]
        at += place - start
        spans.append((at, at + len(expansion)))
        at += len(expansion)
        start = place + 1
    id_pieces.append(ids[start:])
    label_pieces.append(labels[start:])
    return np.concatenate(id_pieces), np.concatenate(label_pieces), spans


def _part_spans(messages: list[dict], text: str, eot: str) -> list[Span] | None:
    """``_assistant_spans`` for contents given as lists of parts: each message's text parts are located in order
    (image parts have no text to find); an assistant turn's span runs from its first text part (leading whitespace
    the template kept included) to the end-of-turn text after its last. None when a text cannot be located (the
    template rewrites it): the caller then falls back to prefix rendering."""
    return _spans_of([(message.get("role"), [part["text"] for part in message["content"]
                                             if part.get("type") == "text" and part.get("text")])
                      for message in messages], text, eot)


def _spans_of(turns: list[tuple[str | None, list[str]]], text: str, eot: str) -> list[Span] | None:
    """The search behind ``_assistant_spans`` and ``_part_spans``: ``turns`` are (role, the texts of its content in
    order; a string content is one text)."""
    cursor, spans = 0, []
    for role, texts in turns:
        needles = [t.strip() for t in texts if t.strip()]
        if role != "assistant":
            for needle in needles:
                at = text.find(needle, cursor)
                if at < 0:
                    return None
                cursor = at + len(needle)
            continue
        if not needles:
            return None  # nothing to search for; the prefix renders know where the turn is
        at = text.find(needles[0], cursor)
        while at >= 0:
            end = at + len(needles[0])
            for needle in needles[1:]:
                found = text.find(needle, end)
                if found < 0:
                    return None
                end = found + len(needle)
            after = _SPACE.match(text, end).end()
            if not eot or text.startswith(eot, after):
                break
            at = text.find(needles[0], at + 1)
        if at < 0:
            return None
        first = next(t for t in texts if t.strip())
        lead = first[: len(first) - len(first.lstrip())]  # leading whitespace the template kept
        if lead and at - len(lead) >= cursor and text.startswith(lead, at - len(lead)):
            at -= len(lead)
        end = after + len(eot) if eot else end
        spans.append((at, end))
        cursor = end
    return spans


def _text_rows(prompts: list[str], completions: list[str], tokenizer, settings: TokenizeSettings):
    masked = settings.train_on == "assistant" and any(prompts)  # plain text trains on every token
    texts = completions
    if any(prompts):
        texts = [prompt + completion for prompt, completion in zip(prompts, completions, strict=True)]
    enc = tokenizer(texts)
    eos = tokenizer.eos_token_id
    all_ids, all_labels, turns = [], [], []
    for prompt, text, row_ids, encoding in zip(prompts, texts, enc["input_ids"], enc.encodings, strict=True):
        if eos is not None and not (row_ids and row_ids[-1] == eos):
            row_ids.append(eos)  # added while the row is still a list: one array per row, not a copy with it
        ids = np.fromiter(row_ids, dtype=np.int32, count=len(row_ids))
        labels = ids
        if masked and prompt:
            labels = _mask(ids, encoding, [(len(prompt), len(text))], text)
            if eos is not None:
                labels[-1] = eos  # the EOS, ft's or the tokenizer's own (whose offsets are often empty), is trained
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
        kept = len(ids) if labels is ids else int(np.count_nonzero(labels != IGNORE_INDEX))
        out["ft_trained"].append(kept)
        out["ft_no_loss"].append(not kept)
    return out
