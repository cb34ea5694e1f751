"""What an import does with each key of the source config, the recipe it builds, and ft's verdict on that recipe.

Every key of the source config ends in the ``Ledger`` in exactly one state:

- **carried**: it became one or more ft keys (``targets``); ``why`` notes a difference in behaviour, if any;
- **ignored**: it has no effect as written (empty, ``null``, or switching off a feature ft does not have);
- **not carried**: ft has no equivalent, or refuses the value; ``why`` says which and what to do.

``check`` validates the drafted recipe with ft's own loader and, where the recipe says what its model reads
(``model.modality``), with the modality rules ``ft train`` applies before reading rows (a vision model's rows are
not packed, …). When ft refuses a value an importer carried (its rules know things a key-by-key mapping does not,
e.g. that NEFTune is SFT-only), that key moves to *not carried* with ft's message as the reason, and the recipe is
checked again; a refusal no carried key accounts for is left for the user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..recipe.errors import Problem, RecipeError
from ..recipe.load import validate
from ..recipe.redact import REDACTED, SECRET_KEY
from ..recipe.rules import check_modality
from ..recipe.schema import Recipe
from ..recipe.yaml_io import Locations, dump_yaml, parse_yaml

CARRIED, IGNORED, NOT_CARRIED = "carried", "ignored", "not carried"


@dataclass
class Entry:
    key: str  # the source key, dotted for nested ones: `lora_r`, `datasets.0.type`, `trl.beta`
    value: Any
    status: str
    targets: tuple[str, ...] = ()  # the ft keys it became (carried)
    why: str = ""  # the reason (ignored, not carried), or a difference in behaviour (carried)
    fixed: bool = False  # carried, and never moved to not carried by a refusal (e.g. model.name, data sources)
    same: bool = False  # carried as ft's own default, which behaves the same (nothing written); ``why`` names it


@dataclass
class Ledger:
    entries: dict[str, Entry] = field(default_factory=dict)
    defaults: list[tuple[str, Any, str]] = field(default_factory=list)  # (ft key, value, why): the source tool's
    # defaults written out where ft's differ, for keys the config leaves unset

    def record(self, entry: Entry) -> None:
        self.entries[entry.key] = entry

    def seen(self, key: str) -> bool:
        return key in self.entries

    def by_status(self, status: str) -> list[Entry]:
        return [entry for entry in self.entries.values() if entry.status == status]

    def counts(self) -> dict[str, int]:
        return {status: len(self.by_status(status)) for status in (CARRIED, IGNORED, NOT_CARRIED)}


class Draft:
    """The recipe being built, as nested dicts, written by dotted key (``train.seed``, ``data.train``)."""

    def __init__(self) -> None:
        self.data: dict = {}

    def set(self, dotted: str, value: Any) -> None:
        *parents, last = dotted.split(".")
        node = self.data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def remove(self, dotted: str) -> None:
        *parents, last = dotted.split(".")
        node: Any = self.data
        trail = []
        for part in parents:
            if not isinstance(node, dict) or part not in node:
                return
            trail.append((node, part))
            node = node[part]
        if isinstance(node, dict):
            node.pop(last, None)
        for parent, part in reversed(trail):  # an emptied section goes too
            if parent[part] == {}:
                del parent[part]


@dataclass
class Verdict:
    text: str  # the recipe YAML (without comments)
    errors: list[Problem]  # ft's refusals no carried key accounted for (empty: the recipe validates)
    warnings: list[Problem]
    message: str = ""  # ft's own error text, when errors


def check(draft: Draft, ledger: Ledger, base_dir: Path, name: str, order: tuple[str, ...] = (),
          header_lines: int = 0) -> Verdict:
    """Validate the draft with ft's loader; move carried keys whose value ft refuses to *not carried* and retry.
    ``header_lines``: how many comment lines will precede the YAML in the file, so problems name the right line."""
    while True:
        text = dump_yaml(ordered(draft.data, order))
        raw, locations = parse_yaml("#\n" * header_lines + text, name)
        try:
            recipe, warnings = validate(raw, locations, base_dir=base_dir, source=name)
            problems = _modality_problems(recipe, locations)
            if not any(p.level == "error" for p in problems):
                return Verdict(text, [], warnings + problems)
            raise RecipeError(problems, name)
        except RecipeError as exc:
            errors = [p for p in exc.problems if p.level == "error"]
            if not any([_refuse(problem, draft, ledger) for problem in errors]):
                return Verdict(text, errors, [], str(exc))


def _modality_problems(recipe: Recipe, locations: Locations) -> list[Problem]:
    """The modality rules' problems for a recipe that declares what its model reads (``model.modality``; unset: known
    only once ``ft train`` reads the model's config), located at their key's line as the loader's are."""
    if recipe.model.modality is None:
        return []
    located = []
    for problem in check_modality(recipe, recipe.model.modality):
        parts = tuple(int(p) if p.isdigit() else p for p in problem.path.split("."))
        while parts and parts not in locations:
            parts = parts[:-1]
        located.append(Problem(problem.path, problem.message, locations.get(parts, ""), problem.level))
    return located


def _refuse(problem: Problem, draft: Draft, ledger: Ledger) -> bool:
    """Move the carried keys behind ``problem`` to not carried (removing their ft keys); False when there are none."""
    path = problem.path
    hit = [entry for entry in ledger.by_status(CARRIED) if not entry.fixed and any(
        path == target or path.startswith(target + ".") for target in entry.targets)]
    for entry in hit:
        for target in entry.targets:
            draft.remove(target)
        entry.status, entry.targets = NOT_CARRIED, ()
        entry.why = f"ft refuses it: `{path}` {problem.message}"
    return bool(hit)


def ordered(data: dict, order: tuple[str, ...]) -> dict:
    """``data`` with the keys named in ``order`` first, in that order: sections by name (``model``), and a section's
    own keys by dotted name (``model.name``), whichever handler wrote them first."""

    def arrange(node: dict, prefix: str) -> dict:
        names = [key[len(prefix):] for key in order if key.startswith(prefix) and "." not in key[len(prefix):]]
        first = {name: node[name] for name in names if name in node}
        return {**first, **{key: value for key, value in node.items() if key not in first}}

    return {key: arrange(value, f"{key}.") if isinstance(value, dict) else value
            for key, value in arrange(data, "").items()}


def shown(key: str, value: Any, limit: int = 70) -> str:
    """A short, one-line form of a value for a comment; credentials are never shown."""
    if SECRET_KEY.search(key.rpartition(".")[2]) and not isinstance(value, bool):
        return REDACTED
    if value is None:
        return "(empty)"
    if isinstance(value, bool):
        return str(value).lower()
    text = " ".join(dump_yaml(value).split()).removesuffix(" ...") if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def trailer(ledger: Ledger) -> list[str]:
    """The comment block that ends an imported recipe: what was not carried and why, the carried keys that behave
    differently in ft, and the keys ignored as having no effect."""
    lines: list[str] = []
    missing, ignored = ledger.by_status(NOT_CARRIED), ledger.by_status(IGNORED)
    differing = [e for e in ledger.by_status(CARRIED) if e.why and not e.same]
    same = [e for e in ledger.by_status(CARRIED) if e.same]
    if missing:
        lines += ["", f"# ---- Not carried ({len(missing)}): no ft equivalent, or a value ft refuses ----"]
        lines += [f"# {e.key}: {shown(e.key, e.value)}\n#     {e.why}" for e in missing]
    if differing:
        lines += ["", f"# ---- Carried, with a difference ({len(differing)}) ----"]
        lines += [f"# {e.key} -> {', '.join(e.targets) or '(ft default)'}: {e.why}" for e in differing]
    if same:
        lines += ["", f"# ---- Carried as ft's own default, which does the same ({len(same)}) ----"]
        lines += [f"# {e.key}: {shown(e.key, e.value)}  (ft: {e.why})" for e in same]
    if ignored:
        lines += ["", f"# ---- Ignored: empty or switched off, no effect ({len(ignored)}) ----"]
        lines += [f"# {e.key}: {shown(e.key, e.value)}  ({e.why})" for e in ignored]
    if ledger.defaults:
        lines += ["", f"# ---- Unset in the config, so its tool's default is written out where ft's differs "
                      f"({len(ledger.defaults)}) ----"]
        lines += [f"# {target}: {shown(target, value)}  ({why})" for target, value, why in ledger.defaults]
    return lines
