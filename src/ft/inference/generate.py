"""``ft generate``: completions of prompts (or a JSON-lines file of them) from a full model, an adapter run or a
merged model, rendered with the chat template the run trained with."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import FtError
from ..model.locate import load_for_generation
from ..recipe.errors import first_line


class InferenceError(FtError):
    """A prompt file, prompt or output directory that ``ft generate`` / ``ft merge`` cannot use (exit code 2)."""


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    chat_template: bool = True  # apply the tokenizer's template when it has one


def generate(path: Path, items: list[tuple[str, dict]], sampling: Sampling, dtype: str | None = None,
             seed: int | None = None, say: Callable[[str], None] = print) -> Iterator[str]:
    """The completion of each (where, item) in turn. Every prompt is rendered before the first completion, so a
    bad line fails before any output; ``seed`` is set once, so a whole file of samples is reproducible."""
    model, tokenizer = load_for_generation(path, dtype, say)
    texts = [prompt_text(tokenizer, item, sampling, where) for where, item in items]
    if seed is not None:
        from transformers import set_seed

        set_seed(seed)
    for text, templated in texts:
        yield complete(model, tokenizer, text, templated, sampling)


def prompt_text(tokenizer, item: dict, sampling: Sampling, where: str) -> tuple[str, bool]:
    """The text the model continues, and whether it already holds the special tokens (a rendered template). A
    plain prompt becomes the user's message when the tokenizer has a chat template, as in training."""
    templated = sampling.chat_template and bool(getattr(tokenizer, "chat_template", None))
    if not templated and "messages" in item:
        why = "--no-chat-template was given" if not sampling.chat_template else "the tokenizer has no chat template"
        raise InferenceError(f"{where}: `messages` are rendered with the chat template, and {why}; give a `prompt` "
                             "text instead.")
    if not templated:
        return item["prompt"], False
    messages = item["messages"] if "messages" in item else [{"role": "user", "content": item["prompt"]}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), True


def complete(model, tokenizer, text: str, templated: bool, sampling: Sampling) -> str:
    """One completion: the new tokens only, decoded without special tokens. A rendered template already holds
    its special tokens; raw text gets the tokenizer's usual ones (BOS)."""
    import torch

    encoded = tokenizer(text, return_tensors="pt", add_special_tokens=not templated).to(model.device)
    with torch.no_grad():
        output = model.generate(**encoded, generation_config=generation_config(model, tokenizer, sampling))
    return tokenizer.decode(output[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)


def generation_config(model, tokenizer, sampling: Sampling):
    """The model's generation config with ft's sampling settings; stops at the tokenizer's end of turn too (a chat
    template may end turns with a token the base's config does not list)."""
    import copy

    config = copy.deepcopy(model.generation_config)
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    config.eos_token_id = sorted({token for token in (*eos, tokenizer.eos_token_id) if token is not None})
    config.pad_token_id = tokenizer.pad_token_id
    config.max_new_tokens = sampling.max_new_tokens
    config.max_length = None
    greedy = sampling.temperature == 0
    config.do_sample = not greedy
    config.temperature = None if greedy else sampling.temperature
    config.top_p = None if greedy else sampling.top_p
    config.top_k = None
    return config


def read_prompts(path: Path) -> list[tuple[str, dict]]:
    """(file:line, object) for each non-blank line of a JSON-lines prompt file; each object has exactly one of
    ``prompt`` (text) or ``messages`` (a chat: a list of {role, content})."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InferenceError(f"--file: cannot read {path}: {first_line(exc)}.") from None
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--file {path}:{number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise InferenceError(f"{where}: not a JSON object ({first_line(exc)}); write one object per line, "
                                 'e.g. {"prompt": "What is 2+2?"}.') from None
        _check_item(item, where)
        items.append((where, item))
    if not items:
        raise InferenceError(f"--file: {path} holds no prompts; write one JSON object per line.")
    return items


def _check_item(item: object, where: str) -> None:
    if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
        raise InferenceError(f"{where}: each line needs exactly one of `prompt` (text) or `messages` (a list of "
                             '{"role", "content"} objects).')
    if "prompt" in item and not isinstance(item["prompt"], str):
        raise InferenceError(f"{where}: `prompt` must be a string.")
    if "messages" in item and not _is_chat(item["messages"]):
        raise InferenceError(f'{where}: `messages` must be a non-empty list of {{"role", "content"}} objects.')


def _is_chat(messages: object) -> bool:
    return (isinstance(messages, list) and bool(messages)
            and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages))
