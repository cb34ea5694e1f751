"""Reading data sources: every file type, save_to_disk directories, fractions, mixtures, split_ratio, and
.jsonl files with invalid JSON lines."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ft.data.formats import normalize
from ft.data.rows import BadRows, DataError
from ft.data.sources import mix, read_source, source_counts, split_off, weighted
from ft.recipe.data_section import DataSource

datasets.disable_progress_bars()
WORDS = ["alpha", "beta", "gamma"]


def _read(path, on_bad_row="error", report=None, seed=0, key="data.train.0", **fields):
    source = DataSource(path=str(path), **fields)
    return read_source(source, seed=seed, on_bad_row=on_bad_row, report=report or BadRows(), key=key)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


WRITERS = {
    "jsonl": lambda p: _jsonl(p, [{"text": w} for w in WORDS]),
    "json": lambda p: p.write_text(json.dumps([{"text": w} for w in WORDS])),
    "parquet": lambda p: pq.write_table(pa.table({"text": WORDS}), p),
    "csv": lambda p: p.write_text("text\n" + "\n".join(WORDS) + "\n"),
    "txt": lambda p: p.write_text("\n".join(WORDS) + "\n"),
}


@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_each_file_type_reads_its_rows_with_their_index(tmp_path, suffix):
    path = tmp_path / f"data.{suffix}"
    WRITERS[suffix](path)
    dataset = _read(path)
    assert dataset["text"] == WORDS
    assert dataset["__ft_row"] == [0, 1, 2]


def test_blank_lines_of_a_text_file_are_not_rows(tmp_path):
    (tmp_path / "data.txt").write_text("alpha\n\n   \nbeta\n")
    dataset = _read(tmp_path / "data.txt")
    assert dataset["text"] == ["alpha", "beta"] and dataset["__ft_row"] == [0, 1]


def test_a_save_to_disk_dataset_and_a_dataset_dict_split(tmp_path):
    datasets.Dataset.from_dict({"text": WORDS}).save_to_disk(str(tmp_path / "plain"))
    assert _read(tmp_path / "plain")["text"] == WORDS
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x"]}),
                          "test": datasets.Dataset.from_dict({"text": WORDS})}).save_to_disk(str(tmp_path / "dict"))
    test = _read(tmp_path / "dict", split="test")
    assert test["text"] == WORDS and test["__ft_row"] == [0, 1, 2]
    with pytest.raises(DataError, match="has no split 'validation'; it has train, test"):
        _read(tmp_path / "dict", split="validation")


def test_a_missing_file_says_where_relative_paths_are_read_from(tmp_path):
    with pytest.raises(DataError, match=r"data.train.0.path: .*nope.jsonl does not exist \(relative paths are read "
                                        r"from the recipe's folder\)"):
        _read(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="does not exist"):
        _read("./missing/data.parquet")


def test_an_unsupported_file_type_is_named(tmp_path):
    (tmp_path / "data.xlsx").write_text("x")
    with pytest.raises(DataError, match=r"unsupported file type '.xlsx'"):
        _read(tmp_path / "data.xlsx")


def test_fraction_is_a_seeded_sorted_subset_of_the_rounded_size(tmp_path):
    path = _jsonl(tmp_path / "data.jsonl", [{"text": str(i)} for i in range(100)])
    first = _read(path, fraction=0.25, seed=1)["__ft_row"]
    assert len(first) == 25 and first == sorted(first) and len(set(first)) == 25
    assert _read(path, fraction=0.25, seed=1)["__ft_row"] == first
    assert _read(path, fraction=0.25, seed=2)["__ft_row"] != first
    assert len(_read(path, fraction=0.001)) == 1  # at least one row


def test_a_mixture_of_two_sources_with_fractions(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"text": f"a{i}"} for i in range(40)])
    b = _jsonl(tmp_path / "b.jsonl", [{"text": f"b{i}"} for i in range(50)])
    report, parts = BadRows(), []
    for i, (path, fraction) in enumerate([(a, 0.5), (b, 0.2)]):
        source = DataSource(path=str(path), format="text", fraction=fraction)
        raw = read_source(source, seed=3, on_bad_row="error", report=report)
        parts.append(normalize(raw, source, key=f"data.train.{i}", on_bad_row="error", report=report))
    mixed = mix(parts)
    assert len(mixed) == 20 + 10
    completions = mixed["completion"]
    assert sum(c.startswith("a") for c in completions) == 20 and sum(c.startswith("b") for c in completions) == 10


def test_a_mixture_of_different_layouts_is_refused(tmp_path):
    text = datasets.Dataset.from_dict({"prompt": [""], "completion": ["x"], "__ft_row": [0]})
    chat = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": "x"}]], "__ft_row": [0]})
    with pytest.raises(DataError, match="data.train.1 has the columns messages but data.train.0 has prompt, comp"):
        mix([text, chat], keys=["data.train.0", "data.train.1"])
    listed = datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]], "completion": ["x"],
                                         "__ft_row": [0]})
    with pytest.raises(DataError, match="hold different kinds of values"):
        mix([text, listed])


def test_split_off_holds_out_a_seeded_disjoint_share():
    dataset = datasets.Dataset.from_dict({"__ft_row": list(range(100))})
    train, held = split_off(dataset, 0.1, seed=5)
    assert (len(train), len(held)) == (90, 10)
    assert set(train["__ft_row"]).isdisjoint(held["__ft_row"])
    assert set(train["__ft_row"]) | set(held["__ft_row"]) == set(range(100))
    assert split_off(dataset, 0.1, seed=5)[1]["__ft_row"] == held["__ft_row"]
    assert len(split_off(dataset, 0.001, seed=5)[1]) == 1
    with pytest.raises(DataError, match="split_ratio"):
        split_off(datasets.Dataset.from_dict({"x": [1]}), 0.5, seed=0)


def _with_invalid_json(tmp_path):
    good = json.dumps({"text": "ok"})
    path = tmp_path / "data.jsonl"
    path.write_text(f"{good}\n\n{{\"text\": oops}}\n{good}\n[1, 2]\n")  # lines 1, (blank), 3, 4, 5
    return path


def test_invalid_json_lines_stop_the_read_naming_file_and_line(tmp_path):
    path = _with_invalid_json(tmp_path)
    with pytest.raises(DataError) as caught:
        _read(path)
    message = str(caught.value)
    assert message.startswith("data.train.0: 2 bad rows in")
    assert f"{path}:3: invalid JSON: " in message and "(invalid_json)" in message
    assert f"{path}:5: a JSON list where an object was expected (wrong_type)" in message
    assert "data.on_bad_row: skip" in message and "\n\n" not in message


def test_invalid_json_lines_are_skipped_and_counted(tmp_path):
    report = BadRows()
    dataset = _read(_with_invalid_json(tmp_path), "skip", report)
    assert dataset["text"] == ["ok", "ok"] and dataset["__ft_row"] == [0, 2]
    assert report.as_dict() == {"data.train.0": {"invalid_json": 1, "wrong_type": 1}}


def test_without_a_key_skipped_lines_move_to_the_key_normalize_is_given(tmp_path):
    report, path = BadRows(), _with_invalid_json(tmp_path)
    source = DataSource(path=str(path), format="text")
    raw = read_source(source, seed=0, on_bad_row="skip", report=report)
    normalize(raw, source, key="data.eval.1", on_bad_row="skip", report=report)
    assert report.as_dict() == {"data.eval.1": {"invalid_json": 1, "wrong_type": 1}}


def _latin1_jsonl(tmp_path):
    """Six chat rows saved as Latin-1, as an editor on Windows might: line 6 holds "café" as the byte 0xe9."""
    path = tmp_path / "data.jsonl"
    lines = [json.dumps({"text": f"row {i}"}) for i in range(1, 6)] + ['{"text": "un café"}']
    path.write_bytes("".join(line + "\n" for line in lines).encode("latin-1"))
    return path


def test_a_line_that_is_not_utf8_is_a_bad_row_named_by_file_and_line(tmp_path):
    path = _latin1_jsonl(tmp_path)
    with pytest.raises(DataError) as caught:
        _read(path)
    message = str(caught.value)
    assert message.startswith("data.train.0: 1 bad row in")
    assert f"{path}:6: not UTF-8 text: byte 0xe9 at column 17 (saved as Latin-1" in message
    assert "(not_utf8)" in message and "data.on_bad_row: skip" in message


def test_a_line_that_is_not_utf8_is_skipped_and_counted(tmp_path):
    report = BadRows()
    dataset = _read(_latin1_jsonl(tmp_path), "skip", report)
    assert dataset["text"] == [f"row {i}" for i in range(1, 6)] and dataset["__ft_row"] == [0, 1, 2, 3, 4]
    assert report.as_dict() == {"data.train.0": {"not_utf8": 1}}


def test_a_text_file_line_that_is_not_utf8_is_a_bad_row_too(tmp_path):
    path = tmp_path / "data.txt"
    path.write_bytes(b"first\n\ncaf\xe9\nlast\n")  # the blank line 2 is not a row
    with pytest.raises(DataError, match=rf"{path}:3: not UTF-8 text: byte 0xe9 at column 4"):
        _read(path, format="text")
    report = BadRows()
    dataset = _read(path, "skip", report, format="text")
    assert dataset["text"] == ["first", "last"] and dataset["__ft_row"] == [0, 2]
    assert report.as_dict() == {"data.train.0": {"not_utf8": 1}}


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_a_csv_file_that_is_not_utf8_is_refused_whole_naming_its_first_bad_line(tmp_path, on_bad_row):
    path = tmp_path / "data.csv"
    path.write_bytes(b"text\nfirst\ncaf\xe9\n")
    with pytest.raises(DataError) as caught:
        _read(path, on_bad_row, format="text")
    message = str(caught.value)
    assert f"is not UTF-8 text (first at {path}:3, byte 0xe9 at column 4" in message
    assert "iconv -f latin1 -t utf-8 data.csv" in message


def _sources(tmp_path, sizes):
    """``mix`` of text sources named a, b, … with ``sizes`` rows each (completions ``a0``, ``a1``, …)."""
    parts = []
    for i, size in enumerate(sizes):
        name = "abcdef"[i]
        path = _jsonl(tmp_path / f"{name}.jsonl", [{"text": f"{name}{j}"} for j in range(size)])
        source = DataSource(path=str(path), format="text")
        parts.append(normalize(_read(path, format="text"), source, key=f"data.train.{i}", on_bad_row="error",
                               report=BadRows()))
    return mix(parts)


def test_a_weighted_mixture_draws_rows_in_the_weights_proportions_seeded(tmp_path):
    mixed = _sources(tmp_path, [3000, 3000])
    drawn = weighted(mixed, [0.8, 0.2], seed=1, stop="first_exhausted")
    completions = drawn["completion"][:]
    names = [c[0] for c in completions]
    assert names.count("a") == 3000  # the first to run out ends it: a, at 4 rows in 5
    assert 0.78 < names.count("a") / len(names) < 0.82
    assert all(int(c[1:]) == i for i, c in enumerate(c for c in completions if c[0] == "b"))  # source order
    assert weighted(mixed, [0.8, 0.2], seed=1, stop="first_exhausted")["completion"][:] == completions
    assert weighted(mixed, [0.8, 0.2], seed=2, stop="first_exhausted")["completion"][:] != completions
    assert source_counts(drawn, ["data.train.0", "data.train.1"]) == {
        "data.train.0": {"rows": 3000}, "data.train.1": {"rows": len(names) - 3000}}


def test_the_mixtures_stopping_rules(tmp_path):
    mixed = _sources(tmp_path, [100, 10])
    first = weighted(mixed, [0.5, 0.5], seed=0, stop="first_exhausted")["completion"][:]
    assert sum(c[0] == "b" for c in first) == 10 and sum(c[0] == "a" for c in first) < 40  # b ran out first
    every = weighted(mixed, [0.5, 0.5], seed=0, stop="all_exhausted")["completion"][:]
    assert set(every) == set(mixed["completion"][:]) and sum(c[0] == "b" for c in every) > 50  # b repeats
    once = weighted(mixed, [0.5, 0.5], seed=0, stop="all_exhausted_without_replacement")["completion"][:]
    assert sorted(once) == sorted(mixed["completion"][:])  # every row exactly once


def test_the_source_of_each_row_and_tokens_per_source_are_counted(tmp_path):
    mixed = _sources(tmp_path, [4, 6]).add_column("length", [1, 2, 3, 4, 10, 10, 10, 10, 10, 10])
    assert source_counts(mixed, ["data.train.0", "data.train.1"], "length") == {
        "data.train.0": {"rows": 4, "tokens": 10}, "data.train.1": {"rows": 6, "tokens": 60}}
