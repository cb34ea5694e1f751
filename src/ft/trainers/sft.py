"""Supervised fine-tuning: TRL's SFTTrainer on rows ft has already tokenized and masked."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import Trainer
from trl import SFTConfig, SFTTrainer

from ..data.images import ImageBatches, ImageTokens
from ..data.labels import IGNORE_INDEX
from ..recipe import Recipe
from .build import TrainerInputs, trainer_kwargs, trl_config
from .metrics import metric_kwargs
from .mixin import FtTrainerMixin
from .token_metrics import scored_sums


def config(recipe: Recipe, defaults: Mapping[str, object]) -> SFTConfig:
    """ft hands SFTTrainer tokenized rows (input_ids, labels carrying the loss mask, length): TRL skips its own
    preparation except packing, and keeps the length column for the length-aware samplers."""
    data = recipe.data
    return trl_config(
        SFTConfig, recipe, defaults,
        max_length=data.max_length,
        packing=data.packing,
        dataset_kwargs={"skip_prepare_dataset": not data.packing},
        remove_unused_columns=False,
        # a stream is sharded one shard per process (ft.data.stream): each reads its own rows, none dispatched
        **({"accelerator_config": {"dispatch_batches": False}} if data.streaming else {}),
    )


def build(recipe: Recipe, inputs: TrainerInputs) -> FtSFTTrainer:
    return FtSFTTrainer(compute_loss_func=inputs.hooks.loss, **metric_kwargs(recipe.metrics),
                        **_collator(recipe, inputs), **trainer_kwargs(recipe, inputs, config(recipe, inputs.defaults)))


def _collator(recipe: Recipe, inputs: TrainerInputs) -> dict:
    """A vision-language model's rows (``ft.data``: token ids, masks and their images' paths) are batched by
    ``ft.data.images.ImageBatches``, which reads the batch's images and runs the processor on them; a text model's by
    TRL's own collator (none given here). The pad token is the one TRL would pad with (``train.pad_token``, else the
    tokenizer's), mirrored onto the model's configs as TRL does for its own collator."""
    processor = inputs.processing_class
    if getattr(processor, "image_processor", None) is None:
        return {}
    tokenizer = processor.tokenizer
    if recipe.train_args.get("pad_token"):
        tokenizer.pad_token = recipe.train_args["pad_token"]
    model = inputs.model
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return {"data_collator": ImageBatches(ImageTokens(processor, recipe.data.image), tokenizer.pad_token_id)}


class FtSFTTrainer(FtTrainerMixin, SFTTrainer):
    """SFTTrainer with ft's token accounting (see FtTrainerMixin) and a one-pass custom loss.

    A recipe's ``loss:`` is Trainer's ``compute_loss_func(outputs, labels, num_items_in_batch)``. It is called
    here after a single forward pass: TRL's own path for it runs a second, no-grad forward for its metrics
    (and is deprecated). Setting ``self.compute_loss_func`` keeps Trainer's documented behaviour: it counts
    ``num_items_in_batch`` over the whole accumulated batch and does not rescale the loss for gradient
    accumulation, because the function normalises by that count itself. At evaluation Trainer passes
    ``num_items_in_batch=None``; ft passes the batch's own count of prediction targets instead, so the same
    normalisation rule holds there.
    """

    def __init__(self, *args, compute_loss_func=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.compute_loss_func = compute_loss_func

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.compute_loss_func is not None:
            return self._custom_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._wants_full_logits(return_outputs):
            return self._model_loss(model, inputs, return_outputs, num_items_in_batch)
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def _custom_loss(self, model, inputs, return_outputs, num_items_in_batch):
        labels = inputs["labels"]
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
        if num_items_in_batch is None:
            num_items_in_batch = (labels[..., 1:] != IGNORE_INDEX).sum()  # targets after the causal shift
        loss = self.compute_loss_func(outputs, labels, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _wants_full_logits(self, return_outputs: bool) -> bool:
        """Whether the loss should come from the model's own forward (full logits) instead of TRL's fused LM head.

        TRL scores every position through a chunked LM head that also returns log-probs, entropy and top-1,
        so it never materialises the logits: the right trade on a GPU with a large vocabulary. It is the wrong one
        (a) when the caller wants the logits anyway (evaluation with metrics: TRL then runs a second forward) and
        (b) on a CPU, where memory is plentiful and the chunking costs a share of every step (benchmarks/README.md).
        Loss variants TRL computes itself (label smoothing, ``loss_type: dft``, MoE auxiliary loss, sequence
        parallelism) stay with TRL.
        """
        if self.label_smoother is not None or self.args.loss_type != "nll" or self.aux_loss_enabled:
            return False
        parallelism = getattr(self.accelerator, "parallelism_config", None)
        if parallelism is not None and parallelism.sp_enabled:
            return False
        return return_outputs or self.args.device.type == "cpu"

    def _model_loss(self, model, inputs, return_outputs, num_items_in_batch):
        """``transformers.Trainer.compute_loss`` (the model's own loss, normalised by ``num_items_in_batch``),
        plus the metrics TRL logs for SFT, measured on the same logits: entropy, mean_token_accuracy,
        num_tokens."""
        loss, outputs = Trainer.compute_loss(self, model, {**inputs, "use_cache": False}, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        self._record_token_metrics(outputs.logits, inputs)
        return (loss, outputs) if return_outputs else loss

    @torch.no_grad()
    def _record_token_metrics(self, logits, inputs) -> None:
        """Entropy and token accuracy of this batch, and the tokens fed so far, kept as device tensors: no host sync
        per step. ``log`` turns them into numbers once per log line (the same means TRL logs)."""
        mode = "train" if self.model.training else "eval"
        targets = inputs["labels"][:, 1:]
        mask = targets != IGNORE_INDEX
        entropy, correct = scored_sums(logits[:, :-1], targets, mask)
        gather = self.accelerator.gather_for_metrics
        valid = gather(mask.sum()).sum().clamp(min=1)  # no target at all: both sums are 0, and so the metrics
        self._metrics[mode]["entropy"].append(gather(entropy).sum() / valid)
        self._metrics[mode]["mean_token_accuracy"].append(gather(correct).sum() / valid)
        if mode == "train":  # padding-free (packed) batches carry position_ids instead of an attention mask
            attention = inputs.get("attention_mask")
            positions = inputs.get("position_ids")
            fed = attention.sum() if attention is not None else torch.tensor(positions.size(1), device=positions.device)
            self._total_train_tokens = self._total_train_tokens + gather(fed).sum() // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

    def log(self, logs: dict, *args, **kwargs) -> None:
        """The metrics ``_record_token_metrics`` kept on the device become numbers here: one sync per log line."""
        for values in self._metrics["train" if self.model.training else "eval"].values():
            kept = [i for i, value in enumerate(values) if isinstance(value, torch.Tensor)]
            if kept:
                for i, number in zip(kept, torch.stack([values[i].float() for i in kept]).tolist(), strict=True):
                    values[i] = number
        if isinstance(self._total_train_tokens, torch.Tensor):
            self._total_train_tokens = int(self._total_train_tokens)
        super().log(logs, *args, **kwargs)
