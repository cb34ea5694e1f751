"""The ``train:`` section: every field of the method's TRL config, type-checked, built from a table.

The table (``train_fields.json``) is generated from the installed transformers/TRL classes by
``scripts/gen_train_fields.py``; reading it keeps ``ft validate`` free of torch imports.
Fields that ft owns elsewhere (optimizer, scheduler, data, model settings) are rejected here with a
pointer to the key that replaces them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    create_model,
    model_validator,
)

from .base import drop_nulls

TABLE_PATH = Path(__file__).with_name("train_fields.json")

# train.<field> -> the recipe key that holds it instead
MOVED = {
    "optim": "optimizer.name",
    "optim_args": "optimizer.args",
    "optim_target_modules": "optimizer.target_modules",
    "learning_rate": "optimizer.lr",
    "weight_decay": "optimizer.weight_decay",
    "adam_beta1": "optimizer.betas",
    "adam_beta2": "optimizer.betas",
    "adam_epsilon": "optimizer.eps",
    "lr_scheduler_type": "scheduler.type",
    "lr_scheduler_kwargs": "scheduler.kwargs",
    "warmup_steps": "scheduler.warmup_steps",
    "warmup_ratio": "scheduler.warmup_steps",
    "max_length": "data.max_length",
    "packing": "data.packing",
    "dataset_num_proc": "data.num_proc",
    "assistant_only_loss": "data.train_on",
    "completion_only_loss": "data.train_on",
    "model_init_kwargs": "model",
    "trust_remote_code": "model.trust_remote_code",
    "resume_from_checkpoint": "the --resume option of `ft train`",
}

# train.<field> -> why a recipe never carries it, and where the value goes instead. These are credentials: a recipe
# file gets shared and committed, and transformers pickles its arguments (`train:` verbatim) into training_args.bin,
# which it writes into every checkpoint and into final/ and uploads with every push. The error never repeats the value.
SECRETS = {
    "hub_token": "a token is never kept in a recipe: the file would hold it, and transformers would pickle it into "
                 "training_args.bin, which goes into every checkpoint and final/ and up with every push to the Hub. "
                 "Remove it and set the HF_TOKEN environment variable or run `hf auth login`: transformers finds "
                 "the token there when it pushes",
}

_StrictFloat = Union[StrictInt, float]  # YAML `1` is a fine float; strings are not
_KINDS: dict[str, Any] = {
    "bool": StrictBool,
    "int": StrictInt,
    "float": _StrictFloat,
    "str": StrictStr,
    "dict": Union[dict[str, Any], StrictStr],
    "list[str]": list[StrictStr],
    "list[float]": list[_StrictFloat],
    "str|list[str]": Union[StrictStr, list[StrictStr]],
    "str|bool": Union[StrictBool, StrictStr],
    "int|str": Union[StrictInt, StrictStr],
}


def _describe(spec: dict) -> str:
    default = spec.get("default")
    return (spec.get("help") or "").strip() + (f" (TRL default: {default!r})" if default is not None else "")


@cache
def field_table() -> dict:
    return json.loads(TABLE_PATH.read_text())


def method_fields(method: str) -> dict[str, dict]:
    table = field_table()
    return {**table["base"], **table["methods"][method]["fields"]}


def _moved(target: str):
    def reject(value):
        raise ValueError(f"is not set under `train:` in ft recipes; set `{target}` instead")

    return reject


def _secret(why: str):
    def reject(value):
        raise ValueError(why)

    return reject


def _unsupported(name: str, python_type: str):
    def reject(value):
        raise ValueError(f"takes a Python object ({python_type}) and cannot be set from a recipe")

    return reject


def _annotation(name: str, spec: dict, moved: dict[str, str]):
    if name in moved:
        return Annotated[Any, AfterValidator(_moved(moved[name]))]
    if name in SECRETS:
        return Annotated[Any, AfterValidator(_secret(SECRETS[name]))]
    kind = spec["kind"]
    if kind == "unsupported":
        return Annotated[Any, AfterValidator(_unsupported(name, spec.get("python_type", "")))]
    tp = Literal[tuple(spec["choices"])] if kind == "choice" else _KINDS[kind]
    return Optional[tp] if spec.get("nullable") else tp


class TrainSection(BaseModel):
    """The base of each method's ``train:`` model (strictness is per field type). ``x: null`` leaves ``x``
    unset, so it is not passed to TRL (``train_args`` holds only the fields set) and ft's own defaults for
    unset keys (bf16, use_cpu, …) still apply."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    OWN: ClassVar[frozenset[str]] = frozenset({"preflight"})  # ft's own keys: not passed to TRL (``Recipe.train_args``)

    preflight: Optional[StrictBool] = Field(
        None, description="ft's own key: before the first step, run forward and backward on the largest batch the data "
        "makes, measure its memory and stop with exit 2 and the changes that fit if it runs out (docs/outputs.md). "
        "Unset: on where memory can run out (a CUDA device), off on a CPU; true or false to choose.")

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        return drop_nulls(cls, data)


@cache
def train_section_model(method: str, moved_to_section: tuple[tuple[str, str], ...] = ()) -> type[BaseModel]:
    """A frozen Pydantic model whose fields are the method config's fields; all default to unset.

    ``moved_to_section`` lists more (TRL field, recipe key) pairs to reject, e.g. ``beta`` → ``dpo.beta``.
    """
    moved = {**MOVED, **dict(moved_to_section)}
    fields = {
        name: (_annotation(name, spec, moved),
               Field(default=None, description=f"Refused: {SECRETS[name]}." if name in SECRETS else _describe(spec)))
        for name, spec in sorted(method_fields(method).items())
    }
    return create_model(f"{method.upper()}TrainSection", __base__=TrainSection, **fields)
