"""The worst batch first: before the first step, one forward and backward of the largest batch the data can produce.

A run that runs out of memory when its longest rows finally come up (step 120, hours in) fails here instead, in
seconds, with the recipe changes that would fit. ``FtTrainerMixin.training_step`` runs it once per process, at its
first call: by then Trainer has done everything the steps rely on (activation checkpointing switched on, the model
wrapped for DDP, autocast set up), so the probe uses memory as a step does. It leaves no trace: the gradients are
cleared, the RNG states (Python, NumPy, torch CPU and CUDA) and the method's logged metrics are put back as they were,
so training is bit-identical to a run without it (tested). The optimizer's state is not allocated yet (it comes at
the first optimizer step); ``ft plan``'s figure for it is added to the measured peak for the step's prediction.

The largest batch is the per-device batch size of the longest rows, as the trainer's collator pads them: for
tokenized rows the length of ``input_ids``; for preference rows (TRL's ``prompt_ids``, ``chosen_ids``,
``rejected_ids``) the prompt plus the longer of the answers (chosen and rejected go through the model together).
For the methods that sample their batches (GRPO, RLOO), the longest prompts followed by ``max_completion_length``
tokens go forward and backward through the policy alone (``_generated_batch``).
"""

from __future__ import annotations

import copy
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import FtError
from ..units import human


class PreflightOutOfMemory(FtError):
    """The largest batch does not fit (exit code 2, before any step and any checkpoint). The message is for the user."""


@dataclass(frozen=True)
class PreflightSettings:
    """What ``ft.run.train`` hands the trainer for the probe (from the recipe and the machine)."""

    say: Callable[[str], None]
    estimate_bytes: float | None = None  # ft plan's peak for the step
    optimizer_state_bytes: float = 0.0  # ft plan's optimizer state, allocated at the first optimizer step
    device_bytes: int | None = None  # the accelerator's memory (None on a CPU)
    fixes: tuple[str, ...] = field(default_factory=tuple)  # the recipe changes that lower the peak, most useful first
    completion_length: int | None = None  # a method that generates: the completion tokens its loss runs on


def settings_for(recipe, cuda: bool, sharded: bool, say: Callable[[str], None]) -> PreflightSettings | None:
    """The probe's settings, or None where it does not run: ``train.preflight: false``; unset on a CPU (memory seldom
    runs out there, and the probe costs a step); a method that generates its batches; FSDP or DeepSpeed, whose
    sharded gradients a probe would have to clear inside their engines (not done yet)."""
    from ..plan.shape import PlanError
    from ..plan.suggest import step_figures
    from ..recipe.methods import generation_of

    wanted = recipe.train.preflight
    if wanted is False or (wanted is None and not cuda):
        return None
    generation = generation_of(recipe)
    completion = generation.max_completion_length if generation is not None else None
    if sharded:
        say("preflight: memory: not run under FSDP or DeepSpeed (not probed yet); `ft plan` estimates the memory")
        return None
    device = None
    if cuda:
        import torch

        device = int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    try:
        figures = step_figures(recipe, "cuda" if cuda else "cpu", device)
    except PlanError:
        figures = None
    if figures is None:
        return PreflightSettings(say, device_bytes=device, completion_length=completion)
    return PreflightSettings(say, figures.peak, figures.optimizer_state, device, figures.lowering, completion)


NOT_TOKENS = frozenset({"position_ids", "token_type_ids", "seq_ids"})  # per-token columns that are not the tokens


def longest_rows(dataset, count: int) -> list[int] | None:
    """Indices of the ``count`` longest rows (ties: the earliest), read from Arrow without a pass in Python; None
    when the dataset has no token columns (a streamed or not yet tokenized one)."""
    import numpy as np
    import pyarrow.compute as pc

    try:
        table = dataset.with_format("arrow")[:]
    except (AttributeError, TypeError):
        return None
    names = [name for name in table.column_names if name.endswith("_ids") and name not in NOT_TOKENS]
    if not names or not len(table):
        return None

    def lengths(name: str):
        return pc.list_value_length(table[name]).to_numpy(zero_copy_only=False).astype(np.int64)

    answers = [lengths(name) for name in names if not name.startswith("prompt")]
    total = np.maximum.reduce(answers) if answers else np.zeros(len(table), np.int64)
    for name in names:
        if name.startswith("prompt"):
            total = total + lengths(name)
    return np.argsort(-total, kind="stable")[:count].tolist()


def run_preflight(trainer, model, step: Callable, settings: PreflightSettings) -> dict | None:
    """Forward and backward of the largest batch through ``step`` (the trainer's own training step), measured; the
    result goes into summary.json's ``preflight``. Raises PreflightOutOfMemory when it does not fit."""
    import torch

    if settings.completion_length is not None and "images" in (trainer.train_dataset.column_names or ()):
        settings.say("preflight: memory: skipped (the prompts hold images, which the policy's rehearsed batch of "
                     "token ids would leave out; ft plan estimates their tokens)")
        return None
    if settings.completion_length is not None:
        batch = _generated_batch(trainer, settings.completion_length)
        step = _policy_step(trainer)
    else:
        dataset = trainer.train_dataset
        if getattr(trainer.args, "remove_unused_columns", False) and hasattr(trainer, "_remove_unused_columns"):
            dataset = trainer._remove_unused_columns(dataset, description="training")
        chosen = longest_rows(dataset, trainer.args.per_device_train_batch_size)
        batch = trainer.data_collator([dataset[i] for i in chosen]) if chosen is not None else None
    if batch is None:
        settings.say("preflight: memory: skipped (the training rows are not tokenized where ft can read their lengths)")
        return None
    shape = _shape(batch)
    cuda = torch.cuda.is_available() and next(model.parameters()).is_cuda
    kept = (_rng_states(cuda), copy.deepcopy(getattr(trainer, "_metrics", None)),
            getattr(trainer, "_total_train_tokens", None))
    meter = _Meter(cuda)
    started = time.perf_counter()
    try:
        step(model, batch)
        if cuda:
            torch.cuda.synchronize()
    except RuntimeError as exc:
        if not _out_of_memory(exc):
            raise
        del batch
        model.zero_grad(set_to_none=True)
        raise PreflightOutOfMemory(_no_fit(shape, exc, settings)) from None
    finally:
        _restore(trainer, kept, cuda)
    seconds = time.perf_counter() - started
    peak = meter.peak()
    model.zero_grad(set_to_none=True)
    result = {"batch": shape, "peak_bytes": peak, "seconds": round(seconds, 3), "measured": meter.source,
              "optimizer_state_bytes": round(settings.optimizer_state_bytes),
              "estimate_bytes": round(settings.estimate_bytes) if settings.estimate_bytes is not None else None}
    line = f"preflight: memory: the largest batch ({_describe(shape)}) went forward and backward in {seconds:.2f} s"
    if meter.cuda:  # the allocator's peak holds the weights too: comparable with ft plan's figure for the step
        step_peak = peak + settings.optimizer_state_bytes
        line += f", peak {human(peak)}; with the optimizer state, a step needs about {human(step_peak)}"
        if settings.estimate_bytes is not None:
            line += f" (ft plan estimated {human(settings.estimate_bytes)})"
        if settings.device_bytes and step_peak > settings.device_bytes:
            line += (f", more than the GPU's {human(settings.device_bytes)}: it may run out of memory at the first "
                     "optimizer step. Changes that lower the peak: " + "; ".join(settings.fixes[:3]))
    else:
        line += f"; the resident memory grew by {human(peak)} (gradients and activations)"
        if settings.estimate_bytes is not None:
            line += f"; ft plan estimated {human(settings.estimate_bytes)} for a whole step, weights included"
    settings.say(line)
    return result


def _generated_batch(trainer, completion_length: int) -> dict | None:
    """For a method that samples its batches (GRPO, RLOO): the longest prompts at the per-device batch size (its
    completions per step), each followed by ``completion_length`` tokens with loss on them: the shape the policy's
    loss runs forward and backward on at the longest. The prompts are rendered as the trainer renders them (their
    chat template); ranked by characters first, so only a few are tokenized."""
    import torch

    dataset, tokenizer = trainer.train_dataset, trainer.processing_class
    count = trainer.args.per_device_train_batch_size
    try:
        prompts = dataset["prompt"][:]  # a list at once (a Column reads row by row)
    except (KeyError, TypeError):
        return None

    def text(prompt) -> str:
        if isinstance(prompt, list):
            return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return prompt

    by_chars = sorted(range(len(prompts)), key=lambda i: -len(str(prompts[i])))[:4 * count]
    encoded = {i: tokenizer(text(prompts[i]), add_special_tokens=not isinstance(prompts[i], list))["input_ids"]
               for i in by_chars}
    longest = sorted(encoded, key=lambda i: -len(encoded[i]))[:count]
    rows = [encoded[longest[k % len(longest)]] for k in range(count)]  # fewer prompts than a batch: repeated
    width = max(len(row) for row in rows) + completion_length
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    filler = torch.randint(0, len(tokenizer), (count, completion_length), generator=torch.Generator().manual_seed(0))
    ids = torch.full((count, width), pad)
    mask = torch.zeros((count, width), dtype=torch.long)
    labels = torch.full((count, width), -100)
    for k, row in enumerate(rows):  # left-padded prompts, as TRL generates from them
        start = width - completion_length - len(row)
        ids[k, start:width - completion_length] = torch.tensor(row)
        ids[k, width - completion_length:] = filler[k]
        mask[k, start:] = 1
        labels[k, width - completion_length:] = filler[k]
    device = trainer.args.device
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def _policy_step(trainer):
    """Forward and backward of the policy alone, under the trainer's autocast: GRPO's and RLOO's own step needs the
    rewards and advantages of a generation, which the probe does not run (the reference model's and the reward
    models' passes are without gradients and smaller)."""

    def step(model, batch):
        with trainer.compute_loss_context_manager():
            loss = model(**batch, use_cache=False).loss
        trainer.accelerator.backward(loss)
        return loss.detach()

    return step


def _shape(batch) -> dict:
    """The batch's sequences and padded length, per tensor of token ids."""
    shapes = {name: list(value.shape) for name, value in batch.items()
              if name.endswith("_ids") and name not in NOT_TOKENS and hasattr(value, "shape")}
    sequences = max((s[0] for s in shapes.values()), default=0)
    tokens = sum(s[0] * s[-1] for s in shapes.values() if len(s) == 2)
    return {"sequences": sequences, "tokens": tokens, "tensors": shapes}


def _describe(shape: dict) -> str:
    parts = [f"{name} {' × '.join(map(str, dims))}" for name, dims in shape["tensors"].items()]
    return ", ".join(parts) or f"{shape['sequences']} sequences"


def _out_of_memory(exc: RuntimeError) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's failure ("DefaultCPUAllocator: can't allocate memory")."""
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or bool(
        re.search(r"out of memory|can't allocate memory|not enough memory", str(exc), re.I))


def _no_fit(shape: dict, exc: RuntimeError, settings: PreflightSettings) -> str:
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    need = f" ft plan estimates {human(settings.estimate_bytes)} for a step" if settings.estimate_bytes else ""
    if settings.device_bytes:
        need += f"{',' if need else ''} the GPU has {human(settings.device_bytes)}"
    fixes = "; ".join([*settings.fixes, "a shorter data.max_length"])
    return (f"preflight: memory: the largest batch the data makes ({_describe(shape)}, per device) ran out of memory "
            f"in forward and backward before the first step ({first}).{need and need + '.'} Changes that lower the "
            f"peak: {fixes}. Nothing was trained and no checkpoint was written; `train.preflight: false` skips this "
            "check (the same batch would fail when it comes up in training).")


class _Meter:
    """The peak memory of what runs between its creation and ``peak()``: CUDA's allocator peak (the counter is reset
    here; the process's peak before it is kept in ``floor_bytes``), or on a CPU the growth of the peak resident set
    over the resident set at the start (Linux: the kernel's high-water mark, reset through /proc/self/clear_refs)."""

    def __init__(self, cuda: bool):
        import torch

        self.cuda = cuda
        self.source = "cuda_max_allocated" if cuda else "process_rss_growth"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        self.start = _status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass  # the peak then starts from the process's earlier peak: an upper bound

    def peak(self) -> int:
        import torch

        if self.cuda:
            return int(torch.cuda.max_memory_allocated())
        return max(0, _status_kib("VmHWM") - self.start) * 1024


def _status_kib(name: str) -> int:
    try:
        with open("/proc/self/status") as f:
            return int(re.search(rf"^{name}:\s+(\d+) kB", f.read(), re.M).group(1))
    except (OSError, AttributeError):
        return 0


def _rng_states(cuda: bool) -> dict:
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if cuda else None}


def _restore(trainer, kept, cuda: bool) -> None:
    """The RNG states and the method's logged metrics as they were before the probe."""
    import numpy as np
    import torch

    states, metrics, tokens = kept
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["cpu"])
    if cuda:
        torch.cuda.set_rng_state_all(states["cuda"])
    if metrics is not None:
        trainer._metrics = metrics
    if tokens is not None:
        trainer._total_train_tokens = tokens
