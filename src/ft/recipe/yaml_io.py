"""YAML reading that remembers where every key was written, with YAML 1.2 floats and booleans, bounded whatever the
file holds.

PyYAML follows YAML 1.1, where ``2e-4`` (no dot) is a *string* and ``no``/``yes``/``on``/``off`` are
*booleans*. Every ML user writes learning rates as ``2e-4``, and every transformers example writes
``save_strategy="no"``, which people copy unquoted; so recipes are read with YAML 1.2's rules for both
(the rules editors' YAML language servers use too): ``2e-4`` is a float, and only ``true``/``false``
(``True``, ``TRUE``, ``False``, ``FALSE``) are booleans.

A recipe is read by ft's own composer (``_Composer``) over the parser's events (libyaml's when PyYAML has it), in one
pass over the written nodes, never over the values aliases expand to, so reading costs what the file's size costs:

- each written key and item is located (``file:line``) as it is composed; a value reached through an alias keeps the
  alias's line and is not walked again (the old walk followed aliases and recorded every expanded path: a 354-byte
  alias bomb grew to 12 GB);
- an alias of an anchor still being composed (``k: &k {self: *k}``, a value that contains itself) is refused at the
  alias's line;
- each node's expanded size (values, characters) and depth is counted from its children's as it closes, so a value
  that aliases expand beyond ``MAX_VALUES`` values, ``MAX_TEXT`` characters or ``MAX_DEPTH`` levels is refused naming
  the anchor behind it and its line, before anything is built;
- a key written twice in one mapping is refused naming both lines (YAML 1.2: keys are unique; PyYAML keeps the last);
- a tag no safe constructor knows (``!!python/object/apply:os.system``), a file that is not UTF-8 text, a file larger
  than ``MAX_FILE_BYTES``, a directory: each is a ``YamlSyntaxError`` with its ``Problem`` (file:line), no traceback.

Messages never quote the file's text beyond a token (a tag, a character): a file named by mistake (``extends:
/etc/shadow``) is not echoed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import FtError
from .errors import Problem

Locations = dict[tuple, str]  # key path (tuple of str/int) -> "file:line"

MAX_FILE_BYTES = 1 << 20  # a recipe is a few kilobytes; a larger file is the wrong file
MAX_VALUES = 50_000  # values (mappings, lists, scalars) once aliases are expanded
MAX_TEXT = 2_000_000  # characters of scalars once aliases are expanded
MAX_DEPTH = 64  # levels of nesting, written or through aliases (recipes nest about five)
NOT_A_MAPPING = "is not a YAML mapping"  # how a problem with a document that is not a mapping starts

_BASE = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


class _Loader(_BASE):  # type: ignore[valid-type,misc]
    """YAML 1.2's floats and booleans (below); events from libyaml where installed, composed by ``_Composer``."""


class _Loader11(_BASE):  # type: ignore[valid-type,misc]
    """YAML 1.1 as PyYAML's ``safe_load`` reads it: ``ft import axolotl`` reads a config as Axolotl does."""


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
    """A file that cannot be read as YAML, or not within ft's bounds: its ``problems`` (each with file:line, the
    reason and the fix); the message is them, one a line."""

    def __init__(self, *args, problems: list[Problem] | None = None, syntax: bool = False):
        self.problems = list(problems or [])
        self.syntax = syntax  # the text is not YAML at all (as opposed to YAML ft refuses)
        super().__init__(*(args or ["\n".join(p.render() for p in self.problems)]))


def load_yaml(path: Path, yaml11: bool = False, mapping: bool = False) -> tuple[object, Locations]:
    """The YAML data of the file at ``path`` and where each written key is (``parse_yaml``); a file that cannot be
    read as text (missing, a directory, not UTF-8, too large) is a ``YamlSyntaxError`` too."""
    return parse_yaml(read_text(path), str(path), yaml11=yaml11, mapping=mapping)


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path``, or ``YamlSyntaxError`` saying in one line why it is not a YAML file to read (the
    file's own bytes are never quoted)."""
    name = str(path)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise _error(name, "", "does not exist") from None
    except IsADirectoryError:
        raise _error(name, "", "is a directory, not a YAML file") from None
    except OSError as exc:
        raise _error(name, "", f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    except ValueError:  # a NUL character in the name
        raise _error(name, "", "is not a path to a file") from None
    if len(data) > MAX_FILE_BYTES:
        raise _error(name, "", f"is larger than {MAX_FILE_BYTES // 1024} KiB: a recipe is a few kilobytes of YAML; "
                               "is it the right file?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, column = _line_column(data[: exc.start])
        raise _error(name, f"{name}:{line}", f"is not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column "
                                             f"{column}. Save the file as UTF-8 (a YAML file is text).") from None


def parse_yaml(text: str, name: str, yaml11: bool = False, mapping: bool = False) -> tuple[object, Locations]:
    """The data of the YAML ``text`` (read from ``name``; an empty document is ``{}``) and the ``file:line`` of every
    key and item written in it, by key path. ``yaml11``: PyYAML's own YAML 1.1 (as ``yaml.safe_load``) instead of a
    recipe's YAML 1.2 scalars. ``mapping``: a document that is not a mapping (nor empty, nor null) is refused by its
    kind, line and column, without its text (a file named by mistake is not echoed). Raises ``YamlSyntaxError`` for
    text that is not YAML or not within the bounds (module docstring)."""
    data, locations, empty = _parse(text, name, yaml11, mapping)
    return ({} if empty else data), locations


def parse_scalar(text: str, where: str = "--set"):
    """A ``--set`` value, read like a value in a recipe file (``true``, ``no``, ``1e-4``, ``[a, b]``, ``null``); text
    that is not YAML is the text itself. YAML ft refuses (an alias bomb, a key written twice, a ``!!python`` tag) is
    a ``YamlSyntaxError`` located at ``where``."""
    try:
        data, _, _ = _parse(text, where, yaml11=False, mapping=False)
    except YamlSyntaxError as exc:
        if exc.syntax:
            return text
        raise YamlSyntaxError(problems=[Problem(p.path, p.message, where) for p in exc.problems]) from None
    return data


def _parse(text: str, name: str, yaml11: bool, mapping: bool) -> tuple[object, Locations, bool]:
    """(data, locations, whether the document is empty); ``parse_yaml`` without its empty document as ``{}``."""
    loader = None
    try:
        loader = (_Loader11 if yaml11 else _Loader)(text)  # PyYAML's own reader checks the characters here
        composer = _Composer(loader, name)
        node = composer.compose()
        if node is None:
            return None, {}, True
        if mapping and not isinstance(node, MappingNode) and node.tag != _CORE + "null":
            kind = {ScalarNode: "a single value", SequenceNode: "a list"}[type(node)]
            mark = node.start_mark
            raise _error(name, f"{name}:{mark.line + 1}", f"{NOT_A_MAPPING} (`key: value` lines): it holds "
                                                         f"{kind}, from line {mark.line + 1}, column {mark.column + 1}")
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, name, text) from None
    finally:
        if loader is not None:
            loader.dispose()
    return (_tree(data) if composer.aliased else data), composer.locations, False


def dump_yaml(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


# --- the composer ---------------------------------------------------------------------------------------------------

_MERGE = "tag:yaml.org,2002:merge"
_CORE = "tag:yaml.org,2002:"
_STR = _CORE + "str"
# the tags a recipe may write (YAML 1.2's core schema): plain values, nothing a constructor makes objects of
_PLAIN = {_CORE + name for name in ("str", "int", "float", "bool", "null", "seq", "map")}


@dataclass
class _Size:
    """A composed node's size once aliases are expanded, and the alias that weighs most in it (for the message)."""

    values: int
    text: int
    depth: int
    heaviest: tuple[int, str, int] | None = None  # (values, anchor, the anchor's line) of its largest alias


@dataclass
class _Frame:
    """A mapping or list being composed: its node, key path, anchor and what its children add up to."""

    node: Node
    path: tuple
    anchor: str | None
    values: int = 1
    text: int = 0
    depth: int = 0
    heaviest: tuple[int, str, int] | None = None
    key: Node | None = None  # a mapping's key waiting for its value
    keys: dict = field(default_factory=dict)  # a mapping's keys so far (as the dict holds them) -> the line of each


class _Composer:
    """Nodes from a loader's events in one pass, iteratively (no recursion, whatever the nesting), with the checks and
    locations the module docstring lists. ``compose()`` gives the document's node (None for an empty document)."""

    def __init__(self, loader, name: str):
        self.loader = loader
        self.name = name
        self.anchors: dict[str, Node] = {}
        self.open: set[str] = set()  # anchors whose node is still being composed
        self.sizes: dict[int, _Size] = {}  # id(node) -> its expanded size, for each anchored node
        self.anchor_lines: dict[str, int] = {}
        self.locations: Locations = {}
        self.duplicates: list[Problem] = []
        self.written = 0
        self.aliased = False

    def compose(self) -> Node | None:
        loader = self.loader
        loader.get_event()  # stream start
        if loader.check_event(yaml.StreamEndEvent):
            loader.get_event()
            return None
        loader.get_event()  # document start
        node = self._document()
        loader.get_event()  # document end
        if not loader.check_event(yaml.StreamEndEvent):
            extra = loader.get_event()
            raise self._fail("", extra.start_mark, "holds more than one YAML document: a recipe is one; remove the "
                                                   "`---` line and what follows, or split it into two files")
        loader.get_event()
        if self.duplicates:
            raise YamlSyntaxError(problems=self.duplicates)
        return node

    def _document(self) -> Node:
        """The document's root node: one loop over its events, a stack of the mappings and lists still open."""
        loader = self.loader
        stack: list[_Frame] = []
        while True:
            event = loader.get_event()
            path = self._child_path(stack[-1]) if stack else ()
            if isinstance(event, yaml.AliasEvent):
                node, size = self._alias(event, path)
            elif isinstance(event, yaml.ScalarEvent):
                node, size = self._scalar(event, path)
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append(self._open(event, path, depth=len(stack) + 1))
                continue
            else:  # the end of the innermost open mapping or list
                frame = stack.pop()
                node, size = self._close(frame, event)
            if not stack:
                return node
            self._add(stack[-1], node, size, event)

    def _child_path(self, frame: _Frame) -> tuple:
        """The key path of the next node ``frame`` receives (a mapping's key gets its mapping's path)."""
        if isinstance(frame.node, SequenceNode):
            return (*frame.path, len(frame.node.value))
        if frame.key is None:
            return frame.path
        return (*frame.path, _key_name(frame.key, self.loader))

    def _count(self, event) -> None:
        self.written += 1
        if self.written > MAX_VALUES:
            raise self._fail("", event.start_mark, f"holds more than {MAX_VALUES:,} values: a recipe holds a few "
                                                   "hundred; is it the right file?")

    def _register(self, anchor: str | None, node: Node, event) -> None:
        if anchor is None:
            return
        if anchor in self.anchors:
            first = self.anchors[anchor].start_mark.line + 1
            raise self._fail("", event.start_mark, f"defines the anchor &{_cut(anchor)} a second time (first at line "
                                                   f"{first}); give each anchor its own name")
        self.anchors[anchor] = node
        self.anchor_lines[anchor] = event.start_mark.line + 1

    def _alias(self, event, path: tuple) -> tuple[Node, _Size]:
        name = event.anchor
        shown = _cut(name)
        where = self._where(event.start_mark)
        if name not in self.anchors:
            raise self._fail(_dotted(path), event.start_mark, f"the alias *{shown} names no anchor written above it; "
                                                              f"write `&{shown}` on the value it stands for, before it")
        if name in self.open:
            raise self._fail(_dotted(path), event.start_mark,
                             f"the alias *{shown} is inside the value of its own anchor &{shown} (line "
                             f"{self.anchor_lines[name]}), so that value would contain itself without end; replace "
                             "the alias with the values it stands for")
        self.aliased = True
        node = self.anchors[name]
        size = self.sizes[id(node)]
        self.locations.setdefault(path, where)
        return node, _Size(size.values, size.text, size.depth, max(
            filter(None, [size.heaviest, (size.values, name, self.anchor_lines[name])])))

    def _scalar(self, event, path: tuple) -> tuple[Node, _Size]:
        self._count(event)
        tag = self._tag(event, ScalarNode, event.value, event.implicit, path)
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
        if tag not in (_STR, _MERGE):
            self._construct(node, event, path)
        self._register(event.anchor, node, event)
        size = _Size(1, len(event.value), 1)
        if event.anchor is not None:
            self.sizes[id(node)] = size
        self.locations.setdefault(path, self._where(event.start_mark))
        return node, size

    def _open(self, event, path: tuple, depth: int) -> _Frame:
        self._count(event)
        if depth > MAX_DEPTH:
            raise self._fail(_dotted(path), event.start_mark, f"is nested more than {MAX_DEPTH} levels deep; a recipe "
                                                              "nests a few levels")
        kind = SequenceNode if isinstance(event, yaml.SequenceStartEvent) else MappingNode
        tag = self._tag(event, kind, None, event.implicit, path)
        node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)
        self._register(event.anchor, node, event)
        if event.anchor is not None:
            self.open.add(event.anchor)
        self.locations.setdefault(path, self._where(event.start_mark))
        return _Frame(node, path, event.anchor)

    def _close(self, frame: _Frame, event) -> tuple[Node, _Size]:
        frame.node.end_mark = event.end_mark
        size = _Size(frame.values, frame.text, frame.depth + 1, frame.heaviest)
        if frame.anchor is not None:
            self.open.discard(frame.anchor)
            self.sizes[id(frame.node)] = size
        self._check(size, frame.anchor, frame.node.start_mark, frame.path)
        return frame.node, size

    def _add(self, frame: _Frame, node: Node, size: _Size, event) -> None:
        """``node`` (of ``size``) into the open ``frame``: a list's item, a mapping's key, or the value of its key."""
        frame.values += size.values
        frame.text += size.text
        frame.depth = max(frame.depth, size.depth)
        if size.heaviest and (frame.heaviest is None or size.heaviest > frame.heaviest):
            frame.heaviest = size.heaviest
        if isinstance(frame.node, SequenceNode):
            frame.node.value.append(node)
        elif frame.key is None:
            self._key(frame, node, event)
        else:
            frame.node.value.append((frame.key, node))
            frame.key = None
        self._check(_Size(frame.values, frame.text, frame.depth + 1, frame.heaviest), frame.anchor,
                    frame.node.start_mark, frame.path)

    def _key(self, frame: _Frame, node: Node, event) -> None:
        """A mapping's key: a scalar (a name, a number), written once in its mapping."""
        if not isinstance(node, ScalarNode):
            raise self._fail(_dotted(frame.path), event.start_mark, "has a mapping or a list as a key; a key is a "
                                                                    "name (`key: value`)")
        frame.key = node
        line = event.start_mark.line + 1
        path = (*frame.path, _key_name(node, self.loader))
        self.locations[path] = self._where(event.start_mark)  # the key's line, not the value's
        identity = (node.tag, node.value) if node.tag == _MERGE else _key_value(node, self.loader)
        first = frame.keys.get(identity)
        if first is None:
            frame.keys[identity] = line
            return
        lines = f"twice on line {line}" if first == line else f"twice, at lines {first} and {line}"
        self.duplicates.append(Problem(
            _dotted(path), f"is written {lines} of the same mapping; a key is written once (YAML 1.2), and ft does not "
                           "choose one for you: keep the one you mean and delete the other",
            self._where(event.start_mark)))

    def _check(self, size: _Size, anchor: str | None, mark, path: tuple) -> None:
        """Refuse a value whose expansion passes a bound, naming the anchor behind it (its own, or its heaviest
        alias's) and that anchor's line."""
        over = (f"{size.values:,} values (at most {MAX_VALUES:,})" if size.values > MAX_VALUES else
                f"{size.text:,} characters (at most {MAX_TEXT:,})" if size.text > MAX_TEXT else
                f"{size.depth} levels of nesting (at most {MAX_DEPTH})" if size.depth > MAX_DEPTH else "")
        if not over:
            return
        if anchor is not None:
            who = f"the anchor &{_cut(anchor)} (line {self.anchor_lines[anchor]})"
        elif size.heaviest is not None:
            _, name, line = size.heaviest
            who = f"the value at line {mark.line + 1}, through the anchor &{_cut(name)} (line {line}),"
        else:
            who = f"the value at line {mark.line + 1}"
        raise self._fail(_dotted(path), mark, f"{who} expands, with its aliases repeated, to {over}: aliases that "
                                              "repeat an anchor many times are refused (an alias bomb); write the "
                                              "values out, or fewer aliases of it")

    def _tag(self, event, kind, value, implicit, path: tuple) -> str:
        """The node's tag: resolved from its text when none is written; a written one must be one a safe loader
        constructs (no ``!!python/...``, no local ``!tag``)."""
        tag = event.tag
        if tag is None or tag == "!":
            return self.loader.resolve(kind, value, implicit)
        if tag not in _PLAIN:
            shown = "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag
            raise self._fail(_dotted(path), event.start_mark, f"has the tag {_token(shown)}, which ft does not read: "
                                                              "ft reads plain values only (text, numbers, true/false, "
                                                              "lists, mappings); remove the tag")
        return tag

    def _construct(self, node: ScalarNode, event, path: tuple) -> None:
        """Build a typed scalar now, where its line is known (the constructor keeps it for the document): PyYAML's
        constructors fail on some text their tag's pattern lets through (``2024-13-45`` as a date, ``!!int x``) with
        a ValueError and its like, not a YAML error."""
        try:
            self.loader.construct_object(node)
        except (yaml.YAMLError, ValueError, KeyError, AttributeError, TypeError, OverflowError) as exc:
            kind = "!!" + node.tag.removeprefix(_CORE)
            reason = "not one of its values" if isinstance(exc, KeyError) else (str(exc).splitlines() or [""])[0][:80]
            raise self._fail(_dotted(path), event.start_mark, f"cannot be read as {kind} ({reason}); quote it to "
                                                              "make it text, or correct it") from None

    def _where(self, mark) -> str:
        return f"{self.name}:{mark.line + 1}"

    def _fail(self, path: str, mark, message: str) -> YamlSyntaxError:
        return YamlSyntaxError(problems=[*self.duplicates, Problem(path, message, self._where(mark))])


def _key_value(node: ScalarNode, loader):
    """A scalar key as the dict will hold it (``1`` and ``01`` are one key), or its tag and text when it has no
    plain value."""
    try:
        value = loader.construct_object(node)
        hash(value)
    except (yaml.YAMLError, TypeError):
        return (node.tag, node.value)
    return value


def _key_name(node: ScalarNode, loader) -> str | int:
    """A key as a location path holds it: a number key as the number (``data.train.0``), any other as its text."""
    value = _key_value(node, loader)
    return value if isinstance(value, int) and not isinstance(value, bool) else node.value


def _dotted(path: tuple) -> str:
    """A key path as a problem names it, each key cut short (a key may be a whole line of a file named by mistake)."""
    return ".".join(_cut(str(p)) for p in path)


def _cut(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _tree(value):
    """``value`` with every mapping and list its own copy: aliases make the constructed data share objects, and the
    recipe is edited in place (``--set``, defaults, ``extends:`` paths). Bounded: the sizes were checked."""
    if isinstance(value, dict):
        return {key: _tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_tree(item) for item in value]
    return value


# --- errors ---------------------------------------------------------------------------------------------------------


def _error(name: str, where: str, message: str) -> YamlSyntaxError:
    """A problem with the file ``name`` at ``where`` (``file:line``), or with the whole file (``where`` empty: the
    problem's ``where`` is the file's name alone)."""
    return YamlSyntaxError(problems=[Problem("", message, where or name)])


def _line_column(before: bytes | str) -> tuple[int, int]:
    """The 1-based line and column just after ``before`` (the bytes or characters before a position)."""
    newline = b"\n" if isinstance(before, bytes) else "\n"
    return before.count(newline) + 1, len(before) - (before.rfind(newline) + 1) + 1


def _token(text: str, limit: int = 40) -> str:
    """A token of the file (a tag, a character) as a message shows it, cut short: a message never quotes a line."""
    return repr(_cut(text, limit))


def _yaml_error(exc: yaml.YAMLError, name: str, text: str) -> YamlSyntaxError:
    """PyYAML's (or libyaml's) error as a Problem at file:line with the column and the parser's reason; never
    its snippet of the file."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow (a control character, NUL)
        position = exc.position if isinstance(exc.position, int) else 0
        # libyaml counts bytes of the UTF-8 text, PyYAML's reader characters
        prefix = text.encode("utf-8")[:position] if _BASE is not yaml.SafeLoader else text[:position].encode("utf-8")
        line, column = _line_column(prefix.decode("utf-8", "ignore"))
        return YamlSyntaxError(problems=[Problem("", f"not valid YAML: a control character (#x{exc.character:04x}) at "
                                                     f"line {line}, column {column}; YAML is text, and this looks like "
                                                     "a binary file", f"{name}:{line}")], syntax=True)
    mark = getattr(exc, "problem_mark", None)
    reason = re.sub(r"'([^']{41,})'", lambda m: _token(m.group(1)), getattr(exc, "problem", None) or
                    type(exc).__name__)
    if isinstance(exc, yaml.constructor.ConstructorError):
        return YamlSyntaxError(problems=[Problem("", f"cannot be read as plain values: {reason}",
                                                 f"{name}:{mark.line + 1}" if mark else "")])
    if mark is None:
        return YamlSyntaxError(problems=[Problem("", f"not valid YAML: {reason}. Check the indentation and quoting.")],
                               syntax=True)
    return YamlSyntaxError(problems=[Problem("", f"not valid YAML at column {mark.column + 1}: {reason}. Check the "
                                                 "indentation and quoting there.", f"{name}:{mark.line + 1}")],
                           syntax=True)
