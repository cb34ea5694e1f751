"""The template consistency check (a chat template that shows the model, when it is asked for a turn, other text than
it was trained on: Qwen3's drops earlier turns' reasoning) and ``--show N`` (the first rows as the model sees them,
trained tokens marked). Real tokenizers and real templates: Qwen3's own template text, ChatML and Llama 3."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ASSETS, DATA, ROOT, run_ft, start_ft, tiny_sft
from transformers import AutoTokenizer

from ft.data.consistency import FIRST, RANDOM, first_mismatch, sample
from ft.data.formats import FORMATS, Names
from ft.data.templates import CHATML, LLAMA3, resolve_chat_template

# Qwen3's chat template (Qwen/Qwen3-8B tokenizer_config.json), verbatim: an assistant turn before the last user message
# is written without its reasoning; a turn after it with its reasoning in <think>, the last one always (empty if none)
QWEN3 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 (the template as Qwen ships it)

# ChatML whose generation prompt writes one newline more than its training turns do
EXTRA_NEWLINE = CHATML.replace("{{- '<|im_start|>assistant\\n' }}{%- endif %}",
                               "{{- '<|im_start|>assistant\\n\\n' }}{%- endif %}")

REASONED = [  # two exchanges, each answer with its reasoning (OpenAI/DeepSeek's reasoning_content)
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 17 + 25?"},
    {"role": "assistant", "content": "42", "reasoning_content": "Seven and five make twelve: carry one. 42."},
    {"role": "user", "content": "And doubled?"},
    {"role": "assistant", "content": "84", "reasoning_content": "Twice 42 is 84."},
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ASSETS)


def _render(tokenizer, template: str, messages: list[dict], **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template, **kwargs)


# --- the check, on templates rendered directly -------------------------------------------------------------------


def test_qwen3_drops_the_first_turns_reasoning_and_the_check_shows_where(tokenizer):
    """Trained whole, the row's first answer is written without its reasoning (Qwen3 keeps only the last exchange's);
    asked that question, the model writes <think>… first. The check finds the first answer's turn, and shows both
    sides from the first token where they part."""
    trained = _render(tokenizer, QWEN3, REASONED)
    assert "Twice 42 is 84." in trained and "carry one" not in trained  # the template as the check sees it
    mismatch = first_mismatch(REASONED, tokenizer, QWEN3)
    assert mismatch is not None
    assert (mismatch.turn, mismatch.kind) == (2, "turn")
    assert mismatch.before.endswith("<|im_start|>assistant\n")
    assert mismatch.inference.startswith("<think>\nSeven") and mismatch.training.startswith("42<|im_end|>")
    prefix = tokenizer(_render(tokenizer, QWEN3, REASONED[:2], add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"]
    assert mismatch.at == len(prefix)  # right after the generation prompt: the prompt itself is the same
    # one exchange alone is rendered the same both ways: the template is consistent there
    assert first_mismatch(REASONED[:3], tokenizer, QWEN3) is None


def test_chat_template_kwargs_enable_thinking_false_changes_the_prompt(tokenizer):
    """With enable_thinking false Qwen3's generation prompt ends with an empty <think> block the training text lacks
    before the first answer: the prompt itself differs (``kind`` prompt)."""
    single = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"},
              {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6"}]
    template = resolve_chat_template(QWEN3, tokenizer, {"enable_thinking": False})  # data.chat_template_kwargs
    mismatch = first_mismatch(single, tokenizer, template)
    assert (mismatch.turn, mismatch.kind) == (1, "prompt")
    assert mismatch.inference.startswith("<think>\n\n</think>") and mismatch.training.startswith("4<|im_end|>")


@pytest.mark.parametrize("template", [CHATML, LLAMA3, "own"], ids=["chatml", "llama3", "tiny-llama's own"])
def test_chatml_and_llama3_render_every_turn_the_same_wherever_it_stands(tokenizer, template):
    """No mismatch on the same many-turn rows (reasoning_content is not written by these templates at all)."""
    template = tokenizer.chat_template if template == "own" else template
    assert first_mismatch(REASONED, tokenizer, template) is None
    three = REASONED + [{"role": "user", "content": "Halved?"}, {"role": "assistant", "content": "42"}]
    assert first_mismatch(three, tokenizer, template) is None


def test_a_generation_prompt_with_other_whitespace_is_a_prompt_mismatch(tokenizer):
    mismatch = first_mismatch(REASONED[:3], tokenizer, EXTRA_NEWLINE)
    assert (mismatch.turn, mismatch.kind) == (2, "prompt")
    assert mismatch.inference.startswith("\n") and mismatch.training.startswith("42")


def test_the_sample_is_the_first_rows_and_a_seeded_draw_of_the_rest():
    assert sample(10, seed=0) == list(range(10))
    rows = sample(3000, seed=42)
    assert rows[:FIRST] == list(range(FIRST)) and len(rows) == FIRST + RANDOM == len(set(rows))
    assert all(FIRST <= i < 3000 for i in rows[FIRST:]) and rows == sorted(rows)
    assert rows == sample(3000, seed=42) and rows != sample(3000, seed=43)


# --- the check in the data preparation (ft preprocess) -----------------------------------------------------------


def _chats(path: Path, rows: list[list[dict]]) -> Path:
    path.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in rows))
    return path


def _two_exchanges(count: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"What is {i} + 2?"}, {"role": "assistant", "content": str(i + 2)},
             {"role": "user", "content": "And doubled?"}, {"role": "assistant", "content": str(2 * i + 4)}]
            for i in range(count)]


def _preprocess_recipe(write_recipe, tmp_path, train: Path, **data_changes) -> Path:
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"].update(train=[{"path": str(train), "format": "chat"}], eval=[],
                          prepared_path=str(tmp_path / "prepared"), **data_changes)
    return write_recipe(recipe)


def test_ft_preprocess_warns_on_qwen3s_template_names_the_row_and_records_it(write_recipe, tmp_path):
    """Two exchanges a row, Qwen3's template: even without reasoning its last turn gets an empty <think> block that
    earlier turns lack, so every row is reported; 200 rows: the first 64 and 64 drawn from the rest are checked.
    Refused under `data.on_template_mismatch: error` (exit 2), before anything is written."""
    train = _chats(tmp_path / "two.jsonl", _two_exchanges(200))
    path = _preprocess_recipe(write_recipe, tmp_path, train, chat_template=QWEN3)
    result = run_ft("preprocess", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    checked = json.loads(result.stdout)["template_mismatch"]
    assert (checked["rows_checked"], checked["rows_mismatched"]) == (FIRST + RANDOM, FIRST + RANDOM)
    assert checked["example"]["row"] == f"{train}:1" and checked["example"]["turn"] == 1
    warning = next(line for line in result.stderr.splitlines() if "chat template renders" in line)
    assert warning.startswith("data: warning: data.train: the chat template renders 128 of 128 sampled rows")
    assert f"{train}:1, assistant turn messages[1]" in warning and "'<think>" in warning
    assert "data.chat_template" in warning and "data.on_template_mismatch: error refuses" in warning

    refused = run_ft("preprocess", str(path), "--set", "data.on_template_mismatch=error")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "data.on_template_mismatch: warn lets such data" in refused.stderr and "Traceback" not in refused.stderr
    assert f"{train}:1, assistant turn messages[1]" in refused.stderr


def test_ft_preprocess_records_no_mismatch_for_the_quickstarts_chatml(tmp_path):
    result = run_ft("preprocess", "recipes/quickstart.yaml", "--set", f"data.prepared_path={tmp_path / 'prepared'}")
    assert result.returncode == 0, result.stderr[-3000:]
    checked = json.loads(result.stdout)["template_mismatch"]
    assert checked == {"rows_checked": FIRST + RANDOM, "rows_mismatched": 0, "example": None}
    assert "chat template renders" not in result.stderr


def test_reasoning_rows_end_to_end_are_checked_with_their_reasoning(write_recipe, tmp_path):
    """Chat rows that carry `reasoning_content` reach the template: the first answer's reasoning is what Qwen3 drops."""
    kept = FORMATS["chat"].convert({"messages": REASONED}, Names({}, {}))["messages"][2]
    if "reasoning_content" not in kept:
        pytest.skip("chat rows do not carry reasoning_content yet (ft.data.formats)")
    train = _chats(tmp_path / "reasoned.jsonl", [REASONED] * 3)
    result = run_ft("preprocess", str(_preprocess_recipe(write_recipe, tmp_path, train, chat_template=QWEN3)))
    assert result.returncode == 0, result.stderr[-3000:]
    example = json.loads(result.stdout)["template_mismatch"]["example"]
    assert example["turn"] == 2 and example["inference"].startswith("<think>\nSeven")


# --- --show --------------------------------------------------------------------------------------------------------


def test_preprocess_show_prints_the_quickstarts_first_rows_marked_and_prepares_nothing(tmp_path):
    prepared = tmp_path / "prepared"
    result = run_ft("preprocess", "recipes/quickstart.yaml", "--show", "3", "--set", f"data.prepared_path={prepared}",
                    env={"NO_COLOR": None})
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    first = [json.loads(line)["messages"] for line in (DATA / "train.jsonl").read_text().splitlines()[:3]]
    blocks = out.split("\n\n")
    assert len(blocks) == 4 and blocks[3].startswith("3 rows shown: ")
    for number, (block, messages) in enumerate(zip(blocks, first, strict=False), 1):
        assert block.startswith(f"row {number}, {DATA / 'train.jsonl'}:{number} (data.train.0): ")
        # the answer and the end-of-turn token are trained; the system prompt, the question, the headers are not
        assert f"<|im_start|>assistant\n[[{messages[2]['content']}<|im_end|>]]" in block
        assert block.count("[[") == 1 and messages[1]["content"] in block and "\x1b[" not in block
        assert "stop: 1 of 1 trained turns end with '<|im_end|>'" in block
        table = {line.split()[0]: line.split()[1:] for line in block.splitlines() if line.startswith("  ")
                 and line.split()[0] in ("system", "user", "assistant")}
        answer = len(AutoTokenizer.from_pretrained(ASSETS)(messages[2]["content"] + "<|im_end|>",
                                                          add_special_tokens=False)["input_ids"])
        assert table["system"][0] == table["user"][0] == "0" and table["assistant"][0] == str(answer)
    assert not prepared.exists()


# what --show never needs (it reads a few rows, it builds no dataset and trains nothing): each costs a second or more
# of the command's start (ft.data.lazy); torch stays, transformers' AutoConfig and AutoTokenizer import it
NOT_FOR_SHOW = ("datasets", "pandas", "trl", "peft")


def _show_imports(recipe: Path | str, *watched: str) -> list[str]:
    """The modules of ``watched`` that ``ft preprocess RECIPE --show 1`` imported, run in a process of its own as the
    command runs (which must succeed)."""
    code = ("import json, sys\n"
            f"sys.argv = ['ft', 'preprocess', {str(recipe)!r}, '--show', '1']\n"
            "from ft import cli\n"
            "try:\n    cli.main()\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
            f"print(json.dumps([m for m in {list(watched)!r} if m in sys.modules]), file=sys.stderr)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("row 1, ")
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_show_imports_nothing_that_builds_a_dataset_or_trains():
    """The quickstart's --show 1 reads its row, converts and tokenizes it without ``datasets`` (ft.data.formats and
    ft.data.sources import it lazily), pandas, TRL or PEFT: what keeps --show fast (timed in benchmarks/README.md)."""
    assert _show_imports("recipes/quickstart.yaml", *NOT_FOR_SHOW) == []


def test_show_reads_only_the_rows_it_shows_and_names_a_bad_one(write_recipe, tmp_path):
    """Line 3 is not JSON and line 5 neither: --show 2 never reaches them; --show 3 shows the bad row by file:line."""
    lines = (DATA / "train.jsonl").read_text().splitlines()[:4]
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join([lines[0], lines[1], "{not json", lines[3], "{nor this"]) + "\n")
    path = _preprocess_recipe(write_recipe, tmp_path, train)
    two = run_ft("preprocess", str(path), "--show", "2")
    assert two.returncode == 0 and "2 rows shown" in two.stdout and "bad row" not in two.stdout, two.stderr[-2000:]
    three = run_ft("preprocess", str(path), "--show", "3")
    assert three.returncode == 0, three.stderr[-2000:]
    assert f"row 3, {train}:3 (data.train.0): a bad row: " in three.stdout and "(invalid_json)" in three.stdout


def test_show_marks_every_trained_turn_and_says_which_do_not_stop(write_recipe, tmp_path):
    """Two exchanges, ChatML: both answers trained. A template that writes nothing after an answer: the stop check
    fails for each, said per row. A max_length that cuts the row is said."""
    train = _chats(tmp_path / "two.jsonl", _two_exchanges(2))
    chatml = run_ft("validate", str(_preprocess_recipe(write_recipe, tmp_path, train, chat_template="chatml")),
                    "--show", "1")
    assert chatml.returncode == 0, chatml.stderr[-2000:]
    resolved, shown = chatml.stdout.split("\nrow 1, ", 1)
    assert yaml.safe_load(resolved)["method"] == "sft"  # ft validate: the resolved recipe first
    assert shown.count("[[") == 2 and "[[2<|im_end|>]]" in shown and "[[4<|im_end|>]]" in shown
    assert "stop: 2 of 2 trained turns end with '<|im_end|>'" in shown

    no_stop = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    path = _preprocess_recipe(write_recipe, tmp_path, train, chat_template=no_stop, max_length=12)
    result = run_ft("preprocess", str(path), "--show", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "may not learn to stop (data.on_missing_stop)" in result.stdout
    assert "cut at data.max_length 12: the last " in result.stdout


def test_show_counts_tool_definitions_results_and_calls_apart(write_recipe, tmp_path):
    """A call, its result and the answer, with the row's tools, rendered by Qwen3's template: the definitions (written
    before the first message) and the result are never trained, the call and the answer are the assistant's."""
    parameters = {"type": "object", "properties": {"km": {"type": "number"}}}
    tools = [{"type": "function", "function": {"name": "convert", "description": "Kilometres to miles",
                                               "parameters": parameters}}]
    called = [{"role": "user", "content": "How many miles is 10 km?"},
              {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {"name": "convert", "arguments": {"km": 10}}}]},
              {"role": "tool", "content": "6.21"},
              {"role": "assistant", "content": "About 6.2 miles."}]
    if "tool_calls" not in FORMATS["chat"].convert({"messages": called}, Names({}, {}))["messages"][1]:
        pytest.skip("chat rows do not carry tool_calls yet (ft.data.formats)")
    train = tmp_path / "tools.jsonl"
    train.write_text(json.dumps({"messages": called, "tools": tools}) + "\n")
    path = _preprocess_recipe(write_recipe, tmp_path, train, chat_template=QWEN3, max_length=1024)
    result = run_ft("preprocess", str(path), "--show", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    table = {line.split()[0]: [int(n) for n in line.split()[1:]] for line in result.stdout.splitlines()
             if line.startswith("  ") and line.split()[0] in ("tools", "user", "tool", "assistant")}
    assert table["tools"][0] == table["user"][0] == table["tool"][0] == 0 and table["tools"][1] > 100
    assert table["assistant"][0] > 0
    assert '[[<tool_call>\n{"name": "convert", "arguments": {"km": 10}}\n</tool_call><|im_end|>]]' in result.stdout
    assert "<tool_response>\n6.21\n</tool_response>" in result.stdout and "[[<tool_response>" not in result.stdout


def test_show_marks_a_text_rows_completion(write_recipe, tmp_path):
    """A prompt/completion row: the completion and the EOS ft adds are trained, the prompt is not."""
    train = tmp_path / "text.jsonl"
    train.write_text(json.dumps({"prompt": "What is 2 + 2?", "completion": " 4"}) + "\n")
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"].update(train=[{"path": str(train), "format": "text"}], eval=[])
    result = run_ft("preprocess", str(write_recipe(recipe)), "--show", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\nWhat is 2 + 2?[[ 4<|im_end|>]]\n" in result.stdout
    roles = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.startswith("  ")}
    assert roles["prompt"][0] == "0" and roles["completion"][1] == "0"


def _on_a_terminal(*args: str, env: dict[str, str | None]) -> str:
    """stdout of the real ``ft`` run with a terminal (a pseudo-terminal) as its stdout."""
    main, child = pty.openpty()
    process = start_ft(*args, env=env, terminal=child)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-2000:]
    return out.decode()


def test_show_colours_trained_tokens_on_a_terminal_unless_no_color():
    coloured = _on_a_terminal("preprocess", "recipes/quickstart.yaml", "--show", "1", env={"NO_COLOR": None})
    assert "\x1b[1;32m10<|im_end|>\x1b[0m" in coloured and "[[" not in coloured
    plain = _on_a_terminal("preprocess", "recipes/quickstart.yaml", "--show", "1", env={"NO_COLOR": "1"})
    assert "[[10<|im_end|>]]" in plain and "\x1b[" not in plain


def test_show_writes_a_vision_chats_image_as_one_marker(write_recipe, tmp_path):
    """The shipped tiny LLaVA (a picture is 4 tokens) on the colour pictures: the image's tokens shown as one marker,
    counted apart, never trained."""
    recipe = {"method": "sft", "model": {"name": str(ROOT / "src/ft/smoke/assets/tiny-llava"), "init": "random"},
              "data": {"train": [{"path": str(ROOT / "data/colours/train.jsonl"), "format": "chat"}],
                       "max_length": 64},
              "train": {"output_dir": str(tmp_path / "out")}}
    result = run_ft("preprocess", str(write_recipe(recipe)), "--show", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    first = json.loads((ROOT / "data/colours/train.jsonl").read_text().splitlines()[0])["messages"]
    assert "<|im_start|>user\n<image×4>What colour is the shape?<|im_end|>" in result.stdout
    assert f"[[{first[1]['content']}<|im_end|>]]" in result.stdout
    assert result.stdout.count("(4 of them image tokens, never trained)") == 2


def test_show_is_refused_for_a_method_trl_tokenizes(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe.update(method="dpo")
    recipe["data"].update(train=[{"path": str(DATA / "preference.jsonl"), "format": "preference"}], eval=[])
    result = run_ft("preprocess", str(write_recipe(recipe)), "--show", "2")
    assert result.returncode == 2 and "method" in result.stderr and "--show prints the rows ft tokenizes" in \
        result.stderr, result.stderr[-2000:]
