"""YAML reading that remembers where every key was written, with YAML 1.2 floats and booleans.

PyYAML follows YAML 1.1, where ``2e-4`` (no dot) is a *string* and ``no``/``yes``/``on``/``off`` are
*booleans*. Every ML user writes learning rates as ``2e-4``, and every transformers example writes
``save_strategy="no"``, which people copy unquoted; so recipes are read with YAML 1.2's rules for both
(the rules editors' YAML language servers use too): ``2e-4`` is a float, and only ``true``/``false``
(``True``, ``TRUE``, ``False``, ``FALSE``) are booleans.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import FtError

Locations = dict[tuple, str]  # key path (tuple of str/int) -> "file:line"


class _Loader(yaml.SafeLoader):
    pass


_FLOAT_12 = re.compile(
    r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
)
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
# the int resolver registered first would still win for plain integers, which is what we want;
# keep ints ints by re-registering int ahead of float for the digit-first characters
for ch in "-+0123456789":
    resolvers = _Loader.yaml_implicit_resolvers.setdefault(ch, [])
    resolvers.sort(key=lambda r: r[0] != "tag:yaml.org,2002:int")


def _yaml12_booleans(loader: type[yaml.SafeLoader]) -> None:
    """Replace YAML 1.1's boolean resolver (yes/no/on/off too) with YAML 1.2's core one, so an unquoted
    ``eval_strategy: no`` is the string the field allows, not ``False``."""
    tag = "tag:yaml.org,2002:bool"
    loader.yaml_implicit_resolvers = {  # a new table: SafeLoader's own stays YAML 1.1
        first: [r for r in resolvers if r[0] != tag] for first, resolvers in loader.yaml_implicit_resolvers.items()
    }
    loader.add_implicit_resolver(tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


_yaml12_booleans(_Loader)


class YamlSyntaxError(FtError):
    """A file that is not valid YAML, with file:line:column and the parser's reason."""


def load_yaml(path: Path) -> tuple[object, Locations]:
    text = path.read_text(encoding="utf-8")
    return parse_yaml(text, str(path))


def parse_yaml(text: str, name: str) -> tuple[object, Locations]:
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        reason = getattr(exc, "problem", None) or str(exc)
        raise YamlSyntaxError(f"{where}: not valid YAML: {reason}. Check indentation and quoting there.") from None
    if node is None:
        return {}, {}
    locations: Locations = {}
    _walk(node, (), name, locations)
    return yaml.load(text, Loader=_Loader), locations  # noqa: S506 - _Loader is a SafeLoader


def _walk(node, path: tuple, name: str, out: Locations) -> None:
    out[path] = f"{name}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            _walk(value_node, path + (key,), name, out)
            out[path + (key,)] = f"{name}:{key_node.start_mark.line + 1}"  # the key's line, not the value's
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), name, out)


def parse_scalar(text: str):
    """A ``--set`` value, read like a value in a recipe file (``true``, ``no``, ``1e-4``, ``[a, b]``, ``null``)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506
    except yaml.YAMLError:
        return text


def dump_yaml(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
