"""``data.eval_exact_match``: after training, the share of held-out prompts the model answers exactly (greedy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from pydantic import Field, PositiveInt, StrictStr

from .base import Section
from .errors import Problem
from .rules import rule

if TYPE_CHECKING:
    from .schema import DataSource  # resolved in schema.py's namespace, where DataSection uses these settings


class ExactMatchSettings(Section):
    """Greedy answers to the first ``n`` held-out prompts, compared with their expected answers (stripped text) at
    the end of ``ft train``; printed and recorded under ``exact_match`` in summary.json (``ft.exact_match``)."""

    n: PositiveInt = Field(200, description="Held-out prompts to answer (the first n rows).")
    max_new_tokens: PositiveInt = Field(8, description="Tokens generated per answer.")
    batch_size: PositiveInt = Field(64, description="Prompts generated together.")
    source: Optional[DataSource] = Field(
        None, description="Held-out rows to score instead of `data.eval` (e.g. {path: prompts-eval.jsonl, "
        "format: prompt} for GRPO): chat (last assistant turn), preference (chosen), prompt (`field`), text.")
    field: StrictStr = Field("answer", description="`prompt` rows: the field holding the expected answer.")


@rule
def exact_match_needs_held_out_rows(recipe) -> list[Problem]:
    """The exact match scores held-out rows: the recipe's evaluation data, or the setting's own source."""
    settings = recipe.data.eval_exact_match
    if settings is not None and settings.source is None and not recipe.data.has_eval:
        return [Problem("data.eval_exact_match", "scores held-out prompts, and the recipe has no `data.eval`; add "
                        "one, or give `data.eval_exact_match.source` (e.g. {path: held-out.jsonl, format: prompt}).")]
    return []
