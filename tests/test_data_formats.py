"""Row formats: canonical layouts, field and role mapping, every bad-row reason, and the error/skip policy."""

from __future__ import annotations

import json

import datasets
import pytest
from conftest import DATA

from ft.data.formats import FORMATS, Names, normalize
from ft.data.rows import REASONS, BadRows, DataError, RowError
from ft.data.sources import read_source
from ft.recipe.data_section import DataSource

datasets.disable_progress_bars()
PLAIN = Names({}, {})
HELLO = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _rows(path, format, on_bad_row="error", report=None, **fields):
    source = DataSource(path=str(path), format=format, **fields)
    report = report if report is not None else BadRows()
    raw = read_source(source, seed=0, on_bad_row=on_bad_row, report=report, key="data.train.0")
    return normalize(raw, source, key="data.train.0", on_bad_row=on_bad_row, report=report)


def _jsonl(path, rows, blank_after=None):
    lines = [json.dumps(row) for row in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def _first(name):
    return json.loads((DATA / name).read_text().splitlines()[0])


def test_chat_rows_of_the_shipped_data_keep_their_messages():
    rows = _rows(DATA / "train.jsonl", "chat")
    assert rows.column_names == ["messages", "__ft_row"] and len(rows) == 3000
    assert rows[0]["messages"] == _first("train.jsonl")["messages"]


def test_instruction_rows_become_a_user_and_an_assistant_turn():
    row, first = _rows(DATA / "instruction.jsonl", "instruction")[0], _first("instruction.jsonl")
    assert row["messages"] == [{"role": "user", "content": f"{first['instruction']}\n\n{first['input']}"},
                               {"role": "assistant", "content": first["output"]}]
    no_input = FORMATS["instruction"].convert({"instruction": "Say hi.", "input": "", "output": "hi"}, PLAIN)
    assert no_input["messages"][0] == {"role": "user", "content": "Say hi."}


def test_text_rows_are_all_completion_and_prompt_completion_rows_are_kept():
    row = _rows(DATA / "text.jsonl", "text")[0]
    assert (row["prompt"], row["completion"]) == ("", _first("text.jsonl")["text"])
    kept = FORMATS["text"].convert({"prompt": "2 + 2 =", "completion": " 4"}, PLAIN)
    assert kept == {"prompt": "2 + 2 =", "completion": " 4"}


def test_plain_text_columnar_path_gives_what_the_row_converter_gives(tmp_path):
    texts = ["one", "  two  ", "three\nlines", "ünïcode"]
    rows = _rows(_jsonl(tmp_path / "t.jsonl", [{"text": t, "id": i} for i, t in enumerate(texts)]), "text")
    assert FORMATS["text"].columnar is not None
    assert rows.column_names == ["prompt", "completion", "__ft_row"]
    assert rows.to_list() == [{**FORMATS["text"].convert({"text": t}, PLAIN), "__ft_row": i}
                              for i, t in enumerate(texts)]


@pytest.mark.parametrize("bad", [" \t", None])
def test_plain_text_with_a_bad_row_still_names_it(tmp_path, bad):
    path = _jsonl(tmp_path / "t.jsonl", [{"text": "fine"}, {"text": bad}, {"text": "also fine"}])
    with pytest.raises(DataError, match=r"t\.jsonl:2: text: "):
        _rows(path, "text")
    report = BadRows()
    assert _rows(path, "text", on_bad_row="skip", report=report)["completion"] == ["fine", "also fine"]
    assert report.total == 1


def test_preference_rows_of_text():
    rows = _rows(DATA / "preference.jsonl", "preference")
    assert rows.column_names == ["prompt", "chosen", "rejected", "__ft_row"]
    assert {k: rows[0][k] for k in ("prompt", "chosen", "rejected")} == _first("preference.jsonl")


def test_preference_rows_of_messages(tmp_path):
    row = {"prompt": [{"role": "user", "content": "1 + 1?"}], "chosen": [{"role": "assistant", "content": "2"}],
           "rejected": [{"role": "assistant", "content": "3"}]}
    rows = _rows(_jsonl(tmp_path / "p.jsonl", [row, row]), "preference")
    assert rows[0]["chosen"] == [{"role": "assistant", "content": "2"}] and rows[1]["prompt"] == row["prompt"]


def test_prompt_rows_keep_every_other_field_for_reward_functions(tmp_path):
    rows = _rows(DATA / "prompts.jsonl", "prompt")
    assert rows.column_names == ["prompt", "answer", "__ft_row"]
    assert {k: rows[0][k] for k in ("prompt", "answer")} == _first("prompts.jsonl")
    renamed = _rows(_jsonl(tmp_path / "q.jsonl", [{"question": "2 * 3?", "answer": "6", "level": 1}]), "prompt",
                    fields={"prompt": "question"})
    assert renamed.column_names == ["prompt", "answer", "level", "__ft_row"]
    assert renamed[0] == {"prompt": "2 * 3?", "answer": "6", "level": 1, "__ft_row": 0}


def test_sharegpt_through_fields_and_roles(tmp_path):
    row = {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "hi"},
                             {"from": "gpt", "value": "hello"}]}
    rows = _rows(_jsonl(tmp_path / "s.jsonl", [row]), "chat",
                 fields={"messages": "conversations", "role": "from", "content": "value"},
                 roles={"human": "user", "gpt": "assistant"})
    assert rows[0]["messages"] == [{"role": "system", "content": "Be brief."}, *HELLO]


BAD = [  # (format, row, reason, field named)
    ("chat", {"other": 1}, "missing_field", "messages"),
    ("chat", {"messages": "hi"}, "wrong_type", "messages"),
    ("chat", {"messages": []}, "empty_chat", "messages"),
    ("chat", {"messages": [{"content": "hi"}]}, "missing_role", "messages[0].role"),
    ("chat", {"messages": [{"role": "narrator", "content": "hi"}]}, "unknown_role", "messages[0].role"),
    ("chat", {"messages": [{"role": "user", "content": "hi"}]}, "no_assistant_turn", "messages"),
    ("chat", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}]},
     "empty_content", "messages[1].content"),
    ("chat", {"messages": [{"role": "user", "content": ["hi"]}]}, "wrong_type", "messages[0].content"),
    ("chat", {"messages": [{"role": "user"}]}, "missing_field", "messages[0].content"),
    ("instruction", {"instruction": "x"}, "missing_field", "output"),
    ("instruction", {"instruction": "x", "input": 3, "output": "y"}, "wrong_type", "input"),
    ("text", {"body": "x"}, "missing_field", "text"),
    ("text", {"text": ""}, "empty_content", "text"),
    ("preference", {"prompt": "q", "chosen": "", "rejected": "b"}, "empty_chosen", "chosen"),
    ("preference", {"prompt": "q", "chosen": "a", "rejected": []}, "empty_rejected", "rejected"),
    ("preference", {"prompt": "q", "chosen": HELLO[1:], "rejected": "b"}, "wrong_type", "prompt"),
    ("preference", {"prompt": HELLO[:1], "chosen": HELLO[:1], "rejected": HELLO[1:]}, "no_assistant_turn", "chosen"),
    ("prompt", {"prompt": 7}, "wrong_type", "prompt"),
    ("prompt", {"prompt": "  "}, "empty_content", "prompt"),
]


@pytest.mark.parametrize(("format", "row", "reason", "field"), BAD)
def test_each_bad_row_reason_is_detected(format, row, reason, field):
    with pytest.raises(RowError) as caught:
        FORMATS[format].convert(row, PLAIN)
    assert (caught.value.reason, caught.value.field) == (reason, field)
    assert caught.value.reason in REASONS


def test_reasons_are_a_closed_set():
    with pytest.raises(ValueError, match="unknown bad-row reason"):
        RowError("looks_odd", "x")


def _bad_chat_file(tmp_path):
    """Line 1 good, line 2 blank, then 7 bad rows on lines 3-9 and a good row on line 10."""
    bad = [{"messages": [{"role": "narrator", "content": "x"}]}, {"messages": [{"role": "user", "content": "x"}]},
           {"messages": []}, {"messages": [{"role": "user", "content": "x"}]}, {"chat": []},
           {"messages": [{"role": "user", "content": "x"}]}, {"messages": [{"role": "user", "content": "x"}]}]
    return _jsonl(tmp_path / "train.jsonl", [{"messages": HELLO}, *bad, {"messages": HELLO}], blank_after=1)


def test_error_mode_lists_the_first_five_bad_rows_by_file_and_line(tmp_path):
    path = _bad_chat_file(tmp_path)
    with pytest.raises(DataError) as caught:
        _rows(path, "chat")
    message = str(caught.value)
    assert message.startswith("data.train.0: 7 bad rows in ") and "the first 5" in message
    assert f"{path}:3: messages[0].role: 'narrator' is not one of system, user, assistant, tool" in message
    assert f"{path}:4: messages: has no assistant message to learn from (no_assistant_turn)" in message
    assert f"{path}:5: messages: has no messages (empty_chat)" in message
    assert f"{path}:7: messages: no 'messages' field (missing_field)" in message
    assert f"{path}:8:" not in message
    assert "map the fields with `fields:`/`roles:`, or set `data.on_bad_row: skip`" in message


def test_skip_mode_drops_and_counts_bad_rows_per_reason(tmp_path):
    report = BadRows()
    rows = _rows(_bad_chat_file(tmp_path), "chat", "skip", report)
    assert rows["__ft_row"] == [0, 8]
    counts = {"no_assistant_turn": 4, "unknown_role": 1, "empty_chat": 1, "missing_field": 1}
    assert report.as_dict() == {"data.train.0": counts} and report.total == 7
    assert report.describe() == ("skipped 7 rows of data.train.0 (no_assistant_turn: 4, empty_chat: 1, "
                                 "missing_field: 1, unknown_role: 1)")


def test_a_source_whose_rows_are_all_bad_is_an_error_even_when_skipping(tmp_path):
    with pytest.raises(DataError, match="none of the 1 rows"):
        _rows(_jsonl(tmp_path / "t.jsonl", [{"messages": []}]), "chat", "skip")


def test_other_files_and_dataset_dicts_name_rows_by_index(tmp_path):
    (tmp_path / "t.csv").write_text("text\nfine\n\"\"\n")
    with pytest.raises(DataError, match=r"t\.csv:row 2: text: no 'text' field \(nor 'prompt' and 'completion'\) "
                                        r"\(missing_field\)"):
        _rows(tmp_path / "t.csv", "text")
    bad = datasets.Dataset.from_dict({"text": ["fine", " "]})
    datasets.DatasetDict({"test": bad}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match=r"dict\[test\]:1: text: is empty \(empty_content\)"):
        _rows(tmp_path / "dict", "text", split="test")


def test_a_field_that_changes_kind_mid_source_is_mixed_kinds(tmp_path):
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"},
            {"prompt": HELLO[:1], "chosen": HELLO[1:], "rejected": HELLO[1:]}]
    report = BadRows()
    kept = _rows(_jsonl(tmp_path / "p.jsonl", rows), "preference", "skip", report)
    assert kept["chosen"] == ["a"] and report.as_dict() == {"data.train.0": {"mixed_kinds": 1}}


def test_bad_rows_describe_several_keys():
    report = BadRows()
    report.add("data.train.0", "invalid_json")
    report.add("data.eval.0", "empty_chat", 2)
    assert report.total == 3
    assert report.describe() == "skipped 3 rows: 1 of data.train.0 (invalid_json: 1), 2 of data.eval.0 (empty_chat: 2)"


def test_values_that_change_type_mid_file_are_judged_row_by_row(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"messages": HELLO}, [1], {"messages": [{"role": "user", "content": ["hi"]}, HELLO[1]]}]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    with pytest.raises(DataError, match=r"t\.jsonl:2: a JSON list where an object was expected"):
        _rows(path, "chat")
    report = BadRows()
    kept = _rows(path, "chat", "skip", report)
    assert kept["messages"] == [HELLO] and report.as_dict() == {"data.train.0": {"wrong_type": 2}}
    path.write_text("\n".join(json.dumps(row) for row in rows[::2]) + "\n")  # arrow reads this one itself
    with pytest.raises(DataError, match=r"t\.jsonl:2: messages\[0\]\.content: expected text, got a list"):
        _rows(path, "chat")
