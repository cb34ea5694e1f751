"""An Ollama Modelfile for an exported GGUF file: its ``TEMPLATE`` (a Go template) and ``stop`` tokens, taken from
the tokenizer's chat template (Jinja).

A Jinja template cannot be translated in general, so ft does not parse it: it renders conversations whose messages
are marker words, reads off the text around each role's content (what comes before the first user turn, around a
leading system message, around user and assistant turns, and the generation prompt), and builds one fixed Go
template from those pieces. Before anything is written, the pieces are checked: conversations with other contents
(with and without a system message, one and several turns) must render exactly as the Jinja template renders them.
A template that does something the fixed shape cannot (Mistral's, which moves the system message into the last user
turn, or one that changes message text) is refused with the reason, and the GGUF file can be exported without
``--modelfile``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ExportError

MARKERS = ("ftmarkersystem", "ftmarkeruserone", "ftmarkerassistantone", "ftmarkerusertwo")


@dataclass(frozen=True)
class Pieces:
    """The literal text around each role's content. ``first_system``: everything before a leading system message's
    content; ``head``: everything before the first user turn when there is no system message (a template's default
    system prompt lives here)."""

    first_system: str
    system_end: str
    head: str
    user_start: str
    user_end: str
    assistant_start: str
    assistant_end: str
    generation: str

    def render(self, messages: list[dict]) -> str:
        """What the Go template below renders for ``messages`` (the check compares it with the Jinja template)."""
        system = bool(messages) and messages[0]["role"] == "system"
        text = self.first_system + messages[0]["content"] + self.system_end if system else self.head
        for index, message in enumerate(messages):
            last = index == len(messages) - 1
            if message["role"] == "user":
                text += self.user_start + message["content"] + self.user_end + (self.generation if last else "")
            elif message["role"] == "assistant":
                text += self.assistant_start + message["content"] + ("" if last else self.assistant_end)
        return text

    def go_template(self) -> str:
        """The same, as Ollama's Go template (one line: no whitespace between actions to trim)."""
        head = (f'{{{{ if .Messages }}}}{{{{ if eq (index .Messages 0).Role "system" }}}}{self.first_system}'
                f'{{{{ (index .Messages 0).Content }}}}{self.system_end}{{{{ else }}}}{self.head}{{{{ end }}}}'
                f'{{{{ else }}}}{self.head}{{{{ end }}}}')
        turns = ('{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}'
                 f'{{{{ if eq .Role "user" }}}}{self.user_start}{{{{ .Content }}}}{self.user_end}'
                 f'{{{{ if $last }}}}{self.generation}{{{{ end }}}}'
                 f'{{{{ else if eq .Role "assistant" }}}}{self.assistant_start}{{{{ .Content }}}}'
                 f'{{{{ if not $last }}}}{self.assistant_end}{{{{ end }}}}{{{{ end }}}}{{{{ end }}}}')
        return head + turns


def modelfile_text(tokenizer, gguf_name: str, where: str) -> str:
    """The Modelfile for ``gguf_name`` (a file beside it), or ExportError saying why the template cannot be one."""
    if not getattr(tokenizer, "chat_template", None):
        raise ExportError(f"--modelfile: the tokenizer of {where} has no chat template, so there is no TEMPLATE to "
                          "write; export without --modelfile (Ollama then needs a TEMPLATE written by hand).")
    pieces = pieces_of(tokenizer)
    _check(tokenizer, pieces)
    template = pieces.go_template()
    stops = stop_tokens(tokenizer, pieces)
    if '"""' in template or "{{" in "".join(vars(pieces).values()) or any('"' in stop for stop in stops):
        raise ExportError("--modelfile: the chat template's text holds quotes or braces a Modelfile cannot carry "
                          "verbatim; export without --modelfile and write the TEMPLATE by hand.")
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{template}"""', *(f'PARAMETER stop "{stop}"' for stop in stops)]
    return "\n".join(lines) + "\n"


def _render(tokenizer, messages: list[dict], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def _between(text: str, start: str | None, end: str | None) -> str:
    begin = 0 if start is None else text.index(start) + len(start)
    return text[begin:] if end is None else text[begin:text.index(end, begin)]


def pieces_of(tokenizer) -> Pieces:
    """Read the pieces off renders of marker conversations; a template whose renders do not decompose this way is
    refused."""
    system, user, assistant, user2 = ({"role": role, "content": text} for role, text in
                                      zip(("system", "user", "assistant", "user"), MARKERS, strict=True))
    try:
        turns = _render(tokenizer, [user, assistant, user2], True)
        one_user = _render(tokenizer, [user], False)
        answered = _render(tokenizer, [user, assistant], False)
        with_system = _render(tokenizer, [system, user, assistant, user2], True)
        before_user = _between(turns, None, user["content"])
        user_end = _between(one_user, user["content"], None)
        user_to_assistant = _between(turns, user["content"], assistant["content"])
        assistant_end = _between(answered, assistant["content"], None)
        assistant_to_user = _between(turns, assistant["content"], user2["content"])
        after_last_user = _between(turns, user2["content"], None)
        system_to_user = _between(with_system, system["content"], user["content"])
        first_system = _between(with_system, None, system["content"])
    except ValueError as exc:  # a marker is missing: the template drops or rewrites a message
        raise _refused(f"a message's text does not appear in the rendered conversation ({exc})") from None
    parts = (user_to_assistant.startswith(user_end) and assistant_to_user.startswith(assistant_end)
             and after_last_user.startswith(user_end))
    user_start = assistant_to_user[len(assistant_end):] if parts else ""
    if not (parts and before_user.endswith(user_start) and system_to_user.endswith(user_start)):
        raise _refused("its turns are not a fixed text around each message")
    return Pieces(first_system=first_system, system_end=system_to_user[:len(system_to_user) - len(user_start)],
                  head=before_user[:len(before_user) - len(user_start)], user_start=user_start, user_end=user_end,
                  assistant_start=user_to_assistant[len(user_end):], assistant_end=assistant_end,
                  generation=after_last_user[len(user_end):])


SAMPLES = (
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 3 + 5?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Add 7 and 9."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One?"},
     {"role": "assistant", "content": "1"}, {"role": "user", "content": "Two?"},
     {"role": "assistant", "content": "2"}, {"role": "user", "content": "Three?"}],
)


def _check(tokenizer, pieces: Pieces) -> None:
    for messages in SAMPLES:
        expected = _render(tokenizer, messages, True)
        if pieces.render(messages) != expected:
            raise _refused(f"with {len(messages)} messages it renders {expected!r}, which a fixed text around each "
                           f"message does not give ({pieces.render(messages)!r})")


def stop_tokens(tokenizer, pieces: Pieces) -> list[str]:
    """The special tokens that end an assistant turn in the template, and the end-of-sequence token."""
    specials = [token for token in tokenizer.all_special_tokens if token and token in pieces.assistant_end]
    return list(dict.fromkeys([*specials, *([tokenizer.eos_token] if tokenizer.eos_token else [])]))


def _refused(why: str) -> ExportError:
    return ExportError(f"--modelfile: the chat template cannot be written as an Ollama TEMPLATE: {why}. Export "
                       "without --modelfile (the GGUF file carries the chat template itself, which llama.cpp and "
                       "LM Studio use) and write the Modelfile's TEMPLATE by hand.")
