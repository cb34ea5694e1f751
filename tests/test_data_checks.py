"""Checks on the tokenized SFT data before training: trained turns that do not end with the token the model stops on
(the end-of-turn masked out of the labels: a model that never stops), and what data.max_length cuts."""

from __future__ import annotations

import json

import pytest
from conftest import ASSETS, DATA, run_ft, tiny_sft
from transformers import AutoTokenizer

from ft import data
from ft.data.rows import DataError
from ft.model import loading
from ft.recipe import load_recipe

# writes each message and a newline: nothing after an answer that a model could learn to stop on
NO_STOP = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
ROWS = 20


def _rows(tmp_path, lines: list[str]):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _prepare(write_recipe, tmp_path, source: dict, **data_changes):
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"].update(train=[source], eval=[], **data_changes)
    loaded = load_recipe(write_recipe(recipe)).recipe
    tokenizer = loading.load_tokenizer(loaded.model)
    said: list[str] = []
    prepared = data.prepare_data(loaded, tokenizer, data.chat_template_for(loaded, tokenizer), said.append)
    return prepared.stats, [line for line in said if "warning" in line]


def _arithmetic(tmp_path, count: int = ROWS):
    return _rows(tmp_path, (DATA / "train.jsonl").read_text().splitlines()[:count])


def test_turns_that_end_with_the_end_of_turn_token_are_counted_and_pass(write_recipe, tmp_path):
    """ChatML writes <|im_end|> after each answer and ft's mask keeps it: every turn stops, nothing is said."""
    stats, warnings = _prepare(write_recipe, tmp_path, {"path": str(_arithmetic(tmp_path)), "format": "chat"},
                               chat_template="chatml")
    assert (stats["train_turns_trained"], stats["train_turns_stopped"], stats["train_stop_share"]) == (ROWS, ROWS, 1.0)
    assert warnings == []


def test_text_rows_end_with_eos_and_pass(write_recipe, tmp_path):
    lines = [json.dumps({"prompt": f"{i} + 1 =", "completion": f" {i + 1}"}) for i in range(ROWS)]
    stats, warnings = _prepare(write_recipe, tmp_path, {"path": str(_rows(tmp_path, lines)), "format": "text"})
    assert (stats["train_turns_trained"], stats["train_stop_share"]) == (ROWS, 1.0) and warnings == []


def test_a_template_that_writes_nothing_after_an_answer_is_warned_with_the_count_and_an_example(write_recipe,
                                                                                                tmp_path):
    path = _arithmetic(tmp_path)
    stats, warnings = _prepare(write_recipe, tmp_path, {"path": str(path), "format": "chat"}, chat_template=NO_STOP)
    assert (stats["train_turns_trained"], stats["train_turns_stopped"], stats["train_stop_share"]) == (ROWS, 0, 0.0)
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert f"{ROWS} of {ROWS} trained turns (100.0%) do not end with the stop token '<|im_end|>'" in warning
    # the first row (8 + 2 = 10): its answer is trained, the template's newline after it is not
    assert f"{path}:1 has a turn whose trained tokens end " in warning and "10" in warning
    assert "data.chat_template" in warning and "data.on_missing_stop: error" in warning


@pytest.mark.slow
def test_on_missing_stop_error_refuses_the_data_before_training(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"].update(train=[{"path": str(_arithmetic(tmp_path)), "format": "chat"}], eval=[],
                          chat_template=NO_STOP, on_missing_stop="error")
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "data.train: 20 of 20 trained turns" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "final").exists()


def _trained_masks(tokenizer, rows: list[dict], format: str) -> list[list[bool]]:
    """Which of each row's tokens are trained, found by transformers alone (not ft's tokenizer code): a text row is the
    tokenizer's plain encoding and the EOS ft ends it with (its documented layout), every token trained; a chat is
    the tokenizer's chat template applied, its tokens trained where the template marks the assistant's turn
    (``{% generation %}``: the answer and its <|im_end|>)."""
    if format == "text":
        return [[True] * (len(tokenizer(row["text"])["input_ids"]) + 1) for row in rows]
    return [[bool(m) for m in tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True,
                                                             return_assistant_tokens_mask=True)["assistant_masks"]]
            for row in rows]


@pytest.mark.parametrize("format", ["text", "chat"])
@pytest.mark.parametrize("truncation", ["truncate", "drop"])
def test_what_max_length_cuts_is_measured_and_warned_with_the_length_that_fits(write_recipe, tmp_path, truncation,
                                                                               format):
    """Rows of 10..49 words (plain text, or a chat's answer): a max_length that cuts the longest quarter of them
    loses a share of the trained tokens that the test counts itself, on the tokenizer's own encoding; 99% of the rows
    fit in the longest row's length."""
    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    lines = [" ".join(f"word{j}" for j in range(10 + i)) for i in range(40)]
    rows = [{"text": line} if format == "text" else
            {"messages": [{"role": "user", "content": f"Write {10 + i} words."},
                          {"role": "assistant", "content": line}]} for i, line in enumerate(lines)]
    masks = _trained_masks(tokenizer, rows, format)
    lengths = sorted(len(mask) for mask in masks)
    max_length = lengths[29]
    full = sum(sum(mask) for mask in masks)
    if truncation == "truncate":  # a cut row keeps the trained tokens of its first max_length
        kept = sum(sum(mask[:max_length]) for mask in masks)
    else:  # a dropped row loses all of its tokens
        kept = sum(sum(mask) for mask in masks if len(mask) <= max_length)
    path = _rows(tmp_path, [json.dumps(row) for row in rows])
    stats, warnings = _prepare(write_recipe, tmp_path, {"path": str(path), "format": format}, max_length=max_length,
                               truncation=truncation)
    cut_rows = sum(n > max_length for n in lengths)
    assert cut_rows == 10 and stats["train_rows_cut_share"] == 0.25
    assert stats["train_trained_tokens_cut"] == full - kept > 0
    assert stats["train_trained_tokens_cut_share"] == round((full - kept) / full, 4)
    assert stats["train_length_p99"] == lengths[-1]
    assert len(warnings) == 1 and "set data.max_length to at least that" in warnings[0]
    assert "25.0% of the rows" in warnings[0] and f"fit in {lengths[-1]} tokens" in warnings[0]


def test_a_cut_below_one_percent_is_recorded_but_not_warned(write_recipe, tmp_path):
    """One row in 200 loses a few tokens: 0.5% of the rows, well under 1% of the trained tokens."""
    short, long = " ".join(["word"] * 30), " ".join(["word"] * 36)
    lines = [json.dumps({"text": short})] * 199 + [json.dumps({"text": long})]
    max_length = len(AutoTokenizer.from_pretrained(ASSETS)(short)["input_ids"]) + 1 + 2
    stats, warnings = _prepare(write_recipe, tmp_path, {"path": str(_rows(tmp_path, lines)), "format": "text"},
                               max_length=max_length)
    assert stats["train_rows_cut_share"] == 0.005
    assert 0 < stats["train_trained_tokens_cut_share"] < 0.01 and warnings == []


def test_the_refusal_is_a_data_error_naming_the_switch(write_recipe, tmp_path):
    with pytest.raises(DataError, match="data.on_missing_stop: warn lets such data"):
        _prepare(write_recipe, tmp_path, {"path": str(_arithmetic(tmp_path)), "format": "chat"},
                 chat_template=NO_STOP, on_missing_stop="error")
