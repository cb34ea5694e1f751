"""The model's dimensions from its config alone (``config.json`` or a GGUF file's metadata, through
``transformers.AutoConfig``; no weights, no torch): the linear layers of a Llama-style decoder (Llama, Mistral, Qwen2,
Gemma, …) that ``ft plan``'s memory model counts."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FtError
from ..model.loading import ModelLoadError, gguf_problems, names_a_path
from ..model.locate import start_config
from ..recipe import Recipe

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PlanError(FtError):
    """No estimate can be made (unreadable config, an architecture not modelled, a bad --gpu-memory): exit 2."""


@dataclass(frozen=True)
class Linear:
    name: str  # the module name PEFT and transformers match targets against: model.layers.0.self_attn.q_proj
    fan_in: int
    fan_out: int
    reads: str  # the tensor it reads: attn_in / mlp_in (a norm's output), attn_out, mlp_mid, head


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

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_linears(self, i: int) -> list[Linear]:
        h, q, kv, inter, p = self.hidden, self.q, self.kv, self.intermediate, f"model.layers.{i}."
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
    file's metadata)."""
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
    config = config.get_text_config()
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
                 kv_heads, head_dim, config.vocab_size, bool(getattr(config, "tie_word_embeddings", False)), biases,
                 dtype if dtype in DTYPE_BYTES else None)
