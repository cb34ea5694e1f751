"""Two processes on CPU (torchrun, gloo): data-parallel training, one set of messages and run files, and a
SIGTERM stop agreed by both processes that torchrun resumes, bit for bit, to the uninterrupted run's weights."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, assert_same_final_weights, tiny_sft
from test_checkpoints import SLOW_STEPS, STEP_LOG, hold_at, sigterm_once_started, steps_by_run

from ft.outputs.checkpoints import complete_checkpoints

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model


def _torchrun(recipe_path) -> list[str]:
    """Two processes on this machine; --standalone picks a free port for their rendezvous."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "ft", "train", str(recipe_path)]


LORA_WITH_DROPOUT = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.1}  # draws random numbers at every step
STEPS = 20


def _recipe(out) -> dict:
    return {**tiny_sft(out, max_steps=STEPS, logging_steps=10), "adapter": LORA_WITH_DROPOUT}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, str]:
    """A 2-process run of ``_recipe`` with its data prepared first, saved at its last step: its output directory and
    torchrun's stderr."""
    folder = tmp_path_factory.mktemp("two-processes")
    recipe = _recipe(folder / "out")
    recipe["train"].update(save_strategy="steps", save_steps=STEPS)
    recipe["data"]["prepared_path"] = str(folder / "prepared")
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = subprocess.run(_torchrun(folder / "recipe.yaml"), cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "out", result.stderr


def test_two_processes_train_data_parallel_and_write_the_run_once(uninterrupted):
    out, stderr = uninterrupted
    assert stderr.count("ft: done") == 1 and "× 2 processes" in stderr

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["steps"] == STEPS
    # data parallel: each optimizer step consumed 2 × 8 rows, so the steps cover twice the epoch fraction
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert abs(state["epoch"] - STEPS / math.ceil(summary["data"]["train_rows"] / 16)) < 1e-9
    assert (out / "final" / "adapter_config.json").is_file()


def test_sigterm_stops_every_process_at_the_same_step_and_torchrun_resumes(uninterrupted, write_recipe, tmp_path):
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    (tmp_path / "step_log.py").write_text(STEP_LOG)
    out = tmp_path / "out"
    recipe = _recipe(out)
    recipe["callbacks"] = [{"cls": "slow_steps:SlowSteps"}, {"cls": "step_log:StepLog"}]
    path = write_recipe(recipe)
    env = {**os.environ, "TQDM_DISABLE": "1"}

    hold_at(out, 5)
    launcher = subprocess.Popen(_torchrun(path), cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    sigterm_once_started(launcher, out)  # torchrun passes it on to both processes
    _, stderr = launcher.communicate(timeout=300)

    assert launcher.returncode != 0 and "stopped by SIGTERM" in stderr, stderr[-3000:]
    # one checkpoint, saved by both processes at the same step: each one's RNG state is in it
    assert [p.name for p in out.glob("checkpoint-*")] == [p.name for p in complete_checkpoints(out)]
    (checkpoint,) = complete_checkpoints(out)
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt"} <= {p.name for p in checkpoint.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["checkpoint"] == str(checkpoint)
    # the resume command is the launcher's, which started both processes (each one's parent)
    assert summary["resume_command"] == shlex.join(_torchrun(path)), summary["resume_command"]
    assert summary["steps"] == int(checkpoint.name.split("-")[1]) < STEPS
    assert not (out / "final").exists()

    (out / "hold-at").unlink()  # the resumed run is not stopped
    resumed = subprocess.run(_torchrun(path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoint}" in resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS and summary["world_size"] == 2
    # both processes took up at the step after the checkpoint's (a fresh start would have taken them all) ...
    stopped_at = int(checkpoint.name.split("-")[1])
    for rank in (0, 1):
        _, second_run = steps_by_run(out / f"steps-rank{rank}.log")
        assert second_run == list(range(stopped_at + 1, STEPS + 1)), rank
    # ... and the resumed run ends where the uninterrupted 2-process run of the same recipe and seed ends, bit for bit:
    # each rank's random state (its dropout masks) is in the checkpoint
    assert_same_final_weights(out, uninterrupted[0])


def test_each_failing_process_keeps_its_own_traceback(write_recipe, tmp_path):
    (tmp_path / "exploding_ranks.py").write_text(
        "from transformers import TrainerCallback\n\n"
        "class Explode(TrainerCallback):\n"
        "    def on_step_end(self, args, state, control, **kwargs):\n"
        "        if state.global_step == 2:\n"
        "            raise RuntimeError(f'disk full on rank {args.process_index}')\n"
    )
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=5)
    recipe["callbacks"] = [{"cls": "exploding_ranks:Explode"}]
    result = subprocess.run(_torchrun(write_recipe(recipe)), cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "disk full on rank 0" in (out / "error.log").read_text()
    assert "disk full on rank 1" in (out / "error-rank1.log").read_text()
