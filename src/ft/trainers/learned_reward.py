"""A learned reward model as a GRPO or RLOO reward: ``<method>.rewards: [{model: runs/rm/final, weight: 1.0}]``.

TRL's GRPOTrainer and RLOOTrainer take a sequence-classification model among their reward functions, with the
tokenizer it was trained with (``reward_processing_classes``). For each round they render every prompt + completion
with that tokenizer (its chat template for chat prompts; the two texts joined for text prompts), pad on the right,
and read the one score at the last real token, in inference mode, on the device the accelerator placed the model on
(the policy's). ft loads the model and tokenizer, in eval mode with gradients off (a LoRA reward run's adapter folded
into its base in memory, as ``ft merge`` folds it), and checks before training what would otherwise fail late or
score nonsense silently: a directory that is not a model with one score (a causal LM, an adapter of one, a classifier
with several labels), a tokenizer that cannot render the prompts, or one with no token to pad with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.loading import names_a_path
from ..model.locate import LocateError, load_adapter_model, locate, scoring_model
from ..recipe import Problem
from ..recipe.errors import first_line
from .plugins import PluginError

TRAIN_ONE = "train one with `method: reward` on preference pairs and name its final/ directory"


@dataclass(frozen=True)
class LearnedReward:
    """A loaded reward model, its tokenizer and its recipe key (``grpo.rewards.<i>.model``)."""

    model: object
    tokenizer: object
    key: str


def load_learned_reward(reference: str, key: str, name: str, trust_remote_code: bool = False,
                        dtype: str | None = None) -> LearnedReward:
    """The reward model at ``reference`` (a model directory, a reward run, its final/ or a checkpoint, or a hub id),
    checked, in ``dtype`` (a torch dtype's name; None: as saved), logged by TRL as ``rewards/<name>/…``. A LoRA
    reward run's adapter is folded into its base in memory, as ``ft merge`` folds it. Raises ``PluginError`` naming
    ``key`` when it is not a reward model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = Path(reference).expanduser()
    if names_a_path(reference) and not folder.exists():
        raise PluginError(Problem(key, f"{reference} does not exist; {TRAIN_ONE} (or give a hub id)."))
    if folder.exists():
        try:
            found = locate(folder, key)
        except LocateError as exc:
            raise PluginError(Problem(key, str(exc).removeprefix(f"{key}: "))) from None
        if found.kind == "adapter":
            return _from_adapter(found, key, name, dtype)
        reference = str(found.path)
    _check_config(reference, key, trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(reference, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise PluginError(Problem(key, f"{reference} has no tokenizer transformers can read "
                                       f"({first_line(str(exc))}); a reward model scores text in its own tokens, so "
                                       "its directory needs the tokenizer it was trained with.")) from None
    _check_padding(tokenizer, reference, key)
    model = AutoModelForSequenceClassification.from_pretrained(reference, trust_remote_code=trust_remote_code)
    return _ready(model, tokenizer, key, name, dtype)


def _check_config(reference: str, key: str, trust_remote_code: bool) -> None:
    """A sequence classifier with one score, judged from its config before any weights load."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(reference, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise PluginError(Problem(key, f"{reference} is not a model transformers can read "
                                       f"({first_line(str(exc))}); {TRAIN_ONE}.")) from None
    architectures = config.architectures or []
    if not any(arch.endswith("ForSequenceClassification") for arch in architectures):
        kind = architectures[0] if architectures else f"{config.model_type} model"
        raise PluginError(Problem(key, f"{reference} is a {kind}, not a sequence-classification model: a reward "
                                       f"model gives one score to prompt + completion; {TRAIN_ONE}."))
    if config.num_labels != 1:
        labels = ", ".join(str(label) for label in config.id2label.values())
        raise PluginError(Problem(key, f"{reference} is a classifier with {config.num_labels} scores ({labels}); a "
                                       f"reward model gives one; {TRAIN_ONE}."))


def _from_adapter(found, key: str, name: str, dtype: str | None) -> LearnedReward:
    """A LoRA reward model: its base rebuilt as ``ft merge`` rebuilds it (the run's recipe: a GGUF file, a seed),
    the adapter and its score head folded in."""
    if not scoring_model(found):
        raise PluginError(Problem(key, f"{found.path} holds a LoRA adapter of a model that writes text, not of a "
                                       f"reward model; {TRAIN_ONE}."))
    try:
        model, tokenizer = load_adapter_model(found, None, key, say=lambda _: None)
    except LocateError as exc:
        raise PluginError(Problem(key, str(exc).removeprefix(f"{key}: "))) from None
    _check_padding(tokenizer, str(found.path), key)
    return _ready(model.merge_and_unload(), tokenizer, key, name, dtype)


def _check_padding(tokenizer, reference: str, key: str) -> None:
    if tokenizer.pad_token is None and tokenizer.eos_token is None:
        raise PluginError(Problem(key, f"the tokenizer of {reference} has neither a pad nor an end-of-sequence token: "
                                       "TRL pads the texts it scores and reads the score before the padding; save "
                                       "the tokenizer with a pad token."))


def _ready(model, tokenizer, key: str, name: str, dtype: str | None) -> LearnedReward:
    """Eval mode (no dropout in a score), no gradients, the recipe's ``dtype`` (cast after loading, so that a LoRA
    run's adapter is folded in at its own precision), and the name TRL logs it under (the last part of the config's
    ``_name_or_path``)."""
    model.eval().requires_grad_(False)
    if dtype is not None:
        import torch

        model.to(getattr(torch, dtype))
    model.config._name_or_path = name
    return LearnedReward(model, tokenizer, key)


def reward_name(reference: str) -> str:
    """The name a reward model's figures are logged under: its directory's name, or the run's name for the final/
    or a checkpoint of a run (``runs/rm/final`` → ``rm``), or a hub id's last part."""
    path = Path(reference.rstrip("/"))
    if path.name == "final" or path.name.startswith("checkpoint-"):
        path = path.parent
    return path.name or reference


def check_renders(reward: LearnedReward, prompt) -> None:
    """Refuse a reward model whose tokenizer cannot render the training prompts (``prompt``: the first row's) the way
    TRL will: a chat prompt needs a chat template that takes its roles; a text prompt is joined to the completion."""
    if isinstance(prompt, str):
        return
    from trl.data_utils import apply_chat_template

    if reward.tokenizer.chat_template is None:
        raise PluginError(Problem(reward.key, "the training prompts are chats, and this reward model's tokenizer has "
                                              "no chat template to render them with; use a reward model trained on "
                                              "chats (its final/ keeps the template) or text prompts."))
    try:
        apply_chat_template({"messages": [*prompt, {"role": "assistant", "content": "1"}]}, reward.tokenizer)
    except Exception as exc:  # the template's own error (a role it does not take, a missing variable)
        raise PluginError(Problem(reward.key, f"this reward model's chat template cannot render the training "
                                              f"prompts ({type(exc).__name__}: {first_line(str(exc))}); use a reward "
                                              "model trained on prompts of this form.")) from None


def reward_inputs(rewards, prompt) -> dict:
    """The trainer's ``reward_funcs`` and ``reward_processing_classes`` from ft's resolved rewards (functions and
    ``LearnedReward``s, in recipe order), each reward model checked against ``prompt`` (the first training row's)."""
    learned = [reward for reward in rewards if isinstance(reward, LearnedReward)]
    for reward in learned:
        check_renders(reward, prompt)
    funcs = [reward.model if isinstance(reward, LearnedReward) else reward for reward in rewards]
    if not learned:
        return {"reward_funcs": funcs}
    return {"reward_funcs": funcs,
            "reward_processing_classes": [r.tokenizer if isinstance(r, LearnedReward) else None for r in rewards]}
