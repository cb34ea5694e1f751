"""The ``adapter:`` section: a PEFT LoRA adapter (with DoRA or rsLoRA), trained on a frozen base.

``target_modules`` is ``all-linear`` (every linear layer but the output head), a list of module names (matched
against the end of each module's name, as PEFT does: ``q_proj`` matches ``model.layers.0.self_attn.q_proj``) or
one regular expression, matched against the whole module name (``.*\\.(q|v)_proj``). ``path`` continues from a
saved adapter (a run's ``final/`` or a checkpoint): its own ``adapter_config.json`` then says rank, targets and the
rest, so those keys stay unset here.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictBool, StrictStr, field_validator

from .base import Section, resolve_input_path
from .optimization import check_regex

# the keys that shape a new adapter; an adapter continued from `path` keeps the ones it was saved with
SHAPE_KEYS = ("r", "alpha", "dropout", "target_modules", "modules_to_save", "use_dora", "use_rslora")


def _regex_or_names(value):
    if isinstance(value, str) and value != "all-linear":
        check_regex(value)
    return value


class AdapterSection(Section):
    kind: Literal["lora"] = Field("lora", description="Adapter type (PEFT).")
    r: PositiveInt = Field(16, description="LoRA rank.")
    alpha: PositiveInt = Field(32, description="LoRA scaling numerator (lora_alpha).")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA branch.")
    target_modules: Union[Literal["all-linear"], list[StrictStr], StrictStr] = Field(
        "all-linear", description="`all-linear`, module names (e.g. [q_proj, v_proj]), or one regular expression "
        "matched against whole module names.")
    modules_to_save: Optional[list[StrictStr]] = Field(
        None, description="Modules trained fully and saved with the adapter (e.g. [lm_head]).")
    use_dora: StrictBool = Field(False, description="DoRA: learn a magnitude per output and the LoRA direction.")
    use_rslora: StrictBool = Field(False, description="rsLoRA: scale by alpha/sqrt(r) instead of alpha/r.")
    path: Optional[StrictStr] = Field(
        None, description="Continue training a saved adapter (a directory with adapter_config.json).")

    checked_targets = field_validator("target_modules")(_regex_or_names)
    resolve_path = field_validator("path")(resolve_input_path)
