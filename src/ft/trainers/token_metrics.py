"""SFT's training metrics measured on the logits ft's own loss path already has (``trainers.sft``): entropy and
top-1 accuracy summed over the positions that have a target, in float32 chunks of at most ``ENTROPY_CHUNK`` values.

The chunk size is a fact of ``ft plan``'s memory model (``ft.plan.memory.ENTROPY_CHUNK``), which counts three such
chunks for these metrics; the metrics read it from there.
"""

from __future__ import annotations

from ..plan.memory import ENTROPY_CHUNK


def scored_sums(logits, targets, mask, elements: int = ENTROPY_CHUNK, pick: bool | None = None):
    """(summed entropy, count of correct top-1 predictions) over the positions that have a target (``mask``).

    On a CPU the targeted positions are gathered straight from ``logits`` (often a non-contiguous view, the logits
    shifted by one) in chunks of rows, so prompt and padding positions (most of an SFT batch) cost nothing and no
    copy of all the logits is made: on a 49k vocabulary and batch 8 × 40 that copy alone took most of the metric's
    time. On an accelerator every row is scored and the mask multiplied in, because picking rows by a mask would
    wait for the device (``pick`` overrides the choice). Rows go in float32 chunks of about ``elements`` values
    (128 MB), so a large vocabulary times a long batch never needs one float32 copy of all the logits."""
    import torch

    pick = logits.device.type == "cpu" if pick is None else pick
    rows = max(1, elements // logits.size(-1))
    entropy = torch.zeros((), device=logits.device)
    correct = torch.zeros((), device=logits.device, dtype=torch.long)
    if pick:
        where = mask.nonzero(as_tuple=True)  # one index tensor per leading dimension
        for start in range(0, where[0].numel(), rows):
            at = tuple(index[start:start + rows] for index in where)
            block = logits[at]
            log_probs = torch.log_softmax(block.float(), dim=-1)
            entropy += -(log_probs.exp() * log_probs).sum()
            correct += (block.argmax(-1) == targets[at]).sum()
        return entropy, correct
    flat, keep, wanted = logits.reshape(-1, logits.size(-1)), mask.reshape(-1), targets.reshape(-1)
    for start in range(0, flat.size(0), rows):
        block, chosen, answers = flat[start:start + rows], keep[start:start + rows], wanted[start:start + rows]
        log_probs = torch.log_softmax(block.float(), dim=-1)
        per_row, hits = -(log_probs.exp() * log_probs).sum(-1), block.argmax(-1) == answers
        entropy += (per_row * chosen).sum()
        correct += (hits & chosen).sum()
    return entropy, correct
