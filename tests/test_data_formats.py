"""Row formats: canonical layouts, field and role mapping, every bad-row reason, and the error/skip policy; a format
is one registered object, which owns its generated example rows and its held-out answers too."""

from __future__ import annotations

import json
import subprocess
import sys

import datasets
import pytest
from conftest import DATA, ROOT

from ft.data.formats import FORMATS, Format, Names, Sum, normalize, register
from ft.data.rows import REASONS, BadRows, DataError, RowError
from ft.data.sources import read_source
from ft.inference.exact_match import held_out_rows
from ft.recipe import load_recipe
from ft.recipe import names as offered
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
    fast = FORMATS["text"].columnar(datasets.Dataset.from_dict({"text": texts, "__ft_row": [0, 1, 2, 3]}), PLAIN)
    assert fast is not None and fast.to_list() == rows.to_list()  # the Arrow path, not the row-by-row one, ran
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
    ("chat", {"messages": [{"role": "user", "content": ["hi"]}]}, "wrong_type", "messages[0].content[0]"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "wrong_type",
     "messages[0].content[0].text"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]}]}, "wrong_type",
     "messages[0].content[0]"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url",
                                                                                         "image_url": "a.png"}]}]},
     "image_content", "messages[0].content[1]"),
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
    with pytest.raises(DataError, match=r"t\.jsonl:2: messages\[0\]\.content\[0\]: expected a content part"):
        _rows(path, "chat")


# --- a format is one registered object -----------------------------------------------------------------------------


def test_every_name_validation_offers_is_one_registered_format():
    assert list(FORMATS) == list(offered.FORMATS)
    assert all(isinstance(fmt, Format) and fmt.name == name for name, fmt in FORMATS.items())


def test_a_format_validation_does_not_offer_is_refused_when_registered():
    class Unlisted(Format):
        name = "unlisted"
        columns = ("prompt",)

    with pytest.raises(ValueError, match="not in recipe/names.py FORMATS"):
        register(Unlisted)
    assert "unlisted" not in FORMATS


MAPPED = {"messages": "conversations", "role": "from", "content": "value", "instruction": "task", "input": "context",
          "output": "response", "prompt": "question", "completion": "reply", "chosen": "good", "rejected": "bad"}
ROLE_NAMES = {"human": "user", "gpt": "assistant"}


def _expected(format, i, chat, fields):
    """What exact match reads from example ``i`` of ``format``: (prompt, answer), or None (a plain text)."""
    case = Sum(i)
    user = [{"role": "user", "content": case.question}]
    if format == "chat":
        if i % 3 == 2:
            return ([*user, {"role": "assistant", "content": case.answer},
                     {"role": "user", "content": f"And {case.a} - {case.b}?"}], str(case.a - case.b))
        return user, case.answer
    if format == "instruction":
        task = "Add the two numbers." + (f"\n\n{case.a} and {case.b}" if i % 2 else "")
        return [{"role": "user", "content": task}], case.answer
    if format == "text":
        return (case.question, f" {case.answer}") if "completion" in fields else None
    if format == "preference":
        return (user, case.answer) if chat else (case.question, f" {case.answer}")
    return (user if chat else case.question), case.answer


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize(("fields", "roles"), [({}, {}), (MAPPED, ROLE_NAMES)])
@pytest.mark.parametrize("format", sorted(FORMATS))
def test_example_rows_are_good_rows_of_their_format_and_exact_match_reads_their_answers(tmp_path, format, chat,
                                                                                         fields, roles):
    """The rows --smoke generates in a source's layout pass its format's conversion, and the held-out answer read
    back from each canonical row is the sum it was generated from."""
    fmt = FORMATS[format]
    generated = fmt.example_rows(6, Names(fields, roles), start=1000, chat=chat, answer_fields=("answer", "total"))
    written = json.dumps(generated)  # in the source's layout: its names, not the canonical ones it renames
    assert not any(f'"{canonical}"' in written for canonical in (*fields, *roles.values()))
    if format == "prompt":
        assert all(row["answer"] == row["total"] == Sum(1000 + i).answer for i, row in enumerate(generated))
    rows = _rows(_jsonl(tmp_path / "g.jsonl", generated), format, fields=fields, roles=roles)
    assert rows["__ft_row"] == list(range(6))
    assert [fmt.prompt_and_answer(row) for row in rows] == [_expected(format, 1000 + i, chat, fields)
                                                              for i in range(6)]


def test_a_prompt_row_is_scored_on_its_answer_field():
    row = {"prompt": "What is 2 + 3?", "answer": None, "total": 5}
    assert FORMATS["prompt"].prompt_and_answer(row) is None
    assert FORMATS["prompt"].prompt_and_answer(row, "total") == ("What is 2 + 3?", "5")


def test_held_out_rows_are_read_by_their_sources_format_not_guessed_from_columns(tmp_path):
    # a prompt row may carry any field for its rewards, a `completion` or `messages` among them: its answer is still
    # its `answer` field, as its format says
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 2 + 3?", "completion": "a draft", "messages": "a note",
                                   "answer": 5}) + "\n")
    scored = f"data.eval_exact_match.source={{path: {prompts}, format: prompt}}"
    recipe = load_recipe(ROOT / "recipes/quickstart.yaml", [scored]).recipe
    assert [(row.prompt, row.answer) for row in held_out_rows(recipe)] == [("What is 2 + 3?", "5")]


NEW_FORMAT = """
import importlib.util
import sys

# the name a new format's author adds to recipe/names.py, read before any recipe module reads that list
spec = importlib.util.spec_from_file_location(
    "ft.recipe.names", importlib.util.find_spec("ft").submodule_search_locations[0] + "/recipe/names.py")
names = importlib.util.module_from_spec(spec)
spec.loader.exec_module(names)
names.FORMATS = (*names.FORMATS, "qa")
sys.modules["ft.recipe.names"] = names

from ft.data.formats import Format, register
from ft.data.rows import text_of


@register
class QuestionAnswer(Format):
    name = "qa"
    columns = ("question", "answer")  # columns of its own: exact match cannot guess where its answer is

    def convert(self, row, names):
        return {"question": text_of(row, names("question")), "answer": text_of(row, names("answer"))}

    def example(self, case, names, chat, answer_fields):
        return {names("question"): case.question, names("answer"): case.answer}

    def prompt_and_answer(self, row, field="answer"):
        return row["question"], row["answer"]


import pathlib
import tempfile

from ft.data.build import read_sources
from ft.data.rows import BadRows, DataError
from ft.inference.exact_match import held_out_rows
from ft.recipe import load_recipe
from ft.recipe.data_section import DataSource
from ft.smoke import first_rows

quickstart = load_recipe("recipes/quickstart.yaml").recipe
unreachable = DataSource(path="someone/qa-dataset", format="qa", fields={"question": "q"})
rows = first_rows.generated(unreachable, "eval", 4, quickstart, chat=True)
assert rows[0] == {"q": "What is 3 + 5?", "answer": "8"}, rows[0]
path = pathlib.Path(tempfile.mkdtemp()) / "qa.jsonl"
first_rows.write_jsonl(path, [*rows, {"q": "What is 1 + 1?"}])
source = DataSource(path=str(path), format="qa", fields={"question": "q"})
try:
    read_sources(quickstart, [source], ["data.eval.0"], BadRows())
    raise AssertionError("the row without an answer was not refused")
except DataError as exc:
    assert "qa.jsonl:5: answer: no 'answer' field (missing_field)" in str(exc), exc
skipping = load_recipe("recipes/quickstart.yaml", ["data.on_bad_row=skip"]).recipe
canonical = read_sources(skipping, [source], ["data.eval.0"], BadRows())
assert canonical.column_names == ["question", "answer", "__ft_row", "__ft_source"], canonical.column_names
assert len(canonical) == 4 and (canonical[0]["question"], canonical[0]["answer"]) == ("What is 3 + 5?", "8")
scored = load_recipe("recipes/quickstart.yaml",
                     ["data.on_bad_row=skip", f"data.eval_exact_match.source={{path: {path}, format: qa, "
                      "fields: {question: q}}"]).recipe
held = held_out_rows(scored)
assert [(h.prompt, h.answer) for h in held] == [(r["q"], r["answer"]) for r in rows], held
print("ok")
"""


def test_a_new_format_reaches_normalization_smoke_rows_and_exact_match():
    """A format registered from outside ft (and its name appended to recipe/names.py, which validation reads) is
    normalized, generated by --smoke and scored by exact match, with no other file edited."""
    result = subprocess.run([sys.executable, "-c", NEW_FORMAT], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
