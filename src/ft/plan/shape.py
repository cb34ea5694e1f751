"""The model's dimensions from its config alone (``config.json`` or a GGUF file's metadata, through
``transformers.AutoConfig``; no weights, no torch): the linear layers of a Llama-style decoder (Llama, Mistral, Qwen2,
Gemma, …) that ``ft plan``'s memory model counts, and, for a vision-language model, its vision tower and projector
(``ft.plan.vision``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.loading import ModelLoadError, gguf_problems, modality_of, modality_problem, names_a_path
from ..model.locate import start_config
from ..recipe import Recipe
from .parts import Linear, PlanError
from .vision import VisionShape, read_vision

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    biases: int  # bias values per layer
    dtype: str | None  # the checkpoint's, which model.dtype: auto keeps
    decoder: str = "model"  # the language model's module path (its layers: {decoder}.layers.{i})
    vision: VisionShape | None = None  # a vision-language model's tower and projector

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_linears(self, i: int) -> list[Linear]:
        h, q, kv, inter, p = self.hidden, self.q, self.kv, self.intermediate, f"{self.decoder}.layers.{i}."
        return [Linear(p + "self_attn.q_proj", h, q, "attn_in"), Linear(p + "self_attn.k_proj", h, kv, "attn_in"),
                Linear(p + "self_attn.v_proj", h, kv, "attn_in"), Linear(p + "self_attn.o_proj", q, h, "attn_out"),
                Linear(p + "mlp.gate_proj", h, inter, "mlp_in"), Linear(p + "mlp.up_proj", h, inter, "mlp_in"),
                Linear(p + "mlp.down_proj", inter, h, "mlp_mid")]

    def linears(self) -> list[Linear]:
        return [lin for i in range(self.layers) for lin in self.layer_linears(i)] + [
            Linear("lm_head", self.hidden, self.vocab, "head")]


_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def read_shape(recipe: Recipe) -> Shape:
    """The model's dimensions, from its config (local directory, the hub cache, or the hub when online; a GGUF
    file's metadata). A vision-language model (``model.modality``, else its config's, as
    ``ft.model.loading.model_modality`` decides, on the config of the model the run starts from) also gets its vision
    tower and projector (``ft.plan.vision.read_vision``)."""
    model = recipe.model
    problems = gguf_problems(model)
    if problems:
        raise PlanError(problems[0].render())
    try:
        config = start_config(model)  # a run's: its base's config
    except ModelLoadError as exc:  # a run that cannot be read: said as ft merge says it
        raise PlanError(str(exc)) from None
    except (OSError, ValueError) as exc:
        if names_a_path(model.name):
            raise PlanError(f"model.name: {model.name!r} is not a directory (a relative path is read from the "
                            "recipe's folder); `ft plan` needs only the model's config.json: point model.name at "
                            "a directory that holds one (for a run's final/, train that run first).") from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise PlanError(
            f"model.name: could not read the model's config from {model.name!r}: {first}. `ft plan` needs only its "
            "config.json: set model.name to a local directory that holds one, or to a hub id that is in the local "
            "cache or reachable from this machine (unset HF_HUB_OFFLINE to download it; `hf auth login` for gated "
            "models).") from None
    vision = None
    if _modality(model, config) == "vision":
        vision = read_vision(config, model.name)
    # a vision-language model ties its head as its own config says (Mistral 3: tied, over its text config's untied)
    tied = getattr(config, "tie_word_embeddings", None)
    config = config.get_text_config()
    tied = bool(getattr(config, "tie_word_embeddings", False) if tied is None else tied)
    missing = [key for key in _REQUIRED if getattr(config, key, None) is None]
    experts = [key for key in _EXPERTS if getattr(config, key, None)]
    kind = getattr(config, "model_type", "?")
    if missing or experts:
        why = (f"lacks {', '.join(missing)}" if missing
               else f"is a mixture of experts ({experts[0]}: {getattr(config, experts[0])})")
        raise PlanError(f"model.name: the config of {model.name!r} ({kind}) {why}; `ft plan` models dense "
                        "Llama-style decoders (Llama, Mistral, Qwen2, Gemma, …) and cannot estimate this model.")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    attention_bias = bool(getattr(config, "attention_bias", False)) or kind.startswith("qwen2")
    biases = (heads + 2 * kv_heads) * head_dim if attention_bias else 0
    if getattr(config, "mlp_bias", False):
        biases += 2 * config.intermediate_size + config.hidden_size
    dtype = getattr(config, "dtype", None)
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    return Shape(model.name, kind, config.hidden_size, config.intermediate_size, config.num_hidden_layers, heads,
                 kv_heads, head_dim, config.vocab_size, tied, biases,
                 dtype if dtype in DTYPE_BYTES else None, vision.language if vision else "model", vision)


def _modality(model, config) -> str:
    """``model.modality`` where the recipe sets it and the config's family allows it, else the config's."""
    problem = modality_problem(model.modality, config)
    if problem:
        raise PlanError(f"model.modality: {problem}")
    return model.modality or modality_of(config)
