"""Chat templates: the built-in ones, resolving ``data.chat_template`` (with ``data.chat_template_kwargs`` written in
as defaults), rendering a canonical chat (its tool calls and tools), and finding a template's end-of-turn text.

The built-ins wrap assistant turns in ``{% generation %}`` markers, so transformers' own assistant mask
(``return_assistant_tokens_mask=True``) works with them too.

Canonical chat rows keep what Arrow cannot type as one struct as JSON text (``ft.data.formats``): an assistant's
``tool_calls`` and a row's ``tools``; a message lacks a key other messages of its source have as a null. ``render``
(and ``template_messages``, ``template_tools``) turn them back into what templates read, here, where a chat is
rendered, and only here: training, exact match and ``ft generate`` render through it.

A built-in is a ``Builtin``: its Jinja and, for ``chatml-tools``, the one that writes tool calls, how to read them back
from what a model writes (transformers' declarative response template, for ``tokenizer.parse_response``): one entry
holds both, so the text a template writes and its parser cannot drift apart. ``ft train`` sets the response template on
the tokenizer with the chat template (``response_template_for``), so final/ ships both.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Llama 3 instruct: like Meta's template, message contents are trimmed.
LLAMA3 = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}"
    "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# ChatML with tools, in the layout of Hermes and Qwen2.5 (a ChatML model with no tool format of its own, SmolLM2, learns
# it), shorter than theirs (every row's prompt holds it: a short instruction, each tool's function as compact JSON):
# the tools as JSON lines inside <tools></tools> in the system prompt (after the row's own system text, if any), each
# call as <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call> in the assistant turn (after its text), the results
# of consecutive tool messages in one user turn, each inside <tool_response>. Without tools it is `chatml`.
CHATML_TOOLS = (
    "{%- if messages and messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- else %}{%- set system = none %}{%- endif %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' + (system + '\\n\\n' if system else '') }}"
    "{{- '# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + ((tool['function'] if tool['function'] is defined else tool) | tojson(separators=(',', ':'))) }}"
    "{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall a function with <tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif system is not none %}{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- content }}"
    "{%- for call in (message['tool_calls'] if message['tool_calls'] is defined and message['tool_calls'] else []) %}"
    "{%- set function = call['function'] if call['function'] is defined else call %}"
    "{%- set arguments = function['arguments'] if function['arguments'] is string else "
    "(function['arguments'] | tojson) %}"
    "{{- ('\\n' if content or not loop.first else '') + '<tool_call>\\n{\"name\": \"' + function['name'] "
    "+ '\", \"arguments\": ' + arguments + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# How to read CHATML_TOOLS' assistant turn back into a message (transformers' response template, version 1; see
# transformers' chat_response_parsing docs): each <tool_call> block is a JSON call, the text outside them the content.
CHATML_TOOLS_RESPONSE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


@dataclass(frozen=True)
class Builtin:
    """A built-in chat template: its Jinja, and how to read what a model writes under it back into a message
    (``response``: a transformers response template, for ``tokenizer.parse_response``; None for a template that
    writes no structure, whose text is the answer)."""

    jinja: str
    response: dict | None = None


BUILTINS: dict[str, Builtin] = {"chatml": Builtin(CHATML), "chatml-tools": Builtin(CHATML_TOOLS, CHATML_TOOLS_RESPONSE),
                                "llama3": Builtin(LLAMA3)}
BUILTIN_TEMPLATES: dict[str, str] = {name: builtin.jinja for name, builtin in BUILTINS.items()}

_FIX = "set data.chat_template: chatml (chatml-tools for tool calls, llama3, or an inline Jinja template)"


class TemplateError(ValueError):
    """``data.chat_template`` cannot be resolved or rendered; the message names the key and the fix."""


def resolve_chat_template(spec: str | None, tokenizer, kwargs: dict | None = None) -> str:
    """The Jinja template for ``data.chat_template``, with ``kwargs`` (``data.chat_template_kwargs``) written in as its
    defaults (``with_defaults``).

    None -> the tokenizer's own template; a built-in name (``BUILTINS``) -> that template; a string
    containing ``{{`` or ``{%`` -> the string itself (inline Jinja). Anything else is a TemplateError.
    """
    return with_defaults(_resolved(spec, tokenizer), kwargs or {})


def response_template_for(spec: str | None, tokenizer) -> dict | None:
    """How to read a model's answer back into a message under ``data.chat_template`` = ``spec`` (a transformers
    response template, which ``tokenizer.parse_response`` reads and final/'s tokenizer_config.json keeps): a built-in's
    own (None for one that writes only text); unset, the tokenizer's own (some models ship one beside their template);
    an inline Jinja template, none (a parser written for another template would misread it)."""
    if spec is None:
        return getattr(tokenizer, "response_template", None)
    builtin = BUILTINS.get(spec)
    return builtin.response if builtin is not None else None


def with_defaults(template: str, kwargs: dict) -> str:
    """``template`` that reads each of ``kwargs`` (e.g. ``enable_thinking: false``) as its value when the caller passes
    none: ``{%- if enable_thinking is not defined %}{%- set enable_thinking = false %}{%- endif %}`` before the
    template's own text, the way Llama 3.1's template defaults its ``date_string``. The template a run trains with is
    the one final/ ships (``ft train`` sets it on the tokenizer), so training, exact match, ``ft generate`` and any
    other reader of final/ render with the same values, with no setting to carry beside the template; a caller's
    own ``enable_thinking=True`` still wins."""
    if not kwargs:
        return template
    head = "".join(f"{{%- if {name} is not defined %}}{{%- set {name} = {_literal(value)} %}}{{%- endif %}}"
                   for name, value in kwargs.items())
    # transformers renders with trim_blocks: the newline right after the last block tag would be dropped
    return head + ("\n" if template.startswith("\n") else "") + template


def _literal(value) -> str:
    """``value`` (a YAML scalar, list or map) as a Jinja literal."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(str(k))}: {_literal(v)}" for k, v in value.items()) + "}"
    raise TemplateError(f"data.chat_template_kwargs: {value!r} cannot be written into a template; use text, numbers, "
                        "true/false, lists and maps.")


def template_messages(messages: list[dict]) -> list[dict]:
    """Canonical messages as chat templates read them: a key whose value is null dropped (a message has only the keys
    it was given: templates test ``'tool_calls' in message``), and ``tool_calls`` decoded from the JSON text the
    canonical rows keep it as (each call ``{"type": "function", "function": {"name", "arguments": {…}}}``, with its
    ``id`` when it has one)."""
    out = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        if isinstance(message.get("tool_calls"), str):
            message["tool_calls"] = json.loads(message["tool_calls"])
        out.append(message)
    return out


def template_tools(tools) -> list[dict] | None:
    """A chat's tool definitions as templates read them: the list, decoded from JSON text when a canonical row keeps
    it so; None when there are none."""
    if isinstance(tools, str):
        tools = json.loads(tools)
    return tools or None


def render(tokenizer, template: str | None, messages: list[dict], tools=None, generation: bool = False) -> str:
    """``messages`` (canonical: ``template_messages``) rendered with ``template`` (None: the tokenizer's own) and
    ``tools`` (a list, or JSON text), with the generation prompt when ``generation``: the one way ft renders a chat."""
    return tokenizer.apply_chat_template(template_messages(messages), tools=template_tools(tools), tokenize=False,
                                         chat_template=template, add_generation_prompt=generation)


def reasoning_closing(template: str, tokenizer) -> str:
    """The text ``template`` writes between an assistant's reasoning and its answer (``"\\n</think>\\n\\n"`` for
    Qwen3), read from a probe turn; ``""`` when it writes none (or no reasoning). The masks count it as the
    reasoning's (``data.train_on_reasoning``)."""
    probe = [{"role": "user", "content": _marker("user")},
             {"role": "assistant", "content": _marker("assistant"), "reasoning_content": _marker("reasoning")}]
    try:
        text = render(tokenizer, template, probe)
    except Exception:  # a template that refuses the probe writes no reasoning ft could mask
        return ""
    start, end = text.find(_marker("reasoning")), text.find(_marker("assistant"))
    if start < 0 or end < start:
        return ""
    return text[start + len(_marker("reasoning")):end]


def _resolved(spec: str | None, tokenizer) -> str:
    if spec is None:
        own = getattr(tokenizer, "chat_template", None)
        if isinstance(own, dict):  # several named templates: the default one is the chat template
            own = own.get("default")
        if not own:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise TemplateError(
                f"data.chat_template is unset and the tokenizer ({name}) has no chat template of its own, "
                f"so chat rows cannot be rendered: {_FIX}."
            )
        return own
    if spec in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[spec]
    if "{{" in spec or "{%" in spec:
        return spec
    close = difflib.get_close_matches(spec.strip().lower(), list(BUILTIN_TEMPLATES), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise TemplateError(
        f"data.chat_template: {spec!r} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}) nor an "
        f"inline Jinja template (one contains '{{{{' or '{{%'); {hint}{_FIX}."
    )


_PROBES = (  # unique markers; the second probe serves templates that refuse a system message
    ("system", "user", "assistant"),
    ("user", "assistant"),
)


def _marker(role: str) -> str:
    return f"ftprobe{role}7q"


def end_of_turn(template: str, tokenizer, parts: bool = False) -> str:
    """The text ``template`` writes right after an assistant message's content: ``<|im_end|>`` for ChatML,
    ``<|eot_id|>`` for Llama 3, ``" </s>"`` for Llama 2, ``""`` when it writes nothing but whitespace.

    It is read from a rendered probe conversation ending with an assistant message: what follows the
    assistant's content, up to the first whitespace after the marker (leading whitespace is kept, trailing
    whitespace dropped). The loss masks count it as part of the assistant turn, so the model learns to stop.
    ``parts``: the probe's contents are lists of parts (``[{"type": "text", "text": …}]``), as a vision-language
    model's rows and templates have them.
    """
    errors = []
    for roles in _PROBES:
        messages = [{"role": role, "content": [{"type": "text", "text": _marker(role)}] if parts else _marker(role)}
                    for role in roles]
        try:
            rendered = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template)
        except Exception as exc:  # any template failure is reported below
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        at = rendered.rfind(_marker("assistant"))
        if at < 0:  # the template rewrites contents: no end-of-turn can be read
            return ""
        suffix = rendered[at + len(_marker("assistant")):]
        return re.match(r"\s*\S*", suffix).group(0).rstrip()
    raise TemplateError(
        f"data.chat_template: the chat template fails to render a plain system/user/assistant conversation "
        f"({errors[-1]}); fix the template or {_FIX}."
    )


def check_image_template(template: str, tokenizer, image_token: str) -> None:
    """A vision-language model's rows hold images as ``{"type": "image"}`` parts: the template must write the
    processor's ``image_token`` once for each (as the families' own templates do), or the images would have no place
    in the text. Checked once, on a probe conversation with one image, before any row is tokenized."""
    probe = [{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": _marker("user")}]},
             {"role": "assistant", "content": [{"type": "text", "text": _marker("assistant")}]}]
    try:
        rendered = tokenizer.apply_chat_template(probe, tokenize=False, chat_template=template)
    except Exception as exc:  # any template failure is reported below
        problem = f"fails on a message whose content is a list of parts ({type(exc).__name__}: {exc})"
    else:
        count = rendered.count(image_token)
        if count == 1:
            return
        problem = f"writes the image token {image_token!r} {count} times for one image part (rendered: {rendered!r})"
    raise TemplateError(
        f"data.chat_template: the chat template {problem}; a vision-language model's template writes {image_token!r} "
        "for each {\"type\": \"image\"} part. Unset data.chat_template to use the model's own template (ft's "
        "built-in templates take text only), or write one that does."
    )
