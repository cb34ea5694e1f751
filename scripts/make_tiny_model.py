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

Tool-call and reasoning chats are masked with the real templates of four families (``TOOL_FAMILIES``, written to
``src/ft/smoke/assets/tiny-<name>/``, read by ``tests/test_tools_reasoning.py``): Qwen2.5's (tools in the system
prompt, calls in ``<tool_call>`` JSON), Qwen3's (reasoning in ``<think>``, dropped from turns before the last user
message; calls as Qwen2.5), Llama 3.1's (tools in the first user turn, a call as bare JSON, results as ``ipython``) and
Mistral Nemo's (``[AVAILABLE_TOOLS]``, ``[TOOL_CALLS]``, ``[TOOL_RESULTS]``), each verbatim as the family's
tokenizer_config.json ships it, with a tokenizer trained as the others are and holding the family's tool and
reasoning tokens (special or not, as the real one has them). Each is checked here: it renders a call, a tool list and
(Qwen3) a reasoning, its tool tokens are single tokens, and the model reads the rendered chat.

A vision-language recipe's smoke run stands in a tiny image-text-to-text model (``ft.smoke.tiny_model.VISION_FAMILIES``,
whose sizes these assets take): ``VISION_ASSETS`` adds each family's config (its language model at the text sizes, a
vision tower of 2 layers of width 64 seeing 16–32 pixel images), its processor (image processor, tokenizer with the
family's image tokens, and a chat template that writes an image part as the family's image token) and generation
config. Only families whose processors build without torchvision: Idefics3 (SmolVLM), LLaVA (also the generic
stand-in of other families) and Gemma 3. The chat template is saved as ``chat_template.json``, the package data's
``*.json``. Each is checked here: the model reads a rendered chat with an image, an image is at most 16 tokens, and
ft's template checks pass.

Deterministic: re-running produces byte-identical files.
Usage: python scripts/make_tiny_model.py        (writes assets/tiny-llama and every family asset into the package)
       python scripts/make_tiny_model.py --out DIR            (tiny-llama only, into DIR)
"""

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AddedToken,
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    CLIPImageProcessor,
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ImageProcessor,
    Gemma3Processor,
    Gemma3TextConfig,
    GemmaConfig,
    GenerationConfig,
    Idefics3Config,
    Idefics3ImageProcessor,
    Idefics3Processor,
    Idefics3VisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaProcessor,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    SiglipVisionConfig,
)

from ft.data.templates import CHATML, LLAMA3
from ft.smoke.tiny_model import FAMILIES as ASSET_FOLDERS
from ft.smoke.tiny_model import TINY as SMOKE_SIZES
from ft.smoke.tiny_model import VISION_FAMILIES as VISION_SIZES

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
    added: tuple[str, ...] = ()  # tokens added after the vocabulary, not special (Qwen's <tool_call>, <think>)


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


def build_family_tokenizer(family: Family, named_tokens: dict | None = None) -> PreTrainedTokenizerFast:
    """``named_tokens``: special tokens the family's processor reads by name (Gemma 3's ``boi_token``)."""
    names = {"bos_token": family.bos, "eos_token": family.eos, "pad_token": family.pad, "unk_token": family.unk}
    named = set(names.values()) | set((named_tokens or {}).values())
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(list(family.specials)), **{k: v for k, v in names.items() if v is not None},
        additional_special_tokens=[t for t in family.specials if t not in named], add_bos_token=family.add_bos,
        **({"extra_special_tokens": named_tokens} if named_tokens else {}),
        model_max_length=MAX_LEN, chat_template=family.template, clean_up_tokenization_spaces=False)
    if family.added:
        tok.add_tokens([AddedToken(token, special=False, normalized=False) for token in family.added])
    return tok


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


# --- the tool-call and reasoning family assets ----------------------------------------------------------------------
# Each template verbatim as the family's tokenizer_config.json ships it (no {% generation %} markers: ft's masks do not
# need them).

QWEN25_TEMPLATE = (
    '{%- if tools %}\n'
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    '    {%- else %}\n'
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    '    {%- endif %}\n'
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user'
    ' query.\\n\\nYou are provided with function signatures within <tools></tools> XML'
    ' tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n'
    '        {{- "\\n" }}\n'
    '        {{- tool | tojson }}\n'
    '    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name'
    ' and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{{\\"name\\":'
    ' <function-name>, \\"arguments\\": <args-json-object>}}\\n</tool_call><|im_end|>\\n" }}\n'
    '{%- else %}\n'
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    '    {%- else %}\n'
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a"
    " helpful assistant.<|im_end|>\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- for message in messages %}\n'
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or'
    ' (message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'"
    ' }}\n'
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    '        {%- if message.content %}\n'
    "            {{- '\\n' + message.content }}\n"
    '        {%- endif %}\n'
    '        {%- for tool_call in message.tool_calls %}\n'
    '            {%- if tool_call.function is defined %}\n'
    '                {%- set tool_call = tool_call.function %}\n'
    '            {%- endif %}\n'
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    '            {{- tool_call.name }}\n'
    '            {{- \'", "arguments": \' }}\n'
    '            {{- tool_call.arguments | tojson }}\n'
    "            {{- '}\\n</tool_call>' }}\n"
    '        {%- endfor %}\n'
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    '        {%- endif %}\n'
    "        {{- '\\n<tool_response>\\n' }}\n"
    '        {{- message.content }}\n'
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    '        {%- endif %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|im_start|>assistant\\n' }}\n"
    '{%- endif %}\n'
)

QWEN3_TEMPLATE = (
    '{%- if tools %}\n'
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    '    {%- endif %}\n'
    '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user'
    ' query.\\n\\nYou are provided with function signatures within <tools></tools> XML'
    ' tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n'
    '        {{- "\\n" }}\n'
    '        {{- tool | tojson }}\n'
    '    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name'
    ' and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\":'
    ' <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    '{%- else %}\n'
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n'
    '{%- for message in messages[::-1] %}\n'
    '    {%- set index = (messages|length - 1) - loop.index0 %}\n'
    '    {%- if ns.multi_step_tool and message.role == "user" and'
    " not(message.content.startswith('<tool_response>') and"
    " message.content.endswith('</tool_response>')) %}\n"
    '        {%- set ns.multi_step_tool = false %}\n'
    '        {%- set ns.last_query_index = index %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- for message in messages %}\n'
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'"
    ' }}\n'
    '    {%- elif message.role == "assistant" %}\n'
    '        {%- set content = message.content %}\n'
    "        {%- set reasoning_content = '' %}\n"
    '        {%- if message.reasoning_content is defined and message.reasoning_content is not'
    ' none %}\n'
    '            {%- set reasoning_content = message.reasoning_content %}\n'
    '        {%- else %}\n'
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    '                {%- set reasoning_content ='
    " message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    '            {%- endif %}\n'
    '        {%- endif %}\n'
    '        {%- if loop.index0 > ns.last_query_index %}\n'
    '            {%- if loop.last or (not loop.last and reasoning_content) %}\n'
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' +"
    " reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    '            {%- else %}\n'
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    '            {%- endif %}\n'
    '        {%- else %}\n'
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    '        {%- endif %}\n'
    '        {%- if message.tool_calls %}\n'
    '            {%- for tool_call in message.tool_calls %}\n'
    '                {%- if (loop.first and content) or (not loop.first) %}\n'
    "                    {{- '\\n' }}\n"
    '                {%- endif %}\n'
    '                {%- if tool_call.function %}\n'
    '                    {%- set tool_call = tool_call.function %}\n'
    '                {%- endif %}\n'
    '                {{- \'<tool_call>\\n{"name": "\' }}\n'
    '                {{- tool_call.name }}\n'
    '                {{- \'", "arguments": \' }}\n'
    '                {%- if tool_call.arguments is string %}\n'
    '                    {{- tool_call.arguments }}\n'
    '                {%- else %}\n'
    '                    {{- tool_call.arguments | tojson }}\n'
    '                {%- endif %}\n'
    "                {{- '}\\n</tool_call>' }}\n"
    '            {%- endfor %}\n'
    '        {%- endif %}\n'
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    '        {%- endif %}\n'
    "        {{- '\\n<tool_response>\\n' }}\n"
    '        {{- message.content }}\n'
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    '        {%- endif %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|im_start|>assistant\\n' }}\n"
    '    {%- if enable_thinking is defined and enable_thinking is false %}\n'
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}'
)

LLAMA31_TEMPLATE = (
    '{{- bos_token }}\n'
    '{%- if custom_tools is defined %}\n'
    '    {%- set tools = custom_tools %}\n'
    '{%- endif %}\n'
    '{%- if not tools_in_user_message is defined %}\n'
    '    {%- set tools_in_user_message = true %}\n'
    '{%- endif %}\n'
    '{%- if not date_string is defined %}\n'
    '    {%- set date_string = "26 Jul 2024" %}\n'
    '{%- endif %}\n'
    '{%- if not tools is defined %}\n'
    '    {%- set tools = none %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- This block extracts the system message, so we can slot it into the right place. #}\n'
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    '    {%- set messages = messages[1:] %}\n'
    '{%- else %}\n'
    '    {%- set system_message = "" %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- System message + builtin tools #}\n'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
    '{%- if builtin_tools is defined or tools is not none %}\n'
    '    {{- "Environment: ipython\\n" }}\n'
    '{%- endif %}\n'
    '{%- if builtin_tools is defined %}\n'
    '    {{- "Tools: " + builtin_tools | reject(\'equalto\', \'code_interpreter\') | join(", ") +'
    ' "\\n\\n"}}\n'
    '{%- endif %}\n'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
    '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
    '{%- if tools is not none and not tools_in_user_message %}\n'
    '    {{- "You have access to the following functions. To call a function, please respond'
    ' with JSON for a function call." }}\n'
    '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of'
    " argument name and its value}.' }}\n"
    '    {{- "Do not use variables.\\n\\n" }}\n'
    '    {%- for t in tools %}\n'
    '        {{- t | tojson(indent=4) }}\n'
    '        {{- "\\n\\n" }}\n'
    '    {%- endfor %}\n'
    '{%- endif %}\n'
    '{{- system_message }}\n'
    '{{- "<|eot_id|>" }}\n'
    '\n'
    '{#- Custom tools are passed in a user message with some extra guidance #}\n'
    '{%- if tools_in_user_message and not tools is none %}\n'
    '    {#- Extract the first user message so we can plug it in here #}\n'
    '    {%- if messages | length != 0 %}\n'
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    '        {%- set messages = messages[1:] %}\n'
    '    {%- else %}\n'
    '        {{- raise_exception("Cannot put tools in the first user message when there\'s no'
    ' first user message!") }}\n'
    '{%- endif %}\n'
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    '    {{- "Given the following functions, please respond with a JSON for a function call "'
    ' }}\n'
    '    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n'
    '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of'
    " argument name and its value}.' }}\n"
    '    {{- "Do not use variables.\\n\\n" }}\n'
    '    {%- for t in tools %}\n'
    '        {{- t | tojson(indent=4) }}\n'
    '        {{- "\\n\\n" }}\n'
    '    {%- endfor %}\n'
    '    {{- first_user_message + "<|eot_id|>"}}\n'
    '{%- endif %}\n'
    '\n'
    '{%- for message in messages %}\n'
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in"
    ' message) %}\n'
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+"
    " message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    '        {%- if not message.tool_calls|length == 1 %}\n'
    '            {{- raise_exception("This model only supports single tool-calls at once!") }}\n'
    '        {%- endif %}\n'
    '        {%- set tool_call = message.tool_calls[0].function %}\n'
    '        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n'
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    '            {{- "<|python_tag|>" + tool_call.name + ".call(" }}\n'
    '            {%- for arg_name, arg_val in tool_call.arguments | items %}\n'
    '                {{- arg_name + \'="\' + arg_val + \'"\' }}\n'
    '                {%- if not loop.last %}\n'
    '                    {{- ", " }}\n'
    '                {%- endif %}\n'
    '                {%- endfor %}\n'
    '            {{- ")" }}\n'
    '        {%- else  %}\n'
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    '            {{- \'{"name": "\' + tool_call.name + \'", \' }}\n'
    '            {{- \'"parameters": \' }}\n'
    '            {{- tool_call.arguments | tojson }}\n'
    '            {{- "}" }}\n'
    '        {%- endif %}\n'
    '        {%- if builtin_tools is defined %}\n'
    "            {#- This means we're in ipython mode #}\n"
    '            {{- "<|eom_id|>" }}\n'
    '        {%- else %}\n'
    '            {{- "<|eot_id|>" }}\n'
    '        {%- endif %}\n'
    '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
    '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
    '        {%- if message.content is mapping or message.content is iterable %}\n'
    '            {{- message.content | tojson }}\n'
    '        {%- else %}\n'
    '            {{- message.content }}\n'
    '        {%- endif %}\n'
    '        {{- "<|eot_id|>" }}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    '{%- endif %}\n'
)

MISTRAL_NEMO_TEMPLATE = (
    '{%- if messages[0]["role"] == "system" %}\n'
    '    {%- set system_message = messages[0]["content"] %}\n'
    '    {%- set loop_messages = messages[1:] %}\n'
    '{%- else %}\n'
    '    {%- set loop_messages = messages %}\n'
    '{%- endif %}\n'
    '{%- if not tools is defined %}\n'
    '    {%- set tools = none %}\n'
    '{%- endif %}\n'
    '{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n'
    '\n'
    '{#- This block checks for alternating user/assistant messages, skipping tool calling'
    ' messages #}\n'
    '{%- set ns = namespace() %}\n'
    '{%- set ns.index = 0 %}\n'
    '{%- for message in loop_messages %}\n'
    '    {%- if not (message.role == "tool" or message.role == "tool_results" or'
    ' (message.tool_calls is defined and message.tool_calls is not none)) %}\n'
    '        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n'
    '            {{- raise_exception("After the optional system message, conversation roles'
    ' must alternate user/assistant/user/assistant/...") }}\n'
    '        {%- endif %}\n'
    '        {%- set ns.index = ns.index + 1 %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '\n'
    '{{- bos_token }}\n'
    '{%- for message in loop_messages %}\n'
    '    {%- if message["role"] == "user" %}\n'
    '        {%- if tools is not none and (message == user_messages[-1]) %}\n'
    '            {{- "[AVAILABLE_TOOLS][" }}\n'
    '            {%- for tool in tools %}\n'
    '                {%- set tool = tool.function %}\n'
    '                {{- \'{"type": "function", "function": {\' }}\n'
    '                {%- for key, val in tool.items() if key != "return" %}\n'
    '                    {%- if val is string %}\n'
    '                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n'
    '                    {%- else %}\n'
    '                        {{- \'"\' + key + \'": \' + val|tojson }}\n'
    '                    {%- endif %}\n'
    '                    {%- if not loop.last %}\n'
    '                        {{- ", " }}\n'
    '                    {%- endif %}\n'
    '                {%- endfor %}\n'
    '                {{- "}}" }}\n'
    '                {%- if not loop.last %}\n'
    '                    {{- ", " }}\n'
    '                {%- else %}\n'
    '                    {{- "]" }}\n'
    '                {%- endif %}\n'
    '            {%- endfor %}\n'
    '            {{- "[/AVAILABLE_TOOLS]" }}\n'
    '            {%- endif %}\n'
    '        {%- if loop.last and system_message is defined %}\n'
    '            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n'
    '        {%- else %}\n'
    '            {{- "[INST]" + message["content"] + "[/INST]" }}\n'
    '        {%- endif %}\n'
    '    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n'
    '        {{- "[TOOL_CALLS][" }}\n'
    '        {%- for tool_call in message.tool_calls %}\n'
    '            {%- set out = tool_call.function|tojson %}\n'
    '            {{- out[:-1] }}\n'
    '            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n'
    '                {{- raise_exception("Tool call IDs should be alphanumeric strings with'
    ' length 9!") }}\n'
    '            {%- endif %}\n'
    '            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n'
    '            {%- if not loop.last %}\n'
    '                {{- ", " }}\n'
    '            {%- else %}\n'
    '                {{- "]" + eos_token }}\n'
    '            {%- endif %}\n'
    '        {%- endfor %}\n'
    '    {%- elif message["role"] == "assistant" %}\n'
    '        {{- message["content"] + eos_token}}\n'
    '    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n'
    '        {%- if message.content is defined and message.content.content is defined %}\n'
    '            {%- set content = message.content.content %}\n'
    '        {%- else %}\n'
    '            {%- set content = message.content %}\n'
    '        {%- endif %}\n'
    '        {{- \'[TOOL_RESULTS]{"content": \' + content|string + ", " }}\n'
    '        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n'
    '            {{- raise_exception("Tool call IDs should be alphanumeric strings with length'
    ' 9!") }}\n'
    '        {%- endif %}\n'
    '        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n'
    '    {%- else %}\n'
    '        {{- raise_exception("Only user and assistant roles are supported, with the'
    ' exception of an initial optional system message!") }}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
)

_QWEN_TOOLS = ("<tool_call>", "</tool_call>")
TOOL_FAMILIES = {  # folder under src/ft/smoke/assets -> the family
    "tiny-qwen2.5": Family(
        Qwen2Config, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), bos=None, eos="<|im_end|>", pad="<|endoftext|>",
        template=QWEN25_TEMPLATE, add_bos=False, stop=("<|im_end|>", "<|endoftext|>"), added=_QWEN_TOOLS,
        extra=FAMILIES["qwen2"].extra),
    "tiny-qwen3": Family(
        Qwen3Config, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), bos=None, eos="<|im_end|>", pad="<|endoftext|>",
        template=QWEN3_TEMPLATE, add_bos=False, stop=("<|im_end|>", "<|endoftext|>"),
        added=(*_QWEN_TOOLS, "<tool_response>", "</tool_response>", "<think>", "</think>"),
        extra={"tie_word_embeddings": True, "max_position_embeddings": 40960,
               "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "use_sliding_window": False,
               "max_window_layers": TINY["num_hidden_layers"]}),
    "tiny-llama3.1": Family(
        LlamaConfig, ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, template=LLAMA31_TEMPLATE, add_bos=True,
        stop=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), extra=FAMILIES["llama"].extra),
    "tiny-mistral-nemo": Family(
        MistralConfig, ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                        "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]"),
        bos="<s>", eos="</s>", pad=None, unk="<unk>", template=MISTRAL_NEMO_TEMPLATE, add_bos=True, stop=("</s>",),
        extra={"tie_word_embeddings": False, "max_position_embeddings": 1024000, "sliding_window": None,
               "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
}

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TOOL_CHAT = [{"role": "user", "content": "What is the weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call00001", "type": "function",
                  "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "21 degrees"},
             {"role": "assistant", "content": "It is 21 degrees in Paris."}]


def check_tool_family(name: str, family: Family, out: Path) -> None:
    """The asset loads; its template, rendered with a tool list and a call, writes both (and Qwen3's a reasoning);
    its tool and reasoning tokens are single tokens; the model reads the rendered chat."""
    import torch

    tok = AutoTokenizer.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == family.config.model_type and cfg.vocab_size >= len(tok), (name, len(tok))
    assert tok.chat_template == family.template, name
    for token in (*family.specials, *family.added):
        assert len(tok(token, add_special_tokens=False).input_ids) == 1, (name, token)
    chat = [dict(m) for m in TOOL_CHAT]
    if name == "tiny-qwen3":
        chat[1]["reasoning_content"] = "The user wants the weather: call get_weather."
        chat[1]["content"] = ""
    text = tok.apply_chat_template(chat, tools=[WEATHER], tokenize=False)
    assert '"city": "Paris"' in text and text.count("get_weather") >= 2, (name, text)
    if name == "tiny-qwen3":  # the call's turn comes after the last user message: its reasoning is written
        assert f"<think>\n{chat[1]['reasoning_content']}\n</think>" in text, text
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        logits = model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits
    assert logits.shape[-1] == cfg.vocab_size
    print(f"{name}: {type(model).__name__}, len(tokenizer)={len(tok)}\n  rendered: {text!r}")


# --- the smoke-test vision-language family assets -----------------------------------------------------------------
# Each template follows its family's published one, an image part written as the family's image token; none has
# {% generation %} markers (the real ones have none: ft's masks do not need them).

SMOLVLM_TEMPLATE = (  # SmolVLM's own (Idefics3): "User:<image>…<end_of_utterance>", no system turn of its own
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")

LLAVA_TEMPLATE = (  # the generic stand-in's: ChatML, an image part written as `<image>`, a content text or parts
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")

GEMMA3_TEMPLATE = (  # Gemma 3's: a system message opens the first user turn; an image part is <start_of_image>
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}{%- set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{%- else %}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' %}{%- endif %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{- '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<end_of_turn>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}")


@dataclass(frozen=True)
class VisionAsset:
    """One vision-language family asset (its sizes: ``ft.smoke.tiny_model.VISION_FAMILIES``, which names its
    folder): the language model's config class, tokenizer and template as a text ``Family``, and the family's
    config, vision config, image processor and processor classes."""

    text: Family
    config: type
    vision_config: type
    image_processor: type
    processor: type
    named_tokens: dict = field(default_factory=dict)  # special tokens the processor reads by name from the tokenizer


VISION_ASSETS = {
    "idefics3": VisionAsset(  # SmolVLM-256M-Instruct's tokens: <|im_start|> begins, <end_of_utterance> ends a turn
        Family(LlamaConfig, ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<end_of_utterance>",
                             "<fake_token_around_image>", "<image>", "<global-img>"),
               bos="<|im_start|>", eos="<end_of_utterance>", pad="<|im_end|>", unk="<|endoftext|>",
               template=SMOLVLM_TEMPLATE, add_bos=False, stop=("<end_of_utterance>",),
               extra={"tie_word_embeddings": True, "max_position_embeddings": 8192,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}),
        Idefics3Config, Idefics3VisionConfig, Idefics3ImageProcessor, Idefics3Processor),
    "llava": VisionAsset(  # LLaVA-1.5's Llama tokens and <image>, with a ChatML template
        Family(LlamaConfig, ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<image>", "<pad>"),
               bos="<s>", eos="<|im_end|>", pad="<pad>", unk="<unk>", template=LLAVA_TEMPLATE, add_bos=False,
               stop=("<|im_end|>", "</s>"),
               extra={"tie_word_embeddings": False, "max_position_embeddings": 4096,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
        LlavaConfig, CLIPVisionConfig, CLIPImageProcessor, LlavaProcessor),
    "gemma3": VisionAsset(
        Family(Gemma3TextConfig, ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                                  "<start_of_image>", "<end_of_image>", "<image_soft_token>"),
               bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>", template=GEMMA3_TEMPLATE, add_bos=True,
               stop=("<eos>", "<end_of_turn>"),
               extra={"tie_word_embeddings": True, "max_position_embeddings": 131072, "sliding_window": 512,
                      "query_pre_attn_scalar": TINY["head_dim"], "layer_types": ["sliding_attention",
                                                                                 "full_attention"]}),
        Gemma3Config, SiglipVisionConfig, Gemma3ImageProcessor, Gemma3Processor,
        named_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                      "image_token": "<image_soft_token>"}),
}
MAX_IMAGE_TOKENS = 16  # an image of the smoke run becomes at most this many tokens


def write_vision_family(name: str, spec: VisionAsset, out: Path) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    out.mkdir(parents=True, exist_ok=True)
    sizes = VISION_SIZES[name]
    tok = build_family_tokenizer(spec.text, spec.named_tokens)
    ids = {f"{key}_token_id": tok.convert_tokens_to_ids(token) if token else None
           for key, token in (("bos", spec.text.bos), ("eos", spec.text.eos), ("pad", spec.text.pad))}
    text = spec.text.config(vocab_size=(len(tok) + 7) // 8 * 8, **TINY, **ids, **spec.text.extra)
    images = {key: tok.convert_tokens_to_ids(token) for key, token in sizes.tokens.items()}
    cfg = spec.config(text_config=text.to_dict(), vision_config=spec.vision_config(**sizes.vision).to_dict(),
                      architectures=[MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[spec.config.model_type]],
                      **sizes.config, **images)
    cfg.save_pretrained(out)
    processor = spec.processor(image_processor=spec.image_processor(**sizes.image_processor), tokenizer=tok,
                               chat_template=spec.text.template, **sizes.processor)
    processor.save_pretrained(out)
    # the template in chat_template.json, which the package data's *.json carries (and transformers reads)
    (out / "chat_template.jinja").unlink()
    (out / "chat_template.json").write_text(json.dumps({"chat_template": spec.text.template}, indent=2) + "\n")
    stop = [tok.convert_tokens_to_ids(t) for t in spec.text.stop]
    GenerationConfig(bos_token_id=ids["bos_token_id"], eos_token_id=stop if len(stop) > 1 else stop[0],
                     pad_token_id=ids["pad_token_id"]).save_pretrained(out)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")


def check_vision_family(name: str, spec: VisionAsset, out: Path) -> None:
    """The asset loads as ft loads a vision-language model (AutoProcessor, AutoModelForImageTextToText); ft's
    template checks pass (the template writes the processor's image token once an image part, and an end of turn);
    an image is at most ``MAX_IMAGE_TOKENS`` tokens; the model reads a rendered chat with its image."""
    import torch
    from PIL import Image

    from ft.data.images import ImageTokens
    from ft.data.templates import check_image_template, end_of_turn

    processor = AutoProcessor.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == spec.config.model_type and processor.chat_template == spec.text.template, name
    tokens = ImageTokens(processor, None)
    check_image_template(processor.chat_template, processor.tokenizer, tokens.token)
    eot = end_of_turn(processor.chat_template, processor.tokenizer, parts=True)
    counts = {size: len(tokens.expansion(size)) for size in ((16, 16), (32, 32), (40, 24), (300, 200))}
    assert max(counts.values()) <= MAX_IMAGE_TOKENS, (name, counts)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Red"}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, chat_template=processor.chat_template)
    inputs = processor(text=text, images=[Image.new("RGB", (40, 24), (220, 30, 30))], add_special_tokens=False,
                       return_tensors="pt")
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(cfg)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[-1] == cfg.get_text_config().vocab_size >= len(processor.tokenizer), name
    print(f"{name}: {type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"len(tokenizer)={len(processor.tokenizer)}, image tokens by size {counts}, end of turn {eot!r}\n"
          f"  rendered: {text!r}")


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
    for folder, family in TOOL_FAMILIES.items():
        write_family(family, args.family_assets / folder)
        check_tool_family(folder, family, args.family_assets / folder)
    assert VISION_ASSETS.keys() == VISION_SIZES.keys(), "an asset for each vision family ft.smoke.tiny_model reads"
    for name, spec in VISION_ASSETS.items():
        write_vision_family(name, spec, args.family_assets / VISION_SIZES[name].folder)
        check_vision_family(name, spec, args.family_assets / VISION_SIZES[name].folder)


if __name__ == "__main__":
    main()
