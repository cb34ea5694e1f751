"""``FtTrainerMixin``: what ft adds to every TRL trainer, whatever the method.

- Token accounting without a device sync per step: tokens fed, non-padding tokens, their ratio
  (padding efficiency) and tokens per second, added to every log line and to ``summary.json``.
- Peak memory (CUDA allocator peak on GPU, the process's peak RSS on CPU) in the same places.

It overrides only documented extension points of ``transformers.Trainer`` (``training_step``, ``log``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping


class FtTrainerMixin:
    _ft_padded = 0  # token positions fed to the model (padding included)
    _ft_real = None  # non-padding tokens, a device tensor summed lazily (no sync per step)
    _ft_started: float | None = None

    def training_step(self, model, inputs, *args, **kwargs):
        ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None  # GRPO passes raw rows
        if ids is not None:
            mask = inputs.get("attention_mask")
            self._ft_count(ids.numel(), mask.sum() if mask is not None else ids.numel())
        return super().training_step(model, inputs, *args, **kwargs)

    def _ft_count(self, padded: int, real) -> None:
        """Add one training micro-batch: ``padded`` positions, ``real`` of them tokens (a device tensor is fine)."""
        self._ft_started = self._ft_started or time.perf_counter()
        self._ft_padded += padded
        self._ft_real = real if self._ft_real is None else self._ft_real + real

    def ft_stats(self) -> dict:
        """Tokens, tokens/s, padding efficiency and peak memory so far (train steps only)."""
        real = int(self._ft_real) if self._ft_real is not None else 0
        seconds = time.perf_counter() - self._ft_started if self._ft_started else 0.0
        stats = {"tokens": real, "tokens_per_second": round(real / seconds, 1) if seconds else None,
                 "padding_efficiency": round(real / self._ft_padded, 4) if self._ft_padded else None}
        stats["peak_memory_gb"] = _peak_memory_gb()
        return stats

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs and self._ft_padded:  # training log lines only
            stats = self.ft_stats()
            logs = {**logs, "tokens_per_second": stats["tokens_per_second"],
                    "padding_efficiency": stats["padding_efficiency"]}
        super().log(logs, *args, **kwargs)


def _peak_memory_gb() -> float:
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**30, 3)
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(rss / (2**30 if sys.platform == "darwin" else 2**20), 3)
