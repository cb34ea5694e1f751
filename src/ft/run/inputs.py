"""The local files and folders a recipe reads, checked to exist before anything loads (``ft validate``, and ``ft
train`` before the model): a misspelt data file or a model folder that is not there is named at its key, with the
close names beside it, instead of surfacing minutes later when the data or the model loads.

What is local is what the loaders themselves treat as local: a data source ``source_kind`` calls ``missing`` (an
absolute, ``./`` or ``~`` path, or a file name with a data suffix: ``data/trian.jsonl``), and a model, adapter or
extra model (a reference, a reward model) whose name ``names_a_path`` (``./models/x``, ``runs/a/final``); a hub id is
the hub checks' (``run.hub``). A missing model folder is a warning (it may be written after validation: by a
script, or by another recipe next to this one, ``model.name: ../runs/smollm2-sft`` beside ``smollm2-sft.yaml``, which
the warning names).
A GGUF file is ``gguf_problems``'; an ``extends:`` target is checked as the recipe is read.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ..data.sources import source_kind
from ..model.loading import names_a_path
from ..model.locate import writer_of
from ..recipe import LoadedRecipe, Problem
from ..recipe.methods import models_of


def missing_inputs(loaded: LoadedRecipe) -> list[Problem]:
    """An error for each local data source the recipe names that does not exist, a warning for each model folder
    (``missing_models``)."""
    return missing_data(loaded) + missing_models(loaded)


def missing_data(loaded: LoadedRecipe) -> list[Problem]:
    """An error for each local data source the recipe names that does not exist (``ft train`` asks before the model
    loads; the model's own load names a missing model folder)."""
    folder = loaded.source.resolve().parent
    return [Problem(key, f"{source.path} does not exist (a relative path is read from the recipe's folder, {folder}, "
                    f"then the working directory).{_close_names(source.path, folder)} Fix the path, or put the file "
                    "there.") for key, source in _sources(loaded.recipe) if source_kind(source) == "missing"]


def missing_models(loaded: LoadedRecipe) -> list[Problem]:
    """A warning for each local model folder the recipe names that does not exist (with the close names beside it), or
    that a recipe next to it writes: a folder may be written after validation (a script, an earlier run), and
    ``ft train`` refuses it when it loads the model; a shipped recipe whose model a script writes still validates."""
    recipe, folder = loaded.recipe, loaded.source.resolve().parent
    problems = []
    for key, name in _models(recipe):
        if not names_a_path(name) or _resolved(name, folder).exists():
            continue
        writer = writer_of(_resolved(name, folder), folder)
        if writer is not None:
            recipe_file = _shown(writer[0])
            problems.append(Problem(key, f"{name} does not exist yet: it is what {recipe_file} writes; train that "
                                    f"recipe first (`ft train {recipe_file}`).", level="warning"))
            continue
        problems.append(Problem(key, f"{name} does not exist (a relative path is read from the recipe's folder, "
                                f"{folder}).{_close_names(name, folder)} Name a model folder (config.json and "
                                "weights), a run directory, or a hub id (`org/name`), or write the folder before "
                                "`ft train` (a script or another step may make it: ft train refuses it then).",
                                level="warning"))
    return problems


def _sources(recipe) -> list[tuple[str, object]]:
    """(key, source) of every data source the recipe reads: training, evaluation and exact match's own."""
    found = [(f"data.train.{i}.path", source) for i, source in enumerate(recipe.data.train)]
    found += [(f"data.eval.{i}.path", source) for i, source in enumerate(recipe.data.eval_sources)]
    exact = recipe.data.eval_exact_match
    if exact is not None and exact.source is not None:
        found.append(("data.eval_exact_match.source.path", exact.source))
    return found


def _models(recipe) -> list[tuple[str, str]]:
    """(key, name) of every model the recipe loads: the policy, an adapter to continue, the method's extra models."""
    found = [("model.name", recipe.model.name)]
    path = getattr(recipe.adapter, "path", None) if recipe.adapter is not None else None
    if path:
        found.append(("adapter.path", path))
    return found + [(extra.key, extra.name) for extra in models_of(recipe) if extra.name]


def _shown(path: Path) -> str:
    """``path`` as the user would type it here: relative to the working directory when it is under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _resolved(name: str, folder: Path) -> Path:
    return folder / Path(name).expanduser()


def _close_names(written: str, folder: Path) -> str:
    """' Did you mean …?' with the names beside the missing one that are close to it, written as it was written."""
    path = Path(written).expanduser()
    parent = path.parent if path.is_absolute() else folder / path.parent
    try:
        beside = [entry.name for entry in parent.iterdir()]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, beside, n=2, cutoff=0.75)
    return (" Did you mean " + " or ".join(f"`{Path(written).parent / name}`" for name in close) + "?") if close else ""
