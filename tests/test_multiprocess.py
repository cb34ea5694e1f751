"""Two processes on CPU (torchrun, gloo): data-parallel training, one set of messages and run files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from conftest import ROOT, tiny_sft


def test_two_processes_train_data_parallel_and_write_the_run_once(write_recipe, tmp_path):
    out = tmp_path / "out"
    recipe = tiny_sft(out, max_steps=10, save_strategy="steps", save_steps=10)
    recipe["data"]["prepared_path"] = str(tmp_path / "prepared")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
               "-m", "ft", "train", str(write_recipe(recipe))]
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"}, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("ft: done") == 1 and "× 2 processes" in result.stderr

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["steps"] == 10
    # data parallel: each optimizer step consumed 2 × 8 rows, so 10 steps cover twice the epoch fraction
    state = json.loads((out / "checkpoint-10" / "trainer_state.json").read_text())
    assert abs(state["epoch"] - 10 / math.ceil(summary["data"]["train_rows"] / 16)) < 1e-9
    assert (out / "final" / "config.json").is_file()
