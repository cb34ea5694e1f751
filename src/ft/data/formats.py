"""Row formats, as a registry: format name -> a function turning one row into TRL's columns.

TRL's trainers read ``messages`` (conversational SFT), ``text`` (plain SFT), ``prompt``/``chosen``/
``rejected`` (preference methods) and ``prompt`` plus any extra columns (GRPO, whose reward functions
receive the extra columns as keyword arguments).
"""

from __future__ import annotations

from collections.abc import Callable

Row = dict
FORMATS: dict[str, Callable[[Row], Row]] = {}


def register(name: str):
    def add(fn: Callable[[Row], Row]):
        FORMATS[name] = fn
        return fn

    return add


class RowError(ValueError):
    """A row that does not fit its format; the message names the field."""


def _field(row: Row, name: str, kind=str):
    if name not in row or row[name] is None:
        raise RowError(f"missing field {name!r}")
    if not isinstance(row[name], kind):
        raise RowError(f"field {name!r} should be {kind.__name__}, got {type(row[name]).__name__}")
    return row[name]


@register("chat")
def chat(row: Row) -> Row:
    messages = _field(row, "messages", list)
    if not messages:
        raise RowError("field 'messages' is empty")
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages]}


@register("instruction")
def instruction(row: Row) -> Row:
    prompt = _field(row, "instruction")
    extra = row.get("input") or ""
    user = f"{prompt}\n\n{extra}" if extra else prompt
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": _field(row, "output")}]}


@register("text")
def text(row: Row) -> Row:
    return {"text": _field(row, "text")}


@register("preference")
def preference(row: Row) -> Row:
    return {key: row[key] for key in ("prompt", "chosen", "rejected") if _field(row, key, (str, list))}


@register("prompt")
def prompt(row: Row) -> Row:
    _field(row, "prompt", (str, list))
    return dict(row)
