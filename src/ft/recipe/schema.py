"""The recipe: frozen Pydantic sections. The validated ``Recipe`` is the only input of every builder.

Relative input paths (``model.name`` when it names a local directory, ``data.*.path``) are resolved
against the recipe file's directory, so a recipe works from any working directory. Output paths
(``train.output_dir``, ``data.prepared_path``) are relative to where ``ft`` runs. Each section has its module
(``data_section``, ``adapter``, ``optimization``, ``distributed``, ``hooks``, the method sections in ``methods``);
the model section and the recipe itself are here.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal, Optional, Union

from pydantic import Field, StrictBool, StrictStr, create_model, field_validator

from .adapter import AdapterSection
from .base import Section, resolve_input_path
from .benchmarks import BenchmarksSection
from .data_section import DataSection
from .distributed import DistributedSection, LaunchSection
from .hooks import HooksMixin
from .methods import DEFAULT_METHOD, METHODS, MODALITIES, moved_to_method_section
from .optimization import OptimizerSection, SchedulerSection
from .train_section import method_fields, train_section_model

Number = Union[int, float]


class QuantizationSection(Section):
    """QLoRA-style loading through bitsandbytes, on any device the installed bitsandbytes supports (CUDA, and the CPU
    with its multi-backend releases: slowly, but enough to test a QLoRA recipe)."""

    bits: Literal[4, 8] = Field(description="Load the base model's linear weights in 4 or 8 bits.")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type.")
    double_quant: StrictBool = Field(True, description="Quantize the quantization constants too (4-bit).")
    compute_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="dtype the 4-bit matmuls compute in."
    )


class ModelSection(Section):
    name: StrictStr = Field(description="A hub id (org/name), a local directory with config.json (or with "
                            "`gguf_file`), or a run ft train left (its directory, final/ or a checkpoint-N/): a LoRA "
                            "run's adapter is folded into its base as it loads (docs/adapters.md).")
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
    gguf_file: StrictStr | None = Field(
        None, description="A GGUF file (llama.cpp's format) to take the weights, config and tokenizer from, "
        "de-quantized to `dtype`: its name inside `name` (a local directory or a hub repository), as transformers' "
        "`gguf_file`. Needs the `gguf` package (`pip install 'ft[gguf]'`).")
    modality: Literal[MODALITIES] | None = Field(
        None, description="What the model reads: `text`, or `vision` (images and text, loaded as "
        "AutoModelForImageTextToText with its processor). Unset: read from its config (vision for a family "
        "transformers has no text-only class for). Set `vision` for a family that has both (Gemma 3, Qwen3.5, "
        "Llama 4) to train it on images; docs/vision.md.")
    freeze: list[Literal["vision", "projector"]] | None = Field(
        None, description="A vision-language model's parts that do not train in a full fine-tune: `vision` (its "
        "vision tower), `projector` (what maps image features into the language model); docs/vision.md.")

    resolve_name = field_validator("name")(resolve_input_path)


class Recipe(HooksMixin):
    """The sections every recipe has. A recipe is an instance of ``recipe_model(method)``: these sections plus the
    method's ``train:`` fields and one optional section per method that has settings (``dpo:``, ``grpo:``, …)."""

    method: Literal[tuple(METHODS)] = Field(DEFAULT_METHOD, description="Training method: " + ", ".join(METHODS) + ".")
    model: ModelSection
    adapter: AdapterSection | None = None
    data: DataSection
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    launch: LaunchSection | None = Field(None, description="The processes `ft train` starts (docs/distributed.md).")
    distributed: DistributedSection = Field(default_factory=DistributedSection, description="ddp, fsdp or deepspeed.")
    benchmarks: Optional[BenchmarksSection] = Field(None, description="lm-eval tasks the run scores the model on, "
                                                    "before, at the end and at checkpoints (docs/eval.md).")

    @property
    def method_section(self):
        """This method's own section (``dpo:`` for DPO, …), or None when the method has none or the recipe left it
        out (the builders then use the section's defaults)."""
        return getattr(self, self.method, None)

    @property
    def train_args(self) -> dict[str, Any]:
        """The ``train:`` fields the recipe set explicitly (unset ones keep TRL's defaults)."""
        return self.train.model_dump(exclude_unset=True, exclude=set(self.train.OWN))  # type: ignore[attr-defined]

    def effective(self, key: str):
        """A ``train:`` value as the trainer will see it: the recipe's, else the method's TRL default."""
        args = self.train_args
        return args[key] if key in args else method_fields(self.method)[key]["default"]


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
