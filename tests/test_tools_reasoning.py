"""Tool calls, tool definitions and reasoning in `chat` rows: read as written, rendered by the model family's own
template, and masked token by token.

1. Data: OpenAI-style assistant `tool_calls` (arguments as an object or a JSON string), `tool` messages with their
   `tool_call_id` and `name`, `reasoning_content` (or a source's `thinking` through `fields:`), a row's `tools`: the
   canonical rows hold them exactly as the format writes them (each message as its JSON text: no key added), and what
   cannot be read is a bad row named `file:line`.
2. Masks, checked token by token with the real templates of four families (the shipped tiny assets
   `tiny-qwen2.5`, `tiny-qwen3`, `tiny-llama3.1`, `tiny-mistral-nemo`): the expected labels are written by hand from
   each template's structure (a turn trains from the end of its generation prompt through its end-of-turn token),
   then `data.train_on_reasoning: false` and `data.train_on_tool_calls: false`.
3. A template that cannot write a call, a tool list, a reasoning or the text beside a call, or that refuses the row,
   makes a bad row, never a flattened one; `data.chat_template_kwargs` are written into the template as defaults;
   exact match and `ft generate` render with the tools.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ft.data.formats import normalize
from ft.data.labels import IGNORE_INDEX
from ft.data.rows import BAD, BadRows, DataError, refused_rendered
from ft.data.sources import mix, read_source
from ft.data.templates import render, with_defaults
from ft.data.tokenize import TokenizeSettings, tokenize_arrays
from ft.recipe import RecipeError, load_recipe
from ft.recipe.data_section import DataSource

ASSETS = Path(str(importlib.resources.files("ft.smoke") / "assets"))
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _call(city: str, id: str = "call00001", arguments=None) -> dict:
    return {"id": id, "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": city} if arguments is None else arguments}}


QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": "", "tool_calls": [_call("Paris")]}
RESULT = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "21 degrees"}
ANSWER = {"role": "assistant", "content": "It is 21 degrees in Paris."}
TOOL_CHAT = [QUESTION, CALL, RESULT, ANSWER]  # call -> result -> final answer
THOUGHT = "The user asks for 2 + 2, which is 4."
REASONED = [{"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": THOUGHT}]


def _tokenizer(family: str):
    return AutoTokenizer.from_pretrained(ASSETS / family)


def _tokenized(family: str, messages: list[dict], tools: list | None = None, template: str | None = None, **settings):
    """One row through ft's tokenization (``tokenize_arrays``), with the asset's own template: (ids, labels, out)."""
    tokenizer = _tokenizer(family)
    config = TokenizeSettings(template=template or tokenizer.chat_template, max_length=4096, truncation="truncate",
                              train_on="assistant", tools=json.dumps(tools) if tools else None, **settings)
    out = tokenize_arrays({"messages": [messages]}, tokenizer, config)
    return out["input_ids"][0].tolist(), out["labels"][0].tolist(), out


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _between(ids: list[int], openers: list[list[int]], closer: int) -> list[int]:
    """Labels as a hand-written mask gives them: the tokens after each of ``openers`` (what ends the prompt of an
    assistant turn: its header, or the `[/INST]` before it) up to and including ``closer`` (its end-of-turn)."""
    labels, i = [IGNORE_INDEX] * len(ids), 0
    while i < len(ids):
        opener = next((o for o in openers if ids[i:i + len(o)] == o), None)
        if opener is None:
            i += 1
            continue
        i += len(opener)
        while i < len(ids):
            labels[i] = ids[i]
            i += 1
            if ids[i - 1] == closer:
                break
    return labels


def _without(labels: list[int], ids: list[int], start: list[int], end: list[int], runs: int = -1) -> list[int]:
    """``labels`` with each run of ``ids`` from ``start`` through ``end`` (both included) untrained (the first
    ``runs`` of them, when given)."""
    labels, i = list(labels), 0
    while i < len(ids) and runs:
        if ids[i:i + len(start)] == start:
            runs -= 1
            j = next(j for j in range(i + len(start), len(ids)) if ids[j:j + len(end)] == end) + len(end)
            labels[i:j] = [IGNORE_INDEX] * (j - i)
            i = j
        else:
            i += 1
    return labels


def _trained(tokenizer, ids: list[int], labels: list[int]) -> str:
    return tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def _canonical(path: Path, on_bad_row: str = "error", report: BadRows | None = None, **source):
    data = DataSource(path=str(path), format="chat", **source)
    report = report if report is not None else BadRows()
    raw = read_source(data, seed=0, on_bad_row=on_bad_row, report=report, key="data.train.0")
    return normalize(raw, data, key="data.train.0", on_bad_row=on_bad_row, report=report)


# --- 1. data -------------------------------------------------------------------------------------------------------


def test_tool_calls_reasoning_and_tools_reach_the_canonical_rows_as_written(tmp_path):
    """Arguments as an object and as a JSON string (arguments of different shapes, which no one Arrow struct holds),
    a tool message's id and name, reasoning read from `thinking` through `fields:`, a row's tools as a list and as
    its JSON text: each canonical message is exactly what the format wrote (no null key added to the others)."""
    rome = _call("Rome", "call00002", arguments='{"city": "Rome", "days": 3, "units": {"temp": "C"}}')
    rows = [{"messages": [QUESTION, {**CALL, "content": None}, RESULT, {**ANSWER, "thinking": "It said 21."}],
             "tools": [WEATHER]},
            {"messages": [{"role": "user", "content": "And Rome?"}, {"role": "assistant", "tool_calls": [rome]},
                          {"role": "tool", "tool_call_id": "call00002", "content": "{\"temp\": 18}"},
                          {"role": "assistant", "content": "18 degrees."}],
             "tools": json.dumps([WEATHER["function"]])},  # a bare function, as JSON text
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    canonical = _canonical(_jsonl(tmp_path / "tools.jsonl", rows), fields={"reasoning_content": "thinking"})
    assert canonical.column_names == ["messages", "tools", "__ft_row"]
    first, second, plain = canonical[0], canonical[1], canonical[2]
    assert first["messages"] == [QUESTION, CALL, RESULT, {**ANSWER, "reasoning_content": "It said 21."}]
    assert first["tools"] == [WEATHER] and second["tools"] == [WEATHER]  # the bare function wrapped as OpenAI's
    parsed = {"city": "Rome", "days": 3, "units": {"temp": "C"}}
    assert second["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [
        {**rome, "function": {"name": "get_weather", "arguments": parsed}}]}
    assert second["messages"][2] == {"role": "tool", "content": "{\"temp\": 18}", "tool_call_id": "call00002"}
    assert plain == {"messages": rows[2]["messages"], "tools": None, "__ft_row": 2}


def test_a_plain_source_and_a_tool_source_mix_in_one_split(tmp_path):
    plain = _canonical(_jsonl(tmp_path / "plain.jsonl", [{"messages": REASONED[:1] + [{"role": "assistant",
                                                                                       "content": "4"}]}]))
    tools = _canonical(_jsonl(tmp_path / "calls.jsonl", [{"messages": TOOL_CHAT}]))
    both = mix([plain, tools], ["data.train.0", "data.train.1"])
    assert [row["messages"] for row in both] == [plain[0]["messages"], TOOL_CHAT]


def test_a_source_with_a_tools_column_mixes_with_one_without_and_each_row_renders_its_tools(write_recipe, tmp_path):
    """Two chat sources of one split, only one with a `tools` column: the other's rows get the column empty (None),
    so the sources mix (datasets refuses to concatenate two layouts), and `ft train` prepares each row with its own
    tools and the others with `data.tools`."""
    from ft import data

    clock = {"type": "function", "function": {"name": "get_time", "description": "The time in a city.",
                                              "parameters": {"type": "object", "properties": {}}}}
    timed = [{"role": "user", "content": "What time is it in Rome?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call00002", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
             {"role": "tool", "tool_call_id": "call00002", "name": "get_time", "content": "10:00"},
             {"role": "assistant", "content": "It is 10 in Rome."}]
    own = _jsonl(tmp_path / "own.jsonl", [{"messages": TOOL_CHAT, "tools": [WEATHER]}])
    plain = _jsonl(tmp_path / "plain.jsonl", [{"messages": timed}])
    both = mix([_canonical(plain), _canonical(own)], ["data.train.0", "data.train.1"], optional=("tools",))
    assert both["tools"] == [None, [WEATHER]] and [row["messages"] for row in both] == [timed, TOOL_CHAT]
    (tmp_path / "tools.json").write_text(json.dumps([clock]))
    recipe = load_recipe(write_recipe({
        "model": {"name": str(ASSETS / "tiny-qwen2.5"), "init": "random"},
        "data": {"train": [{"path": str(own)}, {"path": str(plain)}], "tools": "tools.json", "max_length": 1024},
        "train": {"output_dir": str(tmp_path / "out")}})).recipe
    tokenizer = _tokenizer("tiny-qwen2.5")
    prepared = data.prepare_data(recipe, tokenizer, data.chat_template_for(recipe, tokenizer), say=lambda _: None)
    assert prepared.train["input_ids"] == [_ids(tokenizer, render(tokenizer, None, TOOL_CHAT, [WEATHER])),
                                           _ids(tokenizer, render(tokenizer, None, timed, [clock]))]


BAD_ROWS = [  # (row, reason, where: the field named in the error)
    ({"messages": [QUESTION, {**CALL, "tool_calls": [_call("Paris", arguments='{"city": "Par')]}]},
     "bad_tool_call", "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [QUESTION, {**CALL, "tool_calls": [{"name": "get_weather", "arguments": {}}]}]},
     "bad_tool_call", "messages[1].tool_calls[0]"),
    ({"messages": [QUESTION, {**CALL, "tool_calls": [_call("Paris", arguments=["Paris"])]}]},
     "bad_tool_call", "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [{**QUESTION, "tool_calls": [_call("Paris")]}, ANSWER]}, "bad_tool_call", "messages[0].tool_calls"),
    ({"messages": [QUESTION, {**ANSWER, "thinking": "Hm."}]}, "unmapped_reasoning", "messages[1].thinking"),
    ({"messages": [QUESTION, ANSWER], "tools": {"name": "get_weather"}}, "bad_tools", "tools"),
    ({"messages": [QUESTION, {"role": "assistant", "content": ""}]}, "empty_content", "messages[1].content"),
]


@pytest.mark.parametrize(("row", "reason", "where"), BAD_ROWS, ids=[f"{r}-{i}" for i, (_, r, _) in enumerate(BAD_ROWS)])
def test_a_row_that_cannot_be_read_is_named_by_its_line(tmp_path, row, reason, where):
    path = _jsonl(tmp_path / "bad.jsonl", [{"messages": TOOL_CHAT}, row])
    with pytest.raises(DataError) as caught:
        _canonical(path)
    assert f"{path}:2: {where}: " in str(caught.value) and f"({reason})" in str(caught.value)
    report = BadRows()
    assert len(_canonical(path, on_bad_row="skip", report=report)) == 1
    assert report.as_dict() == {"data.train.0": {reason: 1}}


def test_recipe_keys_read_the_tools_file_beside_the_recipe_and_name_a_bad_one(tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps([WEATHER["function"]]))
    recipe = tmp_path / "recipe.yaml"
    body = ("model: {name: %s, init: random}\ndata:\n  train: [{path: d.jsonl}]\n  tools: %s\n"
            "  chat_template_kwargs: {enable_thinking: false}\n  train_on_tool_calls: false\n"
            "train: {output_dir: out}\n")
    recipe.write_text(body % (ASSETS / "tiny-qwen3", "tools.json"))
    data = load_recipe(recipe).recipe.data
    assert data.tool_list == [WEATHER] and data.chat_template_kwargs == {"enable_thinking": False}
    settings = TokenizeSettings.of(data, "{{ x }}")
    assert json.loads(settings.tools) == [WEATHER] and not settings.train_on_tool_calls and settings.train_on_reasoning
    recipe.write_text(body % (ASSETS / "tiny-qwen3", "missing.json"))
    with pytest.raises(RecipeError, match=r"recipe.yaml:4: data.tools: cannot read .*missing.json"):
        load_recipe(recipe)
    recipe.write_text((body % (ASSETS / "tiny-qwen3", "tools.json")).replace("enable_thinking", "tools"))
    with pytest.raises(RecipeError, match="data.chat_template_kwargs: .*'tools' is what ft"):
        load_recipe(recipe)


# --- 2. masks, token by token --------------------------------------------------------------------------------------


def test_qwen25_trains_the_tool_call_and_the_answer_not_the_tools_or_the_result():
    """Qwen2.5: tools in the system prompt (which also shows a `<tool_call>` example), the call as `<tool_call>` JSON
    after the assistant header, the result as a user turn's `<tool_response>`."""
    tokenizer = _tokenizer("tiny-qwen2.5")
    ids, labels, out = _tokenized("tiny-qwen2.5", TOOL_CHAT, [WEATHER])
    assert ids == _ids(tokenizer, render(tokenizer, None, TOOL_CHAT, [WEATHER]))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert labels == _between(ids, [_ids(tokenizer, "<|im_start|>assistant\n")], end)
    assert _trained(tokenizer, ids, labels) == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
                                                "\n</tool_call><|im_end|>It is 21 degrees in Paris.<|im_end|>")
    assert out["ft_turns"] == [2] and out["ft_turns_stopped"] == [2] and out[BAD[0]] == [""]

    ids, labels, out = _tokenized("tiny-qwen2.5", TOOL_CHAT, [WEATHER], train_on_tool_calls=False)
    assert _trained(tokenizer, ids, labels) == "It is 21 degrees in Paris.<|im_end|>"
    assert out["ft_turns"] == [1] and out["ft_turns_stopped"] == [1]
    # a turn with text and a call: the text trains, the call (and the turn's end after it) does not
    talk = [QUESTION, {**CALL, "content": "Let me check."}, RESULT, ANSWER]
    ids, labels, out = _tokenized("tiny-qwen2.5", talk, [WEATHER], train_on_tool_calls=False)
    expected = _without(_between(ids, [_ids(tokenizer, "<|im_start|>assistant\n")], end), ids,
                        _ids(tokenizer, "\n<tool_call>"), [end])
    assert labels == expected
    assert _trained(tokenizer, ids, labels) == "Let me check.It is 21 degrees in Paris.<|im_end|>"
    assert out["ft_turns"] == [1] and out["ft_turns_stopped"] == [1]  # the text before a call is not a turn to stop


def test_qwen3_trains_the_think_block_and_masks_the_reasoning_on_request():
    """Qwen3: a turn after the last user message opens with `<think>` (empty when it has no reasoning), which the
    model writes after the generation prompt `<|im_start|>assistant\\n`; the reasoning of a turn before the last user
    message is not rendered (the template drops it), so it is not trained, and the row is not bad for it."""
    tokenizer = _tokenizer("tiny-qwen3")
    header, end = _ids(tokenizer, "<|im_start|>assistant\n"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids, labels, out = _tokenized("tiny-qwen3", REASONED)
    assert labels == _between(ids, [header], end)
    assert _trained(tokenizer, ids, labels) == f"<think>\n{THOUGHT}\n</think>\n\n4<|im_end|>"
    ids, labels, _ = _tokenized("tiny-qwen3", REASONED, train_on_reasoning=False)
    think, closed = _ids(tokenizer, "<think>"), _ids(tokenizer, "</think>\n\n")
    assert labels == _without(_between(ids, [header], end), ids, think, closed)
    assert _trained(tokenizer, ids, labels) == "4<|im_end|>"

    second = [*REASONED, {"role": "user", "content": "And 3 + 3?"},
              {"role": "assistant", "content": "6", "reasoning_content": "3 + 3 is 6."}]
    ids, labels, out = _tokenized("tiny-qwen3", second)
    assert THOUGHT not in tokenizer.decode(ids)  # dropped by the template: the model never sees it when asked
    assert labels == _between(ids, [header], end)
    assert _trained(tokenizer, ids, labels) == "4<|im_end|><think>\n3 + 3 is 6.\n</think>\n\n6<|im_end|>"
    assert out[BAD[0]] == [""] and out["ft_turns_stopped"] == [2]

    # a plain row trains the empty think block its template opens the last turn with, as the model must write it
    ids, labels, _ = _tokenized("tiny-qwen3", [REASONED[0], {"role": "assistant", "content": "4"}])
    assert _trained(tokenizer, ids, labels) == "<think>\n\n</think>\n\n4<|im_end|>"

    # reasoning, then a call: masking the reasoning leaves the call, its <tool_call> tags included, trained (and the
    # answer's empty think block: that turn has no reasoning to mask)
    thought_call = [QUESTION, {**CALL, "reasoning_content": "I need the weather."}, RESULT, ANSWER]
    ids, labels, _ = _tokenized("tiny-qwen3", thought_call, [WEATHER], train_on_reasoning=False)
    assert labels == _without(_between(ids, [header], end), ids, think, closed, runs=1)
    assert _trained(tokenizer, ids, labels) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
        "<think>\n\n</think>\n\nIt is 21 degrees in Paris.<|im_end|>")


def test_llama31_trains_the_bare_json_call_after_the_assistant_header():
    """Llama 3.1: tools in the first user turn, the call as `{"name": …, "parameters": …}` alone in its turn, the
    result as an `ipython` turn (written with tojson), every turn closed by `<|eot_id|>`."""
    tokenizer = _tokenizer("tiny-llama3.1")
    ids, labels, out = _tokenized("tiny-llama3.1", TOOL_CHAT, [WEATHER])
    assert ids == _ids(tokenizer, render(tokenizer, None, TOOL_CHAT, [WEATHER]))
    header = _ids(tokenizer, "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert labels == _between(ids, [header], tokenizer.convert_tokens_to_ids("<|eot_id|>"))
    assert _trained(tokenizer, ids, labels) == ('{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
                                                "It is 21 degrees in Paris.<|eot_id|>")
    assert out["ft_turns_stopped"] == [2]


def test_mistral_nemo_trains_tool_calls_from_the_end_of_the_instruction():
    """Mistral Nemo: no generation prompt; an assistant turn follows `[/INST]` or `[/TOOL_RESULTS]`, a call turn is
    `[TOOL_CALLS][{…, "id": …}]</s>` (so `[TOOL_CALLS]` is the model's to write), tools before the last user turn."""
    tokenizer = _tokenizer("tiny-mistral-nemo")
    ids, labels, out = _tokenized("tiny-mistral-nemo", TOOL_CHAT, [WEATHER])
    openers = [_ids(tokenizer, "[/INST]"), _ids(tokenizer, "[/TOOL_RESULTS]")]
    end = tokenizer.convert_tokens_to_ids("</s>")
    assert labels == _between(ids, openers, end)
    assert _trained(tokenizer, ids, labels) == ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                                                '"id": "call00001"}]</s>It is 21 degrees in Paris.</s>')
    ids, labels, out = _tokenized("tiny-mistral-nemo", TOOL_CHAT, [WEATHER], train_on_tool_calls=False)
    assert labels == _without(_between(ids, openers, end), ids, _ids(tokenizer, "[TOOL_CALLS]"), [end])
    assert out["ft_turns"] == [1] and out["ft_turns_stopped"] == [1]
    # two exchanges: Mistral writes the tools before the last user message, so the first turn's prompt renders them
    # elsewhere than the row does; the turn still starts where its prompt ends
    twice = [*TOOL_CHAT, {"role": "user", "content": "And in Rome?"},
             {**CALL, "tool_calls": [_call("Rome", "call00002")]}, {**RESULT, "tool_call_id": "call00002"}, ANSWER]
    ids, labels, _ = _tokenized("tiny-mistral-nemo", twice, [WEATHER])
    assert labels == _between(ids, openers, end)


# --- 3. what a template cannot write; template kwargs; exact match and ft generate -----------------------------------


UNRENDERED = [  # (family, messages, tools, reason, detail)
    ("tiny-qwen2.5", REASONED, None, "template_drops", "messages[1].reasoning_content: the chat template does not "
                                                       "write this reasoning"),
    ("tiny-qwen2", TOOL_CHAT, [WEATHER], "template_drops", "data.tools[0]: the chat template does not write the tool "
                                                           "definition 'get_weather'"),
    ("tiny-llama3.1", [QUESTION, {**CALL, "content": "Let me check."}, RESULT, ANSWER], [WEATHER], "template_drops",
     "messages[1].content: the chat template does not write this assistant text beside its tool calls"),
    ("tiny-llama3.1", [QUESTION, {**CALL, "tool_calls": [_call("Paris"), _call("Rome", "call00002")]}, RESULT, ANSWER],
     [WEATHER], "template_error", "This model only supports single tool-calls at once!"),
    ("tiny-mistral-nemo", [QUESTION, {**CALL, "tool_calls": [_call("Paris", "c1")]}, {**RESULT, "tool_call_id": "c1"},
                           ANSWER], [WEATHER], "template_error", "Tool call IDs should be alphanumeric strings"),
]


@pytest.mark.parametrize(("family", "messages", "tools", "reason", "detail"), UNRENDERED,
                         ids=[f"{f}-{r}" for f, _, _, r, _ in UNRENDERED])
def test_a_row_the_template_cannot_write_whole_carries_no_loss_and_says_why(family, messages, tools, reason, detail):
    _, labels, out = _tokenized(family, messages, tools)
    assert set(labels) <= {IGNORE_INDEX} and out["ft_no_loss"] == [True]  # a refused row: no text at all
    assert out[BAD[0]] == [reason] and detail in out[BAD[1]][0]


def test_bad_rendered_rows_are_refused_by_line_or_skipped_and_counted(tmp_path):
    """What ``ft.data.build`` does with the flags: the row named `file:line` under `on_bad_row: error`, dropped and
    counted under `skip`."""
    path = _jsonl(tmp_path / "rows.jsonl", [{"messages": REASONED}, {"messages": TOOL_CHAT}, {"messages": REASONED}])
    rows = mix([_canonical(path)], ["data.train.0"])
    tokenizer = _tokenizer("tiny-qwen2.5")
    settings = TokenizeSettings(template=tokenizer.chat_template, max_length=4096, truncation="truncate",
                                train_on="assistant", tools=json.dumps([WEATHER]))

    def tokenize(batch):
        out = tokenize_arrays(batch, tokenizer, settings)
        return {"input_ids": [ids.tolist() for ids in out["input_ids"]], BAD[0]: out[BAD[0]], BAD[1]: out[BAD[1]]}

    tokenized = rows.map(tokenize, batched=True, remove_columns=rows.column_names)
    sources = [DataSource(path=str(path), format="chat")]
    with pytest.raises(DataError) as caught:
        refused_rendered(tokenized, rows, sources, "train", "error", BadRows(), print)
    assert f"data.train: 2 rows the chat template cannot render whole:\n  {path}:1: messages[1].reasoning_content: " \
           in str(caught.value) and f"\n  {path}:3: " in str(caught.value)
    report, said = BadRows(), []
    kept, at = refused_rendered(tokenized, rows, sources, "train", "skip", report, said.append)
    assert len(kept) == 1 and at.tolist() == [1] and report.as_dict() == {"data.train.0": {"template_drops": 2}}
    assert said == ["data: train: skipped 2 rows the chat template cannot render whole (template_drops: 2)"]


def test_template_kwargs_are_the_defaults_of_the_template_that_trains_and_ships():
    """`enable_thinking: false` written into Qwen3's template: the generation prompt then holds the empty think block
    (the model is given it, so it is not trained), a caller's own value still wins, and Llama 3.1's date is fixed."""
    tokenizer = _tokenizer("tiny-qwen3")
    template = with_defaults(tokenizer.chat_template, {"enable_thinking": False})
    prompt = render(tokenizer, template, REASONED[:1], generation=True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    asked = tokenizer.apply_chat_template(REASONED[:1], chat_template=template, tokenize=False,
                                          add_generation_prompt=True, enable_thinking=True)
    assert asked.endswith("<|im_start|>assistant\n")
    ids, labels, _ = _tokenized("tiny-qwen3", [REASONED[0], {"role": "assistant", "content": "4"}], template=template)
    assert _trained(tokenizer, ids, labels) == "4<|im_end|>"
    llama = _tokenizer("tiny-llama3.1")
    dated = with_defaults(llama.chat_template, {"date_string": "1 Jan 2026"})
    assert "Today Date: 1 Jan 2026" in render(llama, dated, REASONED[:1], generation=True)


def test_exact_match_renders_held_out_prompts_with_their_tool_calls_and_tools(write_recipe, tmp_path):
    """A held-out row's prompt keeps its call and the tool's result, and is rendered with data.tools; a row whose last
    assistant turn is a call is answered by that turn (its calls are scored: tests/test_chatml_tools.py), or left out
    for a tokenizer that cannot read calls back (``calls=False``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ft.inference.exact_match import exact_match, held_out_rows

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    rows = _jsonl(tmp_path / "eval.jsonl", [{"messages": TOOL_CHAT}, {"messages": TOOL_CHAT[:2]}])
    recipe = load_recipe(write_recipe({
        "model": {"name": str(ASSETS / "tiny-qwen2.5"), "init": "random"},
        "data": {"train": [{"path": str(rows)}], "eval": [{"path": str(rows)}], "tools": str(tools),
                 "eval_exact_match": {"n": 5, "max_new_tokens": 2}},
        "train": {"output_dir": str(tmp_path / "out")}})).recipe
    held = held_out_rows(recipe)
    assert len(held) == 2 and held[0].prompt == TOOL_CHAT[:3] and held[0].answer == ANSWER["content"]
    assert held[1].prompt == [QUESTION] and held[1].answer == CALL
    assert held[0].tools == held[1].tools == [WEATHER]
    said = []
    assert held_out_rows(recipe, calls=False, say=said.append) == held[:1]
    assert said == ["ft: exact match: 1 held-out row is not scored; 1 ends on a tool call, which the chat template "
                    "has no response template to read back from the model's text (data.chat_template: chatml-tools "
                    "has one)"]
    tokenizer = _tokenizer("tiny-qwen2.5")
    prompt = render(tokenizer, None, held[0].prompt, held[0].tools, generation=True)
    assert '"name": "get_weather", "description"' in prompt and '"arguments": {"city": "Paris"}' in prompt
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ASSETS / "tiny-qwen2.5"))
    result = exact_match(model, tokenizer, held, max_new_tokens=2)
    assert result["n"] == 2 and result["examples"][0]["prompt"] == "What is the weather in Paris?"
    assert result["examples"][1]["expected"] == '[{"arguments":{"city":"Paris"},"name":"get_weather"}]'
    assert result["exact_match"] == 0  # the call row among them: tiny-qwen2.5's tokenizer cannot read calls back


def test_ft_generate_renders_the_tools_file_with_every_prompt(tmp_path):
    from ft.inference.generate import InferenceError, Sampling, prompt_text, read_tools

    tokenizer = _tokenizer("tiny-qwen3")
    (tmp_path / "tools.json").write_text(json.dumps([WEATHER["function"]]))
    tools = read_tools(tmp_path / "tools.json")
    text, templated = prompt_text(tokenizer, {"prompt": "Weather in Paris?"}, Sampling(), "--prompt 1", tools=tools)
    assert templated and text == render(tokenizer, None, [{"role": "user", "content": "Weather in Paris?"}],
                                        [WEATHER], generation=True)
    assert '"name": "get_weather"' in text
    (tmp_path / "bad.json").write_text(json.dumps({"name": "get_weather"}))
    with pytest.raises(InferenceError, match=r"--tools: .*bad.json: expected a list of tool definitions"):
        read_tools(tmp_path / "bad.json")
    with pytest.raises(InferenceError, match="--no-chat-template was given"):
        prompt_text(tokenizer, {"prompt": "hi"}, Sampling(chat_template=False), "--prompt 1", tools=tools)


def test_prepared_rows_render_each_rows_own_tools(write_recipe, tmp_path):
    """Through ``prepare_data``, as ``ft train`` prepares SFT rows: a row's `tools` column reaches the template."""
    from ft import data

    rows = _jsonl(tmp_path / "train.jsonl", [{"messages": TOOL_CHAT, "tools": [WEATHER]}] * 2)
    recipe = load_recipe(write_recipe({
        "model": {"name": str(ASSETS / "tiny-qwen2.5"), "init": "random"},
        "data": {"train": [{"path": str(rows)}], "max_length": 1024},
        "train": {"output_dir": str(tmp_path / "out")}})).recipe
    tokenizer = _tokenizer("tiny-qwen2.5")
    prepared = data.prepare_data(recipe, tokenizer, data.chat_template_for(recipe, tokenizer), say=lambda _: None)
    row = prepared.train[0]
    assert row["input_ids"] == _ids(tokenizer, render(tokenizer, None, TOOL_CHAT, [WEATHER]))
    assert _trained(tokenizer, row["input_ids"], row["labels"]) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
        "It is 21 degrees in Paris.<|im_end|>")
