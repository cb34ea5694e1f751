"""What a plan is made of, shared by the language model's shape (``shape``) and a vision-language model's other parts
(``vision``): the linear layers whose weights, adapters and activations the estimate counts, and the error of a plan
that cannot be made."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FtError


class PlanError(FtError):
    """No estimate can be made (unreadable config, an architecture not modelled, a bad --gpu-memory): exit 2."""


@dataclass(frozen=True)
class Linear:
    name: str  # the module name PEFT and transformers match targets against: model.layers.0.self_attn.q_proj
    fan_in: int
    fan_out: int
    reads: str  # the tensor it reads: attn_in / mlp_in (a norm's output), attn_out, mlp_mid, head
    part: str = "language"  # a vision-language model's: language, vision (its tower) or projector
