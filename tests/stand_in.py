"""A stand-in for a causal language model in exact-match tests: ``generate`` writes, for each (left-padded) prompt,
the token ids its subclass's ``written`` gives for the prompt's text, cut or padded to ``max_new_tokens``; no weights,
so what is scored is known exactly."""

from __future__ import annotations

import torch


class Writer(torch.nn.Module):
    def __init__(self, tokenizer):
        from transformers import GenerationConfig

        super().__init__()
        self.tokenizer = tokenizer
        self.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return self.anchor.device

    def written(self, prompt: str) -> list[int]:
        """The ids the model writes after ``prompt`` (its decoded text, padding included)."""
        raise NotImplementedError

    def generate(self, input_ids, attention_mask, generation_config):
        assert (attention_mask[:, -1] == 1).all()  # left padding: every prompt ends at the last column
        width = generation_config.max_new_tokens
        rows = [self.written(self.tokenizer.decode(ids))[:width] for ids in input_ids.tolist()]
        new = [row + [generation_config.pad_token_id] * (width - len(row)) for row in rows]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)
