"""Recipe keys that plug code into the trainer: ``loss``, ``callbacks``, ``metrics``."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictStr, field_validator, model_validator

from .base import Section
from .names import BUILTIN_CALLBACKS, METRICS

_REFERENCE = re.compile(r"[\w.]+:\w+")


def check_reference(value: Optional[str]) -> Optional[str]:
    if value is not None and not _REFERENCE.fullmatch(value):
        raise ValueError("must look like `module:name` (e.g. my_losses:weighted_ce)")
    return value


class BuiltinOrUser(Section):
    """A spec naming either a built-in (``name``) or user code (the field in ``USER_FIELD``), never both."""

    USER_FIELD: ClassVar[str] = ""
    KIND: ClassVar[str] = ""
    MORE_SOURCES: ClassVar[dict[str, str]] = {}  # other fields that can name the source: field -> what it names

    @model_validator(mode="after")
    def one_source(self):
        sources = ("name", self.USER_FIELD, *self.MORE_SOURCES)
        if sum(getattr(self, field) is not None for field in sources) != 1:
            named = [f"`name` (a built-in {self.KIND})", f"`{self.USER_FIELD}` (module:name)",
                     *(f"`{field}` ({what})" for field, what in self.MORE_SOURCES.items())]
            raise ValueError(f"give exactly one of {', '.join(named[:-1])} or {named[-1]}")
        return self


class CallbackSpec(BuiltinOrUser):
    """A built-in callback by ``name`` or a ``transformers.TrainerCallback`` subclass by ``cls: module:Class``."""

    name: Optional[Literal[BUILTIN_CALLBACKS]] = Field(None, description="Built-in callback.")
    cls: Optional[StrictStr] = Field(None, description="`module:Class` of a TrainerCallback subclass.")
    patience: PositiveInt = Field(3, description="early_stopping: evaluations without improvement before stopping.")
    threshold: Union[int, float] = Field(0.0, ge=0, description="early_stopping: least improvement that counts.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for `cls`.")

    USER_FIELD: ClassVar[str] = "cls"
    KIND: ClassVar[str] = "callback"

    checked_cls = field_validator("cls")(check_reference)


class HooksMixin(Section):
    """Fields shared by every recipe (mixed into the recipe model)."""

    loss: Optional[StrictStr] = Field(
        None, description="SFT: `module:function` used as compute_loss_func(outputs, labels, num_items_in_batch).")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="Trainer callbacks.")
    metrics: list[Literal[METRICS]] = Field(
        default_factory=list, description="Evaluation metrics computed batch by batch: token_accuracy, perplexity.")

    checked_loss = field_validator("loss")(check_reference)
