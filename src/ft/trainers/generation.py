"""What ft adds to the trainers that sample completions and score them with rewards (GRPO, RLOO): TRL generates,
batches and scores; ft counts the tokens, stops by signal only at the end of a generation round, gives TRL a
reference model it can load, and maps the shared settings of the method's section onto TRL's config."""

from __future__ import annotations

import tempfile

from trl.trainer.utils import RepeatSampler

from ..model.locate import starts_from_adapter
from ..recipe import Recipe
from ..recipe.methods import generation_of
from .build import TrainerInputs, section_kwargs
from .learned_reward import reward_inputs


class GenerationRounds:
    """A mixin for TRL's GRPOTrainer and RLOOTrainer (before ``FtTrainerMixin`` in the bases).

    ``reference_snapshot``: the KL term's reference model is a copy of the start model. TRL loads it from the
    policy's ``config._name_or_path``, which holds no weights TRL can read when the model was built from its config
    (``model.init: random``) or taken from a GGUF file (``snapshot_reference``); then the start model is saved to a
    temporary directory that TRL loads it from, by every process (transformers' ``save_pretrained`` writes from rank 0
    alone, which would leave the other processes' directories empty: the config and the weights are written here with
    the functions it calls, on every rank).
    """

    def __init__(self, model, *args, reference_snapshot: bool = False, **kwargs):
        config = kwargs.get("args")
        if not (reference_snapshot and config is not None and config.beta != 0.0
                and kwargs.get("peft_config") is None and not isinstance(model, str)):
            super().__init__(model, *args, **kwargs)
            return
        name = model.config._name_or_path
        with tempfile.TemporaryDirectory(prefix="ft-reference-") as start:
            _save_on_this_rank(model, start)
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

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler for the method (its counts: prompts per round, repeats), shuffled per epoch from the seed and
        the epoch's number (``EpochSeeded``), so that a run resumed in a later epoch draws that epoch's order."""
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is not RepeatSampler:  # a TRL that samples otherwise: left as it is
            return sampler
        return EpochSeeded(data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
                           batch_size=sampler.batch_size, repeat_count=sampler.repeat_count, shuffle=sampler.shuffle,
                           seed=sampler.seed)

    def _prepare_inputs(self, generation_batch):
        """TRL's batches are raw rows until this step generates (or takes from its buffer) the completions; the
        prompt and completion tokens are counted here for ft's token accounting."""
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:
            padded = inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()
            self._ft_count(padded, inputs["prompt_mask"].sum() + inputs["completion_mask"].sum(),
                           len(inputs["prompt_ids"]))
        return inputs


class EpochSeeded(RepeatSampler):
    """TRL's RepeatSampler, whose order for an epoch depends on the epoch alone: its generator is seeded with
    ``seed + epoch`` as each epoch begins (transformers' Trainer calls ``set_epoch`` through accelerate's data
    loader). TRL's seeds the generator once and draws each epoch's permutation from where the one before left it, so
    a run resumed in a later epoch, whose fresh generator has drawn fewer permutations by then, draws another epoch's
    order and ends with other weights than the uninterrupted run (found by the moments check: GRPO on two processes,
    16 prompts a round, 62 rounds an epoch of 1000 prompts, stopped after step 248). Epoch 0's order is TRL's."""

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed + epoch)


def _save_on_this_rank(model, folder: str) -> None:
    """The model's config and weights in ``folder`` as ``from_pretrained`` reads them, written by this process whatever
    its rank (shared tensors, such as tied embeddings, stored once as ``save_pretrained`` stores them; the config names
    the model's class, which TRL reads to pick the class it loads)."""
    import copy
    from pathlib import Path

    from safetensors.torch import save_model

    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]  # as save_pretrained records it
    config.save_pretrained(folder)
    save_model(model, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})


def snapshot_reference(recipe: Recipe) -> bool:
    """Whether TRL cannot load the start model by its name: built from its config (no weights on disk), read from
    a GGUF file (a folder or repository TRL would read without its ``gguf_file``), or a LoRA run folded on load."""
    return (recipe.model.init == "random" or recipe.model.gguf_file is not None
            or starts_from_adapter(recipe.model))


def generation_kwargs(recipe: Recipe) -> dict:
    """The method section's settings in TRL's names (``build.section_kwargs``: each field its ``CONFIG_FIELDS`` maps),
    and what else these trainers read from the recipe:

    - ``reward_weights``: TRL reads them from the config, built before the trainer; they live in the recipe as
      ``<method>.rewards[].weight``. The functions go to the constructor.
    - ``remove_unused_columns: False`` (TRL's default, restated): the rows' other fields (``answer``, …) must reach
      the reward functions.
    - ``trust_remote_code``: TRL loads the reference model itself (``beta > 0`` without an adapter) with this flag;
      it follows ``model.trust_remote_code``. Likewise ``model.revision``, through ``model_init_kwargs``, for a
      pretrained model (TRL then warns that the policy ignores model_init_kwargs: it does, ft loaded it already with
      that revision).

    Prompts are used whole (these trainers have no prompt-length setting), so ``data.max_length`` does not apply;
    ``max_completion_length`` bounds the completions.
    """
    section, model = recipe.method_section, recipe.model
    reference_loads = section.beta != 0 and recipe.adapter is None and not snapshot_reference(recipe)
    revision = model.revision if reference_loads else None
    return {
        **section_kwargs(section),
        "reward_weights": [float(spec.weight) for spec in generation_of(recipe).rewards],
        "remove_unused_columns": False,
        "trust_remote_code": model.trust_remote_code,
        "model_init_kwargs": {"revision": revision} if revision else None,
    }


def reward_kwargs(inputs: TrainerInputs) -> dict:
    """The rewards for TRL's constructor: ``reward_funcs``, and with a reward model among them the tokenizers
    (``reward_processing_classes``), each reward model checked against the first training prompt."""
    return reward_inputs(inputs.hooks.rewards, next(iter(inputs.train_dataset))["prompt"])
