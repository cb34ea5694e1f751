"""GRPO: TRL's GRPOTrainer on canonical prompt rows (``prompt`` plus the row's other fields), scored by the
recipe's rewards (``ft.trainers.rewards``). TRL tokenizes, generates and batches; ft adds only its token accounting."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping

from trl import GRPOConfig, GRPOTrainer

from ..recipe import Recipe
from .build import TrainerInputs, trainer_kwargs, trl_config
from .mixin import FtTrainerMixin


class FtGRPOTrainer(FtTrainerMixin, GRPOTrainer):
    """GRPOTrainer with ft's token accounting (see FtTrainerMixin).

    ``reference_snapshot``: the KL term's reference model is a copy of the start model. TRL loads it from
    the policy's ``config._name_or_path``, which holds no weights TRL can read when the model was built from its
    config (``model.init: random``) or taken from a GGUF file (``snapshot_reference``); then the start model is saved
    to a temporary directory that TRL loads it from.
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

    def ft_stop_point(self, global_step: int) -> bool:
        """At the end of a generation round only. TRL generates completions for ``steps_per_generation`` ×
        ``num_iterations`` micro-batches at once and serves them from a buffer, which no checkpoint holds: a run
        resumed inside a round would generate the rest anew (other samples, and rounds shifted). At a round's end
        the buffer is used up, and the resumed run's first micro-batch generates the next round from the same
        weights, prompts and random state as the uninterrupted run's."""
        args = self.args
        return global_step * args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0

    def _prepare_inputs(self, generation_batch):
        """TRL's GRPO batches are raw rows until this step generates (or takes from its buffer) the completions;
        the prompt and completion tokens are counted here for ft's token accounting."""
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:
            padded = inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()
            self._ft_count(padded, inputs["prompt_mask"].sum() + inputs["completion_mask"].sum(),
                           len(inputs["prompt_ids"]))
        return inputs



def config(recipe: Recipe, defaults: Mapping[str, object]) -> GRPOConfig:
    """The ``grpo:`` section, and what else GRPO reads from the recipe:

    - ``reward_weights``: TRL reads them from the config (``GRPOConfig.reward_weights``), which is built before the
      trainer; they live in the recipe as ``grpo.rewards[].weight``. The functions go to the constructor.
    - ``remove_unused_columns: False`` (TRL's GRPO default, restated): the rows' other fields (``answer``, …) must
      reach the reward functions.
    - ``trust_remote_code``: TRL loads the reference model itself (``grpo.beta > 0`` without an adapter) with this
      flag; it follows ``model.trust_remote_code``. Likewise ``model.revision``, through ``model_init_kwargs``,
      for a pretrained model (TRL then warns that the policy ignores model_init_kwargs: it does, ft loaded it
      already with that revision).

    GRPO in this TRL has no prompt-length setting (``max_prompt_length`` is gone): prompts are used whole and
    ``data.max_length`` does not apply; ``grpo.max_completion_length`` bounds the completions.
    """
    grpo, model = recipe.grpo, recipe.model
    reference_loads = grpo.beta != 0 and recipe.adapter is None and not snapshot_reference(recipe)
    revision = model.revision if reference_loads else None
    return trl_config(
        GRPOConfig, recipe, defaults,
        num_generations=grpo.num_generations,
        max_completion_length=grpo.max_completion_length,
        steps_per_generation=grpo.steps_per_generation,
        generation_batch_size=grpo.generation_batch_size,
        temperature=grpo.temperature,
        top_p=grpo.top_p,
        top_k=grpo.top_k,
        beta=grpo.beta,
        loss_type=grpo.loss_type,
        reward_weights=[float(spec.weight) for spec in grpo.rewards],
        remove_unused_columns=False,
        trust_remote_code=model.trust_remote_code,
        model_init_kwargs={"revision": revision} if revision else None,
    )


def snapshot_reference(recipe: Recipe) -> bool:
    """Whether TRL cannot load the start model by its name: built from its config (no weights on disk), or read from
    a GGUF file (a folder or repository TRL would read without its ``gguf_file``)."""
    return recipe.model.init == "random" or recipe.model.gguf_file is not None


def build(recipe: Recipe, inputs: TrainerInputs) -> FtGRPOTrainer:
    return FtGRPOTrainer(reward_funcs=list(inputs.hooks.rewards), reference_snapshot=snapshot_reference(recipe),
                         **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))
