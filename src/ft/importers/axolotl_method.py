"""Axolotl's ``rl:`` and its settings (``trl:``, ``rl_beta``, ``dpo_*``, ``orpo_alpha``, ``kto_*``) → ft's ``method:``
and method sections (``dpo:``, ``grpo:``, ``kto:``, ``orpo:``) and the method's own ``train:`` fields."""

from __future__ import annotations

from typing import Any

from ..recipe.methods import DEFAULT_METHOD, METHOD_SECTIONS, METHODS
from .axolotl_keys import Ctx, handles, number, train_field_problem

# Axolotl's `rl:` value -> the ft method that trains it (each method's ``axolotl`` names)
RL_METHODS = {rl: name for name, method in METHODS.items() for rl in method.axolotl}
# `rl:` values ft has no trainer for: the method the recipe trains instead (its data fits), and why
NEAREST = {"simpo": ("dpo", "SimPO (TRL's CPO trainer) has no ft method; the recipe trains DPO on the same pairs"),
           "ebft": ("sft", "energy-based fine-tuning has no ft method; the recipe trains SFT on the same rows, a "
                    "different objective")}


def method_of(cfg: dict) -> str:
    """The ft method an Axolotl config trains with (decided before any key is mapped: data formats depend on it)."""
    rl = cfg.get("rl")
    if rl in (None, False, ""):
        return DEFAULT_METHOD  # Axolotl without `rl:` is supervised fine-tuning
    return RL_METHODS.get(str(rl)) or NEAREST.get(str(rl), (DEFAULT_METHOD, ""))[0]


@handles("rl")
def rl(ctx: Ctx) -> None:
    name = str(ctx.get("rl"))
    if name in RL_METHODS:
        values: dict[str, Any] = {"method": ctx.method}
        if name == "ipo":
            values["dpo.loss_type"] = ["ipo"]
        if name == "gdpo":  # Axolotl's GDPO: GRPO normalising each reward before summing
            values["train.multi_objective_aggregation"] = "normalize_then_sum"
        ctx.put_many("rl", values)
        ctx.ledger.entries["rl"].fixed = True
    else:
        why = NEAREST.get(name, (DEFAULT_METHOD, f"ft has no `{name}` trainer; the recipe trains SFT"))[1]
        ctx.skip("rl", why)


SECTION_KEYS = {"rl_beta": "beta", "orpo_alpha": "beta", "kto_desirable_weight": "desirable_weight",
                "kto_undesirable_weight": "undesirable_weight", "dpo_loss_type": "loss_type"}
TRAIN_KEYS = {"dpo_label_smoothing": "label_smoothing", "dpo_use_weighting": "use_weighting",
              "dpo_padding_free": "padding_free", "precompute_ref_log_probs": "precompute_ref_log_probs",
              "dpo_use_liger_kernel": "use_liger_kernel", "dpo_loss_weights": "loss_weights"}
# the Axolotl trainer (its `rl:` family) that alone reads each of these keys; rl_beta: every trainer with a beta
OWNER = {"orpo_alpha": "orpo", "kto_desirable_weight": "kto", "kto_undesirable_weight": "kto", "dpo_loss_type": "dpo"}


@handles(*SECTION_KEYS, *TRAIN_KEYS)
def method_settings(ctx: Ctx) -> None:
    for key, field in SECTION_KEYS.items():
        if not ctx.has(key):
            continue
        owner = OWNER.get(key, ctx.family)
        if owner != ctx.family or ctx.method not in METHOD_SECTIONS:
            ctx.off(key, f"read by Axolotl's `{owner}` trainer only, and this config trains `{ctx.method}`"
                    if owner != ctx.family else "this method has no beta")
        elif key == "rl_beta" and "beta" in (ctx.get("trl") or {}):
            ctx.off(key, "trl.beta decides")
        else:
            value = ctx.get(key)
            ctx.put(key, f"{ctx.method}.{field}", list(value) if isinstance(value, list) else number(value))
    for key, field in TRAIN_KEYS.items():
        if ctx.has(key):
            if ctx.family == "dpo" or not key.startswith("dpo_"):
                ctx.train(key, field, ctx.get(key))
            else:
                ctx.off(key, f"read by Axolotl's DPO trainer only, and this config trains `{ctx.method}`")


@handles("trl")
def trl(ctx: Ctx) -> None:
    """``trl:`` holds TRL config fields by their TRL names: each goes to the method's section where ft keeps it
    there, else to ``train:`` where the method's TRL config has it."""
    settings = ctx.get("trl")
    if not isinstance(settings, dict):
        ctx.skip("trl", "expected a mapping of TRL settings")
        return
    section = METHOD_SECTIONS.get(ctx.method)
    owned = set(section.model_fields) if section else set()
    for name, value in settings.items():
        key = f"trl.{name}"
        if value is None:
            ctx.off(key, "empty")
        elif not ctx.has("rl"):
            ctx.off(key, "read by Axolotl's RL trainers only, and this config has no `rl:`")
        elif not ctx.family:  # an `rl:` ft has no trainer for, trained as SFT
            ctx.skip(key, f"read by Axolotl's `{ctx.get('rl')}` trainer, which ft does not have")
        elif name == "reward_funcs":
            _rewards(ctx, settings)
        elif name == "reward_weights" and "reward_funcs" not in settings:
            ctx.skip(key, "weights without reward_funcs")
        elif name == "reward_weights":
            continue  # recorded with reward_funcs
        elif name in owned:
            ctx.put(key, f"{ctx.method}.{name}", number(value))
        elif name == "scale_rewards" and isinstance(value, bool):
            ctx.train(key, name, "group" if value else "none", "true is TRL's `group`, false its `none`")
        elif not train_field_problem(ctx.method, name):
            ctx.train(key, name, value)
        else:
            ctx.skip(key, train_field_problem(ctx.method, name))


def _rewards(ctx: Ctx, settings: dict) -> None:
    """Axolotl names reward functions `module.function`; ft writes `module:function` (a module next to the recipe)."""
    funcs, weights = settings.get("reward_funcs") or [], settings.get("reward_weights") or []
    if not METHODS[ctx.method].generates:
        for key in ("trl.reward_funcs", "trl.reward_weights"):
            if key.split(".")[1] in settings:
                ctx.off(key, "rewards are read by GRPO only")
        return
    rewards = [{"fn": ":".join(str(f).rsplit(".", 1)) if "." in str(f) else str(f),
                **({"weight": number(weights[i])} if i < len(weights) else {})} for i, f in enumerate(funcs)]
    ctx.put("trl.reward_funcs", f"{ctx.method}.rewards", rewards, "each function is imported from a module next to the "
            "recipe (or installed) and called with TRL's reward signature, as in Axolotl")
    if "reward_weights" in settings:
        ctx.put("trl.reward_weights", f"{ctx.method}.rewards", rewards)
