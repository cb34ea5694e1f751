"""Generate ``src/ft/recipe/train_fields.json``: the fields ``train:`` accepts, per method.

``ft validate`` must type-check every ``TrainingArguments`` / TRL config field without importing torch,
transformers or trl (that import alone takes seconds). So the field names, a small type vocabulary,
defaults and help texts are read from the *installed* classes here, once, and committed.
``tests/test_train_fields.py`` regenerates the table in memory and fails when it drifts from the
installed versions; rerun this script after upgrading transformers or TRL.

The methods and their TRL config classes come from ``ft.recipe.methods.METHODS``. A new method whose section takes
its defaults from the table (``trl_default``) needs its entry here first: add it to ``METHODS`` without a section,
run this script, then add the section.

Type vocabulary (see ``ft.recipe.train_section``): bool, int, float, str, dict, list[str], list[float],
str|list[str], str|bool, int|str, choice (with "choices"), unsupported (settable only from Python).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
import types
import typing
from pathlib import Path

from ft.recipe.methods import METHODS  # each method's TRL config class, as ``module:Class``

OUT = Path(__file__).resolve().parents[1] / "src" / "ft" / "recipe" / "train_fields.json"


def _type_spec(tp) -> dict:
    """Map a dataclass field annotation onto the small vocabulary the schema understands."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    nullable = type(None) in args
    parts = [a for a in args if a is not type(None)]
    enums = [a for a in parts if isinstance(a, type) and issubclass(a, enum.Enum)]
    plain = {a for a in parts if a in (bool, int, float, str, dict)}
    origins = {typing.get_origin(a) for a in parts}
    literal_false = any(typing.get_origin(a) is typing.Literal for a in parts)
    if enums:
        kind = {"kind": "choice", "choices": [m.value for m in enums[0]]}
    elif dict in plain or dict in origins:
        kind = {"kind": "dict"}  # a mapping, or a JSON string as transformers also accepts
    elif list in origins:
        inner = next(typing.get_args(a) for a in parts if typing.get_origin(a) is list)
        item = "float" if inner == (float,) else "str"
        kind = {"kind": "str|list[str]" if str in plain else f"list[{item}]"}
    elif plain == {str, bool} or (plain == {str} and literal_false):
        kind = {"kind": "str|bool"}
    elif plain == {int, str}:
        kind = {"kind": "int|str"}
    elif len(plain) == 1 and len(parts) == 1:
        kind = {"kind": next(iter(plain)).__name__}
    else:
        kind = {"kind": "unsupported", "python_type": str(tp)}
    return {**kind, "nullable": nullable} if nullable else kind


def _default(field: dataclasses.Field):
    value = field.default
    if value is dataclasses.MISSING:
        value = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except TypeError:
        value = repr(value)
    return value


def _help(field: dataclasses.Field) -> str:
    text = " ".join(str(field.metadata.get("help", "")).split())
    return text[:400]


VALUES = re.compile(r"(?:Possible|Supported) values are:?\s*(.*?)\.(?:\s|$)")


def _documented_values(field: dataclasses.Field) -> dict:
    """``{"values": [...]}`` when a string field's help lists the values the trainer accepts ("Possible values are:
    'a', 'b'." in TRL's help texts: DPO's and GRPO's ``loss_type``), else {}. TRL types these as plain strings and
    checks them only when training runs; ft checks them when the recipe is read."""
    found = VALUES.search(" ".join(str(field.metadata.get("help", "")).split()))
    values = re.findall(r"'([A-Za-z0-9_\-]+)'", found.group(1)) if found else []
    return {"values": values} if values else {}


def _fields(cls) -> dict[str, dict]:
    hints = typing.get_type_hints(cls)
    return {
        f.name: {**_type_spec(hints[f.name]), "default": _default(f), "help": _help(f), **_documented_values(f)}
        for f in dataclasses.fields(cls)
        if f.init and not f.name.startswith("_")
    }


def build_table() -> dict:
    import importlib

    import transformers
    import trl

    base = _fields(transformers.TrainingArguments)
    methods = {}
    for method, spec in METHODS.items():
        module, _, name = spec.config.partition(":")
        cls = getattr(importlib.import_module(module), name)
        own = _fields(cls)
        # keep only what the method adds or changes, so the table stays readable in review
        methods[method] = {
            "config": f"{module}:{name}",
            "fields": {k: v for k, v in own.items() if base.get(k) != v},
        }
    return {
        "generated_from": {"transformers": transformers.__version__, "trl": trl.__version__},
        "base": base,
        "methods": methods,
    }


def render(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(build_table()))
    print(f"wrote {OUT}", file=sys.stderr)
