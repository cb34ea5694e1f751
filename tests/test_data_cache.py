"""``FT_CACHE_DATA=1`` (``ft.data.cache.kept_entry``): without ``data.prepared_path``, a run's tokenized data is kept in
ft's cache under its fingerprint, and the next run with the same data, tokenizer and template reads it back: the
same rows, the same figures, the same lines said; anything that shaped the rows changed makes another entry."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import ASSETS, DATA, tiny_sft

from ft import data
from ft.data import cache
from ft.model import loading
from ft.recipe import load_recipe


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> Path:
    """A cache folder of the test's own, the switch on (the session's cache is shared by every test)."""
    monkeypatch.setenv("FT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(cache.DATA_SWITCH, "1")
    return tmp_path / "cache"


def _recipe(write_recipe, tmp_path: Path, **data_changes) -> Path:
    recipe = tiny_sft(tmp_path / "out")
    recipe["data"].update({"train": [{"path": str(tmp_path / "train.jsonl"), "format": "chat"}], **data_changes})
    if not (tmp_path / "train.jsonl").exists():
        rows = (DATA / "train.jsonl").read_text().splitlines(keepends=True)[:300]  # a tenth: the cache is the claim
        (tmp_path / "train.jsonl").write_text("".join(rows))
    return write_recipe(recipe)


def _prepare(path: Path, builder: bool = True) -> tuple[data.PreparedData, list[str]]:
    recipe = load_recipe(path).recipe
    tokenizer = loading.load_tokenizer(recipe.model)
    said: list[str] = []
    prepared = data.prepare_data(recipe, tokenizer, data.chat_template_for(recipe, tokenizer), said.append,
                                 builder=builder)
    return prepared, said


def _rows(dataset) -> dict:
    return dataset.to_dict()


def test_a_kept_run_is_read_back_with_the_same_rows_figures_and_lines(private_cache, write_recipe, tmp_path):
    path = _recipe(write_recipe, tmp_path, max_length=40)  # the longest rows dropped: a line to say again
    built, said = _prepare(path)
    (entry,) = (private_cache / "data").iterdir()
    assert built.stats["prepared"] == f"built {entry} (FT_CACHE_DATA)"
    assert any("rows truncated" in line for line in said), said

    reused, said_again = _prepare(path)
    assert reused.stats["prepared"] == f"reused {entry} (FT_CACHE_DATA)"
    assert said_again == said
    assert {**reused.stats, "prepared": None} == {**built.stats, "prepared": None}
    assert _rows(reused.train) == _rows(built.train) and _rows(reused.eval) == _rows(built.eval)
    assert reused.train.cache_files  # read from the entry's files, not tokenized again in memory


def test_an_entry_damaged_by_hand_is_said_and_tokenized_again(private_cache, write_recipe, tmp_path):
    """An Arrow file deleted under the entry's whole manifest: the run says so and tokenizes again (no traceback), and
    the main process keeps a whole entry in its place, which the next run reads back."""
    path = _recipe(write_recipe, tmp_path)
    built, _ = _prepare(path)
    (entry,) = (private_cache / "data").iterdir()
    for arrow in (entry / "train").glob("*.arrow"):
        arrow.unlink()
    again, said = _prepare(path)
    assert any("could not be read; tokenizing it again" in line for line in said), said
    assert again.stats["prepared"] == f"built {entry} (FT_CACHE_DATA)" and list((entry / "train").glob("*.arrow"))
    assert _rows(again.train) == _rows(built.train)
    assert _prepare(path)[0].stats["prepared"] == f"reused {entry} (FT_CACHE_DATA)"


def test_what_shapes_the_rows_makes_another_entry(private_cache, write_recipe, tmp_path):
    path = _recipe(write_recipe, tmp_path)
    first, _ = _prepare(path)
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    (tmp_path / "train.jsonl").write_text("\n".join(lines[:-100]) + "\n")  # the same file, 100 rows fewer
    fewer, _ = _prepare(path)
    assert fewer.stats["prepared"].startswith("built ") and len(fewer.train) == len(first.train) - 100
    longer, _ = _prepare(_recipe(write_recipe, tmp_path, max_length=32))  # a data setting
    assert longer.stats["prepared"].startswith("built ")
    assert len(list((private_cache / "data").iterdir())) == 3


def test_off_unwritable_or_another_process_nothing_is_kept(private_cache, write_recipe, tmp_path, monkeypatch):
    path = _recipe(write_recipe, tmp_path)
    prepared, _ = _prepare(path, builder=False)  # a rank that is not the main process never writes
    assert prepared.stats["prepared"].startswith("built in memory") and not private_cache.exists()
    monkeypatch.setenv(cache.DATA_SWITCH, "0")
    prepared, _ = _prepare(path)
    assert prepared.stats["prepared"].startswith("built in memory") and not private_cache.exists()
    monkeypatch.setenv(cache.DATA_SWITCH, "1")
    private_cache.write_text("a file where the cache folder should be")
    prepared, _ = _prepare(path)  # the run goes on without it
    assert prepared.stats["prepared"].startswith("built in memory") and len(prepared.train)


def test_a_hub_dataset_at_no_fixed_revision_is_never_kept(private_cache):
    components = {"ft version": "1", "data.train.0 contents": "hub:org/rows@unpinned"}
    assert cache.kept_entry(components) is None
    assert cache.kept_entry({**components, "data.train.0 contents": "hub:org/rows@abc123"}) is not None
    os.environ.pop(cache.DATA_SWITCH)
    assert cache.kept_entry({"ft version": "1"}) is None


def test_two_processes_keeping_the_same_entry_leave_one_whole_entry(private_cache, write_recipe, tmp_path):
    """An entry another process renamed into place first is kept as it is; the later writer's copy is dropped."""
    path = _recipe(write_recipe, tmp_path)
    built, _ = _prepare(path)
    (entry,) = (private_cache / "data").iterdir()
    manifest = json.loads((entry / cache.MANIFEST).read_text())
    assert cache.keep(entry, built.train, built.eval, manifest["fingerprint"], {"from": "the later writer"})
    assert json.loads((entry / cache.MANIFEST).read_text()) == manifest
    assert [p.name for p in (private_cache / "data").iterdir()] == [entry.name]  # no staging folder left


def test_the_tokenizer_is_part_of_the_fingerprint(private_cache, write_recipe, tmp_path):
    path = _recipe(write_recipe, tmp_path)
    _prepare(path)
    model = tmp_path / "model"
    shutil.copytree(ASSETS, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_start|>"}))
    recipe = tiny_sft(tmp_path / "out")
    recipe["model"]["name"] = str(model)
    recipe["data"]["train"] = [{"path": str(tmp_path / "train.jsonl"), "format": "chat"}]
    other, _ = _prepare(write_recipe(recipe, name="other.yaml"))
    assert other.stats["prepared"].startswith("built ")
