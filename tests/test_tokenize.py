"""Chat templates and SFT loss masks, on real tokenizers: the shipped tiny one and small ones built here."""

from __future__ import annotations

import random

import pytest
from conftest import ASSETS
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ft.data.templates import BUILTIN_TEMPLATES, TemplateError, end_of_turn, resolve_chat_template
from ft.data.tokenize import IGNORE_INDEX, TokenizeSettings, tokenize_batch

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHAT = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 4 * 1?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 12 + 30?"},
    {"role": "assistant", "content": "It is 42."},
]


@pytest.fixture(scope="module")
def tiny():
    return AutoTokenizer.from_pretrained(ASSETS)


@pytest.fixture(scope="module")
def word_tokenizer():
    """A word-level tokenizer with the Llama 3 special tokens and no chat template of its own."""
    words = "system user assistant You are a geography bot What is the capital of France Paris And Italy Rome ."
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=["[UNK]", *LLAMA3_SPECIALS]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   unk_token="[UNK]")


def settings(template=None, max_length=512, truncation="truncate", train_on="assistant"):
    return TokenizeSettings(template=template, max_length=max_length, truncation=truncation, train_on=train_on)


def trained(tokenizer, out, row=0):
    """The tokens of one output row that carry loss, as decoded strings."""
    pairs = zip(out["input_ids"][row], out["labels"][row], strict=True)
    return [tokenizer.decode([tok]) for tok, label in pairs if label != IGNORE_INDEX]


def chat_out(tokenizer, messages, **kw):
    return tokenize_batch({"messages": [messages]}, tokenizer, settings(**kw))


# --- masks on chat rows ----------------------------------------------------------------------------------------


def test_chat_mask_is_exactly_the_assistant_turns(tiny):
    template = resolve_chat_template(None, tiny)
    out = chat_out(tiny, CHAT, template=template)
    ids, labels = out["input_ids"][0], out["labels"][0]
    reference = tiny.apply_chat_template(CHAT, return_dict=True, return_assistant_tokens_mask=True)
    assert ids == list(reference["input_ids"])
    assert [label != IGNORE_INDEX for label in labels] == [bool(m) for m in reference["assistant_masks"]]
    assert all(label in (IGNORE_INDEX, tok) for tok, label in zip(ids, labels, strict=True))
    assert trained(tiny, out) == ["4", "<|im_end|>", "I", "t", " is", " ", "4", "2", ".", "<|im_end|>"]
    assert out["length"] == [len(ids)]
    assert out["ft_truncated"] == out["ft_too_long"] == out["ft_no_loss"] == [False]


def test_answer_inside_an_earlier_user_message_is_not_mistaken(tiny):
    messages = [{"role": "user", "content": "What is 4 * 1? Answer 4 or 5."}, {"role": "assistant", "content": "4"}]
    out = chat_out(tiny, messages, template=BUILTIN_TEMPLATES["chatml"])
    assert trained(tiny, out) == ["4", "<|im_end|>"]
    first_four = tiny.convert_tokens_to_ids("4")
    assert out["input_ids"][0].index(first_four) < out["labels"][0].index(first_four)


def test_llama3_builtin_trains_contents_and_eot(word_tokenizer):
    messages = [
        {"role": "system", "content": "You are a geography bot ."},
        {"role": "user", "content": "What is the capital of France ?"},
        {"role": "assistant", "content": "  Paris .  "},  # the Llama 3 template trims contents
        {"role": "user", "content": "And Italy ?"},
        {"role": "assistant", "content": "Rome"},
    ]
    out = chat_out(word_tokenizer, messages, template=resolve_chat_template("llama3", word_tokenizer))
    tokens = word_tokenizer.convert_ids_to_tokens(out["input_ids"][0])
    assert tokens[0] == "<|begin_of_text|>" and tokens.count("<|begin_of_text|>") == 1
    assert trained(word_tokenizer, out) == ["Paris", ".", "<|eot_id|>", "Rome", "<|eot_id|>"]


def test_template_that_rewrites_contents_falls_back_to_prefix_renders(tiny):
    shouting = BUILTIN_TEMPLATES["chatml"].replace("message['content']", "(message['content'] | upper)")
    messages = [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi there"},
                {"role": "user", "content": "again"}, {"role": "assistant", "content": "hi"}]
    out = chat_out(tiny, messages, template=shouting)
    reference = tiny.apply_chat_template(messages, chat_template=shouting, return_dict=True,
                                         return_assistant_tokens_mask=True)
    assert [label != IGNORE_INDEX for label in out["labels"][0]] == [bool(m) for m in reference["assistant_masks"]]
    assert "".join(trained(tiny, out)) == "HI THERE<|im_end|>HI<|im_end|>"


def test_train_on_all_labels_every_token(tiny):
    out = chat_out(tiny, CHAT, template=BUILTIN_TEMPLATES["chatml"], train_on="all")
    assert out["labels"] == out["input_ids"]


def test_works_as_a_batched_dataset_map(tiny):
    from datasets import Dataset

    rows = Dataset.from_dict({"messages": [CHAT, CHAT[1:3]]})
    fn_kwargs = {"tokenizer": tiny, "settings": settings(BUILTIN_TEMPLATES["chatml"])}
    mapped = rows.map(tokenize_batch, batched=True, fn_kwargs=fn_kwargs, remove_columns=["messages"])
    assert mapped.column_names == ["input_ids", "labels", "length", "ft_truncated", "ft_too_long", "ft_no_loss",
                                   "ft_full_length", "ft_trained_full", "ft_turns", "ft_turns_stopped", "ft_trained"]
    assert mapped[1]["labels"][-3:] == [tiny.convert_tokens_to_ids("4"), tiny.eos_token_id, IGNORE_INDEX]


# --- text rows -------------------------------------------------------------------------------------------------


def test_text_rows_mask_the_prompt_and_train_the_eos(tiny):
    out = tokenize_batch({"prompt": ["Q: 2+2=", ""], "completion": [" 4", "plain text"]}, tiny, settings())
    assert trained(tiny, out, 0) == [" ", "4", "<|im_end|>"]
    assert out["input_ids"][0][:-3] == tiny("Q: 2+2=")["input_ids"]
    assert out["labels"][1] == out["input_ids"][1]  # plain text: everything, eos included
    assert out["input_ids"][1][-1] == tiny.eos_token_id and out["input_ids"][1].count(tiny.eos_token_id) == 1


def test_text_rows_train_on_all(tiny):
    out = tokenize_batch({"prompt": ["Q: 2+2="], "completion": [" 4"]}, tiny, settings(train_on="all"))
    assert out["labels"] == out["input_ids"]


@pytest.mark.parametrize("name", ["tiny", "word_tokenizer"])
def test_masks_match_the_per_token_rule_at_every_span_end(name, request):
    """The trained run of each row is found from its two ends, never token by token: it must equal the rule applied
    to every token's offsets (inside the completion's characters; a token starting with whitespace before it counts
    when the rest is inside). Random rows whose prompt ends mid-word ("caf" + "é au lait"), in the middle of a
    character split into several tokens (the bytes of "é", "日本", an emoji: tiny-llama's byte fallback), or on
    whitespace that no token holds (the word-level tokenizer drops it)."""
    tokenizer = request.getfixturevalue(name)
    rng = random.Random(0)
    pieces = ["caf", "é", " au", " lait", "日本", "🙂", " ", "  ", "\n", "\t", "What", " is", " the", "capital", " of",
              "France", " Paris", " .", "x"]
    prompts, completions = [], []
    for _ in range(400):
        prompts.append("".join(rng.choices(pieces, k=rng.randint(1, 6))))
        completions.append("".join(rng.choices(pieces, k=rng.randint(0, 6))))
    out = tokenize_batch({"prompt": prompts, "completion": completions}, tokenizer, settings(max_length=10**6))
    eos, rows_trained = tokenizer.eos_token_id, 0
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        text, a = prompt + completion, len(prompt)
        enc = tokenizer(text, return_offsets_mapping=True)
        def inside(s, e, a=a, text=text):
            if s == e:
                return a <= s < len(text)
            return e <= len(text) and (a <= s or s < a < e and text[s:a].isspace())

        expected = [token if inside(*chars) else IGNORE_INDEX
                    for token, chars in zip(enc["input_ids"], enc["offset_mapping"], strict=True)]
        assert out["input_ids"][row] == [*enc["input_ids"], eos]
        assert out["labels"][row] == [*expected, eos], (prompt, completion)
        rows_trained += any(label != IGNORE_INDEX for label in expected)
    assert rows_trained > 200  # most rows train on some completion token, not only on the EOS


# --- length limits ---------------------------------------------------------------------------------------------


def test_truncate_keeps_the_start(tiny):
    full = chat_out(tiny, CHAT, template=BUILTIN_TEMPLATES["chatml"])
    out = chat_out(tiny, CHAT, template=BUILTIN_TEMPLATES["chatml"], max_length=40)
    assert out["input_ids"][0] == full["input_ids"][0][:40] and out["labels"][0] == full["labels"][0][:40]
    assert out["length"] == [40] and out["ft_truncated"] == [True] and out["ft_too_long"] == [False]
    assert out["ft_no_loss"] == [False]


def test_drop_flags_rows_that_are_too_long(tiny):
    full = chat_out(tiny, CHAT, template=BUILTIN_TEMPLATES["chatml"])
    out = chat_out(tiny, CHAT, template=BUILTIN_TEMPLATES["chatml"], max_length=40, truncation="drop")
    assert out["ft_too_long"] == [True] and out["ft_truncated"] == [False]
    assert out["input_ids"] == full["input_ids"]  # returned whole: the caller filters and counts the row
    fits = chat_out(tiny, CHAT, template=BUILTIN_TEMPLATES["chatml"], max_length=len(full["input_ids"][0]),
                    truncation="drop")
    assert fits["ft_too_long"] == [False]


def test_row_whose_answers_are_cut_off_has_no_loss(tiny):
    out = chat_out(tiny, CHAT, template=BUILTIN_TEMPLATES["chatml"], max_length=10)
    assert out["ft_truncated"] == [True] and out["ft_no_loss"] == [True]


# --- templates -------------------------------------------------------------------------------------------------


def test_builtin_and_inline_templates_resolve(tiny):
    assert resolve_chat_template("chatml", tiny) == BUILTIN_TEMPLATES["chatml"]
    inline = "{% for m in messages %}{{ m['content'] }}</s>{% endfor %}"
    assert resolve_chat_template(inline, tiny) == inline
    assert end_of_turn(BUILTIN_TEMPLATES["chatml"], tiny) == "<|im_end|>"
    assert end_of_turn(BUILTIN_TEMPLATES["llama3"], tiny) == "<|eot_id|>"
    assert end_of_turn(inline, tiny) == "</s>"


def test_unknown_template_name_suggests_the_closest(tiny):
    with pytest.raises(TemplateError, match="data.chat_template") as err:
        resolve_chat_template("chatm", tiny)
    assert "did you mean 'chatml'" in str(err.value) and "\n" not in str(err.value)


def test_tokenizer_without_template_needs_one(word_tokenizer):
    assert not word_tokenizer.chat_template
    with pytest.raises(TemplateError, match=r"data\.chat_template.*set data\.chat_template: chatml"):
        resolve_chat_template(None, word_tokenizer)


# --- cost ------------------------------------------------------------------------------------------------------


def test_masking_renders_a_conversation_once_whatever_its_length():
    """Linear in the turns: the whole chat is rendered once and its answers found in one pass over the text, never
    one prefix render per answer (quadratic). Counted on a tokenizer made here, whose apply_chat_template counts
    what it renders; the timing of 200 turns against 20 is benchmarks/chat_mask_scaling.py."""

    def conversation(turns):
        messages = [{"role": "system", "content": "Answer briefly."}]
        for i in range(turns):
            messages += [{"role": "user", "content": f"What is {i} + 1?"},
                         {"role": "assistant", "content": f"{i + 1}"}]
        return messages

    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    render, rendered = tokenizer.apply_chat_template, []

    def counting_render(messages, *args, **kwargs):
        rendered.append(len(messages))
        return render(messages, *args, **kwargs)

    tokenizer.apply_chat_template = counting_render

    def renders(template, turns):
        rendered.clear()
        out = tokenize_batch({"messages": [conversation(turns)]}, tokenizer, settings(template, max_length=10**6))
        assert trained(tokenizer, out).count("<|im_end|>") == turns
        return list(rendered)

    chatml = BUILTIN_TEMPLATES["chatml"]
    short, long = renders(chatml, 20), renders(chatml, 200)
    assert len(short) == len(long)  # as many renders for 200 turns as for 20 ...
    assert short.count(41) == long.count(401) == 1  # ... among them one of the whole conversation
    # the counter does see prefix renders: a template that rewrites contents falls back to them, one pair per answer
    shouting = chatml.replace("message['content']", "(message['content'] | upper)")
    assert len(renders(shouting, 20)) >= 2 * 20
