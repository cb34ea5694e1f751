"""GRPO: TRL's GRPOTrainer on canonical prompt rows (``prompt`` plus the row's other fields), scored by the
recipe's rewards (``ft.rewards``). TRL tokenizes, generates and batches; ft adds only its token accounting."""

from __future__ import annotations

import tempfile

from trl import GRPOTrainer

from ..recipe import Recipe
from ..rewards import reward_functions, reward_weights
from .mixin import FtTrainerMixin


class FtGRPOTrainer(FtTrainerMixin, GRPOTrainer):
    """GRPOTrainer with ft's token accounting (see FtTrainerMixin).

    ``reference_snapshot``: the KL term's reference model is a copy of the start model. TRL loads it from
    the policy's ``config._name_or_path``, which holds no weights when the model was built from its config
    (``model.init: random``); then the start model is saved to a temporary directory that TRL loads it from.
    """

    def __init__(self, model, *args, reference_snapshot: bool = False, **kwargs):
        config = kwargs.get("args")
        if not (reference_snapshot and config is not None and config.beta != 0.0
                and kwargs.get("peft_config") is None and not isinstance(model, str)):
            super().__init__(model, *args, **kwargs)
            return
        name = model.config._name_or_path
        with tempfile.TemporaryDirectory(prefix="ft-grpo-reference-") as start:
            model.save_pretrained(start)
            model.config._name_or_path = start  # TRL loads the reference from here, within __init__
            try:
                super().__init__(model, *args, **kwargs)
            finally:
                model.config._name_or_path = name

    def _prepare_inputs(self, generation_batch):
        """TRL's GRPO batches are raw rows until this step generates (or takes from its buffer) the completions;
        the prompt and completion tokens are counted here for ft's token accounting."""
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:
            padded = inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()
            self._ft_count(padded, inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        return inputs


def data_args(recipe: Recipe) -> dict:
    """GRPOConfig settings that come from the recipe outside the ``grpo:`` field mapping.

    - ``reward_weights``: TRL reads the weights from the config (``GRPOConfig.reward_weights``), and the config
      is built before the constructor kwargs; the weights live in the recipe (``grpo.rewards[].weight``), so
      they are set here with the config rather than patched onto it later. The functions themselves go to
      the constructor (``trainer_kwargs``).
    - ``remove_unused_columns: False`` (TRL's GRPO default, restated): the rows' other fields (``answer``, …)
      must reach the reward functions.
    - ``trust_remote_code``: TRL loads the reference model itself (``grpo.beta > 0`` without an adapter) with
      this flag; it follows ``model.trust_remote_code``.

    GRPO in this TRL has no prompt-length setting (``max_prompt_length`` is gone): prompts are used whole and
    ``data.max_length`` does not apply; ``grpo.max_completion_length`` bounds the completions.
    """
    args = {"reward_weights": reward_weights(recipe), "remove_unused_columns": False,
            "trust_remote_code": recipe.model.trust_remote_code}
    if recipe.model.revision and recipe.model.init == "pretrained" and recipe.grpo.beta != 0 and not recipe.adapter:
        # the reference loads the same revision (TRL then warns that the policy ignores model_init_kwargs: it does,
        # ft loaded it already with that revision)
        args["model_init_kwargs"] = {"revision": recipe.model.revision}
    return args


def trainer_kwargs(ctx) -> dict:
    functions, _weights = reward_functions(ctx.recipe, ctx.base_dir)  # the weights went into the config
    return {"reward_funcs": functions, "reference_snapshot": ctx.recipe.model.init == "random"}
