"""A transformers tokenizer as GGUF metadata: the token list with llama.cpp's token types, the BPE merges, the special
token ids, the add-BOS/EOS flags and the chat template.

The list and types follow llama.cpp's converter: every id up to the model's vocabulary size, ids the tokenizer has no
token for written as ``[PAD<id>]`` (unused), added tokens marked control when special and user-defined when not.
Merges, special ids, flags and the template are read from the saved tokenizer folder by ``gguf.SpecialVocab``.

Two tokenizer kinds are written: byte-level BPE (Llama 3, Qwen2, SmolLM2; llama.cpp's ``gpt2`` model) and
SentencePiece-style BPE with byte fallback (Llama 2, Mistral; llama.cpp's ``llama`` model). For byte-level BPE,
llama.cpp also needs the name of the rule that splits text before BPE (``tokenizer.ggml.pre``): ``pre_tokenizer``
reads it off the tokenizer's own pre-tokenizer, matching the split patterns transformers' GGUF reader knows by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import ExportError

BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def tokenizer_kind(tokenizer, where: str) -> str:
    """"gpt2" (byte-level BPE) or "llama" (SentencePiece-style BPE with byte fallback); anything else is refused."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else {}
    model = spec.get("model") or {}
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        return "llama"
    if model.get("type") == "BPE" and (spec.get("decoder") or {}).get("type") == "ByteLevel":
        return "gpt2"
    raise ExportError(f"{where}: the tokenizer is a {model.get('type') or type(tokenizer).__name__} tokenizer; "
                      "ft export writes byte-level BPE (Llama 3, Qwen2, SmolLM2) and SentencePiece-style BPE with "
                      "byte fallback (Llama 2, Mistral) tokenizers. Nothing was written.")


def add_tokenizer(writer, tokenizer, vocab_size: int, folder: Path, where: str) -> str | None:
    """Write the tokenizer's metadata; returns the pre-tokenizer name written (byte-level BPE only)."""
    import gguf

    kind = tokenizer_kind(tokenizer, where)
    tokens, scores, types = _tokens(tokenizer, vocab_size, kind, where)
    writer.add_tokenizer_model(kind)
    pre = pre_tokenizer(tokenizer) if kind == "gpt2" else None
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    if kind == "llama":
        writer.add_token_scores(scores)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    special.add_special_token.update(adds_special_tokens(tokenizer))
    special.add_to_gguf(writer, quiet=True)
    return pre


def adds_special_tokens(tokenizer) -> dict[str, bool]:
    """Whether encoding a text adds BOS / EOS, as the tokenizer behaves (what gguf's SpecialVocab infers from the
    files is a guess: without a flag or a template post-processor it writes none, and readers then assume BOS)."""
    ids = tokenizer("a")["input_ids"]
    flags = {}
    if tokenizer.bos_token_id is not None:
        flags["bos"] = bool(ids) and ids[0] == tokenizer.bos_token_id
    if tokenizer.eos_token_id is not None:
        flags["eos"] = bool(ids) and ids[-1] == tokenizer.eos_token_id
    return flags


def _tokens(tokenizer, vocab_size: int, kind: str, where: str):
    """(tokens, scores, types) for ids 0..vocab_size-1. Scores matter only to llama.cpp's SentencePiece-style
    tokenizer, which prefers higher ones: a token's score is minus its id, the order BPE learned them in."""
    import gguf

    vocab = tokenizer.get_vocab()
    if vocab and max(vocab.values()) >= vocab_size:
        raise ExportError(f"{where}: the tokenizer has ids up to {max(vocab.values())} but the model's vocabulary "
                          f"(vocab_size) is {vocab_size}; the tokenizer does not belong to this model. Nothing "
                          "was written.")
    by_id = {index: token for token, index in vocab.items()}
    added = tokenizer.added_tokens_decoder
    unknown = tokenizer.unk_token_id
    tokens, scores, types = [], [], []
    for index in range(vocab_size):
        token = by_id.get(index)
        if token is None:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif index in added:
            tokens.append(added[index].content)
            types.append(gguf.TokenType.CONTROL if added[index].special else gguf.TokenType.USER_DEFINED)
        elif index == unknown:
            tokens.append(token)
            types.append(gguf.TokenType.UNKNOWN)
        elif kind == "llama" and BYTE_TOKEN.fullmatch(token):
            tokens.append(token)
            types.append(gguf.TokenType.BYTE)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
        scores.append(0.0 if types[-1] != gguf.TokenType.NORMAL else -float(index))
    return tokens, scores, types


def pre_tokenizer(tokenizer) -> str:
    """llama.cpp's name for how the tokenizer splits text before BPE: a split pattern transformers' GGUF reader maps
    to a name, GPT-2's own, or SmolLM's (single digits, then GPT-2's); "default" when none matches (llama.cpp then
    uses its default split)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    spec = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    steps = spec.get("pretokenizers", [spec]) if spec.get("type") == "Sequence" else [spec]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = (steps[0].get("pattern") or {}).get("Regex")
        for name, split in GGUF_PRE_TOKENIZER_SPLITS.items():
            if split == pattern:
                return name
    return "default"
