"""Generation for a batch of prompts that begin alike, the tokens they share read by the model once.

Held-out chats share their beginning: the chat template's system prompt, and in a tool-calling chat the tool
definitions rendered before every question (about 180 of a held-out tool call's 260 tokens). Generating the batch
as usual (each prompt padded on the left) reads that beginning once per row; here it is read once, its keys and
values (transformers' ``DynamicCache``) repeated for every row, and each row's own tokens follow it, padded in the
middle, the padding masked out. Positions come from the attention mask, so each row's own tokens sit where they sit
in the whole prompt. This is transformers' documented prompt reuse (generate continuing from a cache of the
prompt's beginning), for a batch.

Only models whose every layer attends over the whole sequence take this path (a sliding-window or recurrent layer
would count the padding in the middle as tokens); the others, and batches that share too little, are generated as
usual."""

from __future__ import annotations

MIN_SHARED = 16  # tokens: below this, reading the shared beginning once saves less than repeating its cache costs


def shared_length(ids: list[list[int]]) -> int:
    """The number of tokens every one of ``ids`` begins with, leaving each at least one token of its own (generation
    continues after a token the model reads with the row's own)."""
    if not ids:
        return 0
    limit = min(len(row) for row in ids) - 1
    first, n = ids[0], 0
    while n < limit and all(row[n] == first[n] for row in ids):
        n += 1
    return n


def generate_batch(model, ids: list[list[int]], pad_id: int, config):
    """``model.generate`` of the token lists ``ids`` as one batch, with ``config``: (the output, batch by width of
    the inputs plus the new tokens, and the width of the inputs: the new tokens are ``output[:, width:]``). Their
    shared beginning is read once when it is at least ``MIN_SHARED`` tokens and the model attends over the whole
    sequence in every layer; otherwise each row is padded on the left."""
    import torch

    shared = shared_length(ids) if len(ids) > 1 else 0
    reusable = shared >= MIN_SHARED and getattr(config, "cache_implementation", None) is None  # generate builds none
    cache = _cache(model) if reusable else None
    if cache is None:
        shared = 0
    width = max(len(row) for row in ids)
    rows = [row[:shared] + [pad_id] * (width - len(row)) + row[shared:] for row in ids]
    mask = [[1] * shared + [0] * (width - len(row)) + [1] * (len(row) - shared) for row in ids]
    device = model.device
    inputs = {"input_ids": torch.tensor(rows, device=device), "attention_mask": torch.tensor(mask, device=device)}
    with torch.no_grad():
        if cache is not None:
            keyword = _cache_keyword(model)
            model(input_ids=inputs["input_ids"][:1, :shared], use_cache=True, **{keyword: cache})
            cache.batch_repeat_interleave(len(ids))
            inputs[keyword] = cache
        return model.generate(**inputs, generation_config=config), width


def _cache(model):
    """An empty ``DynamicCache`` for ``model``, or None when one of its layers does not attend over the whole
    sequence (sliding-window, recurrent or linear-attention layers)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 (a config the cache cannot read: the batch is generated as usual)
        return None
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return cache


def _cache_keyword(model) -> str:
    """The keyword the model's forward takes a cache by: ``cache`` (transformers 5.x), or ``past_key_values``
    (earlier, and the name 5.x still maps to ``cache``)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
