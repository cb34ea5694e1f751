"""Two processes on CPU (torchrun, gloo): data-parallel training, one set of messages and run files, and a
SIGTERM stop agreed by both processes that torchrun resumes."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, assert_same_final_weights, tiny_sft
from test_checkpoints import SLOW_STEPS, STEP_LOG, hold_at, sigterm_once_started, steps_by_run

from ft.outputs.checkpoints import complete_checkpoints

pytestmark = pytest.mark.slow  # every test here trains, or reads the real model


def _torchrun(recipe_path) -> list[str]:
    """Two processes on this machine; --standalone picks a free port for their rendezvous."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "ft", "train", str(recipe_path)]


def test_two_processes_train_data_parallel_and_write_the_run_once(write_recipe, tmp_path):
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=10, save_strategy="steps", save_steps=10)
    recipe["data"]["prepared_path"] = str(tmp_path / "prepared")
    result = subprocess.run(_torchrun(write_recipe(recipe)), cwd=ROOT,
                            env={**os.environ, "TQDM_DISABLE": "1"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("ft: done") == 1 and "× 2 processes" in result.stderr

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["steps"] == 10
    # data parallel: each optimizer step consumed 2 × 8 rows, so 10 steps cover twice the epoch fraction
    state = json.loads((out / "checkpoint-10" / "trainer_state.json").read_text())
    assert abs(state["epoch"] - 10 / math.ceil(summary["data"]["train_rows"] / 16)) < 1e-9
    assert (out / "final" / "config.json").is_file()


LORA_WITH_DROPOUT = {"kind": "lora", "r": 8, "alpha": 16, "dropout": 0.1}  # draws random numbers at every step


def test_sigterm_stops_every_process_at_the_same_step_and_torchrun_resumes(write_recipe, tmp_path):
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    (tmp_path / "step_log.py").write_text(STEP_LOG)
    out = tmp_path / "out"
    recipe = {**tiny_sft(out, max_steps=20, logging_steps=10), "adapter": LORA_WITH_DROPOUT}
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
    assert summary["steps"] == int(checkpoint.name.split("-")[1]) < 20
    assert not (out / "final").exists()

    (out / "hold-at").unlink()  # the resumed run is not stopped
    resumed = subprocess.run(_torchrun(path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoint}" in resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 20 and summary["world_size"] == 2
    # both processes took up at the step after the checkpoint's (a fresh start would have taken steps 1-20) ...
    stopped_at = int(checkpoint.name.split("-")[1])
    for rank in (0, 1):
        _, second_run = steps_by_run(out / f"steps-rank{rank}.log")
        assert second_run == list(range(stopped_at + 1, 21)), rank
    # ... and the resumed run ends where an uninterrupted 2-process run of the same recipe and seed ends: each rank's
    # random state (its dropout masks) is in the checkpoint
    uninterrupted = {**tiny_sft(tmp_path / "uninterrupted", max_steps=20, logging_steps=10),
                     "adapter": LORA_WITH_DROPOUT}
    reference = subprocess.run(_torchrun(write_recipe(uninterrupted, name="uninterrupted.yaml")), cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert_same_final_weights(out, tmp_path / "uninterrupted")


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
