"""Tokenization and loss masks for SFT rows, in ft's canonical row layout.

Chat rows have ``messages`` (a list of ``{"role", "content"}``); text rows have ``prompt`` ("" for plain text)
and ``completion``. ``tokenize_batch`` is written for ``datasets.Dataset.map(batched=True)``.

Chat masks are found in character space: each conversation is rendered once with its chat template and
tokenized once; the assistant contents (plus the template's end-of-turn text, so the model learns to stop) are
located in the rendered text, and a token carries loss iff its characters lie inside such a span (the run of such
tokens found from the span's two ends through the tokenizer's character index).

A chat with tool calls or reasoning (``ft.data.formats``: ``tool_calls``, ``reasoning_content``) is rendered with its
tools (its own ``tools``, else ``data.tools``) and masked by what the model writes: an assistant turn trains from where
the generation prompt ends (the turns before it rendered with ``add_generation_prompt``: the ``<think>``,
``<tool_call>`` or ``[TOOL_CALLS]`` the template opens the turn with are the model's to write) through its end-of-turn
text; inside it the reasoning, the text and each call (its name, then its arguments as the template's ``tojson`` writes
them) are located in order, like any text. ``data.train_on_reasoning: false`` masks from the turn's start through the
reasoning and the text the template closes it with (``</think>``); ``data.train_on_tool_calls: false`` masks the turn
from the end of its text on (its calls and, when the turn is only calls, the turn). A template that does not write a
call, a tool's definition, the reasoning of a turn after the last user message (Qwen3's drops it before), or the text
of an assistant turn beside its calls, or that refuses the row, makes the row bad: it carries no loss and is flagged
(``BAD``: the reason and its detail), for ``ft.data.rows.refused_rendered`` to refuse or skip it by name.

A vision-language model's chat rows (contents as lists of text and image parts, and ``images``: their paths) are
masked the same way, from the same rendered text, with no per-family boundaries: the text parts are located in order,
an assistant turn's span runs from its first text to the end-of-turn after its last. Then each image's placeholder
token (which the template writes once per image part) becomes the tokens the model's processor writes for that image
(``ft.data.images.ImageTokens``), none of them trained, whatever ``train_on`` says. Such a row is flagged when its
placeholders and images differ in number (``ft_image_mismatch``), or when ``max_length`` would cut inside an image's
tokens (``ft_cut_image``): ``ft.data.build`` refuses or drops those rows, by name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from ..recipe.data_section import DataSection
from .labels import IGNORE_INDEX
from .rows import BAD, RowError
from .templates import end_of_turn, reasoning_closing, render, template_tools

_SPACE = re.compile(r"\s*")

Span = tuple[int, int]  # [start, end) character positions in the rendered text


@dataclass(frozen=True)
class TokenizeSettings:
    template: str | None  # resolved Jinja chat template (None for text data)
    max_length: int
    truncation: str  # "truncate" (keep the first max_length tokens) | "drop" (flag the row as ft_too_long)
    train_on: str  # "assistant" (loss on assistant spans / completions only) | "all"
    parts: bool = False  # chat contents are lists of parts (a vision-language model's rows, rendered by its template)
    tools: str | None = None  # data.tools as JSON text: the tool definitions of chat rows without their own
    train_on_reasoning: bool = True  # loss on the assistant's reasoning (data.train_on_reasoning)
    train_on_tool_calls: bool = True  # loss on the assistant's tool calls (data.train_on_tool_calls)

    @classmethod
    def of(cls, data: DataSection, template: str | None, parts: bool = False) -> TokenizeSettings:
        """The settings ``data`` (the recipe's ``data:`` section) gives rows rendered with ``template``."""
        tools = data.tool_list
        return cls(template=template, max_length=data.max_length, truncation=data.truncation, train_on=data.train_on,
                   parts=parts, tools=json.dumps(tools) if tools else None,
                   train_on_reasoning=data.train_on_reasoning, train_on_tool_calls=data.train_on_tool_calls)


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

    Chat rows are rendered by ``settings.template`` (which writes its own BOS, if any), with their ``tools`` (a
    column of the batch) or ``settings.tools``; a row the template cannot render whole carries no loss (its reason:
    ``tokenize_arrays``' ``BAD`` columns). Text rows are tokenized with the tokenizer's special tokens (e.g. its BOS)
    and end with ``eos_token_id`` (trained on).
    """
    out = tokenize_arrays(batch, tokenizer, settings)
    for column in BAD:  # a bad row is untrained (ft_no_loss); only ``tokenize_arrays``' callers name it
        out.pop(column, None)
    ids = [row.tolist() for row in out["input_ids"]]
    out["labels"] = [ids[i] if labels is row else labels.tolist()
                     for i, (row, labels) in enumerate(zip(out["input_ids"], out["labels"], strict=True))]
    out["input_ids"] = ids
    return out


def tokenize_arrays(batch: dict[str, list], tokenizer, settings: TokenizeSettings, images=None) -> dict[str, list]:
    """``tokenize_batch`` with each row's input_ids and labels as an int32 numpy array (labels that are every token
    IS the input_ids array), for callers that hand the rows to Arrow whole: masks are computed on arrays, since a
    Python loop per token cost more than the tokenizer itself.

    Chat rows also return ``BAD``: each row's reason (``""`` when good) and its detail, for a row the template cannot
    render whole (the module's docstring).

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
        ids, labels, turns, bad = _chat_rows(batch["messages"], tokenizer, settings, batch.get("tools"))
        out = _limit(ids, labels, turns, settings)
        out[BAD[0]], out[BAD[1]] = ([error.reason if error else "" for error in bad],
                                    [error.render() if error else "" for error in bad])
        return out
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


def _turns(ids: np.ndarray, labels: np.ndarray, stop: int | None, blank=None,
           open_ends: frozenset = frozenset()) -> tuple[int, int, int]:
    """(trained tokens, trained turns, turns ending with ``stop``) of one row; ``blank(i)`` says token i is only
    whitespace (skipped back over at a turn's end, as a template's newline after its end-of-turn token). A run of
    trained tokens whose last token is in ``open_ends`` is no turn: the turn goes on untrained (its tool calls, under
    ``train_on_tool_calls: false``), and the model is not meant to stop there."""
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
        if end in open_ends:
            continue
        count += 1
        while blank is not None and end > start and blank(end):
            end -= 1
        stopped += stop is not None and int(ids[end]) == stop
    return trained, count, stopped


def _chat_rows(conversations: list, tokenizer, settings: TokenizeSettings,
               row_tools: list | None = None) -> tuple[list, list, list, list]:
    """(ids, labels, turns, the RowError of each row the template cannot render whole, or None)."""
    default = template_tools(settings.tools)
    tools = [(row_tools[k] if row_tools is not None else None) or default for k in range(len(conversations))]
    texts, bad = [], []
    for messages, listed in zip(conversations, tools, strict=True):
        try:
            texts.append(render(tokenizer, settings.template, messages, listed))
            bad.append(None)
        except Exception as exc:  # the template's own refusal (raise_exception) or failure on this row
            texts.append("")
            bad.append(RowError("template_error", f"the chat template fails on this row: {_first_line(exc)}",
                                "messages"))
    enc = tokenizer(texts, add_special_tokens=False)
    eot = end_of_turn(settings.template, tokenizer).strip()
    stop = _stop_id(eot, tokenizer)
    turn_of = _Turns(tokenizer, settings, eot)
    all_ids, labels, turns = [], [], []
    rows = zip(conversations, tools, texts, enc["input_ids"], enc.encodings, strict=True)
    for k, (messages, listed, text, row_ids, encoding) in enumerate(rows):
        ids = np.fromiter(row_ids, dtype=np.int32, count=len(row_ids))
        open_ends: frozenset = frozenset()
        if bad[k] is None and listed:
            bad[k] = _tools_unwritten(listed, text, row_tools is not None and bool(row_tools[k]))
        if bad[k] is not None:
            row_labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)  # never trained: refused or skipped by name
        elif _carries_tools(messages) or turn_of.reasons:
            planned = turn_of.plan(messages, listed, text)
            if isinstance(planned, RowError):
                bad[k], row_labels = planned, np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
            else:
                spans, ends = planned
                row_labels = ids if spans is None else _mask(ids, encoding, spans, text)
                open_ends = frozenset(t for a, b in ends if (t := _last_inside(encoding, a, b)) is not None)
        elif settings.train_on == "all":
            row_labels = ids
        else:
            spans = _assistant_spans(messages, text, eot)
            if spans is None:
                spans = _assistant_spans_by_prefix(messages, text, tokenizer, settings.template, listed)
            row_labels = _mask(ids, encoding, spans, text)
        all_ids.append(ids)
        labels.append(row_labels)
        turns.append(_turns(ids, row_labels, stop, lambda i, e=encoding, t=text: _blank(e, t, i), open_ends))
    return all_ids, labels, turns, bad


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _carries_tools(messages: list[dict]) -> bool:
    """A chat with tool calls or reasoning: masked by ``_Turns`` (what the model writes), not by its contents alone
    (as every chat is whose template writes reasoning: ``_Turns.reasons``)."""
    return any(m.get("tool_calls") or m.get("reasoning_content") for m in messages)


def _tools_unwritten(tools: list | None, text: str, own: bool) -> RowError | None:
    """A row whose template does not write the name of each of its tools (a template without tool support ignores
    ``tools``) would train a model to call tools it was never shown: bad (``template_drops``). ``own``: the tools are
    the row's (else ``data.tools``)."""
    for j, tool in enumerate(tools or ()):
        if tool["function"]["name"] not in text:
            where = f"tools[{j}]" if own else f"data.tools[{j}]"
            return RowError("template_drops", f"the chat template does not write the tool definition "
                            f"{tool['function']['name']!r} (it renders no `tools`): a model trained on the row would "
                            "call tools it was never shown; use a template that renders tools (the model family's "
                            "own, e.g. Qwen2.5's, Llama 3.1's, Mistral's)", where)
    return None


@dataclass
class _Turns:
    """Where the assistant turns of a chat with tool calls or reasoning are in its rendered text (the module's
    docstring): ``plan`` gives the spans to train and the span ends where a turn goes on untrained, or the RowError
    of a row whose template drops a call, a reasoning or a text."""

    tokenizer: object
    settings: TokenizeSettings
    eot: str
    _closing: str | None = None

    @property
    def closing(self) -> str:
        """The text the template closes a reasoning with (``reasoning_closing``), read once."""
        if self._closing is None:
            self._closing = reasoning_closing(self.settings.template, self.tokenizer)
        return self._closing

    @property
    def reasons(self) -> bool:
        """The template writes reasoning (Qwen3's): every row is masked by what the model writes, so that a turn
        without reasoning trains the empty ``<think></think>`` the template opens it with, as one with reasoning
        trains its own (a model asked for a turn writes either)."""
        return bool(self.closing.strip())

    def plan(self, messages: list[dict], tools: list | None, text: str):
        """(the spans to train, or None: every token, under ``train_on: all`` with nothing masked; the trained spans
        after which a turn goes on untrained), or the RowError of what the template does not write."""
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        spans: list[Span] = []
        ends: list[Span] = []
        masked: list[Span] = []
        cursor = 0
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                found = _find_text(text, message.get("content") or "", cursor)
                cursor = found[1] if found else cursor
                continue
            start = self._start(messages, i, tools, text, cursor)
            turn = _Turn.located(message, text, start if start is not None else cursor, f"messages[{i}]",
                                 drops_reasoning=i < last_user)
            if isinstance(turn, RowError):
                return turn
            begin = start if start is not None else turn.first
            end = self._end(messages, i, tools, text, turn.last)
            hidden = []
            reasoned = begin  # where the reasoning, and the text the template closes it with, end
            if turn.reasoning is not None:
                reasoned = turn.reasoning[1]
                if self.closing.strip() and text.startswith(self.closing, reasoned):
                    reasoned += len(self.closing)
                if not self.settings.train_on_reasoning:
                    hidden.append((begin, reasoned))
            if turn.calls and not self.settings.train_on_tool_calls:
                hidden.append((turn.text[1] if turn.text is not None else reasoned, end))
            kept = _without(begin, end, hidden)
            if turn.calls and not self.settings.train_on_tool_calls and kept and kept[-1][1] < end:
                ends.append(kept[-1])  # the turn's text, after which its calls go on untrained
            spans += kept
            masked += hidden
            cursor = end
        if self.settings.train_on == "all":
            return (_without(0, len(text), masked) if masked else None), ends
        return spans, ends

    def _end(self, messages: list[dict], i: int, tools: list | None, text: str, last: int) -> int:
        """Where assistant turn ``i`` ends: after the end-of-turn text that follows its last located piece (``last``),
        within the turn: when ``messages[:i + 1]`` rendered alone is where the row's text starts, the turn ends where
        that rendering does (a call turn a template closes with another token, Llama 3.1's ``<|eom_id|>``, does not
        run on into the next message)."""
        try:
            through = render(self.tokenizer, self.settings.template, messages[:i + 1], tools).rstrip()
        except Exception:  # a template may refuse a prefix
            through = None
        limit = len(through) if through is not None and text.startswith(through) and len(through) >= last else None
        found = text.find(self.eot, last) if self.eot else -1
        if found >= 0 and (limit is None or found + len(self.eot) <= limit):
            return found + len(self.eot)
        return limit if limit is not None else last

    def _start(self, messages: list[dict], i: int, tools: list | None, text: str, cursor: int) -> int | None:
        """Where assistant turn ``i``'s own text starts: the end of the turns before it rendered with the generation
        prompt, when that rendering is where the row's text starts; else the same read from the previous message's
        end (what the template writes after that message's text, in that rendering), when that is what follows it
        here (a template that renders earlier turns otherwise once later ones exist: Mistral's tools, before the last
        user message); else None (the turn then trains from its first located text)."""
        if i == 0:
            return None
        try:
            before = render(self.tokenizer, self.settings.template, messages[:i], tools, generation=True)
        except Exception:  # a template may refuse a prefix (e.g. one not ending on a user turn)
            return None
        if text.startswith(before):
            return len(before)
        found = _find_text(before, messages[i - 1].get("content") or "", 0, last=True)
        if found is not None and messages[i - 1].get("role") != "assistant":
            tail = before[found[1]:]
            if tail and text.startswith(tail, cursor):
                return cursor + len(tail)
        return None


@dataclass(frozen=True)
class _Turn:
    """The located pieces of one assistant turn: its reasoning, its text and its calls (each a span), in the order
    templates write them."""

    first: int  # where the first of them starts
    last: int  # where the last of them ends
    reasoning: Span | None
    text: Span | None
    calls: tuple[Span, ...]

    @classmethod
    def located(cls, message: dict, text: str, at: int, where: str, drops_reasoning: bool) -> _Turn | RowError:
        """The pieces of ``message`` found in ``text`` from ``at`` on; a RowError naming what the template does not
        write. ``drops_reasoning``: the turn comes before the row's last user message, whose reasoning a template may
        leave out (Qwen3's: the model never sees it once the next question is asked)."""
        pos, first = at, None
        reasoning = None
        thought = (message.get("reasoning_content") or "").strip()
        if thought:
            found = text.find(thought, pos)
            if found >= 0:
                reasoning, pos, first = (found, found + len(thought)), found + len(thought), found
            elif not drops_reasoning:
                return RowError("template_drops", "the chat template does not write this reasoning (it renders no "
                                "`reasoning_content`): trained, the turn would teach the answer without it; use a "
                                "template that writes it (the model family's own, e.g. Qwen3's), or leave it out of "
                                "the data", f"{where}.reasoning_content")
        said = None
        content = (message.get("content") or "").strip()
        if content:
            found = text.find(content, pos)
            if found < 0:
                beside = " beside its tool calls (Llama 3.1's and Mistral's templates write a call alone)" \
                    if message.get("tool_calls") else ""
                return RowError("template_drops", f"the chat template does not write this assistant text{beside}: "
                                "trained, the row would teach a turn without it; put the text in a turn of its own, "
                                "or use a template that writes both", f"{where}.content")
            said, pos = (found, found + len(content)), found + len(content)
            first = found if first is None else first
        calls = []
        for j, call in enumerate(message.get("tool_calls") or ()):
            function = call["function"]
            name = text.find(function["name"], pos)
            arguments = _find_arguments(text, function.get("arguments") or {}, name + len(function["name"])) \
                if name >= 0 else None
            if arguments is None:
                return RowError("template_drops", f"the chat template does not write this tool call "
                                f"({function['name']!r} and its arguments; it renders no `tool_calls`): trained, "
                                "the row would teach a turn without it; use a template that writes tool calls (the "
                                "model family's own)", f"{where}.tool_calls[{j}]")
            calls.append((name, arguments[1]))
            pos, first = arguments[1], name if first is None else first
        return cls(at if first is None else first, pos, reasoning, said, tuple(calls))


def _find_text(text: str, content: str, cursor: int, last: bool = False) -> Span | None:
    """Where a message's text is in ``text`` from ``cursor`` on (the last place when ``last``): stripped, as templates
    trim, or as a JSON string (Llama 3.1 writes a tool result with ``tojson``); None when neither is there."""
    if not content.strip():
        return None
    for needle in (content.strip(), json.dumps(content, ensure_ascii=False)):
        at = text.rfind(needle, cursor) if last else text.find(needle, cursor)
        if at >= 0:
            return at, at + len(needle)
    return None


def _find_arguments(text: str, arguments: dict, at: int) -> Span | None:
    """The first place from ``at`` where a call's arguments are written as templates write them: ``tojson``
    (transformers' is ``json.dumps`` with non-ASCII kept), ASCII-escaped, compact, or as a JSON string inside the call's
    JSON (a template that writes the arguments with ``tojson`` after turning them into text)."""
    dumped = json.dumps(arguments, ensure_ascii=False)
    forms = (dumped, json.dumps(arguments), json.dumps(arguments, ensure_ascii=False, separators=(",", ":")),
             json.dumps(dumped, ensure_ascii=False))
    found = [(place, place + len(form)) for form in forms if (place := text.find(form, at)) >= 0]
    return min(found) if found else None


def _without(start: int, end: int, masked: list[Span]) -> list[Span]:
    """[start, end) less the ``masked`` spans (each inside it), as sorted disjoint spans."""
    kept, at = [], start
    for a, b in sorted(masked):
        if a > at:
            kept.append((at, a))
        at = max(at, b)
    if at < end:
        kept.append((at, end))
    return kept


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


def _assistant_spans_by_prefix(messages: list[dict], text: str, tokenizer, template: str,
                               tools: list | None = None) -> list[Span]:
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
            before = render(tokenizer, template, messages[:i], tools, generation=True)
            through = render(tokenizer, template, messages[: i + 1], tools)
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
