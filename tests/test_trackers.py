"""Trackers (ft.machine.trackers): TensorBoard by default, writing under the output directory, with the values of the
run's own log history; trackio's local store under the output directory; a tracker that is not installed refused before
any model loads."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sqlite3

import pytest
from conftest import CPU, ROOT, run_ft, tiny_sft
from test_console import default_run

from ft.machine import hardware, trackers
from ft.outputs import checkpoints
from ft.recipe import load_recipe


@pytest.fixture(scope="module")
def default_out(tmp_path_factory):
    """The run tests/test_console.py checks the console of (the same run, once per session)."""
    return default_run(tmp_path_factory.getbasetemp())


def _history(out):
    """The log history of the run's last checkpoint (trainer_state.json)."""
    (checkpoint,) = out.glob("checkpoint-*")
    return json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed (ft[track])")
def test_tensorboard_by_default_under_the_output_dir_with_the_logged_values(default_out):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert list((default_out / "tb").glob("events.out.tfevents.*"))
    assert not (default_out / "runs").exists()  # transformers' own default, <output_dir>/runs/<date>_<host>
    events = EventAccumulator(str(default_out / "tb"))
    events.Reload()
    history = _history(default_out)
    logged = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]
    assert len(logged) == 4
    written = [(event.step, event.value) for event in events.Scalars("train/loss")]
    assert [step for step, _ in written] == [step for step, _ in logged]
    assert [value for _, value in written] == pytest.approx([value for _, value in logged], rel=1e-6)
    evaluated = [(entry["step"], entry["eval_loss"]) for entry in history if "eval_loss" in entry]
    written = [(event.step, event.value) for event in events.Scalars("eval/loss")][:len(evaluated)]
    assert written == [(step, pytest.approx(value, rel=1e-6)) for step, value in evaluated]


def test_the_default_gives_way_to_the_recipe(write_recipe, tmp_path):
    unset = tiny_sft(tmp_path / "out")
    del unset["train"]["report_to"]
    defaults = hardware.device_defaults(load_recipe(write_recipe(unset)).recipe, CPU)
    installed = importlib.util.find_spec("tensorboard") is not None
    assert defaults.get("report_to") == (["tensorboard"] if installed else None)
    explicit = load_recipe(write_recipe(tiny_sft(tmp_path / "out", report_to="trackio"), name="r2.yaml")).recipe
    assert "report_to" not in hardware.device_defaults(explicit, CPU)


def test_tracker_directories_are_set_only_while_building_and_never_over_the_users(monkeypatch, tmp_path):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "mine"))
    with trackers.writing_under(tmp_path / "out"):
        assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "out" / "tb")
        assert os.environ["TRACKIO_DIR"] == str(tmp_path / "mine")
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ and os.environ["TRACKIO_DIR"] == str(tmp_path / "mine")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trackio") is None, reason="trackio is not installed (ft[track])")
def test_trackio_keeps_its_local_store_under_the_output_dir(write_recipe, tmp_path):
    """trackio runs offline: its store is one SQLite file per project (``<project>.db``), here the default project
    ``huggingface``, in ``<output_dir>/trackio``."""
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=2, logging_steps=1, report_to="trackio", run_name="tiny-trackio")
    del recipe["data"]["eval"]
    result = run_ft("train", str(write_recipe(recipe)), env={"TRACKIO_DIR": None})
    assert result.returncode == 0, result.stderr[-3000:]
    store = out / "trackio" / "huggingface.db"
    assert store.is_file(), sorted(str(p) for p in out.rglob("*"))
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT run_name, metrics FROM metrics ORDER BY id").fetchall()
    written = [(values["train/global_step"], values["train/loss"]) for run_name, metrics in rows
               if run_name == "tiny-trackio" and "train/loss" in (values := json.loads(metrics))]
    history = json.loads((out / "log_history.json").read_text())
    logged = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]
    assert len(logged) == 2  # each of the 2 steps, as the run logged it
    assert [step for step, _ in written] == [step for step, _ in logged]
    assert [loss for _, loss in written] == pytest.approx([loss for _, loss in logged], rel=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here: nothing to refuse")
def test_a_tracker_that_is_not_installed_is_refused_before_any_model_loads(write_recipe, tmp_path):
    path = write_recipe(tiny_sft(tmp_path / "out", report_to=["tensorboard", "wandb"]))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "report_to" in text)
    result = run_ft("train", str(path))
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{path}:{line}: train.report_to: `wandb` needs the `wandb` package" in result.stderr
    assert "pip install 'ft[wandb]'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "final").exists()


def test_overwrite_clears_the_trackers_folders_too(tmp_path):
    """``--overwrite`` starts over: the old run's curves would otherwise be drawn with the new run's."""
    for _, folder in trackers.LOCAL_DIRS.values():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "old").write_text("")
    (tmp_path / "notes.txt").write_text("mine")
    checkpoints.clear_previous_run(tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


def test_a_recipe_file_names_the_trackers_it_reports_to():
    assert trackers.named("none") == [] and trackers.named(["tensorboard", "wandb"]) == ["tensorboard", "wandb"]
    assert trackers.named("all") == [] and trackers.named(None) == []


def test_the_extras_install_the_trackers():
    """pyproject's extras hold the packages the refusals name."""
    text = (ROOT / "pyproject.toml").read_text()
    for name, package in trackers.TRACKERS.items():
        extra = package.install.removeprefix("ft[").removesuffix("]")
        assert re.search(rf'^{extra} = \[.*"{name}[<>=~"]', text, re.M), (name, extra)
