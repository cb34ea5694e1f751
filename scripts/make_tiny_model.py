"""Generate ``assets/tiny-llama/`` and the smoke-test family assets (``src/ft/smoke/assets/``, package data): tiny
Llama, Qwen2, Mistral and Gemma configs plus tokenizers.

The project's quickstart and tests must run offline on CPU, so instead of downloading a
model we ship a ~150k-parameter ``LlamaForCausalLM`` *config* (no weights: the project
builds it with ``AutoModelForCausalLM.from_config``) and a small byte-level BPE tokenizer
trained on a built-in corpus of arithmetic chat and plain English. Digits are always
single tokens so arithmetic is learnable. The tokenizer carries a ChatML chat template
whose assistant turns (content + ``<|im_end|>``) are wrapped in ``{% generation %}`` so
TRL's ``assistant_only_loss=True`` works.

``ft train RECIPE --smoke`` replaces a recipe's model by a tiny random one of the same family; offline, where the
real config and tokenizer cannot be read, it takes them from its package's ``assets/tiny-<family>/`` (``FAMILIES``,
in the folders ``ft.smoke.tiny_model.FAMILIES`` names): the family's transformers config class at the smoke test's
sizes (``ft.smoke.tiny_model.TINY``: 2 layers, hidden 64, 4 heads, 2 kv heads, intermediate 128) and
a tokenizer trained like tiny-llama's on the same corpus, with the family's special tokens, BOS behaviour and chat
template (Llama 3 headers, Qwen2 ChatML, Mistral ``[INST]``, Gemma ``<start_of_turn>``). Each is checked here:
ft's loss masks of a rendered conversation must hold exactly the assistant answers and the end-of-turn text.

Deterministic: re-running produces byte-identical files.
Usage: python scripts/make_tiny_model.py        (writes assets/tiny-llama and every FAMILIES entry into the package)
       python scripts/make_tiny_model.py --out DIR            (tiny-llama only, into DIR)
"""

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GemmaConfig,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from ft.data.templates import CHATML, LLAMA3
from ft.smoke.tiny_model import FAMILIES as ASSET_FOLDERS
from ft.smoke.tiny_model import TINY as SMOKE_SIZES

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


def train_bpe(specials: list[str]) -> Tokenizer:
    """The byte-level BPE model every tiny tokenizer uses: ``specials`` take ids 0.., then bytes and merges."""
    tok = Tokenizer(models.BPE())
    # Split every digit into its own pre-token first, so BPE can never merge digits.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def build_tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(SPECIALS), bos_token=BOS, eos_token=IM_END, pad_token=PAD,
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


# --- the smoke-test family assets ---------------------------------------------------------------------------------
# Each template follows its family's published one (system-message handling and role checks included), with the
# assistant's text wrapped in {% generation %} markers as in tiny-llama's.

LLAMA3_TEMPLATE = LLAMA3  # ft's built-in `llama3` template: Meta's, without its date preamble

# Qwen2 Instruct: ft's ChatML, with Qwen's default system message when the chat has none
_LOOP = "{%- for message in messages %}"
QWEN2_TEMPLATE = CHATML.replace(_LOOP, _LOOP + (
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"), 1)

MISTRAL_TEMPLATE = (  # Mistral Instruct v0.3 style: [INST] turns, strictly alternating; a system message opens the
    # first user turn
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- generation %}{{- ' ' + message['content'] | trim + eos_token }}{%- endgeneration %}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported, with the exception of an initial "
    "optional system message!') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

GEMMA_TEMPLATE = (  # Gemma (1.x, 2) instruct: <start_of_turn>user / model, no system role, strictly alternating
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{{- raise_exception('System role not supported') }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<start_of_turn>model\\n' }}"
    "{%- generation %}{{- message['content'] | trim + '<end_of_turn>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- '<start_of_turn>' + message['role'] + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

# the smoke test's sizes (ft.smoke.tiny_model shrinks a real config to these; a family asset is already this small)
TINY = {**SMOKE_SIZES, "head_dim": SMOKE_SIZES["hidden_size"] // SMOKE_SIZES["num_attention_heads"]}


@dataclass(frozen=True)
class Family:
    """One smoke-test family asset (written to the folder ``ft.smoke.tiny_model.FAMILIES`` names for it)."""

    config: type  # the family's transformers config class
    specials: tuple[str, ...]  # special tokens, ids 0.. in this order (as the real tokenizers order theirs)
    bos: str | None
    eos: str
    pad: str | None  # None: the family ships no pad token (ft pads with eos, as with the real model)
    template: str
    add_bos: bool  # the tokenizer writes BOS when it encodes text (Llama 3, Mistral and Gemma do; Qwen2 does not)
    stop: tuple[str, ...]  # generation_config.eos_token_id: the tokens generation stops at
    unk: str | None = None
    extra: dict = field(default_factory=dict)  # the family's own config fields, at their real models' values
    messages: tuple = ()  # the conversation self_check renders


FAMILIES = {
    "llama": Family(
        LlamaConfig,
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, template=LLAMA3_TEMPLATE, add_bos=True,
        stop=("<|end_of_text|>", "<|eot_id|>"),
        extra={"tie_word_embeddings": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
               "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}}),
    "qwen2": Family(
        Qwen2Config, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", template=QWEN2_TEMPLATE, add_bos=False,
        stop=("<|im_end|>", "<|endoftext|>"),
        extra={"tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_parameters":
               {"rope_type": "default", "rope_theta": 1000000.0}, "use_sliding_window": False,
               "max_window_layers": TINY["num_hidden_layers"]}),
    "mistral": Family(
        MistralConfig, ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
        bos="<s>", eos="</s>", pad=None, unk="<unk>", template=MISTRAL_TEMPLATE, add_bos=True, stop=("</s>",),
        extra={"tie_word_embeddings": False, "max_position_embeddings": 32768, "sliding_window": None,
               "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "gemma": Family(
        GemmaConfig, ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>", template=GEMMA_TEMPLATE, add_bos=True,
        stop=("<eos>", "<end_of_turn>"),
        extra={"tie_word_embeddings": True, "max_position_embeddings": 8192, "hidden_act": "gelu_pytorch_tanh",
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
}

CHAT = [{"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 12 + 7?"},
        {"role": "assistant", "content": "19"},
        {"role": "user", "content": "What is 3 * 4?"},
        {"role": "assistant", "content": "The answer is 12."}]


def build_family_tokenizer(family: Family) -> PreTrainedTokenizerFast:
    names = {"bos_token": family.bos, "eos_token": family.eos, "pad_token": family.pad, "unk_token": family.unk}
    named = set(names.values())
    return PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(list(family.specials)), **{k: v for k, v in names.items() if v is not None},
        additional_special_tokens=[t for t in family.specials if t not in named], add_bos_token=family.add_bos,
        model_max_length=MAX_LEN, chat_template=family.template, clean_up_tokenization_spaces=False)


def build_family_config(family: Family, tok):
    ids = {f"{name}_token_id": tok.convert_tokens_to_ids(token) if token else None
           for name, token in (("bos", family.bos), ("eos", family.eos), ("pad", family.pad))}
    return family.config(architectures=[_architecture(family.config)], vocab_size=(len(tok) + 7) // 8 * 8, **TINY,
                         **ids, **family.extra)


def _architecture(config_class) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config_class.model_type]


def write_family(family: Family, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_family_tokenizer(family)
    tok.save_pretrained(out, save_jinja_files=False)
    cfg = build_family_config(family, tok)
    cfg.save_pretrained(out)
    stop = [tok.convert_tokens_to_ids(t) for t in family.stop]
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=stop if len(stop) > 1 else stop[0],
                     pad_token_id=cfg.pad_token_id).save_pretrained(out)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")


def check_family(name: str, family: Family, out: Path) -> None:
    """The asset loads, round-trips text, renders its template, and ft's loss masks of a conversation hold exactly
    each answer and the end-of-turn text after it (what the model learns to write)."""
    import torch

    from ft.data.templates import end_of_turn
    from ft.data.tokenize import TokenizeSettings, tokenize_batch

    tok = AutoTokenizer.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == family.config.model_type and cfg.vocab_size >= len(tok), (cfg.model_type, len(tok))
    for text in ["What is 12 + 7?", "  Hello,\tworld!\n 3 - 40 = -37 "]:
        ids = tok(text).input_ids
        assert (ids[0] == tok.bos_token_id) == family.add_bos, (name, ids)
        assert tok.decode(ids, skip_special_tokens=True) == text, (name, text, ids)
    messages = CHAT[1:] if name in ("gemma",) else CHAT  # Gemma's template refuses a system message, as Gemma's does
    eot = end_of_turn(tok.chat_template, tok)
    settings = TokenizeSettings(template=tok.chat_template, max_length=MAX_LEN, truncation="truncate",
                                train_on="assistant")
    out_ids = tokenize_batch({"messages": [messages]}, tok, settings)
    ids, labels = out_ids["input_ids"][0], out_ids["labels"][0]
    trained = tok.decode([i for i, label in zip(ids, labels, strict=True) if label != -100])
    expected = "".join(m["content"] + eot for m in messages if m["role"] == "assistant")
    assert trained.replace(" ", "") == expected.replace(" ", ""), (name, trained, expected)
    assert trained.strip().startswith(next(m["content"] for m in messages if m["role"] == "assistant")), trained
    rendered = tok.apply_chat_template(messages, tokenize=False)
    prompt = tok.apply_chat_template(messages[:2] if name != "gemma" else messages[:1], tokenize=False,
                                     add_generation_prompt=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        logits = model(**tok(prompt, return_tensors="pt", add_special_tokens=False)).logits
    assert logits.shape[-1] == cfg.vocab_size
    print(f"{name}: {type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"len(tokenizer)={len(tok)}, end of turn {eot!r}\n  rendered: {rendered!r}\n  trained on: {trained!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    parser.add_argument("--assets", type=Path, default=root / "assets", help="write tiny-llama under this folder")
    parser.add_argument("--family-assets", type=Path, default=root / "src" / "ft" / "smoke" / "assets",
                        help="write every family asset under this folder (ft's package data)")
    parser.add_argument("--out", type=Path, default=None, help="write only tiny-llama, into this folder")
    args = parser.parse_args()
    out = args.out or args.assets / "tiny-llama"
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
    if args.out is not None:
        return
    assert FAMILIES.keys() == ASSET_FOLDERS.keys(), "a family for each folder ft.smoke.tiny_model reads"
    for name, family in FAMILIES.items():
        write_family(family, args.family_assets / ASSET_FOLDERS[name])
        check_family(name, family, args.family_assets / ASSET_FOLDERS[name])


if __name__ == "__main__":
    main()
