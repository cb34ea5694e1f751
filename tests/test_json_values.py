"""JSON values read as written (issue 43, finding 6): a string stays a string whatever it looks like ("10", "3.5",
"1e5", "true", "null", an ISO date), a list of content parts stays a list, and no type inferred across rows decides
what a field is: one row unlike the others is judged alone, never the whole file. The same values with and without
``data.streaming``, from .jsonl and .json files."""

from __future__ import annotations

import json
from itertools import islice

import datasets
import pytest
from conftest import tiny_sft

from ft import data
from ft.data import sources
from ft.data.formats import FORMATS, Chat, Names, normalize
from ft.data.rows import BadRows, DataError, RowError
from ft.data.sources import read_source
from ft.data.stream import StreamFailed, streamed_train
from ft.model import loading
from ft.recipe import load_recipe
from ft.recipe.data_section import DataSource

datasets.disable_progress_bars()
LOOKALIKES = ["10", "3.5", "1e5", "true", "null", "2021-03-05", "12:30:00", "2021-03-05T10:00:00Z", "[1]", "{}"]
PARTS = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 8?"}]
IMAGE = [{"type": "image", "image": "a.png"}, {"type": "text", "text": "What is this?"}]


def _write(path, rows):
    """``rows`` as JSON Lines (.jsonl) or as one indented JSON array (.json)."""
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def _place(path, index):
    """How a bad row is named: ``file:line`` in JSON Lines, ``file:row n`` in a JSON array file."""
    return f"{path}:{index + 1}" if path.suffix == ".jsonl" else f"{path}:row {index + 1}"


def _canonical(path, format="chat", on_bad_row="error", report=None, **fields):
    source = DataSource(path=str(path), format=format, **fields)
    report = report if report is not None else BadRows()
    raw = read_source(source, seed=0, on_bad_row=on_bad_row, report=report, key="data.train.0")
    rows = normalize(raw, source, key="data.train.0", on_bad_row=on_bad_row, report=report)
    return [{k: v for k, v in row.items() if k != "__ft_row"} for row in rows]


def _chat(answer, user="How many?"):
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def _poisoned(image=False):
    """The issue's file: 200 chats whose answers are strings that look like other things, and one whose question is a
    list of text parts (and, with ``image``, one more whose question holds an image)."""
    rows = [_chat(LOOKALIKES[i % len(LOOKALIKES)]) for i in range(200)]
    rows.insert(100, {"messages": [{"role": "user", "content": PARTS}, {"role": "assistant", "content": "10"}]})
    if image:
        rows.insert(150, {"messages": [{"role": "user", "content": IMAGE}, {"role": "assistant", "content": "a cat"}]})
    return rows


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_one_row_of_text_parts_poisons_nothing(tmp_path, suffix, on_bad_row):
    rows, report = _poisoned(), BadRows()
    canonical = _canonical(_write(tmp_path / f"chat{suffix}", rows), on_bad_row=on_bad_row, report=report)
    assert len(canonical) == 201 and report.as_dict() == {}
    assert [row["messages"][1]["content"] for row in canonical] == [row["messages"][1]["content"] for row in rows]
    assert canonical[100]["messages"][0] == {"role": "user", "content": "What is 2 + 8?"}  # the parts, joined
    assert canonical[3]["messages"][1]["content"] == "true" and canonical[4]["messages"][1]["content"] == "null"


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_an_image_part_is_one_bad_row_named_by_its_part(tmp_path, suffix):
    path = _write(tmp_path / f"chat{suffix}", _poisoned(image=True))
    with pytest.raises(DataError) as caught:
        _canonical(path)
    message = str(caught.value)
    assert message.startswith("data.train.0: 1 bad row in")
    assert (f"{_place(path, 150)}: messages[0].content[0]: an 'image' part: images need a vision-language model"
            in message and "(image_content)" in message)
    report = BadRows()
    kept = _canonical(path, on_bad_row="skip", report=report)
    assert len(kept) == 201 and report.as_dict() == {"data.train.0": {"image_content": 1}}
    assert kept[150]["messages"][1]["content"] == LOOKALIKES[149 % len(LOOKALIKES)]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_iso_dates_times_and_numbers_written_as_strings_stay_text(tmp_path, suffix):
    answers = ["2021-03-05", "2021-03-05T10:00:00Z", "12:30:00", "2021-03-05 10:00", "10", "3.5", "1e5", "true", "null"]
    dates = [f"2021-03-{day:02d}" for day in range(1, 13)]
    for name, outputs in (("dates", dates), ("mixed", answers)):  # all dates: Arrow's JSON reader reads timestamps
        rows = [{"instruction": "When?", "input": "null" if i % 2 else "", "output": output}
                for i, output in enumerate(outputs)]
        canonical = _canonical(_write(tmp_path / f"{name}{suffix}", rows), "instruction")
        assert [row["messages"][1]["content"] for row in canonical] == outputs
        assert canonical[1]["messages"][0]["content"] == "When?\n\nnull"  # the string "null" is text, not null


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_number_where_the_others_wrote_text_is_one_bad_row(tmp_path, suffix):
    rows = [{"instruction": "Add 2 and 8.", "output": "10"} for _ in range(6)]
    rows[4]["output"] = 10
    path = _write(tmp_path / f"sums{suffix}", rows)
    with pytest.raises(DataError, match=r"1 bad row in") as caught:
        _canonical(path, "instruction")
    assert f"{_place(path, 4)}: output: expected text, got a number (wrong_type)" in str(caught.value)
    report = BadRows()
    kept = _canonical(path, "instruction", "skip", report)
    assert [row["messages"][1]["content"] for row in kept] == ["10"] * 5
    assert report.as_dict() == {"data.train.0": {"wrong_type": 1}}


def _tool_rows():
    weather = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}
    rome = {"type": "function", "function": {"name": "get_weather", "arguments": '{"unit": "C", "city": "Rome"}'}}
    return [
        _chat("10"),
        {"messages": [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": "", "tool_calls": [weather]},
                      {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21}"},
                      {"role": "assistant", "content": "21 degrees"}]},
        _chat("2021-03-05", user=PARTS),
        {"messages": [{"role": "user", "content": "And Rome?", "name": "ann"},
                      {"role": "assistant", "content": "Checking.", "tool_calls": [rome]},
                      {"role": "tool", "content": "null"},
                      {"role": "assistant", "content": "null"}], "id": 7, "score": 2.5},
        {"messages": [{"role": "user", "content": IMAGE}, {"role": "assistant", "content": "a cat"}], "id": "8"},
        _chat("true"),
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_every_row_reaches_its_format_as_written_and_is_judged_alone(tmp_path, suffix, monkeypatch):
    """Tool calls, a tool turn, text and image parts, a message key only one message has, fields of changing kinds:
    the chat format receives each row exactly as Python's json reads it (its keys, their order, their values), and
    the rows it keeps, refuses or counts are those it keeps, refuses or counts one by one."""
    rows = _tool_rows()
    seen = []
    convert = Chat.convert
    monkeypatch.setattr(Chat, "convert", lambda self, row, names: seen.append(row) or convert(self, row, names))
    report = BadRows()
    canonical = _canonical(_write(tmp_path / f"tools{suffix}", rows), on_bad_row="skip", report=report)
    arrived = [{k: v for k, v in row.items() if k != "__ft_row" and v is not None} for row in seen]
    assert [json.dumps(row) for row in arrived[-len(rows):]] == [json.dumps(row) for row in rows]
    expected, reasons = [], {}
    for row in rows:
        try:
            expected.append(convert(FORMATS["chat"], row, Names({}, {})))
        except RowError as error:
            reasons[error.reason] = reasons.get(error.reason, 0) + 1
    assert canonical == expected and report.as_dict() == {"data.train.0": reasons}
    assert reasons == {"image_content": 1}  # what the chat format says of these rows today (a call may have no text)


def test_fields_of_several_kinds_reach_reward_functions_as_written(tmp_path, monkeypatch):
    """The kind of a field is that of all its values, over the whole file: a late row of another kind makes the
    column hold each value as its JSON text (not the first batch's type), and a whole number beside a fraction stays
    whole."""
    monkeypatch.setattr(sources, "WRITE_BATCH", 3, raising=False)
    answers = ["10", "3.5", "true", "null", "2021-03-05", "x", "y", 7, 2.5, [1, 2], None, {"a": 1}]
    rows = [{"prompt": f"q{i}", "answer": answer, "level": 2.5 if i == 11 else i} for i, answer in enumerate(answers)]
    del rows[10]["answer"]  # a row without the field reads as null
    canonical = _canonical(_write(tmp_path / "prompts.jsonl", rows), "prompt")
    assert [row["answer"] for row in canonical] == answers
    assert [type(row["level"]) for row in canonical] == [int] * 11 + [float]
    late = [{"prompt": f"q{i}", "answer": str(i)} for i in range(7)] + [{"prompt": "q7", "answer": 7}]
    assert [row["answer"] for row in _canonical(_write(tmp_path / "late.jsonl", late), "prompt")] == [
        "0", "1", "2", "3", "4", "5", "6", 7]  # the last, partial batch changes the kind


def test_arrows_read_is_kept_only_where_it_changed_nothing(tmp_path, monkeypatch):
    """Files Arrow's JSON reader reads as Python's json would keep its fast read (typed columns, not JSON text); where
    it would fill a key some messages lack (as null) or read 1 beside 2.5 as 1.0, the file is read as written."""
    plain = _write(tmp_path / "plain.jsonl", [_chat(str(i)) for i in range(5)])
    raw = read_source(DataSource(path=str(plain)), seed=0, on_bad_row="error", report=BadRows())
    assert isinstance(raw.features["messages"], datasets.List)  # Arrow's own read
    assert [row["messages"][1]["content"] for row in _canonical(plain)] == [str(i) for i in range(5)]
    named = [_chat("1"), {"messages": [{"role": "user", "content": "hi", "name": "ann"},
                                       {"role": "assistant", "content": "2"}]}]
    seen = []
    convert = Chat.convert
    monkeypatch.setattr(Chat, "convert", lambda self, row, names: seen.append(row) or convert(self, row, names))
    _canonical(_write(tmp_path / "named.jsonl", named))
    assert [row["messages"] for row in seen[-2:]] == [row["messages"] for row in named]  # no "name": None added
    levels = _canonical(_write(tmp_path / "levels.jsonl", [{"prompt": "q", "level": 1}, {"prompt": "q", "level": 2.5}]),
                        "prompt")
    assert [row["level"] for row in levels] == [1, 2.5] and type(levels[0]["level"]) is int


def test_a_json_array_is_read_element_by_element_across_chunks(tmp_path, monkeypatch):
    """A window of a few bytes at a time: elements, strings with brackets, commas, quotes and characters of several
    bytes, and numbers cut at a window's edge all read as ``json.load`` reads the whole file."""
    monkeypatch.setattr(sources, "CHUNK", 5, raising=False)
    rows = [{"text": "a ], b, \"c\" [", "n": 123456789}, {"text": "café ✓ 日本語"}, {"text": "  "}, "plain text",
            12345, {"text": "last", "list": [1.5e10, True, None]}]
    path = tmp_path / "rows.json"
    path.write_bytes(b"\xef\xbb\xbf \n" + json.dumps(rows, indent=2, ensure_ascii=False).encode() + b"\n\n")
    report = BadRows()
    texts = _canonical(path, "text", "skip", report)
    assert [row["completion"] for row in texts] == [rows[0]["text"], rows[1]["text"], "plain text", "last"]
    assert report.as_dict() == {"data.train.0": {"empty_content": 1, "wrong_type": 1}}
    read = list(sources.json_rows(path, "rows.json"))
    assert [row for _, row in read if isinstance(row, dict)] == [rows[0], rows[1], rows[2], {"text": "plain text"},
                                                                 rows[5]]
    assert read[4][1].render() == "a JSON int where an object was expected (wrong_type)"  # 12345, not 12 or 1


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_a_json_array_with_a_syntax_error_is_refused_naming_its_line(tmp_path, on_bad_row):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b"}\n  {"text": "c"}\n]\n')
    with pytest.raises(DataError) as caught:
        _canonical(path, "text", on_bad_row)
    message = str(caught.value)
    assert f"data.train.0.path: {path}: line 4, column 3: expected ',' or ']' after an element" in message
    assert "(.jsonl), where a bad line is one bad row" in message
    path.write_bytes('[{"text": "café"}]'.encode("latin-1"))
    with pytest.raises(DataError, match="is not UTF-8 text: ft reads data files as UTF-8"):
        _canonical(path, "text", on_bad_row)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_stream_reads_the_values_the_whole_read_does(write_recipe, tmp_path, suffix):
    rows = _poisoned(image=True)[95:160]
    path = _write(tmp_path / f"chat{suffix}", rows)
    recipe = tiny_sft(tmp_path / "out", max_steps=10)
    recipe["data"].update(train=[{"path": str(path), "format": "chat"}], eval=[], on_bad_row="skip")
    loaded = load_recipe(write_recipe(recipe)).recipe
    tokenizer = loading.load_tokenizer(loaded.model)
    template = data.chat_template_for(loaded, tokenizer)
    whole = data.prepare_data(loaded, tokenizer, template, say=lambda _: None)
    assert len(whole.train) == 64 and whole.stats["skipped_rows"] == {"data.train.0": {"image_content": 1}}
    stats = {}
    stream = streamed_train(loaded, tokenizer, template, 1, lambda _: None, stats)
    streamed = [row["input_ids"] for row in islice(stream, 64)]
    assert streamed == whole.train["input_ids"]
    assert stats["skipped_rows"] == {"data.train.0": {"image_content": 1}}
    recipe["data"]["on_bad_row"] = "error"
    stream = streamed_train(load_recipe(write_recipe(recipe)).recipe, tokenizer, template, 1, lambda _: None, {})
    with pytest.raises(StreamFailed, match=rf"{_place(path, 55)}: messages\[0\]\.content\[0\]: an 'image' part"):
        list(islice(stream, 64))


def test_json_lines_in_a_json_file_an_empty_array_and_a_file_of_bad_lines(tmp_path):
    lines = tmp_path / "lines.json"
    lines.write_text('{"text": "10"}\n\n{"text": "2021-03-05"}\n')  # JSON Lines, as datasets writes .json files
    assert [row["completion"] for row in _canonical(lines, "text")] == ["10", "2021-03-05"]
    (tmp_path / "empty.json").write_text(" [ ] ")
    with pytest.raises(DataError, match=r"empty\.json has no rows"):
        _canonical(tmp_path / "empty.json", "text")
    (tmp_path / "bad.jsonl").write_text('{"text": oops}\n[1]\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: none of its 2 rows could be read \(invalid_json: 1, "
                                        r"wrong_type: 1\)"):
        _canonical(tmp_path / "bad.jsonl", "text", "skip")
