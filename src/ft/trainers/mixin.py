"""``FtTrainerMixin``: what ft adds to every TRL trainer, whatever the method.

- Token accounting without a device sync per step: tokens fed, non-padding tokens, their ratio
  (padding efficiency) and tokens per second, added to every log line and to ``summary.json``.
- Peak memory (CUDA allocator peak on GPU, the process's peak RSS on CPU) in the same places.
- The recipe's optimizer and scheduler beyond transformers' names: a class of the user's, per-module parameter
  groups, a scheduler class (``ft.trainers.optimization``).
- The FLOPs estimate Trainer adds up every step (``total_flos``), with the model's parameters counted once.
- Where a stop by signal may save and end training (``ft_stop_point``, read by ``trainers.preemption``).
- The worst batch first (``trainers.preflight``): at the first training step, a forward and backward of the largest
  batch the data makes, measured, leaving no trace.

- The push at the end of a run (``train.push_to_hub``) made by ft once summary.json exists (``push_to_hub`` below).

It overrides only documented extension points of ``transformers.Trainer`` (``training_step``, ``log``,
``create_optimizer``, ``create_scheduler``, ``floating_point_ops``) and its public ``push_to_hub``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from . import resume_weights
from .optimization import Optimization, build_scheduler, check_groups_match, param_groups


class FtTrainerMixin:
    _ft_padded = 0  # token positions fed to the model (padding included)
    _ft_real = None  # non-padding tokens, a device tensor summed lazily (no sync per step)
    _ft_samples = 0  # sequences (rows, or packed rows) fed to the model
    _ft_started: float | None = None
    _ft_flop_params: int | None = None  # the model's non-embedding parameters, counted at the first step
    ft_optimization = Optimization()  # what the recipe adds; set per trainer in __init__
    ft_preflight = None  # trainers.preflight.PreflightSettings: probe the largest batch at the first step
    ft_preflight_result: dict | None = None  # what the probe measured (summary.json ``preflight``)
    _ft_preflight_pending = False
    _ft_peak_floor = 0  # the process's memory peak before the probe reset the counter (bytes)
    ft_stream_failure: Exception | None = None  # a streamed source failed: training stopped with a checkpoint

    def __init__(self, *args, ft_optimization: Optimization | None = None, ft_preflight=None, ft_card=None,
                 **kwargs):
        self.ft_card = ft_card  # trainers.card.CardFacts: what README.md says of the run (before TRL's init saves)
        super().__init__(*args, **kwargs)
        self.ft_preflight, self._ft_preflight_pending = ft_preflight, ft_preflight is not None
        self.ft_optimization = ft_optimization = ft_optimization or Optimization()
        if ft_optimization.optimizer is not None:  # only SFTTrainer's constructor takes it; every Trainer reads it
            self.optimizer_cls_and_kwargs = ft_optimization.optimizer
        check_groups_match(self.model.named_parameters(), ft_optimization.groups)  # names as wrapped (PEFT)

    def create_optimizer(self, model=None):
        """With ``optimizer.groups`` or arguments this machine needs: the Trainer's own optimizer creation, handed
        ft's parameter groups and those arguments through ``optimizer_cls_and_kwargs``."""
        ft = self.ft_optimization
        if self.optimizer is None and ft.changes_optimizer:
            opt_model = self.model if model is None else model
            cls, kwargs = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            kwargs = {**kwargs, **ft.machine_kwargs}
            if ft.groups:
                kwargs["params"] = param_groups(opt_model.named_parameters(), set(self.get_decay_parameter_names(
                    opt_model)), ft.groups, kwargs.get("lr", self.args.learning_rate), self.args.weight_decay)
            self.optimizer_cls_and_kwargs = (cls, kwargs)
        return super().create_optimizer(model)

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The Trainer's own, except when a streamed source fails mid-stream (``ft.data.stream.StreamFailed``): no
        batch is trained, training stops at the last finished step, and the Trainer saves its checkpoint there, as
        at a ``save_steps`` step (``ft_stream_failure`` holds the reason; ``ft train`` reports it and exits 1). Its
        resume skips exactly the batches those steps consumed, so no row is lost or trained twice. With several
        processes every rank agrees at each step (one integer, all-reduced), so all stop at the same step."""
        from ..data.stream import StreamFailed

        failure = None
        try:
            samples = super().get_batch_samples(epoch_iterator, num_batches, device)
        except StreamFailed as exc:
            failure, samples = exc, ([], None)
        if self.args.world_size > 1 and getattr(self.train_dataset, "n_shards", None) is not None:
            import torch
            import torch.distributed as dist

            flag = torch.tensor([int(failure is not None)], device=self.args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and failure is None:
                failure, samples = StreamFailed("another process's stream failed (its message is above)"), ([], None)
        if failure is not None:
            self.ft_stream_failure = failure
            self.control.should_save = True
            self.control.should_training_stop = True
        return samples

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """A full model's checkpoint loaded under the model's own names (``ft.trainers.resume_weights``: transformers
        5.25 loads those of families that rename their modules, LLaVA, Gemma 3, Qwen2-VL, into nothing); anything
        else, the Trainer's own loading."""
        target = model if model is not None else self.model
        files = resume_weights.shard_files(resume_from_checkpoint)
        plain = files is not None and not hasattr(target, "peft_config") and not self.is_fsdp_enabled \
            and not self.is_deepspeed_enabled
        state = resume_weights.renamed_state(target, files) if plain else None
        if state is None:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._issue_warnings_after_load(target.load_state_dict(state, False))
        return None

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> None:
        """README.md in the output directory, at each checkpoint save and before a push: ft's card
        (``trainers.card``), which names the base as the recipe does, where TRL's names a local, GGUF or
        random-init base ``None``. A trainer built without the recipe's facts writes TRL's."""
        if self.ft_card is None:
            return super().create_model_card(model_name, dataset_name, tags)
        if not self.is_world_process_zero():
            return None
        from .card import write_card

        name = model_name or Path(self.args.output_dir).name
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        write_card(self.ft_card, Path(self.args.output_dir), name, type(self).__name__, tags)
        return None

    def push_to_hub(self, *args, **kwargs) -> None:
        """Pushes nothing. transformers calls this from ``save_model`` when ft saves final/: before summary.json
        exists, saving the model a second time into the output directory and uploading both copies. ft pushes final/
        and summary.json itself once the run's report is written (``ft.outputs.hub_push``); the pushes at checkpoint
        saves (``hub_strategy``) are transformers' own and unchanged."""
        return None

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """With ``scheduler.class``: that class, given the number of training steps where it asks for them."""
        if self.lr_scheduler is None and self.ft_optimization.scheduler is not None:
            cls, kwargs = self.ft_optimization.scheduler
            self.lr_scheduler = build_scheduler(cls, kwargs, optimizer or self.optimizer, num_training_steps)
        return super().create_scheduler(num_training_steps, optimizer)

    def ft_stop_point(self, global_step: int) -> bool:
        """Whether a checkpoint at the end of ``global_step`` holds everything training carries into the next step,
        so that a run resumed from it continues exactly as the uninterrupted run: at every step end, unless a method
        buffers work across steps (GRPO's generated completions)."""
        return True

    def training_step(self, model, inputs, *args, **kwargs):
        if self._ft_preflight_pending:  # the first step of this process: everything a step relies on is set up
            from .preflight import run_preflight

            self._ft_preflight_pending = False
            self._ft_peak_floor = _peak_memory_bytes()
            self.ft_preflight_result = run_preflight(self, model, super().training_step, self.ft_preflight)
        ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None  # GRPO passes raw rows
        if ids is not None:
            mask = inputs.get("attention_mask")
            self._ft_count(ids.numel(), mask.sum() if mask is not None else ids.numel(), len(ids))
        return super().training_step(model, inputs, *args, **kwargs)

    def floating_point_ops(self, inputs) -> int:
        """Trainer's estimate, 6 × input tokens × non-embedding parameters, without recounting the parameters at
        every step: Trainer walks every module and parameter of the model for it each time (more, the larger or
        PEFT-wrapped the model; benchmarks/README.md), and the count does not change during training."""
        if self._ft_flop_params is None:
            if not hasattr(self.model, "num_parameters"):
                return super().floating_point_ops(inputs)
            self._ft_flop_params = self.model.num_parameters(exclude_embeddings=True)
        main_input = getattr(self.model, "main_input_name", "input_ids")
        return 6 * inputs[main_input].numel() * self._ft_flop_params if main_input in inputs else 0

    def _ft_count(self, padded: int, real, samples: int = 0) -> None:
        """Add one training micro-batch: ``padded`` positions, ``real`` of them tokens (a device tensor is fine), in
        ``samples`` sequences."""
        self._ft_started = self._ft_started or time.perf_counter()
        self._ft_padded += padded
        self._ft_samples += samples
        self._ft_real = real if self._ft_real is None else self._ft_real + real

    def ft_stats(self) -> dict:
        """Tokens, tokens/s, samples, padding efficiency and peak memory so far (train steps only)."""
        real = int(self._ft_real) if self._ft_real is not None else 0
        seconds = time.perf_counter() - self._ft_started if self._ft_started else 0.0
        stats = {"tokens": real, "tokens_per_second": round(real / seconds, 1) if seconds else None,
                 "samples": self._ft_samples,
                 "padding_efficiency": round(real / self._ft_padded, 4) if self._ft_padded else None}
        stats["peak_memory_gb"] = round(max(_peak_memory_bytes(), self._ft_peak_floor) / 2**30, 3)
        return stats

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs and self._ft_padded:  # training log lines only
            stats = self.ft_stats()
            logs = {**logs, "tokens_per_second": stats["tokens_per_second"],
                    "padding_efficiency": stats["padding_efficiency"]}
        super().log(logs, *args, **kwargs)


def _peak_memory_bytes() -> int:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss if sys.platform == "darwin" else rss * 1024
