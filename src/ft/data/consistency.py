"""The template consistency check: does the chat template show the model, when it is asked for an assistant turn, the
text it was trained on before that turn?

ft trains a chat row rendered once, whole. At inference the model is given the turns before an answer rendered with
the generation prompt (``apply_chat_template(turns_before, add_generation_prompt=True)``), and writes the answer as
the template renders a conversation's last turn. Some templates render a turn otherwise depending on what follows it:
Qwen3's drops the reasoning of every assistant turn before the last user message (and writes an empty ``<think>``
block in the last), gpt-oss's ends earlier turns with ``<|end|>`` and the last with ``<|return|>``, others inject the
date or differ in whitespace. A model trained on such a row learns text it never sees when asked, and is asked in
text it never saw. For each assistant turn ``k`` of a row, with the row's training text tokenized as ft tokenizes it:

- the prompt: ``messages[:k]`` rendered with the generation prompt must be a token prefix of the training text;
- the turn: ``messages[:k + 1]`` rendered alone (the turn as the model writes it when asked; trailing whitespace
  aside) must be a token prefix of the training text, for each turn that is not the row's last message (the last
  one's rendering is the training text).

Both hold for ChatML and Llama 3, whatever the rows. Only a sample of the training rows is rendered (``sample``: the
first rows and a seeded random share of the rest), before tokenizing, with no model: a few hundred renders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .rows import DataError
from .templates import render

FIRST, RANDOM = 64, 64  # rows checked: the first ones, and a seeded random sample of the rest
SHOWN_TOKENS = 16  # tokens shown on each side of the first difference


@dataclass(frozen=True)
class Mismatch:
    """Where an assistant turn's inference rendering first differs from the training text of its row."""

    turn: int  # the assistant turn's index in the row's messages
    kind: str  # "prompt" (the turns before it, with the generation prompt) or "turn" (the turn rendered as the last)
    at: int  # the first differing token's index
    before: str  # the decoded tokens the two share just before it
    inference: str  # the decoded tokens from there on: at inference, and in the training text
    training: str

    def as_dict(self, row: str) -> dict:
        """summary.json's ``data.template_mismatch.example`` (``row``: where the row is)."""
        return {"row": row, "turn": self.turn, "kind": self.kind, "token": self.at, "before": self.before,
                "inference": self.inference, "training": self.training}

    def describe(self, row: str) -> str:
        """The mismatch in the warning's words: the row, the turn, which rendering differs, and both sides."""
        what = ("the prompt the model is given for it (the turns before it, add_generation_prompt=True)"
                if self.kind == "prompt" else "the turn as the model writes it when asked (rendered as the last turn)")
        return (f"{row}, assistant turn messages[{self.turn}]: {what} differs from the training text at token "
                f"{self.at}, after {self.before!r}: at inference {self.inference!r}, in training {self.training!r}")


def first_mismatch(messages: Sequence[dict], tokenizer, template: str, tools=None) -> Mismatch | None:
    """The first assistant turn of ``messages`` (canonical) whose prompt or own rendering is not a token prefix of the
    row's training text (the module's docstring), or None. Rendered as ft's tokenization renders a row
    (``templates.render``, with ``tools``: a list or JSON text; ``data.chat_template_kwargs`` are in ``template``),
    then tokenized without special tokens. A turn whose prefix the template refuses to render is not checked (a
    template may refuse, e.g., a conversation that does not end on a user turn), nor a row it refuses whole (a bad
    row, named as such when it is tokenized)."""
    messages = list(messages)
    texts: list[tuple[int, str, str]] = []  # (turn, kind, text)
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or k == 0:
            continue
        try:
            texts.append((k, "prompt", render(tokenizer, template, messages[:k], tools, generation=True)))
            if k + 1 < len(messages):
                texts.append((k, "turn", render(tokenizer, template, messages[:k + 1], tools).rstrip()))
        except Exception:  # noqa: BLE001 (a template's own refusal: that prefix cannot be asked for)
            continue
    try:
        trained = render(tokenizer, template, messages, tools)
    except Exception:  # noqa: BLE001 (a row the template refuses is a bad row of its own)
        return None
    if not texts:
        return None
    full, *views = tokenizer([trained, *(text for _, _, text in texts)], add_special_tokens=False)["input_ids"]
    for (turn, kind, _), ids in zip(texts, views, strict=True):
        at = _first_difference(ids, full)
        if at is not None:
            before = _decode(tokenizer, full[max(0, at - SHOWN_TOKENS):at])
            return Mismatch(turn, kind, at, before, _decode(tokenizer, ids[at:at + SHOWN_TOKENS]),
                            _decode(tokenizer, full[at:at + SHOWN_TOKENS]))
    return None


def _first_difference(ids: list[int], full: list[int]) -> int | None:
    """The first index where ``ids`` is not ``full`` (``ids`` longer than ``full`` differs where ``full`` ends)."""
    shared = min(len(ids), len(full))
    differs = np.flatnonzero(np.asarray(ids[:shared]) != np.asarray(full[:shared]))
    if len(differs):
        return int(differs[0])
    return shared if len(ids) > len(full) else None


def _decode(tokenizer, ids: list[int]) -> str:
    """Tokens as text, special tokens written out (they are often where templates differ)."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) if ids else "(end)"


def sample(count: int, seed: int, first: int = FIRST, random: int = RANDOM) -> list[int]:
    """The rows checked of ``count``: the first ``first``, and ``random`` more drawn from the rest with ``seed``
    (sorted)."""
    head = list(range(min(first, count)))
    rest = count - len(head)
    drawn = np.random.default_rng(seed).choice(rest, size=min(random, rest), replace=False) + len(head) if rest else []
    return head + sorted(int(i) for i in drawn)


def check_template(rows: Sequence[dict], place: Callable[[int], str], tokenizer, template: str, *, on_mismatch: str,
                   say: Callable[[str], None], tools=None) -> dict:
    """Check each of ``rows`` (canonical chat rows; ``place(i)`` says where row ``i`` is, e.g. ``file:line``) with
    ``first_mismatch``, passing the template a row's own ``tools`` (when it has them) or ``tools`` (``data.tools``).
    Returns summary.json's ``data.template_mismatch``: the rows checked and mismatched, and the first mismatch. Any
    mismatch is warned (one paragraph, the first one shown) or, with ``on_mismatch == "error"``, refused (DataError
    naming ``data.on_template_mismatch``)."""
    found, example = 0, None
    for i, row in enumerate(rows):
        mismatch = first_mismatch(row["messages"], tokenizer, template, row.get("tools") or tools)
        if mismatch is not None:
            found += 1
            example = example or (place(i), mismatch)
    stats = {"rows_checked": len(rows), "rows_mismatched": found,
             "example": example[1].as_dict(example[0]) if example else None}
    if example is None:
        return stats
    message = (f"data.train: the chat template renders {found} of {len(rows)} sampled rows otherwise when the model "
               "is asked for an assistant turn than in the text it is trained on, so the model learns text it never "
               f"sees when asked; e.g. {example[1].describe(example[0])}. Templates that drop earlier turns' reasoning "
               "(Qwen3), inject a date or differ in whitespace do this: set data.chat_template to a template that "
               "renders each turn the same wherever it stands (for Qwen3, one that keeps every turn's reasoning), or "
               "give the rows one exchange each; "
               f"data.on_template_mismatch: {'warn lets' if on_mismatch == 'error' else 'error refuses'} such data.")
    if on_mismatch == "error":
        raise DataError(message)
    say("data: warning: " + message)
    return stats
