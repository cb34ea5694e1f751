"""``ft generate``: completions of prompts (or a JSON-lines file of them) from a full model, an adapter run or a
merged model, rendered with the chat template the run trained with.

A vision-language run (its processing class a processor: ``ft.model.locate.load_processing_class``) renders each
prompt as a user message of content parts, ``--image`` first when given, and its processor turns the rendered text
and the image into the model's inputs (the image token expanded, ``pixel_values``), as in training.

``--tools FILE`` (a JSON list of tool definitions, as ``data.tools`` takes) is rendered with every chat prompt, as
training renders a row's tools (``ft.data.templates.render``); a ``--file`` line may carry its own ``tools``. The
run's ``data.chat_template_kwargs`` need no flag: they are written into the template final/ ships
(``ft.data.templates.with_defaults``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..data.formats import instruction_text
from ..data.templates import render
from ..errors import FtError
from ..model.loading import text_tokenizer
from ..model.locate import load_for_generation
from ..recipe.data_section import function_schemas, tool_file
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
             seed: int | None = None, say: Callable[[str], None] = print, image: Path | None = None,
             tools: Path | None = None) -> Iterator[str]:
    """The completion of each (where, item) in turn. Every prompt is rendered before the first completion, so a
    bad line fails before any output; ``seed`` is set once, so a whole file of samples is reproducible. ``image``
    (``--image``): a picture every prompt asks about, for a vision-language model; ``tools`` (``--tools``): a JSON file
    of tool definitions the template renders with every prompt that has none of its own; both read before the model
    loads."""
    picture = read_image(image) if image is not None else None
    listed = read_tools(tools) if tools is not None else None
    if listed is not None and not sampling.chat_template:
        raise InferenceError("--tools: the tools are written into the prompt by the chat template, and "
                             "--no-chat-template was given; drop one of the two.")
    model, tokenizer = load_for_generation(path, dtype, say)
    if picture is not None and not sees(tokenizer):
        raise InferenceError(f"--image: {path} is a text model, which reads no images; drop --image, or generate "
                             "with a vision-language run (a model whose folder holds processor_config.json).")
    if picture is not None and not (sampling.chat_template and getattr(tokenizer, "chat_template", None)):
        raise InferenceError("--image: the image is placed in the prompt by the chat template (its image token), and "
                             + ("--no-chat-template was given" if not sampling.chat_template else
                                "the model's processor has no chat template") + "; drop --no-chat-template.")
    texts = [prompt_text(tokenizer, item, sampling, where, picture is not None, listed) for where, item in items]
    if seed is not None:
        from transformers import set_seed

        set_seed(seed)
    for text, templated in texts:
        yield complete(model, tokenizer, text, templated, sampling, picture)


def sees(processing_class) -> bool:
    """Whether the processing class reads images (a processor with an image processor), i.e. the model is a
    vision-language one."""
    return getattr(processing_class, "image_processor", None) is not None


def read_image(path: Path):
    """``--image``: the picture, decoded, upright and RGB as training reads one (``ft.data.images.load_image``); a
    missing or unreadable file is refused naming the flag, before any model loads."""
    from ..data.images import load_image

    if not path.is_file():
        raise InferenceError(f"--image: {path} does not exist or is not a file; give the path of an image file.")
    try:
        return load_image(str(path), None)
    except Exception as exc:  # PIL's errors for a file that is not an image: UnidentifiedImageError, OSError, ...
        raise InferenceError(f"--image: {path} cannot be read as an image ({first_line(exc)}); give a PNG, JPEG or "
                             "another format PIL reads.") from None


def read_tools(path: Path) -> list[dict]:
    """``--tools``: the tool definitions of a JSON file (a list, as ``data.tools`` takes), checked before any model
    loads; refused naming the flag and what is wrong."""
    try:
        return tool_file(path)
    except ValueError as exc:
        raise InferenceError(f"--tools: {exc}; give a JSON file holding a list of tool definitions, e.g. "
                             '[{"type": "function", "function": {"name": "get_weather", "parameters": …}}].') from None


def prompt_text(tokenizer, item: dict, sampling: Sampling, where: str, image: bool = False,
                tools: list | None = None) -> tuple[str, bool]:
    """The text the model continues, and whether it already holds the special tokens (a rendered template). A
    plain prompt becomes the user's message when the tokenizer has a chat template, as in training. A processor's
    template reads content parts (SmolVLM's takes no plain string): each message's text becomes a text part, and
    ``image`` puts an image part first in the last user message. The template renders the item's own ``tools``, else
    ``tools`` (``--tools``)."""
    templated = sampling.chat_template and bool(getattr(tokenizer, "chat_template", None))
    if not templated and (tools or item.get("tools")):
        raise InferenceError(f"{where}: tools are written into the prompt by the chat template, and "
                             + ("--no-chat-template was given" if not sampling.chat_template else
                                "the model has no chat template") + "; drop the tools, or use a chat model.")
    if not templated and "messages" in item:
        why = "--no-chat-template was given" if not sampling.chat_template else "the tokenizer has no chat template"
        raise InferenceError(f"{where}: `messages` are rendered with the chat template, and {why}; give a `prompt` "
                             "text instead.")
    if not templated:
        return asked(item), False
    messages = item["messages"] if "messages" in item else [{"role": "user", "content": asked(item)}]
    if sees(tokenizer):
        messages = [{**m, "content": [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str)
                     else m["content"]} for m in messages]
    if image:
        last = max(i for i, m in enumerate(messages) if m["role"] == "user") if any(
            m["role"] == "user" for m in messages) else len(messages) - 1
        messages[last] = {**messages[last], "content": [{"type": "image"}, *messages[last]["content"]]}
    return render(tokenizer, None, messages, item.get("tools") or tools, generation=True), True


def asked(item: dict) -> str:
    """The text of an item that asks in text: its ``prompt``, or its ``instruction`` and ``input`` joined as an
    instruction row's user turn is in training (``ft.data.formats.instruction_text``)."""
    if "instruction" in item:
        return instruction_text(item["instruction"], item.get("input"))
    return item["prompt"]


def complete(model, tokenizer, text: str, templated: bool, sampling: Sampling, image=None) -> str:
    """One completion: the new tokens only, decoded without special tokens. A rendered template already holds
    its special tokens; raw text gets the tokenizer's usual ones (BOS). ``tokenizer`` may be a processor, which is
    handed ``image`` (a PIL image, or None) with the text."""
    import torch

    pictures = {"images": [[image]]} if image is not None else {}
    encoded = tokenizer(text=[text], return_tensors="pt", add_special_tokens=not templated, **pictures).to(model.device)
    if "pixel_values" in encoded:  # the processor's float32 pixels, in the model's dtype
        encoded["pixel_values"] = encoded["pixel_values"].to(model.dtype)
    text_side = text_tokenizer(tokenizer)
    with torch.no_grad():
        output = model.generate(**encoded, generation_config=generation_config(model, text_side, sampling))
    return text_side.decode(output[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)


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


ASKING = ("prompt", "messages", "instruction")  # what a prompt file's line asks with: exactly one of them


def _check_item(item: object, where: str) -> None:
    if not isinstance(item, dict) or sum(key in item for key in ASKING) != 1:
        raise InferenceError(f"{where}: each line needs exactly one of `prompt` (text), `messages` (a list of "
                             '{"role", "content"} objects) or `instruction` (with an optional `input`, as '
                             "instruction rows are written), and may have `tools`.")
    for key in ("instruction", "input"):
        if key in item and not isinstance(item[key], str):
            raise InferenceError(f"{where}: `{key}` must be a string.")
    if item.get("tools") is not None:
        try:
            item["tools"] = function_schemas(item["tools"])
        except ValueError as exc:
            raise InferenceError(f"{where}: `tools`: {exc}; give a list of tool definitions, as --tools "
                                 "takes.") from None
    if "prompt" in item and not isinstance(item["prompt"], str):
        raise InferenceError(f"{where}: `prompt` must be a string.")
    if "messages" in item and not _is_chat(item["messages"]):
        raise InferenceError(f'{where}: `messages` must be a non-empty list of {{"role", "content"}} objects.')


def _is_chat(messages: object) -> bool:
    return (isinstance(messages, list) and bool(messages)
            and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages))
