"""The SFT data pipeline end to end: prepared cache and its fingerprint, length column, samplers, packing,
bad-row and truncation reporting in summary.json."""

from __future__ import annotations

import importlib.resources
import json
import shutil

import pytest
from conftest import ASSETS, CPU, DATA, run_ft, tiny_sft
from transformers import AutoTokenizer

from ft import data
from ft.model import loading
from ft.recipe import load_recipe
from ft.run.train import prepare_trainer
from ft.trainers.hooks import Hooks


def _silent(_message: str) -> None:
    pass


ROWS = 300


@pytest.fixture
def workdir(tmp_path):
    """A copy of the data (its first 300 training chats: what the cache tests change and count, in a quarter of the
    time the 3000 took) and tokenizer that a test may change."""
    rows = (DATA / "train.jsonl").read_text().splitlines(keepends=True)[:ROWS]
    (tmp_path / "train.jsonl").write_text("".join(rows))
    shutil.copy(DATA / "eval.jsonl", tmp_path / "eval.jsonl")
    shutil.copytree(ASSETS, tmp_path / "model")
    return tmp_path


def _recipe(workdir, write_recipe, **data_changes):
    recipe = tiny_sft(workdir / "out")
    recipe["model"]["name"] = str(workdir / "model")
    recipe["data"].update({"train": [{"path": str(workdir / "train.jsonl"), "format": "chat"}],
                           "eval": [{"path": str(workdir / "eval.jsonl"), "format": "chat"}],
                           "prepared_path": str(workdir / "prepared"), **data_changes})
    return write_recipe(recipe)


def _prepare(path, messages=None, **kwargs):
    recipe = load_recipe(path).recipe
    say = messages.append if messages is not None else _silent
    tokenizer = loading.load_tokenizer(recipe.model)
    return data.prepare_data(recipe, tokenizer, data.chat_template_for(recipe, tokenizer), say, **kwargs)


@pytest.mark.slow
def test_preprocess_writes_tokens_masks_and_length_column(workdir, write_recipe):
    path = _recipe(workdir, write_recipe)
    result = run_ft("preprocess", str(path), "--set", "train.length_column_name=n_tokens")
    assert result.returncode == 0, result.stderr[-2000:]
    stats = json.loads(result.stdout)
    assert stats["train_rows"] == ROWS and stats["eval_rows"] == 200
    import datasets

    train = datasets.load_from_disk(str(workdir / "prepared" / "train"))
    assert set(train.column_names) == {"input_ids", "labels", "n_tokens"}
    row = train[0]
    assert row["n_tokens"] == len(row["input_ids"]) == len(row["labels"])
    assert any(label == -100 for label in row["labels"]) and any(label != -100 for label in row["labels"])


def test_two_tokenizing_processes_prepare_the_same_rows_as_one(workdir, write_recipe, monkeypatch):
    """data.num_proc 2 splits the rows between two workers (each builds its own Arrow columns from the masks):
    the prepared rows, masks, lengths and counts are those of one process, row for row."""
    monkeypatch.setenv("FT_CACHE_DATA", "0")  # both tokenized here (num_proc is not part of the data's fingerprint)
    one = _prepare(_recipe(workdir, write_recipe, prepared_path=None, max_length=33))
    two = _prepare(_recipe(workdir, write_recipe, prepared_path=None, max_length=33, num_proc=2))
    assert one.train.to_dict() == two.train.to_dict() and one.eval.to_dict() == two.eval.to_dict()
    assert one.stats == two.stats and one.stats["train_rows_truncated"] > 0
    labels = one.train["labels"]
    assert sum(label != -100 for row in labels for label in row) < sum(len(row) for row in labels)  # masked


def test_unchanged_inputs_reuse_the_cache_and_say_so(workdir, write_recipe):
    path = _recipe(workdir, write_recipe)
    first, second = [], []
    _prepare(path, first)
    prepared = _prepare(path, second)
    assert any("no prepared dataset" in m for m in first)
    assert any("reusing the prepared dataset" in m for m in second)
    assert prepared.stats["prepared"].startswith("reused")


def test_a_changed_data_file_invalidates_the_cache(workdir, write_recipe):
    path = _recipe(workdir, write_recipe)
    _prepare(path)
    with (workdir / "train.jsonl").open("a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "What is 1 + 1?"},
                                         {"role": "assistant", "content": "2"}]}) + "\n")
    messages = []
    prepared = _prepare(path, messages)
    assert any("stale" in m and "data.train.0 contents" in m for m in messages), messages
    assert len(prepared.train) == ROWS + 1


def test_an_edited_tools_file_invalidates_the_cache_and_its_new_definitions_are_rendered(write_recipe, tmp_path):
    """`data.tools` names a file: the cache key holds its contents, so an edit at the same path is a stale cache (and
    the rows are rendered again, with the new definition), while the same contents elsewhere are reused."""
    model = importlib.resources.files("ft.smoke") / "assets" / "tiny-qwen2.5"  # its template renders tools
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "21 degrees"}, {"role": "assistant", "content": "21 degrees."}]}) + "\n")

    def tools(folder, description):
        folder.mkdir(exist_ok=True)
        (folder / "tools.json").write_text(json.dumps([{"name": "get_weather", "description": description,
                                                        "parameters": {"type": "object", "properties": {}}}]))
        return str(folder / "tools.json")

    def prepare(tools_file):
        recipe = {"model": {"name": str(model), "init": "random"}, "train": {"output_dir": str(tmp_path / "out")},
                  "data": {"train": [{"path": str(rows)}], "tools": tools_file, "max_length": 512,
                           "prepared_path": str(tmp_path / "prepared")}}
        messages = []
        prepared = _prepare(write_recipe(recipe), messages)
        tokenizer = AutoTokenizer.from_pretrained(model)
        return " ".join(messages), tokenizer.decode(prepared.train[0]["input_ids"])

    path = tools(tmp_path / "a", "The weather in a city.")
    said, text = prepare(path)
    assert "no prepared dataset" in said and "The weather in a city." in text
    said, text = prepare(tools(tmp_path / "b", "The weather in a city."))  # the same definitions, another file
    assert "reusing the prepared dataset" in said, said
    tools(tmp_path / "a", "Today's weather in a city, in degrees Celsius.")
    said, text = prepare(path)
    assert "stale (changed: data.tools contents)" in said, said
    assert "in degrees Celsius" in text and "The weather in a city." not in text


def test_a_changed_tokenizer_invalidates_the_cache(workdir, write_recipe):
    path = _recipe(workdir, write_recipe)
    _prepare(path)
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    tokenizer.add_tokens(["<|new|>"])
    tokenizer.save_pretrained(workdir / "model")
    messages = []
    _prepare(path, messages)
    assert any("stale" in m and "tokenizer" in m for m in messages), messages


def test_a_changed_max_length_invalidates_but_packing_does_not(workdir, write_recipe):
    path = _recipe(workdir, write_recipe)
    _prepare(path)
    messages = []
    _prepare(_recipe(workdir, write_recipe, packing=True), messages)
    assert any("reusing" in m for m in messages), messages
    messages = []
    _prepare(_recipe(workdir, write_recipe, max_length=32), messages)
    assert any("stale" in m and "data settings" in m for m in messages), messages


@pytest.mark.slow
def test_require_prepared_refuses_a_stale_cache(workdir, write_recipe):
    path = _recipe(workdir, write_recipe, require_prepared=True)
    result = run_ft("train", str(path))
    assert result.returncode == 2
    assert "data.require_prepared" in result.stderr and "ft preprocess" in result.stderr
    assert run_ft("preprocess", str(path)).returncode == 0
    result = run_ft("train", str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "reusing the prepared dataset" in result.stderr


def test_preprocess_without_prepared_path_names_the_key(write_recipe, tmp_path):
    result = run_ft("preprocess", str(write_recipe(tiny_sft(tmp_path / "out"))))
    assert result.returncode == 2 and "data.prepared_path" in result.stderr


@pytest.mark.parametrize("strategy, sampler", [("group_by_length", "LengthGroupedSampler"),
                                               ("batch_rebalance", "BatchRebalanceSampler")])
def test_length_samplers_read_the_length_column(workdir, write_recipe, strategy, sampler):
    path = _recipe(workdir, write_recipe)
    recipe = load_recipe(path, [f"train.train_sampling_strategy={strategy}",
                                "train.gradient_accumulation_steps=2"]).recipe
    trainer, prepared = prepare_trainer(recipe, Hooks(), CPU, _silent)
    # a length column that disagrees with the real lengths proves the sampler reads it instead of scanning
    fake = list(reversed(range(len(prepared.train))))
    trainer.train_dataset = prepared.train.remove_columns("length").add_column("length", fake)
    loader = trainer.get_train_dataloader()
    used = _find_sampler(loader, sampler)
    assert used is not None, f"no {sampler} in the train dataloader"
    assert list(used.lengths) == fake


def _find_sampler(node, name: str, depth: int = 4):
    """accelerate wraps samplers (DataLoaderShard → BatchSampler(Shard) → sampler); look through the wrappers."""
    if type(node).__name__ == name:
        return node
    for attr in ("batch_sampler", "sampler"):
        inner = getattr(node, attr, None)
        if inner is not None and inner is not node and depth:
            found = _find_sampler(inner, name, depth - 1)
            if found is not None:
                return found
    return None


@pytest.mark.slow
def test_packing_feeds_whole_rows_back_to_back_that_do_not_attend_to_each_other(write_recipe, tmp_path):
    """TRL 1.16 packs best-fit-decreasing (rows kept whole, up to max_length per packed sequence) and padding-free:
    a batch's packed sequences arrive concatenated as one row with no attention mask, and position_ids restarting at
    0 where each original row starts tell the attention (sdpa's mask, flash-attention's cu_seq_lens) where to cut."""
    import datasets
    import torch
    from transformers import TrainerCallback

    from ft.run.train import train

    class RecordTrainBatches(TrainerCallback):
        """Keeps the keyword arguments of every training forward pass (the batches exactly as the model gets them)
        and the model."""

        def __init__(self):
            self.batches, self.model, self._hook = [], None, None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            def keep(module, _args, inputs):
                if module.training:
                    self.batches.append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})

            self.model = model
            self._hook = model.register_forward_pre_hook(keep, with_kwargs=True)

        def on_train_end(self, args, state, control, **kwargs):
            self._hook.remove()

    recipe = tiny_sft(tmp_path / "out", max_steps=3)  # batches of 8 packed sequences of <= 64 tokens
    recipe["data"].update(packing=True, prepared_path=str(tmp_path / "prepared"))
    recorder = RecordTrainBatches()
    result = train(load_recipe(write_recipe(recipe)), resume="never", say=_silent, callbacks=[recorder])
    assert result.status == "completed" and len(recorder.batches) == 3

    prepared = datasets.load_from_disk(str(tmp_path / "prepared" / "train"))
    labels_of = {tuple(row["input_ids"]): row["labels"] for row in prepared}
    for batch in recorder.batches:
        ids, positions, labels = batch["input_ids"], batch["position_ids"], batch["labels"]
        assert ids.shape[0] == 1 and "attention_mask" not in batch and ids.shape[1] <= 8 * 64
        starts = (positions[0] == 0).nonzero().flatten().tolist()
        spans = list(zip(starts, [*starts[1:], ids.shape[1]], strict=True))
        assert starts[0] == 0 and len(spans) > 8  # more rows than packed sequences: several rows in each
        whole_rows = 0
        for start, end in spans:
            assert positions[0, start:end].tolist() == list(range(end - start))
            row = tuple(ids[0, start:end].tolist())
            if row in labels_of:  # a prepared row, whole and alone between two restarts (padding would not be)
                whole_rows += end - start
                # its loss mask travels with it: the prompt stays -100, the answer keeps its labels
                assert labels[0, start:end].tolist() == labels_of[row]
                assert labels[0, start] == -100 and 0 < int((labels[0, start:end] != -100).sum()) < end - start
        assert whole_rows / ids.numel() >= 0.99  # the non-pad fraction (padding-free: no padding is added at all)
        assert ids.shape[1] >= 0.85 * 8 * 64  # and the 8 packed sequences are nearly full (0.92-1.0 here)

    # no attention across row boundaries: each row's logits in the packed batch are those of the row run alone,
    # while the same tokens as one running sequence (position_ids counting on) give every later row other logits
    model, batch = recorder.model.eval(), recorder.batches[0]
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    with torch.no_grad():
        packed = model(**inputs).logits[0]
        running = model(input_ids=batch["input_ids"]).logits[0]
        for start, end in zip(starts[1:], [*starts[2:], batch["input_ids"].shape[1]], strict=True):
            alone = model(input_ids=batch["input_ids"][:, start:end]).logits[0]
            assert torch.allclose(packed[start:end], alone, atol=1e-4)
            assert not torch.allclose(running[start:end], alone, atol=1e-2)


@pytest.mark.slow
def test_bad_rows_and_truncation_are_counted_in_the_summary(write_recipe, tmp_path):
    rows = (DATA / "train.jsonl").read_text().splitlines()[:40]
    rows += ["{not json", json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
             json.dumps({"messages": [{"role": "user", "content": "What is " + "1 + " * 40 + "1?"},
                                      {"role": "assistant", "content": "41"}]})]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=1)
    recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl")}], eval=[], on_bad_row="skip",
                          truncation="drop", max_length=64)
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 0, result.stderr[-2000:]
    stats = json.loads((out / "summary.json").read_text())["data"]
    assert stats["skipped_rows"] == {"data.train.0": {"invalid_json": 1, "no_assistant_turn": 1}}
    assert stats["train_rows_dropped_as_too_long"] == 1
    assert stats["train_rows"] == 40
    assert "skipped 2 rows" in result.stderr


@pytest.mark.slow
def test_bad_rows_stop_the_run_by_default_naming_file_and_line(write_recipe, tmp_path):
    rows = (DATA / "train.jsonl").read_text().splitlines()[:5]
    rows.insert(3, json.dumps({"messages": [{"role": "narrator", "content": "x"}]}))
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl")}], eval=[])
    result = run_ft("train", str(write_recipe(recipe)))
    assert result.returncode == 2
    assert f"{tmp_path / 'train.jsonl'}:4" in result.stderr and "narrator" in result.stderr
    assert "data.on_bad_row: skip" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # a refusal leaves no output directory behind


@pytest.mark.slow
@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_a_latin1_line_in_a_users_file_is_a_bad_row_in_ft_train(write_recipe, tmp_path, on_bad_row):
    """A new user's file with "café" saved as Latin-1 in line 6: a bad row with its line, or skipped and counted;
    never an unexplained UnicodeDecodeError."""
    rows = (DATA / "train.jsonl").read_text().splitlines()[:8]
    rows[5] = json.dumps({"messages": [{"role": "user", "content": "Un café?"},
                                       {"role": "assistant", "content": "Oui."}]}, ensure_ascii=False)
    (tmp_path / "train.jsonl").write_bytes(("\n".join(rows) + "\n").encode("latin-1"))
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=1)
    recipe["data"].update(train=[{"path": str(tmp_path / "train.jsonl")}], eval=[], on_bad_row=on_bad_row)
    result = run_ft("train", str(write_recipe(recipe)))
    assert "UnicodeDecodeError" not in result.stderr and "Traceback" not in result.stderr
    if on_bad_row == "error":
        assert result.returncode == 2
        assert f"{tmp_path / 'train.jsonl'}:6: not UTF-8 text: byte 0xe9" in result.stderr
        return
    assert result.returncode == 0, result.stderr[-2000:]
    stats = json.loads((out / "summary.json").read_text())["data"]
    assert stats["skipped_rows"] == {"data.train.0": {"not_utf8": 1}} and stats["train_rows"] == 7


def test_a_weighted_mixture_is_prepared_in_its_proportions_and_counted_per_source(workdir, write_recipe):
    shutil.copy(DATA / "instruction.jsonl", workdir / "instruction.jsonl")
    train = [{"path": str(workdir / "train.jsonl"), "format": "chat", "weight": 1},
             {"path": str(workdir / "instruction.jsonl"), "format": "instruction", "weight": 3}]
    path = _recipe(workdir, write_recipe, train=train)
    result = run_ft("preprocess", str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    stats = json.loads(result.stdout)
    chats, instructions = stats["train_sources"]["data.train.0"], stats["train_sources"]["data.train.1"]
    assert instructions["rows"] == 200  # the smaller source at 3 in 4 rows runs out first and ends the mixture
    assert 0.7 < instructions["rows"] / stats["train_rows"] < 0.8
    assert chats["rows"] + instructions["rows"] == stats["train_rows"]
    assert chats["tokens"] + instructions["tokens"] == stats["train_tokens"]
    assert "data: mixture (first exhausted): data.train.0 2" in result.stderr
    import datasets

    prepared = datasets.load_from_disk(str(workdir / "prepared" / "train"))
    assert len(prepared) == stats["train_rows"] and "__ft_source" not in prepared.column_names
    again = _prepare(path)  # reused from the cache
    shutil.rmtree(workdir / "prepared")  # built again, as a resumed run on another machine would
    assert _prepare(path).train["input_ids"] == again.train["input_ids"] == prepared["input_ids"]


def test_a_weighted_source_left_with_no_rows_is_named(workdir, write_recipe):
    """Every row of data.train.1 is longer than max_length and dropped: that source cannot take its share."""
    long = {"messages": [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "yes"}]}
    (workdir / "long.jsonl").write_text(json.dumps(long) + "\n")
    train = [{"path": str(workdir / "train.jsonl"), "format": "chat", "weight": 1},
             {"path": str(workdir / "long.jsonl"), "format": "chat", "weight": 1}]
    path = _recipe(workdir, write_recipe, train=train, truncation="drop", prepared_path=None)
    with pytest.raises(data.DataError, match=r"data\.train\.1: no rows of this source are left"):
        _prepare(path)


def test_a_weighted_mixture_of_preference_pairs_goes_to_trl_in_its_proportions(write_recipe, tmp_path):
    recipe = tiny_sft(tmp_path / "out")
    recipe.update(method="dpo")
    recipe["data"].update(eval=[], mix_stop="all_exhausted", train=[
        {"path": str(DATA / "preference.jsonl"), "format": "preference", "weight": 1},
        {"path": str(DATA / "preference-eval.jsonl"), "format": "preference", "weight": 1}])
    loaded = load_recipe(write_recipe(recipe)).recipe
    messages = []
    prepared = data.prepare_data(loaded, None, None, messages.append)
    counts = prepared.stats["train_sources"]
    assert counts["data.train.0"]["rows"] == 1000 and counts["data.train.1"]["rows"] > 900  # the smaller repeats
    assert prepared.stats["train_rows"] == len(prepared.train) == sum(c["rows"] for c in counts.values())
    assert not [c for c in prepared.train.column_names if c.startswith("__ft")]
    assert any(m.startswith("data: mixture (all exhausted)") for m in messages)


@pytest.mark.slow
def test_a_runs_saved_recipe_preprocesses_to_the_same_prepared_dataset(workdir, write_recipe):
    """The recipe.yaml a run leaves (every default written out) is a recipe of its own: `ft preprocess` on it finds
    the dataset the run prepared (same fingerprint, so it is reused, not tokenized again) and `--show` renders the
    same rows as from the recipe the user wrote."""
    path = _recipe(workdir, write_recipe)
    trained = run_ft("train", str(path), "--set", "train.max_steps=1")
    assert trained.returncode == 0, trained.stderr[-2000:]
    saved = workdir / "out" / "recipe.yaml"
    again = run_ft("preprocess", str(saved))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "reusing the prepared dataset" in again.stderr
    assert json.loads(again.stdout)["train_rows"] == ROWS
    shown = [run_ft("preprocess", str(recipe), "--show", "2") for recipe in (path, saved)]
    assert all(result.returncode == 0 for result in shown)
    assert shown[0].stdout == shown[1].stdout and "What is" in shown[0].stdout
