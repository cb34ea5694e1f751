"""``ft preprocess``: the data of a recipe tokenized once, with loss masks and a length column, into
``data.prepared_path``, where ``ft train`` (and every rank of a multi-process run) reads it. The path is held while it
is checked and written (``ft.outputs.lock``): two writers would swap in each other's half-written folders. ``--show N``
(``show``) prints the first training rows as the model sees them instead, preparing nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import data
from ..model import loading, locate
from ..outputs import lock
from ..recipe import LoadedRecipe, Problem, RecipeError


def preprocess(loaded: LoadedRecipe, say: Callable[[str], None] = print, *, wait: bool = False) -> data.PreparedData:
    """Tokenize once into ``data.prepared_path`` (a no-op when the fingerprint already matches). When another process
    writes it, ``ft preprocess`` is refused (exit 2, naming it); ``wait`` (the launcher of a run's ranks) waits for it
    instead, then reuses what it wrote."""
    recipe = loaded.recipe
    if recipe.data.prepared_path is None:
        raise loaded.error([Problem("data.prepared_path", "`ft preprocess` writes the tokenized dataset there; "
                                    "set it (e.g. prepared/my-run) so `ft train` can reuse it.")])
    problems = loading.gguf_problems(recipe.model)
    if problems:
        raise loaded.error(problems)
    with lock.prepared_path(Path(recipe.data.prepared_path), wait=wait, say=say):
        processing_class = locate.start_processing_class(recipe.model)  # a processor for a vision-language model
        try:
            return data.prepare_data(recipe, processing_class, data.chat_template_for(recipe, processing_class), say)
        except RecipeError as exc:  # what the model's modality shows wrong in the recipe (data.packing with images)
            raise loaded.error(exc.problems) from None


def show(loaded: LoadedRecipe, count: int, colour: bool = False) -> str:
    """``--show N`` (``ft preprocess``, ``ft validate``): the first ``count`` training rows as the model sees them,
    trained tokens marked (``ft.data.show``), with the model's processing class and chat template as ``ft train``
    loads them; nothing is prepared or written. Refused (exit 2, naming ``method``) for the methods whose rows TRL
    tokenizes."""
    from ..recipe.methods import METHODS

    recipe = loaded.recipe
    if not METHODS[recipe.method].ft_tokenizes:
        raise loaded.error([Problem("method", f"--show prints the rows ft tokenizes, with their loss masks (sft); "
                                    f"{recipe.method}'s rows are tokenized by TRL's trainer, its own way. Drop --show, "
                                    "or show the rows of an SFT recipe on the same data.")])
    from ..data.show import show_rows
    problems = loading.gguf_problems(recipe.model)
    if problems:
        raise loaded.error(problems)
    processing_class = locate.start_processing_class(recipe.model)
    try:
        return show_rows(recipe, processing_class, data.chat_template_for(recipe, processing_class), count, colour)
    except RecipeError as exc:
        raise loaded.error(exc.problems) from None
