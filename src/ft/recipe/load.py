"""Recipe file → frozen Recipe: YAML, ``extends:``, ``--set``, validation, and readable errors.

Every problem is collected and raised together in one ``RecipeError`` so ``ft validate`` shows the
whole list at once; each names the dotted key, the ``file:line`` it came from, the bad value, what is
allowed, and (for unknown names) the closest valid ones.

A relative input path is relative to the file that wrote it: a base recipe's (``extends:``) are made absolute
against the base's folder as it is read, the recipe's own and ``--set`` values are resolved against the recipe's
folder (then the working directory) by the schema's validators (``base.resolve_input_path``).
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .base import resolve_input_path
from .errors import Problem, RecipeError, did_you_mean
from .methods import DEFAULT_METHOD, METHODS, moved_to_method_section
from .processes import Processes
from .redact import REDACTED, SECRET_KEY, shown
from .rules import check_rules
from .schema import Recipe, recipe_model
from .train_section import MOVED
from .yaml_io import NOT_A_MAPPING, Locations, YamlSyntaxError, load_yaml, parse_scalar


@dataclass(frozen=True)
class LoadedRecipe:
    recipe: Recipe
    warnings: list[Problem]
    source: Path
    locations: Locations

    @property
    def folders(self) -> list[Path]:
        """The folders of the files the recipe was read from, each once: its own, then its bases' (``extends:``)
        that still give it a key. The modules a recipe names (``module:function``) are looked up in them."""
        files = [self.source] + [Path(file) for file, _, line in (where.rpartition(":") for where in
                                                                   self.locations.values()) if file and line.isdigit()]
        return list(dict.fromkeys(file.resolve().parent for file in files))

    def error(self, problems: list[Problem]) -> RecipeError:
        """A RecipeError for problems found later (e.g. machine checks), located like load-time ones."""
        located = [Problem(p.path, p.message, p.where or _where(p.path, self.locations), p.level) for p in problems]
        return RecipeError(located, str(self.source))


def load_recipe(path: str | Path, overrides: Sequence[str] = (), processes: Processes | None = None) -> LoadedRecipe:
    """Read, merge, override and validate a recipe. Raises ``RecipeError`` listing every problem. ``processes``: the
    process count the command knows (``ft train --num-processes``, a rank's world size) for the rules that involve
    processes; None leaves it to the recipe's ``launch:``."""
    path = Path(path)
    raw, locations = read_merged(path)
    for item in overrides:
        _apply_set(raw, locations, item, str(path))
    _default_output_dir(raw, path)
    recipe, warnings = validate(raw, locations, base_dir=path.resolve().parent, source=str(path), processes=processes)
    return LoadedRecipe(recipe, warnings, path, locations)


def read_merged(path: Path, _chain: tuple[Path, ...] = (), _via: tuple[str, str, str] | None = None
                ) -> tuple[dict, Locations]:
    """The recipe as a dict after resolving ``extends:`` (relative to each file; chains allowed). A base's relative
    input paths are made absolute against its own folder (``anchor_input_paths``); the recipe's own stay as written,
    for ``validate`` to resolve against its folder. ``_via``: for a base, (the recipe the user named, the ``extends:``
    line that names the base, the value written there): what is wrong with the base file as a whole (missing, a
    directory, not a recipe) is blamed on that line, and every problem is listed under the recipe the user named."""
    source = _via[0] if _via else str(path)
    try:
        data, locations = load_yaml(path, mapping=True)
    except YamlSyntaxError as exc:
        raise RecipeError([_file_problem(p, path, _via) for p in exc.problems], source) from None
    if data is None:
        data = {}
    if not _looks_like_a_recipe(data):
        line = locations.get((), str(path)).rpartition(":")[2]
        problem = Problem("", f"{_NOT_A_RECIPE}: none of its {len(data)} top-level keys is a recipe's (method:, "
                              f"model:, data:, train:, …) or close to one, from line {line}; is it the right file?",
                          locations.get((), str(path)))
        raise RecipeError([_file_problem(problem, path, _via)], source)
    if _chain:  # a base of the recipe: its paths are relative to its own folder, not to the recipe extending it
        anchor_input_paths(data, path.resolve().parent)
    parent = data.pop("extends", None)
    if parent is None:
        return data, locations
    where = locations.get(("extends",), str(path))
    if not isinstance(parent, str) or not parent.strip() or "\0" in parent:
        raise RecipeError([Problem("extends", f"must be a path to another recipe file (got {shown(parent)})", where)],
                          source)
    base = path.parent / parent
    if base.resolve() in (*_chain, path.resolve()):
        cycle = " -> ".join(str(p) for p in (*_chain, path.resolve(), base.resolve()))
        raise RecipeError([Problem("extends", f"`extends` forms a cycle: {cycle}. Remove one link.", where)], source)
    merged, base_locations = read_merged(base, (*_chain, path.resolve()), (source, where, shown(parent)))
    return deep_merge(merged, data), {**base_locations, **locations}


def _file_problem(problem: Problem, path: Path, via: tuple[str, str, str] | None) -> Problem:
    """A problem reading the recipe file ``path`` as a recipe's problem. One with the file as a whole (missing, a
    directory, not a mapping, not a recipe) names the file; in a base (read through ``extends:``, ``via``) it is the
    ``extends:`` line's. One at a line of the file (YAML syntax, a key written twice) stays at that line."""
    whole = problem.where == str(path) or problem.message.startswith((_NOT_A_RECIPE, NOT_A_MAPPING))
    if not whole:  # at its line; its key only when a recipe could have written it (else it is the file's own text)
        top = problem.path.partition(".")[0]
        keys = _recipe_keys()
        known = not top or top in keys or bool(did_you_mean(top, keys))
        return problem if known else Problem("", problem.message, problem.where, problem.level)
    if via is None:
        return problem if problem.where != str(path) else Problem("", f"recipe file {str(path)!r} {problem.message}")
    _, where, parent = via
    return Problem("extends", f"names {parent}, which {problem.message}", where)


_NOT_A_RECIPE = "is not a recipe"


@cache
def _recipe_keys() -> frozenset[str]:
    """Every top-level key a recipe of some method may write, and ``extends``: the sections every recipe has (the
    default method's recipe holds every method's section too) and each method's section by name. Read from the
    method table alone, so a method registered without its ``train:`` field table yet is no obstacle."""
    sections = {name for name, method in METHODS.items() if method.section is not None}
    return frozenset({"extends", *_keys(recipe_model(DEFAULT_METHOD)), *sections})


def _looks_like_a_recipe(data: dict) -> bool:
    """False for a mapping none of whose top-level keys is a recipe's or close to one (``/etc/shadow`` read as YAML
    is a mapping of its lines): its keys are not shown back as unknown keys, since they are the file's own text."""
    keys = _recipe_keys()
    return not data or any(str(key) in keys or did_you_mean(str(key), keys) for key in data)


def anchor_input_paths(raw: dict, folder: Path) -> None:
    """Make each input path of ``raw`` (one recipe file's own keys: ``model.name``, ``data.*.path``,
    ``dpo.ref_model``, …) that names something in ``folder`` absolute, in place. The keys are those the schema resolves
    with ``resolve_input_path``; a value that names nothing there (a hub id, a path relative to the working directory)
    is left as written."""
    _anchor(raw, [recipe_model(DEFAULT_METHOD)], folder)  # every method's section is in it; train: holds no input path


def _anchor(node: dict, models: list[type[BaseModel]], folder: Path) -> None:
    """``anchor_input_paths`` on ``node``, read as one of ``models`` (a union's members; every method's recipe at the
    top, whose sections are the same but for ``train:``)."""
    for key, value in node.items():
        for model in models:
            field = _keys(model).get(key)
            if field is None:
                continue
            if key in _input_path_keys(model) and isinstance(value, str):
                node[key] = value = _anchored(value, folder)
            elif key in _input_path_keys(model) and isinstance(value, list):  # a list of paths (benchmarks.tasks)
                node[key] = value = [_anchored(item, folder) if isinstance(item, str) else item for item in value]
            inner = _models_in(field.annotation)
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict) and inner:
                    _anchor(item, inner, folder)


def _anchored(value: str, folder: Path) -> str:
    candidate = folder / value
    return str(candidate.resolve()) if candidate.exists() else value


@cache
def _input_path_keys(model: type[BaseModel]) -> set[str]:
    """The keys of ``model`` (as a recipe writes them) whose validator is ``resolve_input_path``, or calls it (a key
    that takes a file or an inline mapping)."""
    names: set[str] = set()
    for decorator in model.__pydantic_decorators__.field_validators.values():
        func = getattr(decorator.func, "__func__", decorator.func)
        calls = getattr(getattr(func, "__code__", None), "co_names", ())
        if func is resolve_input_path or "resolve_input_path" in calls:
            names.update(decorator.info.fields)
    return {field.alias or name for name, field in model.model_fields.items() if name in names}


def _default_output_dir(raw: dict, path: Path) -> None:
    """``train.output_dir`` defaults to ``runs/<recipe file name>`` under the working directory."""
    if raw.get("train") is None:  # `train: null` means no train settings, like a missing section
        raw["train"] = {}
    train = raw["train"]
    if isinstance(train, dict) and train.get("output_dir") is None:
        train["output_dir"] = str(Path("runs") / path.stem)


def deep_merge(base: dict, override: dict) -> dict:
    """Maps merge key by key, recursively; any other value (lists included) replaces the base's."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _apply_set(raw: dict, locations: Locations, item: str, source: str) -> None:
    key, sep, text = item.partition("=")
    where = f"--set {key}={REDACTED}" if sep and SECRET_KEY.search(key.strip().rpartition(".")[2]) else f"--set {item}"
    if not sep or not key.strip():
        raise RecipeError([Problem("", "`--set` takes KEY=VALUE with a dotted key, e.g. train.max_steps=10", where)],
                          source)
    parts: list[Any] = [int(p) if p.isdigit() else p for p in key.strip().split(".")]
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise RecipeError([Problem(".".join(map(str, parts[: i + 1])), "no such list item", where)], source)
            node = node[part]
            continue
        if not isinstance(node.get(part), (dict, list)):
            node[part] = [] if isinstance(nxt, int) else {}
        node = node[part]
    last = parts[-1]
    try:
        value = parse_scalar(text, where)
    except YamlSyntaxError as exc:
        raise RecipeError([Problem(key.strip(), p.message, where) for p in exc.problems], source) from None
    if isinstance(node, list):
        if not isinstance(last, int) or last > len(node):
            raise RecipeError([Problem(key, "no such list item", where)], source)
        node[last:last + 1] = [value]
    else:
        node[last] = value
    locations[tuple(parts)] = where
    for end in range(1, len(parts)):  # a section or key the flag creates is the flag's (`--set nosuch.key=1`)
        locations.setdefault(tuple(parts[:end]), where)


def validate(raw: dict, locations: Locations, base_dir: Path, source: str = "",
             processes: Processes | None = None) -> tuple[Recipe, list[Problem]]:
    """The Recipe of ``raw`` (a recipe read as YAML, ``extends:`` and ``--set`` applied) and its warnings; raises
    ``RecipeError`` with every problem, located by ``locations``."""
    method = DEFAULT_METHOD if raw.get("method") is None else raw["method"]  # `method: null` is the default too
    if not isinstance(method, str) or method not in METHODS:
        hint = did_you_mean(method, METHODS)
        raise RecipeError([Problem("method", f"got {method!r}; allowed: {', '.join(METHODS)}.{hint}",
                                   locations.get(("method",), ""))], source)
    cls = recipe_model(method)
    try:
        recipe = cls.model_validate(raw, context={"base_dir": str(base_dir)})
    except ValidationError as exc:
        problems = [_problem(err, cls, locations) for err in exc.errors()]
        raise RecipeError(sorted(problems, key=_line_order), source) from None
    problems = check_rules(recipe, processes)
    located = [Problem(p.path, p.message, p.where or _where(p.path, locations), p.level) for p in problems]
    if any(p.level == "error" for p in located):
        raise RecipeError(located, source)
    return recipe, located


def _where(dotted: str, locations: Locations) -> str:
    parts = tuple(int(p) if p.isdigit() else p for p in dotted.split(".")) if dotted else ()
    while parts and parts not in locations:
        parts = parts[:-1]
    return locations.get(parts, "")


def _problem(err: dict, cls: type[BaseModel], locations: Locations) -> Problem:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _is_union_tag(p)))
    dotted = ".".join(str(p) for p in loc)
    where = _where(dotted, locations)
    kind = err["type"]
    secret = any(SECRET_KEY.search(str(part)) for part in loc)  # a credential's value is never repeated
    value = err.get("input")
    got = shown(value, loc)
    if kind == "extra_forbidden":
        moved = {**MOVED, **moved_to_method_section(cls.model_fields["method"].default)}
        if loc[:1] == ("train",) and len(loc) == 2 and loc[-1] in moved:  # e.g. warmup_ratio, gone in 5.x
            return Problem(dotted, f"is not set under `train:` in ft recipes; set `{moved[loc[-1]]}` instead.", where)
        allowed = [name for name in _fields_at(cls, loc[:-1]) if loc[:1] != ("train",) or name not in moved]
        return Problem(dotted, f"unknown key.{_suggestion(cls, loc, allowed)} Allowed here: "
                               f"{_short_list(allowed)}.", where)
    if kind == "missing":
        written = loc in locations  # as `key: null`, which leaves the key unset
        fix = "and cannot be null; give it a value" if written else "but missing; add it to the recipe"
        return Problem(dotted, f"is required {fix}.", where or _where("", locations))
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'|(\d+)", err["ctx"]["expected"])
        options = [a or b for a, b in choices]
        hint = "" if secret else did_you_mean(value, options)
        return Problem(dotted, f"got {got}; allowed: {', '.join(options)}.{hint}{_yaml_hint(err)}", where)
    if kind == "value_error":
        said = "" if secret else f" (got {got})"
        return Problem(dotted, f"{err['msg'].removeprefix('Value error, ')}{said}.", where)
    return Problem(dotted, f"{err['msg']} (got {got}).{_yaml_hint(err)}", where)


_QUOTE_IT = (" Unquoted `true`/`false` is a YAML boolean, and this key takes a string: quote the value, "
             "or write one of the strings the key allows.")
_TRUE_FALSE = " Write `true` or `false` (recipes are read as YAML 1.2, where yes/no/on/off are strings)."


def _yaml_hint(err: dict) -> str:
    """The fix when YAML's typing of an unquoted value is the likely cause: a boolean where a string is
    wanted (``eval_strategy: false``), or ``yes``/``no`` habits on a true/false key (``packing: yes``)."""
    expected = str(err.get("ctx", {}).get("expected", ""))
    wants_text = err["type"] == "string_type" or "'" in expected
    if isinstance(err.get("input"), bool) and wants_text:
        return _QUOTE_IT
    return _TRUE_FALSE if err["type"] == "bool_type" else ""


def _line_order(problem: Problem) -> tuple:
    file, _, line = problem.where.rpartition(":")
    return (file, int(line)) if line.isdigit() else (problem.where, 0)


def _is_union_tag(part: str) -> bool:
    """Pydantic names union members in error locations (``union[...]``, ``list[str]``); drop them."""
    return "[" in part or part in {"str", "int", "float", "bool", "dict", "list", "function-after",
                                   "literal['all-linear']", "tuple"} or part.startswith(("function-", "constrained-"))


def _suggestion(cls: type[BaseModel], loc: tuple, allowed: list[str]) -> str:
    """The likeliest key meant by the unknown key at ``loc``: the same key where it lives in another section (a key
    written in the wrong section: ``train.eval_exact_match`` is ``data.eval_exact_match``), else a close name here,
    else a close name in another section."""
    key = str(loc[-1])
    homes = _homes(cls)
    here = ".".join(str(part) for part in loc[:-1] if not isinstance(part, int))
    moved = [path for path in homes.get(key, []) if path.rpartition(".")[0].replace("[]", "") != here]
    if moved:
        places = " or ".join(f"`{path}`" for path in moved[:3])
        return f" It is a key of another section: {places}; move it there."
    close = [repr(name) for name in difflib.get_close_matches(key, allowed, n=3, cutoff=0.6)]
    elsewhere = difflib.get_close_matches(key, [name for name in homes if name not in allowed], n=2, cutoff=0.85)
    close += [f"`{path}`" for name in elsewhere for path in homes[name][:2]]
    return f" Did you mean {' or '.join(close)}?" if close else ""


@cache
def _homes(cls: type[BaseModel]) -> dict[str, list[str]]:
    """Every key of the recipe model ``cls``, in every section at any depth, with the dotted paths it lives at (an
    item of a list of sections shown as ``[]``: ``data.train[].path``)."""
    homes: dict[str, list[str]] = {}

    def walk(model, prefix: str, seen: tuple) -> None:
        for key, field in _keys(model).items():
            path = f"{prefix}{key}"
            homes.setdefault(key, []).append(path)
            listed = typing.get_origin(field.annotation) is list or any(
                typing.get_origin(arg) is list for arg in typing.get_args(field.annotation))
            for inner in _models_in(field.annotation):
                if inner not in seen:
                    walk(inner, f"{path}{'[]' if listed else ''}.", (*seen, inner))

    walk(cls, "", (cls,))
    return homes


def _fields_at(cls: type[BaseModel], loc: tuple) -> list[str]:
    """The keys of the (sub)model at a location, as a recipe writes them (``class``, not ``cls``), for did-you-mean
    suggestions."""
    model: Any = cls
    for part in loc:
        if isinstance(part, int):
            continue
        field = _keys(model).get(part)
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(_keys(model))


def _keys(model) -> dict:
    """A model's fields by the key a recipe writes for each (its alias, where it has one)."""
    fields = getattr(model, "model_fields", {})
    return {field.alias or name: field for name, field in fields.items()}


def _model_in(annotation):
    found = _models_in(annotation)
    return found[0] if found else None


def _models_in(annotation) -> list[type[BaseModel]]:
    """Every model ``annotation`` names (``Optional[X]``, ``list[X]``, ``Union[list[X], Y]``), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _short_list(names: list[str], limit: int = 12) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f", … ({len(names)} in all; `ft schema` lists them)"
