"""The training methods: one declarative table (``METHODS``), and the sections of the methods that have settings
of their own (``dpo:``, ``grpo:``, ``kto:``, ``orpo:``).

``METHODS`` is what the rest of ft knows about a method: the recipe schema (``method:`` and the method sections),
the rules (which data formats it trains on), the data pipeline (whether ft tokenizes its rows) and
``scripts/gen_train_fields.py`` (its TRL config class) all read it. Its trainer is built by the module named
after it, ``ft.trainers.<method>``.

Each section's fields map onto the method's TRL config fields (``CONFIG_FIELDS``): those TRL fields are rejected
under ``train:`` with a pointer to the section, so every setting has exactly one home, and the method's builder
in ``ft.trainers`` passes each one on. Defaults are TRL's own, read from the generated field table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictStr, field_validator

from .base import Section, resolve_input_path
from .hooks import BuiltinOrUser, check_reference
from .names import BUILTIN_REWARDS
from .train_section import method_fields

Number = Union[int, float]


def trl_default(method: str, name: str):
    return method_fields(method)[name]["default"]


class MethodSection(Section):
    """A method's own settings. ``CONFIG_FIELDS`` (section field -> TRL config field) are the TRL fields it owns:
    they are refused under ``train:`` with a pointer here, and the method's builder passes each one on.
    ``CONFIG_MOVED`` names more TRL fields refused under ``train:`` whose value comes from elsewhere."""

    CONFIG_FIELDS: ClassVar[dict[str, str]] = {}
    CONFIG_MOVED: ClassVar[dict[str, str]] = {}


class DpoSection(MethodSection):
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {"beta": "beta", "loss_type": "loss_type"}

    beta: Number = Field(trl_default("dpo", "beta"), ge=0, description="Strength of the implicit KL penalty.")
    loss_type: list[StrictStr] = Field(trl_default("dpo", "loss_type"), description="DPO loss variant(s).")
    ref_model: Optional[StrictStr] = Field(
        None, description="Reference model (hub id or directory); unset: a frozen copy of the start model, "
        "or the base with the adapter disabled when training LoRA.")

    resolve_ref = field_validator("ref_model")(resolve_input_path)


class RewardSpec(BuiltinOrUser):
    """A GRPO reward: a built-in by ``name`` or a user function by ``fn: module:function``."""

    name: Optional[Literal[BUILTIN_REWARDS]] = Field(None, description="Built-in reward.")
    fn: Optional[StrictStr] = Field(None, description="User reward `module:function` (a module next to the recipe "
                                    "is importable).")
    weight: Number = Field(1.0, description="Weight of this reward in the sum.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the reward.")

    USER_FIELD: ClassVar[str] = "fn"
    KIND: ClassVar[str] = "reward"

    checked_fn = field_validator("fn")(check_reference)


class GrpoSection(MethodSection):
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {
        name: name for name in ("num_generations", "max_completion_length", "steps_per_generation",
                                "generation_batch_size", "temperature", "top_p", "top_k", "beta")
    }

    num_generations: PositiveInt = Field(trl_default("grpo", "num_generations"),
                                         description="Completions sampled per prompt.")
    max_completion_length: PositiveInt = Field(trl_default("grpo", "max_completion_length"),
                                               description="Token limit of each completion.")
    steps_per_generation: Optional[PositiveInt] = Field(
        None, description="Optimizer steps served by one generation round (unset: gradient_accumulation_steps).")
    generation_batch_size: Optional[PositiveInt] = Field(
        None, description="Prompts×completions per generation round (alternative to steps_per_generation).")
    temperature: Number = Field(trl_default("grpo", "temperature"), gt=0, description="Sampling temperature.")
    top_p: Number = Field(trl_default("grpo", "top_p"), gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(trl_default("grpo", "top_k"), ge=0, description="Top-k sampling (0: off).")
    beta: Number = Field(trl_default("grpo", "beta"), ge=0, description="KL coefficient (0: no reference model).")
    rewards: list[RewardSpec] = Field(min_length=1, description="Reward functions, summed with their weights.")

    CONFIG_MOVED: ClassVar[dict[str, str]] = {"reward_weights": "grpo.rewards[].weight"}


class KtoSection(MethodSection):
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {
        "beta": "beta", "desirable_weight": "desirable_weight", "undesirable_weight": "undesirable_weight"}

    beta: Number = Field(trl_default("kto", "beta"), ge=0, description="KTO beta.")
    desirable_weight: Number = Field(trl_default("kto", "desirable_weight"), gt=0,
                                     description="Weight of desirable (chosen) examples.")
    undesirable_weight: Number = Field(trl_default("kto", "undesirable_weight"), gt=0,
                                       description="Weight of undesirable (rejected) examples.")


class OrpoSection(MethodSection):
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {"beta": "beta"}

    beta: Number = Field(trl_default("orpo", "beta"), gt=0, description="ORPO lambda (odds-ratio weight).")


@dataclass(frozen=True)
class Method:
    """What ft knows about one training method (its trainer is built by ``ft.trainers.<name>``)."""

    section: type[MethodSection] | None  # its own recipe section, named after the method; None: no settings
    formats: frozenset[str]  # the data formats (``data.*.format``) it trains on
    config: str  # its TRL config class, ``module:Class`` (imported only by ``ft train`` and the field generator)
    ft_tokenizes: bool  # True: ft tokenizes and masks the rows itself; False: TRL's trainer tokenizes canonical rows


_PREFERENCE = frozenset({"preference"})
METHODS: dict[str, Method] = {
    "sft": Method(None, frozenset({"chat", "instruction", "text"}), "trl:SFTConfig", ft_tokenizes=True),
    "dpo": Method(DpoSection, _PREFERENCE, "trl:DPOConfig", ft_tokenizes=False),
    "grpo": Method(GrpoSection, frozenset({"prompt"}), "trl:GRPOConfig", ft_tokenizes=False),
    "kto": Method(KtoSection, _PREFERENCE, "trl:KTOConfig", ft_tokenizes=False),
    "orpo": Method(OrpoSection, _PREFERENCE, "trl.experimental.orpo:ORPOConfig", ft_tokenizes=False),
}
METHOD_SECTIONS: dict[str, type[MethodSection]] = {name: m.section for name, m in METHODS.items() if m.section}


def moved_to_method_section(method: str) -> dict[str, str]:
    """TRL config field -> the method-section key that replaces it under ``train:``."""
    section = METHODS[method].section
    if section is None:
        return {}
    moved = {trl: f"{method}.{field}" for field, trl in section.CONFIG_FIELDS.items()}
    return {**moved, **section.CONFIG_MOVED}
