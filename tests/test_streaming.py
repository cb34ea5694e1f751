"""data.streaming: rows read, tokenized and (with packing) packed as training consumes them; sharded by process; bad
rows as without streaming; a source that fails mid-stream stops the run with a checkpoint, and the resumed run ends
where an uninterrupted one does."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ASSETS, DATA, ROOT, assert_same_final_weights, run_ft, tiny_sft
from transformers import AutoTokenizer

from ft import data
from ft.data.rows import DataError
from ft.data.stream import StreamFailed, streamed_train
from ft.model import loading
from ft.recipe import RecipeError, load_recipe

QWEN3 = Path(str(importlib.resources.files("ft.smoke") / "assets" / "tiny-qwen3"))  # renders tools and reasoning
DELETE_AT = """
import os

from transformers import TrainerCallback


class DeleteAt(TrainerCallback):
    \"\"\"Deletes `path` at the end of optimizer step `step`: the stream has it open and reads on to its end, then
    cannot open it for the next pass.\"\"\"

    def __init__(self, step: int, path: str):
        self.step, self.path = step, path

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and os.path.exists(self.path):
            os.remove(self.path)
"""


def _streamed(out, path, **train) -> dict:
    recipe = tiny_sft(out, **{"max_steps": 80, "per_device_train_batch_size": 4, "logging_steps": 10, "seed": 0,
                              **train})
    recipe["data"].update(train=[{"path": str(path)}], eval=[], streaming=True)
    recipe["adapter"] = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.1}  # draws random numbers each step
    return recipe


def _rows(path, count):
    shutil.copy(DATA / "train.jsonl", path)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:count]))
    return path


def _stream(write_recipe, recipe: dict, world_size=1, stats=None, messages=None):
    loaded = load_recipe(write_recipe(recipe)).recipe
    tokenizer = loading.load_tokenizer(loaded.model)
    say = messages.append if messages is not None else (lambda _: None)
    return streamed_train(loaded, tokenizer, data.chat_template_for(loaded, tokenizer), world_size, say,
                          {} if stats is None else stats), tokenizer


def _by_template(path) -> list[tuple[list[int], list[int]]]:
    """(token ids, trained token ids) of each row of a chat file, in the file's order, by transformers alone (not ft's
    reading, tokenizing or sharding): the tokenizer's chat template applied, trained where the template marks the
    assistant's turn (``{% generation %}``: the answer and its <|im_end|>)."""
    tokenizer = AutoTokenizer.from_pretrained(ASSETS)
    rows = []
    for line in Path(path).read_text().splitlines():
        out = tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        rows.append((out["input_ids"], [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]))
    return rows


def test_the_stream_never_ends_and_shards_rows_by_process(write_recipe, tmp_path):
    path = _rows(tmp_path / "train.jsonl", 30)
    rows = [ids for ids, _ in _by_template(path)]
    messages, stats = [], {}
    stream, _ = _stream(write_recipe, _streamed(tmp_path / "out", path), stats=stats, messages=messages)
    read = [row["input_ids"] for row, _ in zip(stream, range(75), strict=False)]  # 256 read ahead
    assert read == rows + rows + rows[:15]  # pass after pass, in the file's order
    assert stats["passes"]["data.train.0"] >= 3 and any("ran out after 30 rows" in m for m in messages)
    sharded, _ = _stream(write_recipe, _streamed(tmp_path / "out", path), world_size=2)
    assert sharded.n_shards == 2
    mine = [[row["input_ids"] for row, _ in zip(sharded.shard(2, rank), range(15), strict=False)] for rank in (0, 1)]
    assert mine[0] == rows[0::2] and mine[1] == rows[1::2]  # rank r: the file's rows whose index is r modulo 2


def test_a_bad_row_in_a_stream_is_named_or_skipped_as_without_streaming(write_recipe, tmp_path):
    path = _rows(tmp_path / "train.jsonl", 12)
    lines = path.read_text().splitlines()
    lines[5] = json.dumps({"messages": [{"role": "user", "content": "Un café?"},
                                        {"role": "assistant", "content": "Oui."}]}, ensure_ascii=False)
    path.write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    stream, _ = _stream(write_recipe, _streamed(tmp_path / "out", path))
    with pytest.raises(StreamFailed, match=rf"{path}:6: not UTF-8 text: byte 0xe9"):
        list(zip(stream, range(10), strict=False))
    skipping = _streamed(tmp_path / "out", path)
    skipping["data"]["on_bad_row"] = "skip"
    stats = {}
    stream, _ = _stream(write_recipe, skipping, stats=stats)
    assert len(list(zip(stream, range(33), strict=False))) == 33  # three passes of the 11 good rows
    assert stats["skipped_rows"] == {"data.train.0": {"not_utf8": 1}}  # counted once, on the first pass


@pytest.mark.slow
def test_a_source_gone_mid_stream_stops_with_a_checkpoint_and_resumes_to_the_uninterrupted_weights(
        write_recipe, tmp_path):
    """The file is deleted at step 1; the stream reads its open copy to the end (the first 256 rows are tokenized in
    one batch) and fails to open it for the next pass. The run stops at the last finished step with a checkpoint,
    exit 1; with the file back, the same command resumes and ends bit for bit where an uninterrupted run ends."""
    path = _rows(tmp_path / "train.jsonl", 20)
    kept = tmp_path / "kept.jsonl"
    shutil.copy(path, kept)
    (tmp_path / "delete_at.py").write_text(DELETE_AT)
    out = tmp_path / "out"
    failing = _streamed(out, path)
    failing["callbacks"] = [{"cls": "delete_at:DeleteAt", "kwargs": {"step": 1, "path": str(path)}}]
    command = [sys.executable, "-m", "ft", "train", str(write_recipe(failing))]
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(tmp_path)}
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 1, first.stderr[-3000:]
    assert f"data.train.0: {path} could not be read mid-stream" in first.stderr and "Traceback" not in first.stderr
    summary = json.loads((out / "summary.json").read_text())
    step = summary["steps"]
    assert summary["status"] == "stopped" and summary["stopped_by"] == "data" and 0 < step < 80
    assert summary["checkpoint"] == str(out / f"checkpoint-{step}") and not (out / "final").exists()
    assert f"saved {out / f'checkpoint-{step}'}" in first.stderr

    shutil.copy(kept, path)
    resumed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and f"resuming from {out / f'checkpoint-{step}'}" in resumed.stderr, \
        resumed.stderr[-3000:]
    reference = run_ft("train", str(write_recipe(_streamed(tmp_path / "uninterrupted", path), name="ref.yaml")))
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert_same_final_weights(out, tmp_path / "uninterrupted")


@pytest.mark.slow
def test_a_streamed_run_packs_and_records_what_it_read(write_recipe, tmp_path):
    recipe = _streamed(tmp_path / "out", DATA / "train.jsonl", max_steps=4)
    recipe["data"].update(packing=True, eval=[{"path": str(DATA / "eval.jsonl")}])
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["data"]["streaming"] is True and summary["data"]["eval_rows"] == 200
    assert summary["data"]["train_rows_tokenized"] >= 16
    assert "streaming the training rows (read, tokenized and packed" in result.stderr


@pytest.mark.parametrize(("changes", "key", "says"), [
    ({"method": "dpo"}, "data.streaming", "prepares its whole dataset first"),
    ({"train.max_steps": None}, "data.streaming", "needs `train.max_steps`"),
    ({"data.eval": {"split_ratio": 0.1}}, "data.eval.split_ratio", "needs the whole dataset"),
    ({"data.prepared_path": "prepared"}, "data.prepared_path", "never cached"),
    ({"data.train.0.fraction": 0.5}, "data.train.0.fraction", "needs the whole dataset"),
    ({"train.train_sampling_strategy": "group_by_length"}, "train.train_sampling_strategy", "reads every row's length"),
    ({"train.dataloader_num_workers": 2}, "train.dataloader_num_workers", "one shard per process"),
])
def test_what_needs_the_whole_dataset_is_refused_with_streaming(write_recipe, tmp_path, changes, key, says):
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"]["streaming"] = True
    for dotted, value in changes.items():
        if dotted == "method":
            recipe["method"] = value
            recipe["data"].update(train=[{"path": str(DATA / "preference.jsonl"), "format": "preference"}], eval=[])
            continue
        *parents, last = dotted.split(".")
        node = recipe
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(recipe))
    errors = {p.path: p.message for p in info.value.problems if p.level == "error"}
    assert says in errors[key], errors


def test_the_stream_reads_parquet_files_and_folders_of_data_files_as_it_reads_jsonl(write_recipe, tmp_path):
    import datasets

    _rows(tmp_path / "train.jsonl", 6)
    stream, _ = _stream(write_recipe, _streamed(tmp_path / "out", tmp_path / "train.jsonl"))
    expected = [row["input_ids"] for row, _ in zip(stream, range(12), strict=False)]
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "folder").mkdir()
    shutil.copy(tmp_path / "train.jsonl", tmp_path / "folder" / "part-0.jsonl")  # read by datasets' streaming
    for source in (tmp_path / "train.parquet", tmp_path / "folder"):
        stream, _ = _stream(write_recipe, _streamed(tmp_path / "out", source))
        assert [row["input_ids"] for row, _ in zip(stream, range(12), strict=False)] == expected, source


RECORD_LABELS = """
import json
import os

import torch.nn.functional as F


def recorded(outputs, labels, num_items_in_batch=None):
    \"\"\"The plain token loss, after writing each row's trained label ids to labels-<rank>.jsonl.\"\"\"
    with open(os.path.join(os.environ["LABELS_DIR"], f"labels-{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
        for row in labels.tolist():
            f.write(json.dumps([t for t in row if t != -100]) + "\\n")
    logits = outputs.logits[:, :-1].flatten(0, 1).float()
    return F.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=-100, reduction="sum") / num_items_in_batch
"""


@pytest.mark.slow
def test_two_processes_train_on_their_own_rows_of_the_stream(write_recipe, tmp_path):
    """Each rank's trained rows (their labels, as the loss sees them) are the file's rows whose index is r modulo 2,
    in order, so no row is trained twice: the trained tokens of each, as the tokenizer's own chat template marks
    them (not ft's stream or its shards)."""
    path = _rows(tmp_path / "train.jsonl", 200)
    (tmp_path / "record_labels.py").write_text(RECORD_LABELS)
    recipe = _streamed(tmp_path / "out", path, max_steps=4)
    recipe.pop("adapter")
    recipe["loss"] = "record_labels:recorded"
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(tmp_path), "LABELS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "ft", "train", str(write_recipe(recipe)), "--num-processes", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [trained for _, trained in _by_template(path)]
    for rank in (0, 1):
        trained = [json.loads(line) for line in (tmp_path / f"labels-{rank}.jsonl").read_text().splitlines()]
        assert trained == rows[rank::2][:16], rank  # 4 steps of 4 rows, from the file's row `rank` on, every other


def test_a_missing_source_or_sources_of_different_kinds_are_refused_before_training(write_recipe, tmp_path):
    with pytest.raises(DataError, match=rf"data.train.0.path: {tmp_path / 'nope.jsonl'} does not exist"):
        _stream(write_recipe, _streamed(tmp_path / "out", tmp_path / "nope.jsonl"))
    mixed = _streamed(tmp_path / "out", DATA / "train.jsonl")
    mixed["data"]["train"].append({"path": str(DATA / "text.jsonl"), "format": "text"})
    with pytest.raises(DataError, match="data.train.1 has format `text`, whose rows have other columns"):
        _stream(write_recipe, mixed)
    mixed["data"]["train"][1] = {"path": str(DATA / "instruction.jsonl"), "format": "instruction"}
    stream, _ = _stream(write_recipe, mixed)  # instructions stream as chats: one kind of row
    assert len(list(zip(stream, range(4), strict=False))) == 4


def test_a_streamed_chat_keeps_its_tools_tool_calls_and_reasoning_as_without_streaming(write_recipe, tmp_path):
    """A chat source's own `tools` column (named through `fields:`), its tool calls and its reasoning (`thinking`,
    mapped to reasoning_content) reach the streamed tokens and masks exactly as `ft train` prepares them without
    streaming, with `data.tools` for the row that has none and `data.train_on_reasoning: false` masking the
    reasoning: a stream that dropped any of them would render other text."""
    weather, clock = ({"type": "function", "function": {"name": name, "description": what, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        for name, what in (("get_weather", "The weather in a city."), ("get_time", "The time in a city.")))
    question = {"role": "user", "content": "What is the weather in Paris?"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    result = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "21 degrees"}
    answer = {"role": "assistant", "content": "It is 21 degrees in Paris.", "thinking": "The tool said 21."}
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in (
        {"messages": [question, call, result, answer], "functions": [weather]},
        {"messages": [{"role": "user", "content": "What is 2 + 2?"},
                      {"role": "assistant", "content": "4", "thinking": "Two and two make four."}]})))
    (tmp_path / "tools.json").write_text(json.dumps([clock]))
    recipe = _streamed(tmp_path / "out", path, max_steps=1)
    recipe["model"] = {"name": str(QWEN3), "init": "random"}
    fields = {"reasoning_content": "thinking", "tools": "functions"}
    recipe["data"].update(train=[{"path": str(path), "fields": fields}], tools="tools.json", train_on_reasoning=False,
                          max_length=1024)
    stream, tokenizer = _stream(write_recipe, recipe)
    streamed = [(row["input_ids"], row["labels"]) for row, _ in zip(stream, range(2), strict=False)]
    recipe["data"]["streaming"] = False
    loaded = load_recipe(write_recipe(recipe)).recipe
    prepared = data.prepare_data(loaded, tokenizer, data.chat_template_for(loaded, tokenizer), lambda _: None)
    assert streamed == [(row["input_ids"], row["labels"]) for row in prepared.train]
    (tools, call_ids), (default, _) = streamed
    text, trained = tokenizer.decode(tools), tokenizer.decode([t for t in call_ids if t != -100])
    assert "get_weather" in text and "get_time" not in text and "The tool said 21." in text  # its own tools
    assert '"arguments": {"city": "Paris"}' in trained and "The tool said 21." not in trained  # reasoning masked
    assert "get_time" in tokenizer.decode(default) and "Two and two make four." in tokenizer.decode(default)
