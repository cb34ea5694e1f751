"""The recipe: frozen Pydantic sections. The validated ``Recipe`` is the only input of every builder.

Relative input paths (``model.name`` when it names a local directory, ``data.*.path``) are resolved
against the recipe file's directory, so a recipe works from any working directory. Output paths
(``train.output_dir``, ``data.prepared_path``) are relative to where ``ft`` runs.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictBool, StrictStr, create_model, field_validator

from .adapter import AdapterSection
from .base import Section, resolve_input_path
from .distributed import DistributedSection, LaunchSection
from .evaluation import ExactMatchSettings
from .hooks import HooksMixin
from .methods import METHODS, moved_to_method_section
from .names import FORMATS
from .optimization import OptimizerSection, SchedulerSection
from .train_section import train_section_model

Number = Union[int, float]


class QuantizationSection(Section):
    """QLoRA-style loading through bitsandbytes, on any device the installed bitsandbytes supports (CUDA, and the CPU
    since bitsandbytes 0.45's multi-backend release: slowly, but enough to test a QLoRA recipe)."""

    bits: Literal[4, 8] = Field(description="Load the base model's linear weights in 4 or 8 bits.")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type.")
    double_quant: StrictBool = Field(True, description="Quantize the quantization constants too (4-bit).")
    compute_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="dtype the 4-bit matmuls compute in."
    )


class ModelSection(Section):
    name: StrictStr = Field(description="A hub id (org/name) or a local directory with config.json.")
    init: Literal["pretrained", "random"] = Field(
        "pretrained", description="`pretrained` loads weights; `random` builds the model from its config."
    )
    revision: StrictStr | None = Field(None, description="Hub revision (branch, tag or commit).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; `auto` keeps the checkpoint's (float32 for random init)."
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"] | None = (
        Field(None, description="Attention kernel; unset lets transformers choose.")
    )
    trust_remote_code: StrictBool = Field(False, description="Allow custom modelling code from the hub.")
    quantization: QuantizationSection | None = None

    resolve_name = field_validator("name")(resolve_input_path)


class DataSource(Section):
    path: StrictStr = Field(description="A local file (.jsonl/.json/.parquet/.csv/.txt), a `save_to_disk` "
                            "directory, or a hub dataset id.")
    format: Literal[FORMATS] = Field("chat", description="How rows are read: " + ", ".join(FORMATS) + ".")
    split: StrictStr = Field("train", description="Split to read (hub datasets and dataset dicts).")
    name: Optional[StrictStr] = Field(None, description="Hub dataset configuration name.")
    revision: Optional[StrictStr] = Field(None, description="Hub dataset revision (a commit pins the data).")
    fraction: Number = Field(1.0, gt=0, le=1,
                             description="Share of this source's rows to use (sampled with data.seed).")
    fields: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="Canonical name -> this source's name, for columns and message keys, "
        "e.g. {messages: conversations, role: from, content: value} for ShareGPT.")
    roles: dict[StrictStr, StrictStr] = Field(
        default_factory=dict,
        description="This source's role names -> canonical roles, e.g. {human: user, gpt: assistant}.")

    resolve_path = field_validator("path")(resolve_input_path)


ExactMatchSettings.model_rebuild()  # its `source` is a DataSource, defined just above


class SplitRatio(Section):
    split_ratio: Number = Field(gt=0, lt=1, description="Share of the training rows held out for evaluation.")


class DataSection(Section):
    train: list[DataSource] = Field(min_length=1, description="Training sources, mixed (concatenated, then shuffled "
                                    "by the trainer).")
    eval: Union[list[DataSource], SplitRatio] = Field(
        default_factory=list, description="Evaluation sources, or {split_ratio: 0.05} to hold out training rows.")
    seed: int = Field(42, description="Seed for fractions and split_ratio.")
    max_length: PositiveInt = Field(1024, description="Tokens per sequence.")
    truncation: Literal["truncate", "drop"] = Field(
        "truncate", description="Rows longer than max_length: cut to max_length, or dropped (both counted).")
    packing: StrictBool = Field(False, description="Pack several rows into each sequence (SFT only).")
    train_on: Literal["assistant", "all"] = Field(
        "assistant", description="Which tokens carry loss: assistant turns (chat) / completions (text) only, or all.")
    chat_template: Optional[StrictStr] = Field(
        None, description="Unset: the tokenizer's own; `chatml` or `llama3`; or an inline Jinja template.")
    num_proc: Optional[PositiveInt] = Field(None, description="Processes for tokenization.")
    prepared_path: Optional[StrictStr] = Field(
        None, description="Where `ft preprocess` writes the tokenized dataset and `ft train` reads it "
        "(relative to the working directory).")
    require_prepared: StrictBool = Field(
        False, description="Refuse to train when the prepared dataset is missing or stale instead of rebuilding it.")
    on_bad_row: Literal["error", "skip"] = Field(
        "error", description="A row that does not fit its format: stop and list it, or skip it (counted per reason).")
    eval_exact_match: Optional[ExactMatchSettings] = Field(None, description="Greedy exact match after training.")

    @property
    def eval_sources(self) -> list[DataSource]:
        return self.eval if isinstance(self.eval, list) else []

    @property
    def has_eval(self) -> bool:
        return bool(self.eval_sources) or isinstance(self.eval, SplitRatio)


class Recipe(HooksMixin):
    """The sections every recipe has. A recipe is an instance of ``recipe_model(method)``: these sections plus the
    method's ``train:`` fields and one optional section per method that has settings (``dpo:``, ``grpo:``, …)."""

    method: Literal[tuple(METHODS)] = Field("sft", description="Training method: " + ", ".join(METHODS) + ".")
    model: ModelSection
    adapter: AdapterSection | None = None
    data: DataSection
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    launch: LaunchSection | None = Field(None, description="The processes `ft train` starts (docs/distributed.md).")
    distributed: DistributedSection = Field(default_factory=DistributedSection, description="ddp, fsdp or deepspeed.")

    @property
    def method_section(self):
        """This method's own section (``dpo:`` for DPO, …), or None when the method has none or the recipe left it
        out (the builders then use the section's defaults)."""
        return getattr(self, self.method, None)

    @property
    def train_args(self) -> dict[str, Any]:
        """The ``train:`` fields the recipe set explicitly (unset ones keep TRL's defaults)."""
        return self.train.model_dump(exclude_unset=True)  # type: ignore[attr-defined]


@cache
def recipe_model(method: str) -> type[Recipe]:
    """The Recipe class for one method: the common sections, every method's section (a section of another
    method is refused by a rule, with a clearer message than "unknown key") and that method's ``train:``."""
    train = train_section_model(method, tuple(sorted(moved_to_method_section(method).items())))
    sections = {name: (Optional[m.section], Field(None, description=f"{name.upper()} settings (method: {name} only)."))
                for name, m in METHODS.items() if m.section is not None}
    return create_model(
        f"{method.upper()}Recipe",
        __base__=Recipe,
        method=(Literal[method], Field(method, description="Training method.")),
        **sections,
        train=(train, Field(default_factory=train, description="Trainer settings (TrainingArguments/TRL names).")),
    )
