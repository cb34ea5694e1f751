"""Generate ``assets/tiny-llama/``: a tiny, randomly initialised Llama config plus tokenizer.

The project's quickstart and tests must run offline on CPU, so instead of downloading a
model we ship a ~150k-parameter ``LlamaForCausalLM`` *config* (no weights: the project
builds it with ``AutoModelForCausalLM.from_config``) and a small byte-level BPE tokenizer
trained on a built-in corpus of arithmetic chat and plain English. Digits are always
single tokens so arithmetic is learnable. The tokenizer carries a ChatML chat template
whose assistant turns (content + ``<|im_end|>``) are wrapped in ``{% generation %}`` so
TRL's ``assistant_only_loss=True`` works.

Deterministic: re-running produces byte-identical files.
Usage: python scripts/make_tiny_model.py [--out assets/tiny-llama]
"""

import argparse
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

PAD, BOS, IM_START, IM_END = "<|pad|>", "<|bos|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [PAD, BOS, IM_START, IM_END]  # ids 0..3
VOCAB_SIZE = 512  # 256 byte symbols + 4 specials + 252 merges
MAX_LEN = 512

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- (message['content'] or '') + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

ENGLISH = """
You are a calculator. You are a helpful assistant. What is the answer? The answer is
the sum of the two numbers. Add the two numbers. Subtract the second number from the first.
Multiply the two numbers. Please answer with a single number and nothing else. The user asks
a question and the assistant gives an answer. This is a small model used for tests, so it
knows only a few words, but it can still read and write any text because every byte is a token.
Once upon a time there was a little bird who lived in a tree near the river. Every morning
she would sing a song for the people in the town, and they would stop to listen. One day a
cold wind came from the north and the bird could not find any food. The children of the
town saw that she was hungry, so they brought her bread and water. From that day on, the
bird and the children were good friends, and the town was never quiet again.
Here is a list of common words: time, year, people, way, day, man, woman, thing, world,
life, hand, part, child, eye, place, work, week, case, point, number, group, problem, fact,
good, new, first, last, long, great, little, own, other, old, right, big, high, different,
small, large, next, early, young, important, few, public, bad, same, able, to, of, in, for,
on, with, at, by, from, up, about, into, over, after, be, have, do, say, get, make, go,
know, take, see, come, think, look, want, give, use, find, tell, ask, seem, feel, try,
leave, call, yes, no, true, false, correct, wrong, plus, minus, times, equals, question.
"""


def corpus():
    """Fixed training text: English paragraphs plus arithmetic chat phrases (no randomness)."""
    lines = [line.strip() for line in ENGLISH.strip().splitlines()] * 4
    for a in range(0, 100, 7):
        for b in range(0, 100, 11):
            lines.append(f"What is {a} + {b}? {a + b}")
            lines.append(f"What is {a} - {b}? {a - b}")
            lines.append(f"{a} and {b}")
            lines.append(f"What is {a % 10} * {b % 10}? {(a % 10) * (b % 10)}")
    lines += ["system\nYou are a calculator.", "user\nWhat is", "assistant\n"] * 20
    return lines


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    # Split every digit into its own pre-token first, so BPE can never merge digits.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=IM_END, pad_token=PAD,
        additional_special_tokens=[IM_START], model_max_length=MAX_LEN,
        chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)


def build_config(tok) -> LlamaConfig:
    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=(len(tok) + 7) // 8 * 8, hidden_size=64, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=MAX_LEN, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_theta=10000.0, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)


def self_check(out: Path) -> None:
    import torch

    tok = AutoTokenizer.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    for text in ["What is 12 + 7?", "19", "You are a calculator.", "  Hello,\tworld!\n 3 - 40 = -37 "]:
        ids = tok(text).input_ids
        assert tok.decode(ids, skip_special_tokens=True) == text, (text, ids)
    assert all(len(tok(d, add_special_tokens=False).input_ids) == 1 for d in "0123456789")
    assert len(tok("1234567890").input_ids) == 10, "digits must be single tokens"
    assert tok.pad_token_id != tok.eos_token_id and tok.eos_token == IM_END
    assert cfg.vocab_size >= len(tok) and cfg.eos_token_id == tok.eos_token_id

    msgs = [{"role": "system", "content": "You are a calculator."},
            {"role": "user", "content": "What is 12 + 7?"},
            {"role": "assistant", "content": "19"},
            {"role": "user", "content": "What is 3 * 4?"},
            {"role": "assistant", "content": "12"}]
    enc = tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    expected = tok("19<|im_end|>12<|im_end|>", add_special_tokens=False).input_ids
    assert masked == expected, (tok.convert_ids_to_tokens(masked), expected)
    prompt = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n"), prompt

    print("rendered chat template:\n" + tok.apply_chat_template(msgs, tokenize=False))
    print("token / assistant_mask:")
    for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True):
        print(f"  {m} {i:4d} {tok.decode([i])!r}")

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    ids = tok.apply_chat_template(msgs[:2], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == cfg.vocab_size
    gen = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] <= ids["input_ids"].shape[1] + 5
    print(f"vocab: len(tokenizer)={len(tok)} config.vocab_size={cfg.vocab_size}")
    print(f"ids: pad={tok.pad_token_id} bos={tok.bos_token_id} "
          f"im_start={tok.convert_tokens_to_ids(IM_START)} eos(im_end)={tok.eos_token_id}")
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    print("self-check OK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "assets/tiny-llama")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json.
    tok.save_pretrained(out, save_jinja_files=False)
    cfg = build_config(tok)
    cfg.save_pretrained(out)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(out)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")
    self_check(out)


if __name__ == "__main__":
    main()
