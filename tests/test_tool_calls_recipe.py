"""A real model learns to call a tool, offline: ``recipes/smollm2-tools.yaml`` (LoRA on SmolLM2-135M-Instruct with the
built-in ``chatml-tools`` template) through the real CLI, shortened to keep CI time down, scored after training by the
run itself on the first held-out rows of ``data/tool-calls/eval.jsonl``; then ``ft generate --tools`` on what it
trained.

The base model, shown the tools, answers in words or writes calls that do not parse (scored apart, on fewer rows: the
prompts are long); the trained one calls the right function with the arguments of the question, compared as parsed
JSON (``ft.inference.exact_match``). The rows that go
on after the call (the tool's result, then the answer in words) are scored on that answer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_ft, train_shortened

pytestmark = [pytest.mark.slow, pytest.mark.full]  # the full check (conftest.FULL_CHECK): minutes of training
RECIPE = ROOT / "recipes" / "smollm2-tools.yaml"
DATA = ROOT / "data" / "tool-calls"
HELD_OUT = 24  # held-out rows the trained model is scored on (the shipped recipe scores 200)
BASE_CALLS = 4  # of those calls, the ones the base model is asked (each costs about 2 s of CI: it writes 52 tokens)
# 30 of the recipe's 50 steps, of 2 rows, not 4: training is most of this test's time (the rows are about 260 tokens,
# 180 of them the tools). Measured on 2 cores (seed 0): 30 steps of 2 rows called 15 of the 16 calls in the first 24
# held-out rows right (2026-12-07, 0.92 exact match of the 24), 40 steps all 24 of the first 32 rows (2026-12-06);
# with 4 rows, 30 and 40 steps got 30 of the first 40 rows' 32 calls, 50 steps 32. The threshold (0.9 of the calls)
# allows one miss
STEPS, ROWS = 30, 2


@pytest.fixture(scope="module")
def trained(smollm2, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2-tools") / "run"
    # no eval loss: the held-out rows are the exact match's own source
    # max_new_tokens unset: the longest of these rows' expected turns (the recipe's 56 is its 200 rows' longest); the
    # base model is scored apart, on fewer rows (``test_the_base_model_does_not_call``)
    held_out = f"{{n: {HELD_OUT}, before: false, source: {{path: {DATA / 'eval.jsonl'}, format: chat}}}}"
    return train_shortened(RECIPE, out, STEPS, held_out, f"train.per_device_train_batch_size={ROWS}")


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "exact_match.jsonl").read_text().splitlines()]


def _calls(line: dict) -> bool:
    """A row whose expected answer is a call (compact JSON), not the answer in words after a tool's result."""
    return line["expected"].startswith("[{")


def test_the_base_model_does_not_call(smollm2):
    """The base model, shown the same tools in the same template (the run's chatml-tools, and its response template
    to read calls back), answers the held-out calls in words or with calls that do not parse: the calls the trained
    model gets right are training's doing."""
    from ft.data.templates import BUILTIN_TEMPLATES, response_template_for
    from ft.inference.exact_match import answer_tokens, exact_match, held_out_rows
    from ft.model.loading import load_model, load_tokenizer
    from ft.recipe import load_recipe

    recipe = load_recipe(RECIPE, [f"data.eval_exact_match={{n: {HELD_OUT}}}"]).recipe
    tokenizer = load_tokenizer(recipe.model)
    tokenizer.chat_template = BUILTIN_TEMPLATES["chatml-tools"]
    tokenizer.response_template = response_template_for("chatml-tools", tokenizer)
    rows = [row for row in held_out_rows(recipe, HELD_OUT) if isinstance(row.answer, dict)][:BASE_CALLS]
    model = load_model(recipe, seed=0)
    result = exact_match(model, tokenizer, rows, max_new_tokens=answer_tokens(model, tokenizer, rows)[0],
                         examples=len(rows))
    assert result["n"] == BASE_CALLS and result["exact_match"] == 0.0, result["examples"]


def test_the_trained_one_calls_right(trained):
    lines = _lines(trained)
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["exact_match"]["n"] == len(lines) == HELD_OUT and "exact_match_before" not in summary
    calls = [line for line in lines if _calls(line)]
    after = sum(line["after"] == line["expected"] for line in calls) / len(calls)
    assert after >= 0.9, [(line["expected"], line["after"]) for line in calls if line["after"] != line["expected"]]
    assert json.loads(calls[0]["expected"])[0].keys() == {"name", "arguments"}


def test_the_answers_after_a_tools_result_are_scored_on_their_text(trained):
    """The first held-out rows that go on after the call are in the scored rows, each expecting its answer in words."""
    rows = [json.loads(line) for line in (DATA / "eval.jsonl").read_text().splitlines()][:HELD_OUT]
    answered = [row["messages"][-1]["content"] for row in rows if len(row["messages"]) == 4]
    assert answered and [line["expected"] for line in _lines(trained) if not _calls(line)] == answered


def test_ft_generate_with_the_tools_file_prints_the_call(trained):
    line = next(line for line in _lines(trained) if _calls(line) and line["after"] == line["expected"])
    result = run_ft("generate", str(trained), "--tools", str(DATA / "tools.json"), "--prompt", line["prompt"],
                    "--max-new-tokens", "64")
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"<tool_call>\s*(\{.*\})\s*</tool_call>", result.stdout, re.S)
    assert found, result.stdout
    call = json.loads(found.group(1))
    assert [call] == json.loads(line["expected"])


def test_final_ships_the_template_and_how_to_read_its_calls_back(trained):
    """final/'s tokenizer keeps chatml-tools and its response template (ft.run.train sets both), so anyone's
    ``tokenizer.parse_response`` reads the trained model's calls back as exact match did."""
    from transformers import AutoTokenizer

    from ft.data.templates import BUILTIN_TEMPLATES, response_template_for

    tokenizer = AutoTokenizer.from_pretrained(trained / "final")
    assert tokenizer.chat_template == BUILTIN_TEMPLATES["chatml-tools"]
    assert tokenizer.response_template == response_template_for("chatml-tools", tokenizer)
    line = next(line for line in _lines(trained) if _calls(line))
    message = tokenizer.parse_response(f"<tool_call>\n{json.dumps(json.loads(line['expected'])[0])}\n</tool_call>"
                                       "<|im_end|>", prefix="<|im_start|>assistant\n")
    assert [call["function"] for call in message["tool_calls"]] == json.loads(line["expected"])
