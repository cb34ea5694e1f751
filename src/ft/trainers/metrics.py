"""Evaluation metrics computed batch by batch.

``preprocess_logits_for_metrics`` runs on each evaluation batch right after the forward pass and replaces the
(batch × length × vocab) logits by two numbers per token — the argmax and the label's negative
log-likelihood — so evaluation memory no longer grows with the vocabulary. ``compute_metrics`` then reads
only those. Labels are shifted as in causal-LM training; positions labelled -100 are ignored.
"""

from __future__ import annotations

import math

from ..data.labels import IGNORE_INDEX


def reduce_logits(logits, labels):
    import torch

    if isinstance(logits, tuple):
        logits = logits[0]
    logits, targets = logits[:, :-1, :], labels[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), targets.clamp(min=0), reduction="none")
    return torch.stack([logits.argmax(-1).float(), nll], dim=-1)


def _shifted(eval_pred):
    import numpy as np

    reduced, labels = eval_pred.predictions, eval_pred.label_ids
    targets = labels[:, 1:]
    width = min(reduced.shape[1], targets.shape[1])
    reduced, targets = reduced[:, :width], targets[:, :width]
    keep = targets != IGNORE_INDEX
    return np.asarray(reduced), targets, keep


def token_accuracy(eval_pred) -> float:
    reduced, targets, keep = _shifted(eval_pred)
    return float((reduced[..., 0][keep] == targets[keep]).mean()) if keep.any() else 0.0


def perplexity(eval_pred) -> float:
    reduced, _, keep = _shifted(eval_pred)
    return float(math.exp(min(reduced[..., 1][keep].mean(), 50.0))) if keep.any() else float("nan")


METRICS = {"token_accuracy": token_accuracy, "perplexity": perplexity}


def metric_kwargs(names: list[str]) -> dict:
    """Trainer keyword arguments for the recipe's ``metrics:`` (empty when none are asked for)."""
    if not names:
        return {}

    def compute_metrics(eval_pred) -> dict:
        return {name: METRICS[name](eval_pred) for name in names}

    return {"compute_metrics": compute_metrics, "preprocess_logits_for_metrics": reduce_logits}
