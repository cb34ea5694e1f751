"""Resuming only what can be resumed: recipe drift refused (harmless changes noted), no mixing of runs without
--overwrite, and a checkpoint killed mid-write passed over for the previous complete one."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import run_ft, tiny_sft
from safetensors.torch import load_file
from test_checkpoints import assert_same_final_weights

from ft.outputs.checkpoints import complete_checkpoints, resume_command
from ft.run.drift import differences, is_harmless


def test_drift_keys_are_told_apart_from_harmless_ones():
    saved = {"method": "sft", "optimizer": {"lr": 0.003}, "data": {"train": [{"path": "a.jsonl"}], "eval": []},
             "train": {"max_steps": 100, "seed": 42}}
    now = {"method": "sft", "optimizer": {"lr": 0.001}, "data": {"train": [{"path": "a.jsonl"}, {"path": "b.jsonl"}],
                                                                   "eval": {"split_ratio": 0.1}},
           "train": {"max_steps": 200, "logging_steps": 7}}  # seed unset now: TRL's default, 42, is no change
    changes = {change.key: (change.saved, change.now) for change in differences(saved, now, "sft")}
    assert changes == {"optimizer.lr": (0.003, 0.001), "data.train.1.path": (None, "b.jsonl"),
                       "data.eval": ([], None), "data.eval.split_ratio": (None, 0.1),
                       "train.max_steps": (100, 200), "train.logging_steps": (10, 7)}
    assert [key for key in changes if is_harmless(key)] == ["data.eval", "train.logging_steps", "train.max_steps"]


@pytest.mark.slow  # it trains
def test_a_run_resumes_only_under_its_own_recipe_and_is_never_mixed_with_another(write_recipe, tmp_path):
    out = tmp_path / "out"
    path = write_recipe(tiny_sft(out, max_steps=4, save_strategy="steps", save_steps=2))
    assert run_ft("train", str(path)).returncode == 0
    finished = load_file(out / "final" / "model.safetensors")
    (out / "notes.txt").write_text("mine")  # a file of the user's own

    # a change that alters training is refused, naming each difference and both ways out
    drifted = run_ft("train", str(path), "--set", "optimizer.lr=0.001", "--resume", str(out / "checkpoint-2"))
    assert drifted.returncode == 2, drifted.stderr[-2000:]
    assert "optimizer.lr: 0.003 → 0.001" in drifted.stderr and "Traceback" not in drifted.stderr
    assert "--resume never" in drifted.stderr and "--overwrite" in drifted.stderr

    # a fresh run on top of this one is refused without --overwrite
    fresh = run_ft("train", str(path), "--resume", "never")
    assert fresh.returncode == 2 and "holds another run (checkpoint-2, checkpoint-4, final" in fresh.stderr

    # killed while writing checkpoint-4 (its trainer_state.json, written last, missing): auto resumes from
    # checkpoint-2, with a harmless change noted, and ends where the uninterrupted run ended
    shutil.rmtree(out / "final")
    (out / "summary.json").unlink()
    (out / "checkpoint-4" / "trainer_state.json").unlink()
    resumed = run_ft("train", str(path), "--set", "train.logging_steps=1")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {out / 'checkpoint-2'}" in resumed.stderr
    assert "leave the training as it was: train.logging_steps: 10 → 1" in resumed.stderr
    again = load_file(out / "final" / "model.safetensors")
    assert again.keys() == finished.keys() and all((again[k] == finished[k]).all() for k in again)

    # --overwrite clears the old run (its checkpoint-4 would outrank the new run's checkpoint-2) and keeps mine
    shorter = run_ft("train", str(path), "--set", "train.max_steps=2", "--resume", "never", "--overwrite")
    assert shorter.returncode == 0, shorter.stderr[-2000:]
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2"] and (out / "notes.txt").read_text()
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    reference = tiny_sft(tmp_path / "reference", max_steps=2, save_strategy="no")
    assert run_ft("train", str(write_recipe(reference, name="reference.yaml"))).returncode == 0
    assert_same_final_weights(out, tmp_path / "reference")  # a fresh run: nothing of the old one mixed in


def test_the_resume_command_is_the_command_that_ran_less_what_would_undo_the_resume(tmp_path):
    argv = ["/venv/bin/ft", "train", "my recipe.yaml", "--set", "train.output_dir=/runs/a", "--resume", "never",
            "--overwrite", "--set", "callbacks.0.kwargs.api_key=sk-123"]
    assert resume_command(argv) == ("ft train 'my recipe.yaml' --set train.output_dir=/runs/a "
                                    "--set 'callbacks.0.kwargs.api_key=<redacted>'")
    launcher = tmp_path / "cmdline"  # /proc/<torchrun's pid>/cmdline: NUL-separated
    launcher.write_bytes(b"\0".join([b"/usr/bin/python", b"-m", b"torch.distributed.run", b"--nproc_per_node", b"2",
                                     b"-m", b"ft", b"train", b"r.yaml", b"--resume=never", b""]))
    assert resume_command(["x", "train", "r.yaml"], launcher) == \
        "/usr/bin/python -m torch.distributed.run --nproc_per_node 2 -m ft train r.yaml"


@pytest.mark.slow  # it trains
def test_a_run_by_epochs_killed_after_its_last_step_trains_no_step_past_its_end(write_recipe, tmp_path):
    """num_train_epochs without max_steps, ending inside an epoch (0.01 of 375 steps: 4): a run killed after its last
    checkpoint (checkpoint-4) resumes to final/ without training a step 5, as the uninterrupted run ended."""
    def by_epochs(out):
        recipe = tiny_sft(out, save_strategy="steps", save_steps=2, num_train_epochs=0.01, logging_steps=1)
        del recipe["train"]["max_steps"]
        return recipe

    out, reference = tmp_path / "out", tmp_path / "reference"
    path = write_recipe(by_epochs(out))
    assert run_ft("train", str(path)).returncode == 0
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
    shutil.copytree(out, reference)
    shutil.rmtree(out / "final")  # as a kill after checkpoint-4 leaves it
    (out / "summary.json").unlink()

    resumed = run_ft("train", str(path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 5/4" not in resumed.stderr and "nothing is left to train" in resumed.stderr, resumed.stderr[-3000:]
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
    assert_same_final_weights(out, reference)
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
