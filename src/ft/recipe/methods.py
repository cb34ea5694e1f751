"""The training methods: one declarative table (``METHODS``), and the sections of the methods that have settings
of their own (``dpo:``, ``grpo:``, ``kto:``, ``orpo:``).

A method is its entry here and its trainer module, ``ft.trainers.<method>``; nothing else in ft lists methods. The
entry holds every fact the rest of ft needs: the recipe schema (``method:`` and the method sections), the rules
(which data formats it trains on, which method-only keys it reads), the data pipeline (whether ft tokenizes its
rows), ``scripts/gen_train_fields.py`` (its TRL config class), summary.json's headline and the console line (its
headline figures), ``ft plan`` (sequences per row, a reference copy, the fused LM head), ``--smoke`` (whether it
generates) and ``ft import axolotl`` (Axolotl's names for it). ``tests/test_layout.py`` fails when another module
keeps a list of methods of its own.

Each section's fields map onto the method's TRL config fields (``CONFIG_FIELDS``): those TRL fields are rejected
under ``train:`` with a pointer to the section, so every setting has exactly one home, and the method's builder
in ``ft.trainers`` passes each one on. Defaults are TRL's own, read from the generated field table.

A section also declares what the rest of ft must know of it without reading its field names: the models the method
loads besides the policy (``MethodSection.models``: a reference, reward models, a teacher, each an ``ExtraModel``
under its recipe key), which the Hub check, ``--smoke``, the trainers' hooks and ``ft plan`` read; and, for a method
that samples completions while training, how it batches them (``MethodSection.generation``: a ``Generation``), which
the rules, the preflight, ``--smoke`` and the trainers read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictStr, field_validator, model_validator

from .base import Section, resolve_input_path
from .errors import did_you_mean
from .hooks import BuiltinOrUser, check_reference
from .names import BUILTIN_REWARDS
from .train_section import method_fields

Number = Union[int, float]


def trl_default(method: str, name: str):
    return method_fields(method)[name]["default"]


def documented_values(method: str, name: str) -> list[str]:
    """The values TRL's help text for the method's config field lists as accepted (e.g. ``loss_type``), as the
    generated field table recorded them; [] when the help lists none."""
    return method_fields(method)[name].get("values", [])


def one_of_documented(method: str, name: str):
    """A validator: each value (one, or a list) is one TRL documents for ``method``'s ``name``. TRL checks these only
    when the loss is first computed, after the model loaded; the recipe is checked before anything loads."""

    def check(value):
        allowed = documented_values(method, name)
        for item in value if isinstance(value, list) else [value]:
            if allowed and item not in allowed:
                raise ValueError(f"{item!r} is not a {method} {name} TRL accepts; choose from {', '.join(allowed)} "
                                 f"(docs/trainers.md says what each does).{did_you_mean(item, allowed)}")
        return value

    return field_validator(name)(check)


@dataclass(frozen=True)
class ModelRole:
    """What a model a method loads besides the policy is to it: ``what`` names it in messages (``the reference
    model``), and ``scores`` says how it loads: a sequence classifier with one score
    (``AutoModelForSequenceClassification``: a reward model), else a causal LM (``AutoModelForCausalLM``)."""

    what: str
    scores: bool = False

    @property
    def auto_class(self) -> str:
        """The transformers auto class it loads as (``MODEL_CLASSES``, for a text model)."""
        return MODEL_CLASSES[("scores" if self.scores else "writes", "text")]


ROLES: dict[str, ModelRole] = {
    "reference": ModelRole("the reference model"),  # the KL term's anchor (DPO's ``ref_model``)
    "reward": ModelRole("a reward model", scores=True),  # scores sampled completions (GRPO/RLOO ``rewards[].model``)
    "teacher": ModelRole("the teacher model"),  # distillation's target distribution (TRL's GKD ``teacher_model``)
}


@dataclass(frozen=True)
class ExtraModel:
    """A model a method loads besides the one it trains, as its section declares it (``MethodSection.models``):
    its recipe ``key`` (``dpo.ref_model``, ``grpo.rewards.0.model``), its ``name`` (a hub id, or a path already
    resolved against the recipe's folder), its ``role`` (a key of ``ROLES``) and the ``dtype`` it runs in (None:
    as its loader decides; a reward model's ``dtype:``)."""

    key: str
    name: str
    role: str
    dtype: str | None = None

    @property
    def scores(self) -> bool:
        """It loads as a sequence classifier with one score (a reward model), not as a causal LM."""
        return ROLES[self.role].scores

    @property
    def auto_class(self) -> str:
        return ROLES[self.role].auto_class

    @property
    def what(self) -> str:
        return ROLES[self.role].what


@dataclass(frozen=True)
class Generation:
    """How a method that samples completions while training (GRPO, RLOO) batches them, as its section declares it
    (``MethodSection.generation``): ``num_generations`` completions per prompt, each at most
    ``max_completion_length`` tokens; one round serves ``steps_per_generation`` optimizer steps or holds
    ``generation_batch_size`` completions (at most one is set; neither: TRL's ``gradient_accumulation_steps``); the
    ``rewards`` score them. ``at`` is the section's recipe key: each figure is set there under its own name
    (``key``)."""

    at: str
    num_generations: int
    max_completion_length: int
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None
    rewards: tuple[RewardSpec, ...] = ()

    def key(self, name: str) -> str:
        """The recipe key of the figure ``name`` (``grpo.num_generations``)."""
        return f"{self.at}.{name}"


class MethodSection(Section):
    """A method's own settings. ``CONFIG_FIELDS`` (section field -> TRL config field) are the TRL fields it owns:
    they are refused under ``train:`` with a pointer here, and the method's builder passes each one on.
    ``CONFIG_MOVED`` names more TRL fields refused under ``train:`` whose value comes from elsewhere. A section with
    required keys must be written when its method is chosen (``EXAMPLE`` shows them in that error).

    ``models`` and ``generation`` are what the rest of ft reads of a section besides its TRL fields: a new method
    with a teacher, a judge or its own way of sampling declares them here, and the Hub check, ``--smoke``, the hooks,
    ``ft plan``, the rules and the preflight follow without naming its fields. ``GENERATES`` says, from the class
    alone, whether ``generation`` returns one (``Method.generates`` reads it)."""

    CONFIG_FIELDS: ClassVar[dict[str, str]] = {}
    CONFIG_MOVED: ClassVar[dict[str, str]] = {}
    EXAMPLE: ClassVar[str] = ""  # a value for the section's required keys, for the error when the section is missing
    GENERATES: ClassVar[bool] = False  # its method samples completions while training: ``generation`` says how

    def problems(self, effective: Callable[[str], Any]) -> list[tuple[str, str]]:
        """(recipe key, why) for each of this section's settings that does not fit the recipe's ``train:`` values
        (``effective(name)``: the value the trainer will see). Checked with the recipe (``rules``), where TRL checks
        only once the model is loaded."""
        return []

    def models(self, at: str) -> tuple[ExtraModel, ...]:
        """The models the method loads besides the policy, in the order it loads them, each under its recipe key
        (``at``: this section's key, the method's name). None by default."""
        return ()

    def generation(self, at: str) -> Generation | None:
        """How the method samples completions (``at``: this section's key); None for a method that does not."""
        return None


class DpoSection(MethodSection):
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {"beta": "beta", "loss_type": "loss_type"}

    beta: Number = Field(trl_default("dpo", "beta"), ge=0, description="Strength of the implicit KL penalty.")
    loss_type: list[StrictStr] = Field(trl_default("dpo", "loss_type"), description="DPO loss variant(s).")
    ref_model: Optional[StrictStr] = Field(
        None, description="Reference model (hub id or directory); unset: a frozen copy of the start model, "
        "or the base with the adapter disabled when training LoRA.")

    resolve_ref = field_validator("ref_model")(resolve_input_path)
    known_loss = one_of_documented("dpo", "loss_type")

    def models(self, at: str) -> tuple[ExtraModel, ...]:
        """``ref_model`` when set (unset: a copy of the start model or the base with the adapter off, no model of
        its own: ``ft.trainers.reference``)."""
        return (ExtraModel(f"{at}.ref_model", self.ref_model, "reference"),) if self.ref_model else ()

    F_DIVERGENCE_LOSSES: ClassVar[tuple[str, ...]] = ("sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust",
                                                      "discopop", "sft")

    def problems(self, effective: Callable[[str], Any]) -> list[tuple[str, str]]:
        """What DPOTrainer checks of its loss types once the model is loaded: EXO needs label smoothing (its paper
        recommends 1e-3), robust DPO a smoothing below 0.5 (the assumed share of flipped labels), AOT sorts samples
        and so cannot take WPO weighting, and an f-divergence other than reverse KL cancels only in the losses built
        on the chosen-rejected reward difference."""
        losses, smoothing = self.loss_type, effective("label_smoothing")
        if "exo_pair" in losses and smoothing == 0:
            return [("dpo.loss_type", "exo_pair needs `train.label_smoothing` above 0 (the EXO paper recommends "
                     "0.001).")]
        if "robust" in losses and not 0 <= smoothing < 0.5:
            return [("train.label_smoothing", "robust DPO reads it as the share of flipped labels: it must be in "
                     f"[0, 0.5), not {smoothing}.")]
        if effective("use_weighting") and {"aot", "aot_unpaired"} & set(losses):
            return [("train.use_weighting", "aot and aot_unpaired sort the samples of a batch, which would misalign "
                     "WPO's per-pair weights; drop use_weighting or choose another loss type.")]
        divergence = effective("f_divergence_type")
        if divergence != "reverse_kl" and not set(losses) <= set(self.F_DIVERGENCE_LOSSES):
            return [("train.f_divergence_type", f"{divergence} works only with the loss types "
                     f"{', '.join(self.F_DIVERGENCE_LOSSES)} (the others have no f-divergence form); the recipe has "
                     f"{', '.join(losses)}.")]
        return []


class RewardSpec(BuiltinOrUser):
    """A GRPO or RLOO reward: a built-in by ``name``, a user function by ``fn: module:function``, or a learned reward
    model by ``model:`` (a directory, relative to the recipe, or a hub id)."""

    name: Optional[Literal[BUILTIN_REWARDS]] = Field(None, description="Built-in reward.")
    fn: Optional[StrictStr] = Field(None, description="User reward `module:function` (a module next to the recipe "
                                    "is importable).")
    model: Optional[StrictStr] = Field(
        None, description="A reward model: a sequence-classification model with one score (the final/ of a `method: "
        "reward` run, or a hub id); it scores prompt + completion with its own tokenizer and chat template.")
    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="A reward model's dtype while it scores (unset: as it was saved). bfloat16 halves its memory "
        "and, on GPUs and on CPUs with bf16 matrix units, most of its time.")
    weight: Number = Field(1.0, description="Weight of this reward in the sum.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the reward.")

    USER_FIELD: ClassVar[str] = "fn"
    KIND: ClassVar[str] = "reward"
    MORE_SOURCES: ClassVar[dict[str, str]] = {"model": "a reward model's directory or hub id"}

    checked_fn = field_validator("fn")(check_reference)
    resolve_model = field_validator("model")(resolve_input_path)

    def model_at(self, key: str) -> ExtraModel | None:
        """This reward's model, declared under ``key`` (``grpo.rewards.0``): None for a function."""
        return ExtraModel(f"{key}.model", self.model, "reward", self.dtype) if self.model is not None else None

    @model_validator(mode="after")
    def no_args_for_a_model(self):
        if self.model is not None and self.args:
            raise ValueError("`args` are keyword arguments of a reward function; a reward `model` takes none (it "
                             "scores prompt + completion as it was trained to)")
        if self.model is None and self.dtype is not None:
            raise ValueError("`dtype` is the dtype a reward `model` scores in; a reward function has none")
        return self


GENERATION_FIELDS = ("num_generations", "max_completion_length", "steps_per_generation", "generation_batch_size",
                     "temperature", "top_p", "top_k", "beta")


def generation_section(method: str) -> type[MethodSection]:
    """The settings every method that samples completions and scores them with rewards shares (GRPO, RLOO), with
    that method's own TRL defaults (RLOO's differ from GRPO's)."""

    class GenerationSection(MethodSection):
        CONFIG_FIELDS: ClassVar[dict[str, str]] = {name: name for name in GENERATION_FIELDS}
        CONFIG_MOVED: ClassVar[dict[str, str]] = {"reward_weights": f"{method}.rewards[].weight"}
        EXAMPLE: ClassVar[str] = "[{name: exact_match}]"

        num_generations: PositiveInt = Field(trl_default(method, "num_generations"),
                                             description="Completions sampled per prompt.")
        max_completion_length: PositiveInt = Field(trl_default(method, "max_completion_length"),
                                                   description="Token limit of each completion.")
        steps_per_generation: Optional[PositiveInt] = Field(
            None, description="Optimizer steps served by one generation round (unset: gradient_accumulation_steps).")
        generation_batch_size: Optional[PositiveInt] = Field(
            None, description="Prompts×completions per generation round (alternative to steps_per_generation).")
        temperature: Number = Field(trl_default(method, "temperature"), gt=0, description="Sampling temperature.")
        top_p: Number = Field(trl_default(method, "top_p"), gt=0, le=1, description="Nucleus sampling.")
        top_k: int = Field(trl_default(method, "top_k"), ge=0, description="Top-k sampling (0: off).")
        beta: Number = Field(trl_default(method, "beta"), ge=0, description="KL coefficient (0: no reference model).")
        rewards: list[RewardSpec] = Field(min_length=1, description="Rewards (built-ins, functions, reward models), "
                                          "summed with their weights.")

        GENERATES: ClassVar[bool] = True

        def models(self, at: str) -> tuple[ExtraModel, ...]:
            """The reward models among the rewards, in recipe order."""
            found = (spec.model_at(f"{at}.rewards.{i}") for i, spec in enumerate(self.rewards))
            return tuple(model for model in found if model is not None)

        def generation(self, at: str) -> Generation:
            return Generation(at, self.num_generations, self.max_completion_length, self.steps_per_generation,
                              self.generation_batch_size, tuple(self.rewards))

    return GenerationSection


class GrpoSection(generation_section("grpo")):
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {name: name for name in (*GENERATION_FIELDS, "loss_type")}

    loss_type: StrictStr = Field(trl_default("grpo", "loss_type"),
                                 description="GRPO loss formulation (how token losses are aggregated).")

    known_loss = one_of_documented("grpo", "loss_type")

    SEQUENCE_LEVEL: ClassVar[tuple[str, ...]] = ("luspo",)  # GRPOConfig: needs importance_sampling_level='sequence'
    TOKEN_LEVEL: ClassVar[tuple[str, ...]] = ("bnpo", "dr_grpo", "dapo", "cispo", "vespo")  # refused at sequence level

    def problems(self, effective: Callable[[str], Any]) -> list[tuple[str, str]]:
        """TRL's GRPO loss types each assume a level of importance sampling (``train.importance_sampling_level``,
        per token by default): LUSPO scales whole sequences and needs ``sequence``; the token-normalised ones need
        ``token``. GRPOTrainer raises on a mismatch once the model is loaded."""
        level = effective("importance_sampling_level")
        if self.loss_type in self.SEQUENCE_LEVEL and level != "sequence":
            return [("grpo.loss_type", f"{self.loss_type} weighs whole sequences, so it needs "
                     f"`train.importance_sampling_level: sequence` (the recipe has {level}).")]
        if self.loss_type in self.TOKEN_LEVEL and level != "token":
            return [("grpo.loss_type", f"{self.loss_type} normalises token by token, so it needs "
                     f"`train.importance_sampling_level: token` (the default; the recipe has {level}); with "
                     "sequence-level sampling use grpo, sapo or luspo.")]
        return []


class RlooSection(generation_section("rloo")):
    """RLOO: each completion's advantage is its reward minus the mean of the other completions of its prompt."""


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
class Headline:
    """A figure that shows what a method did: ``name`` in summary.json's ``headline``, the trainer's log ``key`` it is
    read from, and its ``label`` on the console's training line (None: not there; the loss has a place of its own)."""

    name: str
    key: str
    label: str | None = None


# recipe keys that only some methods read: each Method lists those it reads (``reads``), and the rules refuse one in a
# recipe whose method does not, naming the methods that do
ONLY_SOME = ("data.packing", "train.neftune_noise_alpha", "loss", "metrics")


# What a model reads (``ft.model.loading.modality_of`` decides from its config, through transformers' own auto tables):
# text alone, or images and text. Each modality has its own auto class and its own processing class (a tokenizer, or
# a processor that holds one).
MODALITIES = ("text", "vision")
# (what a method's model gives, what it reads) -> the transformers auto class it loads as. The method table says which
# modalities each method trains (``Method.modalities``); this table says what class such a model is.
MODEL_CLASSES: dict[tuple[str, str], str] = {
    ("writes", "text"): "AutoModelForCausalLM",
    ("writes", "vision"): "AutoModelForImageTextToText",
    ("scores", "text"): "AutoModelForSequenceClassification",
}
PEFT_TASKS = {"writes": "CAUSAL_LM", "scores": "SEQ_CLS"}  # PEFT's task type, by what the model gives


@dataclass(frozen=True)
class Method:
    """Everything ft knows about one training method; its trainer is built by ``ft.trainers.<name>``."""

    section: type[MethodSection] | None  # its own recipe section, named after the method; None: no settings
    formats: tuple[str, ...]  # the data formats (``data.*.format``) it trains on; the first is its usual one
    config: str  # its TRL config class, ``module:Class`` (imported only by ``ft train`` and the field generator)
    ft_tokenizes: bool  # True: ft tokenizes and masks the rows itself; False: TRL's trainer tokenizes canonical rows
    headlines: tuple[Headline, ...] = ()  # summary.json's headline and the console's training line, in this order
    reads: frozenset[str] = frozenset()  # the keys of ``ONLY_SOME`` this method reads
    trainer: str = ""  # the module with its ``config`` and ``build`` ("": ``ft.trainers.<name>``, as every shipped one)
    sequences_per_row: int = 1  # sequences one row puts through the model together (chosen and rejected: 2)
    reference_copy: bool = False  # a full fine-tune keeps a frozen copy of the start model as its reference
    fused_lm_head: bool = False  # on an accelerator TRL scores the LM head in tiles, never the full logits
    axolotl: tuple[str, ...] = ()  # Axolotl's ``rl:`` values that train this method
    scores: bool = False  # trains a model that scores a sequence (one number: a reward model) instead of writing text
    modalities: tuple[str, ...] = ("text",)  # the modalities (``MODALITIES``) of the models it trains
    # modality -> why it trains no such model (what TRL or transformers lacks), for each modality it does not train:
    # the modality rule that refuses such a model says it
    cannot_train: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def output(self) -> str:
        """What its model gives: ``scores`` (one number per sequence) or ``writes`` (the next token)."""
        return "scores" if self.scores else "writes"

    def model_class(self, modality: str = "text") -> str | None:
        """The transformers auto class it trains a model of ``modality`` as (``MODEL_CLASSES``); None: it does not
        train such models (``modalities``), and ``ft.model.loading`` refuses the model naming why."""
        return MODEL_CLASSES.get((self.output, modality)) if modality in self.modalities else None

    @property
    def peft_task(self) -> str:
        """PEFT's task type for the adapter of its model."""
        return PEFT_TASKS[self.output]

    @property
    def generates(self) -> bool:
        """It samples completions while training: its batches count completions, rewards score them. Its section
        says so (``MethodSection.GENERATES``) and declares how (``MethodSection.generation``)."""
        return self.section is not None and self.section.GENERATES


# TRL 1.16's DPO and KTO trainers read a dataset with an ``images`` column through their vision collators
# (``DataCollatorForVisionPreference``, ``DataCollatorForVisionUnpairedPreference``: each batch's images processed as
# it comes), and its GRPO and RLOO trainers put a row's images into its prompt for generation and the loss; ORPO (in
# ``trl.experimental``) and the reward trainer tokenize text only
_VISION_TRAINED = ("text", "vision")
_ACCURACY = Headline("reward_accuracy", "rewards/accuracies", "acc")
_MARGIN = Headline("reward_margin", "rewards/margins", "margin")
DEFAULT_METHOD = "sft"
METHODS: dict[str, Method] = {
    "sft": Method(None, ("chat", "instruction", "text"), "trl:SFTConfig", ft_tokenizes=True,
                  headlines=(Headline("token_accuracy", "mean_token_accuracy", "acc"), Headline("loss", "loss")),
                  reads=frozenset(ONLY_SOME), fused_lm_head=True, modalities=("text", "vision")),
    "dpo": Method(DpoSection, ("preference",), "trl:DPOConfig", ft_tokenizes=False, headlines=(_ACCURACY, _MARGIN),
                  sequences_per_row=2, reference_copy=True, axolotl=("dpo", "ipo"), modalities=_VISION_TRAINED),
    "grpo": Method(GrpoSection, ("prompt",), "trl:GRPOConfig", ft_tokenizes=False,
                   headlines=(Headline("reward", "reward", "reward"),), axolotl=("grpo", "gdpo"),
                   modalities=_VISION_TRAINED),
    "kto": Method(KtoSection, ("preference",), "trl:KTOConfig", ft_tokenizes=False, headlines=(_MARGIN,),
                  reference_copy=True, axolotl=("kto",), modalities=_VISION_TRAINED),
    "orpo": Method(OrpoSection, ("preference",), "trl.experimental.orpo:ORPOConfig", ft_tokenizes=False,
                   headlines=(_ACCURACY, _MARGIN), sequences_per_row=2, axolotl=("orpo",),
                   cannot_train={"vision": "TRL's ORPOTrainer (trl.experimental.orpo, TRL 1.16) tokenizes text "
                                           "alone: it has no collator for images and reads no `images` column"}),
    "rloo": Method(RlooSection, ("prompt",), "trl:RLOOConfig", ft_tokenizes=False,
                   headlines=(Headline("reward", "reward", "reward"),), modalities=_VISION_TRAINED),
    "reward": Method(None, ("preference",), "trl:RewardConfig", ft_tokenizes=False,
                     headlines=(Headline("pair_accuracy", "accuracy", "acc"), Headline("reward_margin", "margin",
                                                                                        "margin")),
                     sequences_per_row=2, scores=True,
                     cannot_train={"vision": "TRL's RewardTrainer tokenizes text alone, and transformers has no "
                                             "sequence-classification class (one score) for an image-text-to-text "
                                             "model"}),
}
METHOD_SECTIONS: dict[str, type[MethodSection]] = {name: m.section for name, m in METHODS.items() if m.section}


def moved_to_method_section(method: str) -> dict[str, str]:
    """TRL config field -> the method-section key that replaces it under ``train:``."""
    section = METHODS[method].section
    if section is None:
        return {}
    moved = {trl: f"{method}.{field}" for field, trl in section.CONFIG_FIELDS.items()}
    return {**moved, **section.CONFIG_MOVED}


def models_of(recipe) -> tuple[ExtraModel, ...]:
    """The models ``recipe`` (a ``Recipe``) loads besides the policy, as its method's section declares them
    (``MethodSection.models``); none when the method has no section or the recipe left it out (its defaults name
    none)."""
    section = recipe.method_section
    return section.models(recipe.method) if section is not None else ()


def generation_of(recipe) -> Generation | None:
    """How ``recipe``'s method samples completions (``MethodSection.generation``); None when it does not (a generating
    method's section is required: the rules refuse a recipe without one)."""
    section = recipe.method_section
    return section.generation(recipe.method) if section is not None else None


def readers(key: str) -> list[str]:
    """The methods that read ``key`` (one of ``ONLY_SOME``)."""
    return [name for name, method in METHODS.items() if key in method.reads]
