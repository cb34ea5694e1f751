"""``ft preprocess``: the data of a recipe tokenized once, with loss masks and a length column, into
``data.prepared_path``, where ``ft train`` (and every rank of a multi-process run) reads it."""

from __future__ import annotations

from collections.abc import Callable

from .. import data
from ..model import loading, locate
from ..recipe import LoadedRecipe, Problem


def preprocess(loaded: LoadedRecipe, say: Callable[[str], None] = print) -> data.PreparedData:
    """Tokenize once into ``data.prepared_path`` (a no-op when the fingerprint already matches)."""
    recipe = loaded.recipe
    if recipe.data.prepared_path is None:
        raise loaded.error([Problem("data.prepared_path", "`ft preprocess` writes the tokenized dataset there; "
                                    "set it (e.g. prepared/my-run) so `ft train` can reuse it.")])
    problems = loading.gguf_problems(recipe.model)
    if problems:
        raise loaded.error(problems)
    tokenizer = locate.start_processing_class(recipe.model)
    return data.prepare_data(recipe, tokenizer, data.chat_template_for(recipe, tokenizer), say)
