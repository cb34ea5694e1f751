"""The machinery the Axolotl mapping modules share: the registry of key handlers and the context they write through.

A handler is registered for the Axolotl keys it owns (``@handles("adapter", "lora_r", …)``) and runs once when the
config has any of them. It reads the config (``ctx.cfg``, empty values already taken out and recorded as ignored)
and, for each key it owns that the config has, calls one of ``ctx.put`` / ``ctx.train`` (carried), ``ctx.off``
(ignored: no effect) or ``ctx.skip`` (not carried). A key no handler records is reported as not carried by
``axolotl.py`` (with a reason from ``REASONS`` there, or "no ft equivalent").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..recipe import Problem
from ..recipe.methods import DEFAULT_METHOD, moved_to_method_section
from ..recipe.train_section import MOVED, method_fields
from .axolotl_types import family_of
from .ledger import CARRIED, IGNORED, NOT_CARRIED, Draft, Entry, Ledger


@dataclass
class Ctx:
    cfg: dict  # the Axolotl config, without its empty keys
    draft: Draft = field(default_factory=Draft)
    ledger: Ledger = field(default_factory=Ledger)
    method: str = DEFAULT_METHOD  # the ft method the config trains with (decided first, from `rl`)
    modality: str = "text"  # what its rows hold: text, vision or audio (decided first: ``axolotl_vision.modality_of``)
    refusals: list[Problem] = field(default_factory=list)  # what ft cannot train, whatever the keys say

    @property
    def family(self) -> str:
        """Axolotl's name for the method (``axolotl_types.family_of``)."""
        return family_of(self.method)

    def has(self, key: str) -> bool:
        return key in self.cfg

    def get(self, key: str, default: Any = None) -> Any:
        return self.cfg.get(key, default)

    def put(self, key: str, target: str | None, value: Any = None, why: str = "", *, fixed: bool = False) -> None:
        """``key`` carried to ft's ``target`` (None: ft's default already does what it says, nothing written).
        ``fixed``: never moved to not carried when ft refuses the recipe (the user must see that refusal)."""
        if target is not None:
            self.draft.set(target, value)
        self.ledger.record(Entry(key, self._value(key), CARRIED, (target,) if target else (), why, fixed))

    def same(self, key: str, default: str) -> None:
        """``key`` carried as ft's own default, which does what its value says (nothing written); ``default`` says
        what ft does."""
        self.ledger.record(Entry(key, self._value(key), CARRIED, why=default, same=True))

    def carry(self, key: str, targets: tuple[str, ...], why: str = "") -> None:
        """``key`` carried into ft keys the handler writes itself (e.g. the items of ``data.train``): recorded only,
        and fixed."""
        self.ledger.record(Entry(key, self._value(key), CARRIED, targets, why, fixed=True))

    def put_many(self, key: str, values: dict[str, Any], why: str = "") -> None:
        """``key`` carried to several ft keys at once."""
        for target, value in values.items():
            self.draft.set(target, value)
        self.ledger.record(Entry(key, self._value(key), CARRIED, tuple(values), why))

    def train(self, key: str, name: str, value: Any, why: str = "") -> None:
        """``key`` carried to ``train.<name>``, when the method's TRL config has that field; else not carried."""
        reason = train_field_problem(self.method, name)
        if reason:
            self.skip(key, reason)
        else:
            self.put(key, f"train.{name}", value, why)

    def default(self, target: str, value: Any, why: str) -> None:
        """Write Axolotl's default for a key the config leaves unset, where ft's default differs."""
        self.draft.set(target, value)
        self.ledger.defaults.append((target, value, why))

    def off(self, key: str, why: str) -> None:
        self.ledger.record(Entry(key, self._value(key), IGNORED, why=why))

    def skip(self, key: str, why: str) -> None:
        self.ledger.record(Entry(key, self._value(key), NOT_CARRIED, why=why))

    def refuse(self, key: str, target: str, why: str) -> None:
        """``key`` not carried, and the recipe refused for it (written, exit 1): the config trains something ft does
        not (``why``), which no key of the recipe would fix. ``target``: the recipe key the refusal names."""
        self.skip(key, why)
        self.refusals.append(Problem(target, f"the Axolotl config's `{key}: {self._value(key)}`: {why}"))

    def _value(self, key: str) -> Any:
        node: Any = self.cfg
        for part in key.split("."):
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node


def train_field_problem(method: str, name: str) -> str:
    """Why ``train.<name>`` cannot hold a value for ``method`` ("" when it can)."""
    moved = {**MOVED, **moved_to_method_section(method)}
    if name in moved:
        return f"ft sets it as `{moved[name]}`"
    if name not in method_fields(method):
        return f"`{name}` is not a setting of ft's method `{method}` (its TRL config has no such field)"
    return ""


@dataclass(frozen=True)
class Handler:
    keys: tuple[str, ...]
    run: Callable[[Ctx], None]


HANDLERS: list[Handler] = []


def handles(*keys: str):
    """Register a handler for the Axolotl keys it owns."""

    def register(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        HANDLERS.append(Handler(keys, fn))
        return fn

    return register


def number(value: Any) -> Any:
    """A number written as text (Axolotl reads YAML 1.1, where `2e-5` is a string) as a number; else unchanged."""
    if isinstance(value, str):
        try:
            parsed = float(value)
        except ValueError:
            return value
        return int(parsed) if parsed.is_integer() and "." not in value and "e" not in value.lower() else parsed
    return value


def _is_number(value: Any) -> bool:
    value = number(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# what a value must be for the handlers to read it (a config Axolotl itself would refuse otherwise): kind -> test
KINDS: dict[str, Callable[[Any], bool]] = {
    "a number": _is_number,
    "text": lambda v: isinstance(v, str),
    "a mapping": lambda v: isinstance(v, dict),
    "a list": lambda v: isinstance(v, list),
    "text or a list of text": lambda v: isinstance(v, str) or (isinstance(v, list) and all(
        isinstance(x, str) for x in v)),
    "text or a mapping": lambda v: isinstance(v, (str, dict)),
    "a list or a mapping": lambda v: isinstance(v, (list, dict)),
    "a mapping of lists": lambda v: isinstance(v, dict) and all(isinstance(x, list) or x is None for x in v.values()),
    "true, false or text": lambda v: isinstance(v, (bool, str)),
    "a number or [width, height]": lambda v: _is_number(v) or (isinstance(v, list) and len(v) == 2 and all(
        _is_number(x) for x in v)),
}
_NUMBERS = ("micro_batch_size", "eval_batch_size", "gradient_accumulation_steps", "batch_size", "num_epochs",
            "max_steps", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
            "warmup_steps", "warmup_ratio", "cosine_min_lr_ratio", "cosine_constant_lr_ratio", "logging_steps",
            "eval_steps", "save_steps", "evals_per_epoch", "saves_per_epoch", "save_total_limit", "seed",
            "neftune_noise_alpha", "early_stopping_patience", "sequence_len", "val_set_size", "lora_r", "lora_alpha",
            "lora_dropout", "rl_beta", "orpo_alpha", "kto_desirable_weight", "kto_undesirable_weight",
            "dataset_num_proc", "dataset_processes", "dpo_label_smoothing")
_TEXTS = ("base_model", "base_model_config", "revision_of_model", "output_dir", "optimizer", "lr_scheduler",
          "chat_template", "chat_template_jinja", "adapter", "rl", "hub_model_id", "hub_strategy", "hub_revision",
          "attn_implementation", "dataset_prepared_path", "lora_model_dir", "model_type", "tokenizer_type",
          "excess_length_strategy", "wandb_project", "wandb_name", "trackio_project_name", "trackio_run_name",
          "trackio_space_id", "mlflow_experiment_name", "mlflow_run_name", "processor_type", "image_resize_algorithm")
_MAPPINGS = ("gradient_checkpointing_kwargs", "lr_scheduler_kwargs", "bnb_config_kwargs", "trl", "fsdp_config",
             "special_tokens", "chat_template_kwargs")
EXPECTED: dict[str, str] = {  # Axolotl key -> its kind
    **dict.fromkeys(_NUMBERS, "a number"), **dict.fromkeys(_TEXTS, "text"), **dict.fromkeys(_MAPPINGS, "a mapping"),
    **dict.fromkeys(("datasets", "test_datasets", "pretraining_dataset"), "a list or a mapping"),
    **dict.fromkeys(("plugins", "fsdp", "lora_target_modules", "optim_target_modules"), "text or a list of text"),
    "lora_modules_to_save": "text or a list of text", "dpo_loss_type": "text or a list of text",
    "optim_args": "text or a mapping", "deepspeed": "text or a mapping", "bf16": "true, false or text",
    "tf32": "true, false or text", "gradient_checkpointing": "true, false or text",
    "image_size": "a number or [width, height]",
}
ENTRY_EXPECTED: dict[str, str] = {  # dataset-entry key -> its kind
    "type": "text or a mapping", "roles": "a mapping of lists", "message_property_mappings": "a mapping",
    "data_files": "text or a list of text", "field_messages": "text", "field_chosen": "text",
    "field_rejected": "text", "field": "text", "text_column": "text", "message_field_role": "text",
    "message_field_content": "text", "field_thinking": "text", "field_tools": "text", "template_thinking_key": "text",
}


def misfit(expected: dict[str, str], key: str, value: Any) -> str:
    """Why ``value`` cannot be read as Axolotl's ``key`` ("" when it can)."""
    kind = expected.get(key.rpartition(".")[2])
    if kind is None or KINDS[kind](value):
        return ""
    return f"Axolotl reads {kind} here, not {type(value).__name__} (it would refuse this config)"
