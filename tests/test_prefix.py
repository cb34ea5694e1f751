"""A batch of prompts that begin alike (``ft.inference.prefix``): the shared beginning is read by the model once and
each row's own tokens after it, and the answers are the ones each prompt gets generated alone."""

from __future__ import annotations

import pytest
import torch
from conftest import ASSETS

from ft.inference.generate import Sampling, generation_config
from ft.inference.prefix import MIN_SHARED, generate_batch, shared_length


def test_the_shared_beginning_leaves_each_row_a_token_of_its_own():
    assert shared_length([[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 3, 4, 7]]) == 3
    assert shared_length([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter row keeps its last token
    assert shared_length([[9, 2], [1, 2]]) == 0 and shared_length([]) == 0


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ASSETS)).eval()
    return model, AutoTokenizer.from_pretrained(ASSETS)


def _forward_lengths(model) -> tuple[list[tuple[int, int]], object]:
    """(batch, sequence length) of each forward pass the model's decoder runs, recorded by a forward hook."""
    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_hook(lambda _m, args, kwargs, _out: seen.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    return seen, hook


def test_a_batch_sharing_its_beginning_reads_it_once_and_answers_as_each_prompt_alone(tiny):
    model, tokenizer = tiny
    beginning = "You are a careful assistant. These are the tools: " + " ".join(f"tool_{i}" for i in range(20))
    prompts = [f"{beginning} Question {q}: what is {q} times {q + 3}?" for q in (1, 22, 333)]
    ids = [tokenizer(prompt).input_ids for prompt in prompts]
    shared = shared_length(ids)
    assert shared >= MIN_SHARED and len({len(row) for row in ids}) > 1  # own parts of different lengths: padded
    config = generation_config(model, tokenizer, Sampling(max_new_tokens=6))
    config.eos_token_id = []  # every row writes its six tokens

    seen, hook = _forward_lengths(model)
    try:
        output, width = generate_batch(model, ids, tokenizer.pad_token_id or 0, config)
    finally:
        hook.remove()
    own = width - shared
    assert seen[:2] == [(1, shared), (3, own)]  # the beginning once, then each row's own tokens, never the whole
    assert seen[2:] == [(3, 1)] * 5  # then one token at a time: six new tokens, the first from the own tokens
    for row, prompt_ids in zip(output[:, width:].tolist(), ids, strict=True):
        alone = model.generate(torch.tensor([prompt_ids]), generation_config=config)
        assert row == alone[0, len(prompt_ids):].tolist()


def test_a_batch_that_shares_too_little_is_padded_on_the_left(tiny):
    model, tokenizer = tiny
    ids = [tokenizer(prompt).input_ids for prompt in ("One two three four five six", "Seven eight")]
    config = generation_config(model, tokenizer, Sampling(max_new_tokens=3))
    seen, hook = _forward_lengths(model)
    try:
        output, width = generate_batch(model, ids, tokenizer.pad_token_id or 0, config)
    finally:
        hook.remove()
    assert seen[0] == (2, width) == (2, max(map(len, ids)))  # the whole of each prompt, as generate always reads it
    assert output[1, :width - len(ids[1])].tolist() == [tokenizer.pad_token_id or 0] * (width - len(ids[1]))
