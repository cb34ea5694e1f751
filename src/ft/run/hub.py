"""The Hugging Face Hub as this machine sees it, for the recipes that push to it.

transformers and TRL push with the token huggingface_hub finds on the machine: the ``HF_TOKEN`` environment variable,
else the login ``hf auth login`` stored. A recipe never carries one (``train.hub_token`` is refused: the recipe file
would hold it, and transformers pickles its arguments into every ``training_args.bin``). Without a token, or with the
Hub switched off, the trainer would fail creating the repository after the model loaded; ``check_hub`` runs at the
start of ``ft train``, before any model or data loads, next to ``hardware.check_hardware``.
"""

from __future__ import annotations

from ..recipe import Problem, Recipe
from ..recipe.errors import first_line
from ..recipe.hub import pushing_keys

FIX = ("set the `HF_TOKEN` environment variable to a write token (https://huggingface.co/settings/tokens) or run "
       "`hf auth login` on this machine")


def check_hub(recipe: Recipe) -> list[Problem]:
    """What stops this machine from pushing where the recipe asks (nothing when it does not push)."""
    keys = pushing_keys(recipe)
    if not keys:
        return []
    from huggingface_hub import constants, get_token  # a lazy module: cheap, and only for recipes that push

    problems = []
    if constants.is_offline_mode():
        problems += [Problem(key, "the Hub is switched off here (HF_HUB_OFFLINE is set), so the push would fail; "
                             "unset HF_HUB_OFFLINE on a machine that reaches huggingface.co, or remove this key.")
                     for key in keys]
    try:
        token = get_token()
    except Exception as exc:  # with HF_OIDC_RESOURCE set, a failed token exchange raises
        return problems + [Problem(key, f"getting a Hugging Face token failed ({first_line(exc)}); {FIX}.")
                           for key in keys]
    if token is None:
        problems += [Problem(key, "pushing to the Hub needs a Hugging Face token and this machine has none (no "
                             f"HF_TOKEN environment variable, no stored login); {FIX}, or remove this key.")
                     for key in keys]
    return problems
